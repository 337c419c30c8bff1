"""`specfleet sandbox`: the product running on one machine, with traffic, Prometheus and live flips.

    specfleet sandbox up     [--dir DIR]            start everything and apply the sandbox fleet
    specfleet sandbox load   [--scenario NAME]      drive a scenario through the router (live view)
    specfleet sandbox demo                          up, then the "demo" scenario, then how to explore
    specfleet sandbox info                          how to reach the running sandbox
    specfleet sandbox down                          stop exactly what `up` started

`up` starts, in order: the local control plane (real etcd, kube-apiserver, controller-manager,
scheduler; kwok plays three GPU nodes), an agent that plays the pods (one engine emulator per engine
pod, started from that pod's own rendered arguments, and the router process fed by EndpointSlices
from the apiserver) and serves pod discovery to Prometheus, Debian's Prometheus, and the operator;
then measures the engines' cost profile with `specfleet profile` (specfleet_sandbox.profiling),
applies it as the ConfigMap the fleet's Goodput policy reads, applies the sandbox fleet
(specfleet_sandbox.fleet) and waits until it is Ready. Every process is recorded by PID and start
time in DIR/sandbox.json and stopped exactly by `down`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from specfleet.cli.common import CommandParser
from specfleet_runtime.names import ROUTER_PORT
from specfleet_sandbox.fleet import DEFAULT_NAMESPACE, SERVED_MODEL, sandbox_fleet
from specfleet_sandbox.processes import Detached, OperatorProcess
from specfleet_sandbox.profiling import break_even, emulator_args, measure_profile
from specfleet_sandbox.prometheus import PrometheusProcess, scrape_config
from specfleet_sandbox.scenario import (
    BASELINE_ACCEPTANCE,
    SCENARIOS,
    Phase,
    Rollout,
    RolloutKey,
    content_shift_args,
    observe_rollouts,
    run_scenario,
    summary_lines,
)
from specfleet_testbed import Cluster, ClusterError, ensure_binaries, local_address
from specfleet_testbed.cluster import STATE_FILE as CLUSTER_STATE

DEFAULT_DIR = Path(tempfile.gettempdir()) / "specfleet-demo"
STATE = "sandbox.json"
FLEET_NAME = "assistant"
ROUTER_ARGS = ["--endpoint-address-map", "10.0.0.0/8=127.0.0.0/8", "--log-level", "warning"]
CRD = Path(__file__).resolve().parents[2] / "crds" / "specfleet.io_speculativedeployments.yaml"


class SandboxError(RuntimeError):
    """Something the user can act on; printed without a traceback."""


# The sandbox extra (pyproject.toml): `load` drives traffic with openai and draws its live view with rich.
EXTRA_MODULES = ("openai", "rich")


def _require_extra(command: str) -> None:
    """Refuse, naming the extra to install, before a command that needs it starts anything."""
    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SandboxError(
            f"`specfleet sandbox {command}` needs {' and '.join(missing)}, which come with the sandbox "
            "extra: pip install 'specfleet[sandbox]'"
        )


def _say(message: str) -> None:
    print(f"== {message}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_state(work: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((work / STATE).read_text())
    except FileNotFoundError:
        raise SandboxError(f"no sandbox in {work}: run `specfleet sandbox up` first") from None
    return state


def _write_state(work: Path, state: dict[str, Any]) -> None:
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(work / STATE)


def _wait(what: str, probe: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise SandboxError(f"timed out after {timeout:.0f}s waiting for {what}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


# --- up ------------------------------------------------------------------------------------------


def _cmd_up(args: argparse.Namespace) -> int:
    work: Path = args.dir
    if (work / STATE).exists() or (work / "cluster" / CLUSTER_STATE).exists():
        raise SandboxError(f"a sandbox is already recorded in {work}: run `specfleet sandbox down` first")
    up(work, args.namespace)
    return 0


def up(work: Path, namespace: str) -> dict[str, Any]:
    """Start every part, apply the fleet, wait for Ready; returns the recorded state."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    state: dict[str, Any] = {"namespace": namespace, "name": FLEET_NAME, "processes": []}
    _say("control-plane binaries (built once from the Go module proxy; minutes on a cold cache)")
    bin_dir = ensure_binaries()
    _say("starting the control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok")
    cluster = Cluster(bin_dir, work / "cluster", detach=True, keep=True).start()
    state["kubeconfig"] = str(cluster.kubeconfig)
    state["bin_dir"] = str(bin_dir)
    _write_state(work, state)
    try:
        cluster.kubectl("apply", "--server-side", "--field-manager=specfleet-sandbox", "-f", str(CRD))
        cluster.wait_established("crd/speculativedeployments.specfleet.io")
        cluster.kubectl("create", "namespace", namespace)

        _say("starting the pod agent: engine emulators and the router, as kwok's pods come and go")
        discovery_port = _free_port()
        agent_log = work / "agent.log"
        with agent_log.open("ab") as log:
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "specfleet_sandbox",
                    "agent",
                    "--dir",
                    str(work),
                    "--namespace",
                    namespace,
                    "--discovery-port",
                    str(discovery_port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        state["processes"].append(asdict(Detached.of("agent", agent.pid, agent_log)))
        _write_state(work, state)
        discovery_url = f"http://127.0.0.1:{discovery_port}/targets"
        _wait("the pod agent", lambda: _answers(discovery_url), timeout=60, interval=0.3)

        _say("starting Prometheus (Debian's package, installed on first use), scraping every second")
        # Empty: an earlier sandbox's series in the same folder would count as engines for Prometheus's
        # 5-minute lookback (its pods' names hash alike: same templates), halving the per-replica rates
        # the policy reads (seen: a pool turned off as RealizedBelowPrediction on a ghost replica).
        shutil.rmtree(work / "prometheus", ignore_errors=True)
        prometheus = PrometheusProcess(
            work / "prometheus", scrape_config(discovery_url=discovery_url, interval_seconds=1)
        ).start()
        assert prometheus.proc is not None
        state["prometheus_url"] = prometheus.url
        state["processes"].append(
            asdict(Detached.of("prometheus", prometheus.proc.pid, work / "prometheus" / "prometheus.log"))
        )
        _write_state(work, state)

        _say("starting the operator (specfleet run)")
        operator = OperatorProcess(cluster.kubeconfig, work / "operator.log", resync_seconds=5).start()
        state["processes"].append(asdict(Detached.of("operator", operator.pid, work / "operator.log")))
        _write_state(work, state)

        fleet = sandbox_fleet(namespace, prometheus.url)
        fleet["metadata"]["name"] = FLEET_NAME
        _measure(work, cluster, fleet, namespace)
        _say(f"applying the sandbox fleet {namespace}/{FLEET_NAME} (examples/02, adapted)")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(fleet))
        _wait(
            f"{FLEET_NAME} Ready",
            lambda: _condition(cluster, namespace, "Ready") == "True",
            timeout=180,
        )
        state["router_url"] = _wait("the router", lambda: router_url(cluster, namespace), timeout=60)
        _write_state(work, state)
    except BaseException:
        _say(f"start-up failed; stopping what was started (logs in {work})")
        down(work, keep_logs=True)
        raise
    _say(f"sandbox up in {time.monotonic() - started:.0f}s; router at {state['router_url']}")
    return state


