"""The Standby pod's supervisor (runtime/specfleet_runtime/standby.py) against two real engine emulators.

The supervisor starts `python -m vllm.entrypoints.openai.api_server` as it does in a pod; here a shim
package of that name on PYTHONPATH runs the engine emulator in its place (time scale 0, so sleeping and
waking are instant). The shim records, as each engine starts, whether the other engine's port answers
and whether it sleeps: the start order is read from that record, not from timing.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from specfleet_runtime import standby
from specfleet_runtime.standby import (
    CANNOT_SLEEP,
    CANNOT_SLEEP_EXIT_CODE,
    StandbyArgs,
    build_standby_args,
    engine_host,
    engine_port,
    parse_standby_args,
)
from specfleet_runtime.vllm_args import VLLM_SERVER_MODULE, EngineArgs, build_vllm_args

ROOT = Path(__file__).resolve().parents[2]
# Generous: the emulators start in ~2 s each on an idle machine, far slower on a loaded CI runner.
WAIT_SECONDS = 60.0

SHIM = """
import json, os, sys, urllib.request

def peer_state(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping", timeout=2) as r:
            return json.load(r)["is_sleeping"]
    except OSError:
        return "down"

port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["SHIM_RECORD"], "a") as out:
    peer = int(os.environ["SHIM_PEER_" + str(port)])
    ready = os.path.exists(os.environ["SHIM_READY"])
    out.write(json.dumps({"port": port, "peer_sleeping": peer_state(peer), "ready": ready}) + "\\n")
if os.environ.get("SHIM_CPU"):
    # What vLLM's CPU build answers --enable-sleep-mode with, before it serves anything.
    print("ValueError: Sleep mode is not supported on current platform.", flush=True)
    sys.exit(1)
if os.environ.get("SHIM_NO_SLEEP_ROUTES"):
    os.environ.pop("VLLM_SERVER_DEV_MODE", None)  # an engine without the /sleep routes: 404
from specfleet_runtime.emulator.__main__ import main
main(sys.argv[1:] + ["--host", "127.0.0.1", "--time-scale", "0"])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _engine(port: int, speculative: bool) -> list[str]:
    from specfleet_runtime.vllm_args import SpeculativeConfig

    spec = (
        SpeculativeConfig(method="eagle3", num_speculative_tokens=3, model="drafter") if speculative else None
    )
    return build_vllm_args(
        EngineArgs(model="m", served_model_name="m", port=port, speculative=spec, enable_sleep_mode=True)
    )


