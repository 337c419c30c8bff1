"""The sandbox's pod agent (specfleet_sandbox.pods.PodRunner) playing a Standby pod, against a fake
Kubernetes API that lists the pod as rendered for examples/10-standby-flips.yaml: the supervisor runs
both engines as emulators on the pod's loopback twin, the pod turns Ready only once the supervisor's
ready file exists and the plain engine answers, and a deleted pod's SIGTERM reaches both engines.

The e2e tier runs the same agent against the real control plane (tests/e2e/test_standby_pool.py).
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specfleet.api.validation import parse_resource
from specfleet.render.engine import render_pool_deployment
from specfleet_runtime.names import ENGINE_PORT, STANDBY_SPECULATIVE_PORT
from specfleet_runtime.standby import parse_standby_args
from specfleet_sandbox.pods import PodProcess, PodRunner, standby_pod_args
from specfleet_testbed import READY_ANNOTATION, local_address
from support.manifests import ROOT, load_yaml

# Generous: two emulators start one after the other, slowly on a loaded 2-core runner.
WAIT_SECONDS = 90.0
# Instant steps, sleeps and wakes: this tests the agent, not the emulator's timing.
EMULATOR_ARGS = ["--time-scale", "0"]

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def _standby_container() -> dict[str, Any]:
    body = load_yaml(ROOT / "examples" / "10-standby-flips.yaml")
    body["metadata"].update(uid="uid-1", generation=1)
    deployment = render_pool_deployment(parse_resource(body), "latency", "Off", standby=True)
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


class FakeCore:
    """The two CoreV1Api calls the agent makes: list the namespace's pods, patch one's annotations."""

    def __init__(self) -> None:
        self.pods: list[Any] = []
        self.patches: list[tuple[str, dict[str, Any], float]] = []

    def list_namespaced_pod(self, namespace: str) -> Any:
        return SimpleNamespace(items=list(self.pods))

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.patches.append((name, body, time.time()))


def _pod(name: str, pod_ip: str, container: dict[str, Any], grace: int = 30) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(
            uid=f"uid-{name}", name=name, labels={"specfleet.io/pool": "latency"}, deletion_timestamp=None
        ),
        status=SimpleNamespace(phase="Running", pod_ip=pod_ip),
        spec=SimpleNamespace(
            containers=[SimpleNamespace(command=container["command"], args=container["args"])],
            termination_grace_period_seconds=grace,
        ),
    )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[PodRunner, FakeCore]]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    runner = PodRunner(kubeconfig, "ns", tmp_path / "pods", emulator_args=EMULATOR_ARGS, prestop_seconds=0.2)
    core = FakeCore()
    runner._core = core  # type: ignore[assignment]
    runner.start()
    try:
        yield runner, core
    finally:
        runner.stop()


def _pod_ip() -> str:
    """A fake pod IP outside kwok's 10.244.0.0/16, so no e2e pod on this machine shares its twin."""
    return f"10.213.{random.randrange(1, 255)}.{random.randrange(1, 255)}"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _wait(what: str, check: Any, runner: PodRunner) -> Any:
    deadline = time.monotonic() + WAIT_SECONDS
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} within {WAIT_SECONDS} s\n{runner.logs()}"
        assert not runner.errors, runner.errors
        time.sleep(0.1)
    return value


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is `pid` (the supervisor's two engines)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_the_agent_runs_a_standby_pods_supervisor_with_both_engines_on_the_twin_address(agent):
    runner, core = agent
    pod_ip = _pod_ip()
    core.pods = [_pod("big-model-latency-a", pod_ip, _standby_container())]
    (pp,) = _wait("the Standby pod's process", lambda: runner.processes("engine"), runner)
    assert isinstance(pp, PodProcess)
    assert pp.ready_file is not None
    twin = local_address(pod_ip)
    assert (pp.address, pp.port, pp.speculative_port) == (twin, ENGINE_PORT, STANDBY_SPECULATIVE_PORT)

    ((name, body, marked_at),) = _wait("the pod marked Ready", lambda: core.patches, runner)
    assert (name, body) == ("big-model-latency-a", {"metadata": {"annotations": {READY_ANNOTATION: "true"}}})
    # Ready only after the startupProbe's file: the supervisor writes it once the plain engine serves.
    assert pp.ready_file.read_text() == "ready\n"
    assert marked_at >= pp.ready_file.stat().st_mtime
    assert _get(f"http://{twin}:{ENGINE_PORT}/is_sleeping") == {"is_sleeping": False}
    assert _get(f"http://{twin}:{STANDBY_SPECULATIVE_PORT}/is_sleeping") == {"is_sleeping": True}
    # Each engine is the emulator with its own rendered arguments: the drafter on the speculative one.
    spec_state = _get(f"{runner.speculative_url(pp)}/admin/state")
    plain_state = _get(f"{runner.url(pp)}/admin/state")
    assert spec_state["speculative"] is not None, spec_state
    assert plain_state["speculative"] is None, plain_state

    # Deleted: the preStop delay, then SIGTERM to the supervisor, which relays it to both engines.
    engines = _children(pp.proc.pid)
    assert len(engines) == 2, engines
    core.pods = []
    _wait("the supervisor to exit", lambda: pp.proc.poll() is not None, runner)
    assert pp.proc.returncode == 0
    assert not [pid for pid in engines if _alive(pid)]
    assert "stopped on signal 15" in runner.logs()


def test_the_supervisors_engines_get_the_twin_address_the_emulators_options_and_the_pods_files(tmp_path):
    rendered = parse_standby_args(_standby_container()["args"])
    home = tmp_path / "pod.standby"
    args = standby_pod_args(_standby_container()["args"], "127.244.0.9", ["--time-scale", "10"], home)
    assert args.speculative == (*rendered.speculative, "--host", "127.244.0.9", "--time-scale", "10")
    assert args.plain == (*rendered.plain, "--host", "127.244.0.9", "--time-scale", "10")
    assert (args.ready_file, args.termination_log) == (str(home / "ready"), str(home / "termination-log"))
    assert args.startup_timeout_seconds == rendered.startup_timeout_seconds