def _measure(work: Path, cluster: Cluster, fleet: dict[str, Any], namespace: str) -> None:
    """`specfleet profile` against emulated engines; its ConfigMap applied where the fleet names it."""
    _say("measuring the engines' cost profile with `specfleet profile` (about a minute)")
    started = time.monotonic()
    try:
        measured = measure_profile(work, fleet, namespace, BASELINE_ACCEPTANCE)
    except RuntimeError as err:
        raise SandboxError(
            f"measuring the cost profile failed (log: {work / 'profile.log'}): {err}"
        ) from None
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(measured.config_map))
    policy = fleet["spec"]["policy"]
    point = break_even(
        measured.profile,
        BASELINE_ACCEPTANCE,
        int(fleet["spec"]["drafter"]["numSpeculativeTokens"]),
        int(policy.get("goodput", {}).get("marginPercent", 5)),
    )
    _say(
        f"profile measured in {time.monotonic() - started:.0f}s, applied as configmap/"
        f"{measured.config_map['metadata']['name']}; the policy predicts speculation stops paying above "
        f"{point.off_above:.0f} running requests per replica and pays again below {point.on_below:.0f}"
    )


def _condition(cluster: Cluster, namespace: str, type_: str) -> str | None:
    out = cluster.kubectl("get", "sd", FLEET_NAME, "-n", namespace, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    for c in json.loads(out.stdout).get("status", {}).get("conditions", []):
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def _ready_pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json", check=False)
    if out.returncode != 0:
        return []
    return [
        p
        for p in json.loads(out.stdout)["items"]
        if p.get("status", {}).get("podIP")
        and not p["metadata"].get("deletionTimestamp")
        and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions", [])
        )
    ]


def _pod_url(pod: dict[str, Any], default_port: int) -> str:
    args: list[str] = pod["spec"]["containers"][0].get("args") or []
    port = int(args[args.index("--port") + 1]) if "--port" in args else default_port
    return f"http://{local_address(pod['status']['podIP'])}:{port}"