class Pod:
    """One supervisor process with its two emulated engines, in a temporary directory."""

    def __init__(self, tmp: Path, stale_ready: bool = False, **shim_env: str) -> None:
        package = tmp / "shim" / "vllm" / "entrypoints" / "openai"
        package.mkdir(parents=True)
        for level in (package, package.parent, package.parent.parent):
            (level / "__init__.py").write_text("")
        (package / "api_server.py").write_text(textwrap.dedent(SHIM))
        self.speculative_port, self.plain_port = _free_port(), _free_port()
        self.record = tmp / "record.jsonl"
        self.ready = tmp / "state" / "ready"
        self.termination = tmp / "termination-log"
        if stale_ready:  # left by the container's previous run: an emptyDir outlives a restart
            self.ready.parent.mkdir(parents=True)
            self.ready.write_text("stale\n")
        args = StandbyArgs(
            speculative=tuple(_engine(self.speculative_port, True)),
            plain=tuple(_engine(self.plain_port, False)),
            ready_file=str(self.ready),
            termination_log=str(self.termination),
            startup_timeout_seconds=int(WAIT_SECONDS),
        )
        paths = [
            str(tmp / "shim"),
            *(str(ROOT / p) for p in ("runtime", "operator")),
            os.environ.get("PYTHONPATH", ""),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, paths)),
            "SHIM_RECORD": str(self.record),
            "SHIM_READY": str(self.ready),
            f"SHIM_PEER_{self.speculative_port}": str(self.plain_port),
            f"SHIM_PEER_{self.plain_port}": str(self.speculative_port),
            **shim_env,
        }
        env.pop(standby.SERVER_DEV_MODE_ENV, None)  # the supervisor sets it for its engines
        # Its own session: `close` can stop the supervisor and both engines by that group, whatever
        # state the test left them in (a SIGKILL to the supervisor alone would orphan its engines).
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specfleet_runtime.standby", *build_standby_args(args)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def records(self) -> dict[int, tuple[object, bool]]:
        """Each engine's port: (the other engine's /is_sleeping or "down", the ready file existed), as
        it was when the engine started."""
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        return {doc["port"]: (doc["peer_sleeping"], doc["ready"]) for doc in map(json.loads, lines)}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (self.ready.exists() and self.ready.read_text() == "ready\n"):
            assert self.proc.poll() is None, f"supervisor exited: {self.stderr()}"
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.1)

    def wait(self) -> int:
        return self.proc.wait(WAIT_SECONDS)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode() if self.proc.poll() is not None else ""

    def close(self) -> None:
        """SIGTERM the supervisor (it stops both engines), then SIGKILL whatever of its group is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(WAIT_SECONDS)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait()


def _get(port: int, path: str) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.load(response)


def _parent(proc: Path) -> int | None:
    try:
        # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces: split after its ")".
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def pod_factory(tmp_path):
    pods: list[Pod] = []

    def make(stale_ready: bool = False, **shim_env: str) -> Pod:
        pod = Pod(tmp_path, stale_ready, **shim_env)
        pods.append(pod)
        return pod

    yield make
    for pod in pods:
        pod.close()


def test_the_plain_engine_starts_only_after_the_speculative_one_sleeps_then_the_pod_is_ready(pod_factory):
    pod = pod_factory(stale_ready=True)
    pod.wait_ready()
    # When the speculative engine started the plain one was not there; when the plain one started the
    # speculative one was up and asleep; neither saw a ready file (the stale one was removed first).
    assert pod.records() == {pod.speculative_port: ("down", False), pod.plain_port: (True, False)}
    assert pod.ready.read_text() == "ready\n"
    assert _get(pod.speculative_port, "/is_sleeping") == {"is_sleeping": True}
    assert _get(pod.plain_port, "/is_sleeping") == {"is_sleeping": False}
    models = _get(pod.plain_port, "/v1/models")
    assert isinstance(models, dict)
    assert models["data"][0]["id"] == "m"
    assert not pod.termination.exists()


def test_sigterm_stops_both_engines(pod_factory):
    pod = pod_factory()
    pod.wait_ready()
    assert _answers(pod.plain_port)
    assert _answers(pod.speculative_port)
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.wait() == 0, pod.stderr()
    assert not _answers(pod.plain_port)
    assert not _answers(pod.speculative_port)


def test_stopping_an_engine_already_told_to_stop_sends_it_no_second_sigterm(tmp_path):
    """The pod's SIGTERM goes to both engines; when the idle one exits first the supervisor waits for
    the other instead of signalling it again (a second SIGTERM can cut its requests short)."""
    counted = tmp_path / "sigterms"
    child = textwrap.dedent(
        f"""
        import signal, sys, time
        seen = []
        def on_term(*_):
            seen.append(1)
            open({str(counted)!r}, "w").write(str(len(seen)))
        signal.signal(signal.SIGTERM, on_term)
        print("up", flush=True)
        while not seen:
            time.sleep(0.01)
        time.sleep(0.5)  # finishing its requests
        sys.exit(0)
        """
    )
    engine = standby.Engine.__new__(standby.Engine)
    engine.name, engine.told_to_stop = "speculative", False
    engine.proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
    assert engine.proc.stdout is not None
    assert engine.proc.stdout.readline() == b"up\n"
    engine._relay = standby.threading.Thread(target=lambda: None)
    engine._relay.start()
    engine.signal(signal.SIGTERM)
    engine.stop(seconds=10)
    assert engine.proc.returncode == 0
    assert counted.read_text() == "1"


def test_an_engine_exiting_stops_the_pod_with_its_code_and_a_standby_message(pod_factory):
    pod = pod_factory()
    pod.wait_ready()
    # Kill the plain engine: the supervisor's child whose command line names its port.
    children = [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit()
        and _parent(proc) == pod.proc.pid
        and str(pod.plain_port).encode() in (proc / "cmdline").read_bytes().split(b"\0")
    ]
    assert len(children) == 1
    os.kill(children[0], signal.SIGKILL)
    assert pod.wait() == 128 + signal.SIGKILL
    assert (
        pod.termination.read_text() == f"standby: the plain engine exited with code {128 + signal.SIGKILL}\n"
    )
    assert not _answers(pod.speculative_port)


def test_an_engine_without_the_sleep_routes_ends_the_pod_with_the_cannot_sleep_message(pod_factory):
    pod = pod_factory(SHIM_NO_SLEEP_ROUTES="1")
    assert pod.wait() == CANNOT_SLEEP_EXIT_CODE
    message = pod.termination.read_text()
    assert message == f"{CANNOT_SLEEP}: POST /sleep?level=1 answered 404\n"
    # The plain engine never started, the speculative one was stopped, and the pod never got ready.
    assert pod.records() == {pod.speculative_port: ("down", False)}
    assert not _answers(pod.speculative_port)
    assert not pod.ready.exists()


def test_vllm_on_cpu_refusing_sleep_mode_at_start_is_a_cannot_sleep_message_too(pod_factory):
    pod = pod_factory(SHIM_CPU="1")
    assert pod.wait() == CANNOT_SLEEP_EXIT_CODE
    assert pod.termination.read_text() == (
        f"{CANNOT_SLEEP}: ValueError: Sleep mode is not supported on current platform.\n"
    )


def test_the_command_line_round_trips_and_names_each_engines_port():
    args = StandbyArgs(
        speculative=tuple(_engine(8001, True)),
        plain=tuple(_engine(8000, False)),
        ready_file="/x/ready",
        termination_log="/x/log",
        startup_timeout_seconds=900,
    )
    assert parse_standby_args(build_standby_args(args)) == args
    assert engine_port(args.speculative) == 8001
    assert engine_port(["--port=9"]) == 9
    for bad in (
        ["--ready-file", "r"],  # no engines
        ["--", *args.speculative],  # no separator
        ["--", *args.speculative, "---", *args.speculative],  # one port for both
        ["--", "--model", "m", "---", *args.plain],  # no port
    ):
        with pytest.raises(ValueError, match=r"expected|port"):
            parse_standby_args(bad)


def test_the_supervisor_dials_each_engine_at_its_host_or_loopback_where_it_listens_on_every_address():
    assert engine_host(["--port", "8000"]) == "127.0.0.1"
    assert engine_host(["--host", "0.0.0.0", "--port", "8000"]) == "127.0.0.1"
    assert engine_host(["--host", "10.0.0.1", "--host=127.244.0.7"]) == "127.244.0.7"  # the last wins
    assert engine_host(["--host", "::"]) == "127.0.0.1"


def test_the_supervisor_is_one_stdlib_file_and_installs_itself(tmp_path):
    # The engine image is vLLM's: the supervisor must run there as a copied file, without specfleet.
    tree = ast.parse(Path(standby.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert standby.ENGINE_MODULE == VLLM_SERVER_MODULE
    target = tmp_path / "dir" / "standby.py"
    subprocess.run(
        [sys.executable, "-m", "specfleet_runtime.standby", "--install-to", str(target)], check=True
    )
    assert target.read_text() == Path(standby.__file__).read_text()
    # The copy runs on its own (isolated mode: no PYTHONPATH, no site-packages of ours).
    run = subprocess.run(
        [sys.executable, "-I", str(target), "--", "--port", "1", "---"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "no --port" in run.stderr