def router_url(cluster: Cluster, namespace: str) -> str | None:
    """The router pod's process (on its pod IP's loopback twin), once it answers /readyz."""
    for pod in _ready_pods(
        cluster, namespace, f"app.kubernetes.io/component=router,app.kubernetes.io/instance={FLEET_NAME}"
    ):
        url = _pod_url(pod, ROUTER_PORT)
        if _answers(f"{url}/readyz"):
            return url
    return None


# --- agent ---------------------------------------------------------------------------------------


def _cmd_agent(args: argparse.Namespace) -> int:
    """Runs until SIGTERM: pod discovery for Prometheus and the pod runner (kubelet stand-in)."""
    from specfleet_sandbox.discovery import PodDiscovery
    from specfleet_sandbox.pods import PodRunner, compiled_router

    kubeconfig = args.dir / "cluster" / "kubeconfig"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    discovery = PodDiscovery(kubeconfig, args.namespace, port=args.discovery_port).start()
    runner = PodRunner(
        kubeconfig,
        args.namespace,
        args.dir / "pods",
        emulator_args=[
            *emulator_args(),
            "--acceptance",
            ",".join(map(str, BASELINE_ACCEPTANCE)),
            *content_shift_args(),
        ],
        router_args=ROUTER_ARGS,
        router_pythonpath=compiled_router(),
    ).start()
    try:
        while not stop.wait(1.0):
            for error in runner.errors[-3:]:
                print(f"pod runner: {error}", flush=True)
            runner.errors.clear()
    finally:
        runner.stop()
        discovery.stop()
    return 0


# --- load ----------------------------------------------------------------------------------------


def _attach(work: Path) -> tuple[dict[str, Any], Cluster]:
    state = _read_state(work)
    cluster = Cluster.attach(work / "cluster")
    if not all(cluster.alive().values()):
        raise SandboxError(f"the sandbox's control plane in {work} is not running: `down`, then `up`")
    return state, cluster


def _cmd_load(args: argparse.Namespace) -> int:
    _require_extra("load")
    result_ok = load(args.dir, args.scenario)
    return 0 if result_ok else 1


def load(work: Path, scenario_name: str, *, live: bool | None = None) -> bool:
    """Run a scenario with a live view; print the summary. True when no request failed."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    from specfleet.cli.status_view import fleet_view, plain_lines

    if scenario_name not in SCENARIOS:
        raise SandboxError(f"unknown scenario {scenario_name!r}; choose from {', '.join(SCENARIOS)}")
    scenario = SCENARIOS[scenario_name]
    state, cluster = _attach(work)
    namespace = state["namespace"]
    url = router_url(cluster, namespace) or state.get("router_url")
    if not url:
        raise SandboxError("the router is not ready")
    api = k8s.CustomObjectsApi(k8s_config.new_client_from_config(config_file=state["kubeconfig"]))  # type: ignore[no-untyped-call]

    def resource() -> dict[str, Any]:
        obj: Any = api.get_namespaced_custom_object(
            "specfleet.io", "v1alpha1", namespace, "speculativedeployments", state["name"]
        )
        return dict(obj)

    terminal = sys.stdout.isatty() if live is None else live
    last_key: tuple[Any, ...] = ()
    last_print = 0.0
    rollouts: dict[RolloutKey, Rollout] = {}
    live_view: Any = None
    if terminal:
        from rich.console import Console
        from rich.live import Live

        live_view = Live(console=Console(), auto_refresh=False)
        live_view.start()

    def tick(phase: Phase, elapsed: float) -> None:
        nonlocal last_key, last_print
        try:
            obj = resource()
            observe_rollouts(obj, rollouts)
            view = fleet_view(obj)
        except Exception as err:  # the live view must never stop the load
            print(f"(status unavailable: {err})", flush=True)
            return
        header = f"[{phase.name} {elapsed:4.0f}/{phase.seconds:.0f}s] expect: {phase.expect}"
        if live_view is not None:
            from rich.console import Group
            from rich.text import Text

            from specfleet.cli.status import rich_renderable

            live_view.update(Group(Text(header, style="bold"), rich_renderable([view])), refresh=True)
            return
        # Without a terminal: print on every change of mode, K, readiness, decision or condition, and
        # otherwise every 15 s (load and tokens/s change on every read).
        key = (phase.name, view.conditions, *((p.mode, p.k, p.replicas, p.decision) for p in view.pools))
        if key != last_key or time.monotonic() - last_print >= 15:
            print(f"--- {time.strftime('%H:%M:%S')} {header}", *plain_lines(view), sep="\n", flush=True)
            last_key, last_print = key, time.monotonic()

    print(f"scenario {scenario.name}: {scenario.description}", flush=True)
    try:
        result = run_scenario(
            scenario,
            url,
            SERVED_MODEL,
            on_tick=tick,
            tick_seconds=2.0,
        )
    finally:
        if live_view is not None:
            live_view.stop()
    final = resource()
    observe_rollouts(final, rollouts)
    history = final.get("status", {}).get("history", [])
    print("\n".join(summary_lines(result, history, rollouts)), flush=True)
    return result.failed == 0


# --- info, down, demo ------------------------------------------------------------------------------


def info_text(work: Path, state: dict[str, Any]) -> str:
    bin_dir = state.get("bin_dir", "")
    ns, name = state["namespace"], state["name"]
    return f"""
The sandbox keeps running. Explore it:
  export KUBECONFIG={state["kubeconfig"]} PATH={bin_dir}:$PATH
  kubectl -n {ns} get sd,deploy,pods -o wide
  specfleet status -n {ns} {name} --watch
  curl -s {state.get("router_url")}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model":"{SERVED_MODEL}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":16}}'
  python -c 'import openai; c = openai.OpenAI(base_url="{state.get("router_url")}/v1", api_key="x"); print(c.chat.completions.create(model="{SERVED_MODEL}", messages=[{{"role":"user","content":"hi"}}], max_tokens=16).choices[0].message.content)'
  open {state.get("prometheus_url")}/graph   (Prometheus: e.g. vllm:spec_decode_num_accepted_tokens_total)
  specfleet sandbox load --scenario NAME      ({", ".join(SCENARIOS)})
Logs: {work}/operator.log, {work}/agent.log, {work}/pods/*.log, {work}/prometheus/prometheus.log
Stop everything: make demo-down   (or: specfleet sandbox down)
"""


def _cmd_info(args: argparse.Namespace) -> int:
    print(info_text(args.dir, _read_state(args.dir)))
    return 0


def down(work: Path, *, keep_logs: bool = False) -> None:
    """Stop, in reverse order, exactly the processes `up` recorded, then the control plane."""
    try:
        state = _read_state(work)
    except SandboxError:
        state = {"processes": []}
    for record in reversed(state.get("processes", [])):
        process = Detached(**record)
        if not process.stop():
            print(f"{process.name} (pid {process.pid}) did not stop", file=sys.stderr)
    if (work / "cluster" / CLUSTER_STATE).exists():
        cluster = Cluster.attach(work / "cluster")
        cluster.keep = keep_logs
        cluster.stop()
    if not keep_logs:
        (work / STATE).unlink(missing_ok=True)


def _cmd_down(args: argparse.Namespace) -> int:
    down(args.dir)
    print(f"sandbox in {args.dir} stopped", file=sys.stderr)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    _require_extra("demo")
    work: Path = args.dir
    if (work / STATE).exists():
        raise SandboxError(f"a sandbox is already recorded in {work}: run `make demo-down` first")
    state = up(work, args.namespace)
    ok = load(work, args.scenario)
    print(info_text(work, state))
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="specfleet sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{up,load,demo,info,down}")
    for name, func, text in (
        ("up", _cmd_up, "start everything and apply the sandbox fleet"),
        ("load", _cmd_load, "drive a scenario through the router"),
        ("demo", _cmd_demo, "up, then the demo scenario"),
        ("info", _cmd_info, "how to reach the running sandbox"),
        ("down", _cmd_down, "stop exactly what up started"),
        ("agent", _cmd_agent, None),  # internal: started by `up`, so not listed
    ):
        cmd = sub.add_parser(name, help=text, description=text) if text else sub.add_parser(name)
        cmd.add_argument(
            "--dir",
            type=Path,
            default=Path(os.environ.get("DEMO_DIR", DEFAULT_DIR)),
            help="the sandbox's working folder: its state, logs and control plane (DEMO_DIR overrides)",
        )
        cmd.set_defaults(func=func)
    for name in ("up", "demo", "agent"):
        sub.choices[name].add_argument(
            "--namespace", default=DEFAULT_NAMESPACE, help="namespace of the fleet"
        )
    for name in ("load", "demo"):
        sub.choices[name].add_argument(
            "--scenario", default="demo", choices=sorted(SCENARIOS), help="the load to drive"
        )
    sub.choices["agent"].add_argument(
        "--discovery-port", type=int, required=True, help="port serving pod discovery to Prometheus"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (SandboxError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
