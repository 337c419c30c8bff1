"""The kubelet's stand-in for the e2e tier and the sandbox: runs a real process for every Running kwok pod.

kwok marks pods Running with fake IPs but runs nothing. This runner watches the namespace's pods
and starts, for each, the process its container describes, on the pod IP's loopback twin: a pod
whose container runs vLLM's OpenAI server gets the engine emulator with the *same arguments*
(so the operator's rendered command line is what drives it), a router pod gets the router (with
`router_pythonpath` from `compiled_router()`: its request path compiled with mypyc, as the image
ships it). A Standby pod (its container runs the supervisor, runtime/specfleet_runtime/standby.py)
gets the supervisor itself, copied into a folder that stands in for the pod's standby emptyDir as its
init container would, with a `vllm.entrypoints.openai.api_server` stand-in on PYTHONPATH that runs the
emulator: both engines get the emulator with their own rendered arguments, on the pod's twin address.
Like a readiness probe, the runner marks a pod Ready (through the test bed's readiness annotation, see
specfleet_testbed.stages) only once its process answers /health (a Standby pod: once the supervisor's
ready file exists, what its startupProbe checks, and the plain engine answers). When a pod goes away
the process gets a preStop-like delay, then SIGTERM, so in-flight requests drain (the supervisor
relays it to both engines), and SIGKILL to its whole process group once the pod's
terminationGracePeriodSeconds have passed, as the kubelet kills a container.
Every process is tracked by PID and stopped exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from specfleet_runtime import standby
from specfleet_runtime.names import ENGINE_PORT, ROUTER_PORT
from specfleet_runtime.vllm_args import VLLM_SERVER_MODULE
from specfleet_testbed import READY_ANNOTATION, local_address

REPO = Path(__file__).resolve().parents[2]
# What a Standby pod's supervisor starts as `python -m vllm.entrypoints.openai.api_server`: the engine
# emulator, with the engine's own arguments (the runner appends --host and its emulator options).
VLLM_STAND_IN = """# vLLM's OpenAI server, played by the engine emulator (written by specfleet_sandbox.pods).
import sys

from specfleet_runtime.emulator.__main__ import main

main(sys.argv[1:])
"""


def compiled_router(python: str = sys.executable) -> Path:
    """The folder that, first on PYTHONPATH, makes the router run its request path as the image ships
    it: compiled with mypyc by scripts/compile-router.sh (about a minute the first time, then cached
    under $SPECFLEET_CACHE by source hash)."""
    script = REPO / "scripts" / "compile-router.sh"
    command = ["bash", str(script), "--python", python]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compiling the router failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class PodProcess:
    name: str
    role: str  # "engine" or "router"
    address: str
    port: int
    proc: subprocess.Popen[bytes]
    stop_at: float | None = None
    args: list[str] = field(default_factory=list)
    ready_marked: bool = False
    grace_seconds: float = 30.0  # the pod's terminationGracePeriodSeconds
    kill_at: float | None = None
    # A Standby pod: the supervisor's ready file, and the speculative engine's port (`port` is the
    # plain engine's).
    ready_file: Path | None = None
    speculative_port: int | None = None


def _port(args: list[str], default: int) -> int:
    return int(args[args.index("--port") + 1]) if "--port" in args else default


def install_vllm_stand_in(folder: Path) -> Path:
    """A package tree under `folder` whose `vllm.entrypoints.openai.api_server` runs the emulator;
    `folder` first on PYTHONPATH makes a Standby supervisor's engines emulators."""
    package = folder / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True, exist_ok=True)
    for level in (package, package.parent, package.parent.parent):
        (level / "__init__.py").touch()
    (package / "api_server.py").write_text(VLLM_STAND_IN)
    return folder


def standby_pod_args(
    args: list[str], address: str, emulator_args: list[str], home: Path
) -> standby.StandbyArgs:
    """A Standby pod's supervisor arguments as the runner starts them: both engines on the pod's twin
    `address` with the emulator's options, the ready file and termination message under `home` (the
    pod's standby emptyDir and its container's termination log)."""
    rendered = standby.parse_standby_args(args)
    extra = ("--host", address, *emulator_args)
    return replace(
        rendered,
        speculative=(*rendered.speculative, *extra),
        plain=(*rendered.plain, *extra),
        ready_file=str(home / "ready"),
        termination_log=str(home / "termination-log"),
    )


class PodRunner:
    """Plays every engine and router pod of one namespace on loopback."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        logdir: Path,
        *,
        emulator_args: list[str] | None = None,
        router_args: list[str] | None = None,
        router_pythonpath: Path | None = None,
        prestop_seconds: float = 2.0,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.logdir = logdir
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.emulator_args = emulator_args or []
        self.router_args = router_args or []
        self.router_pythonpath = router_pythonpath
        self.prestop_seconds = prestop_seconds
        # The acceptance of engines started from now on (`set_acceptance`; None: the emulator's args').
        self.acceptance: list[float] | None = None
        self.vllm_stand_in = install_vllm_stand_in(self.logdir / "vllm-stand-in")
        self.running: dict[str, PodProcess] = {}
        self.draining: list[PodProcess] = []
        self.started_total = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self.errors: list[str] = []
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._core = k8s.CoreV1Api(api)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            everything = [*self.running.values(), *self.draining]
            # All at once: each drains (a router first serves out its shutdown delay) in parallel.
            for pp in everything:
                if pp.proc.poll() is None:
                    pp.proc.send_signal(signal.SIGTERM)
            for pp in everything:
                self._reap(pp)
            self.running.clear()
            self.draining.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as err:
                self.errors.append(repr(err))
            self._stop.wait(0.25)

    # ---- reconcile pods -> processes --------------------------------------------------------

    def _sync(self) -> None:
        pods: list[Any] = self._core.list_namespaced_pod(self.namespace).items
        now = time.monotonic()
        with self._lock:
            live: set[str] = set()
            for pod in pods:
                uid = pod.metadata.uid
                wanted = (
                    pod.status.phase == "Running"
                    and pod.status.pod_ip
                    and pod.metadata.deletion_timestamp is None
                )
                if wanted:
                    live.add(uid)
                    if uid not in self.running and not self._address_busy(pod.status.pod_ip):
                        launched = self._launch(pod)
                        if launched is not None:
                            self.running[uid] = launched
                    pp = self.running.get(uid)
                    if pp is not None and not pp.ready_marked and self._healthy(pp):
                        # What a readiness probe does: the pod turns Ready once its process answers.
                        self._core.patch_namespaced_pod(
                            pod.metadata.name,
                            self.namespace,
                            {"metadata": {"annotations": {READY_ANNOTATION: "true"}}},
                        )
                        pp.ready_marked = True
            for uid in list(self.running):
                if uid not in live:
                    pp = self.running.pop(uid)
                    # Like the kubelet: the preStop sleep, then SIGTERM, then SIGKILL when the pod's
                    # grace period (counted from the deletion) runs out.
                    pp.stop_at = now + min(self.prestop_seconds, pp.grace_seconds)
                    pp.kill_at = now + pp.grace_seconds
                    self.draining.append(pp)
            for pp in list(self.draining):
                if pp.stop_at is not None and now >= pp.stop_at:
                    pp.proc.send_signal(signal.SIGTERM)
                    pp.stop_at = None
                elif pp.stop_at is None and pp.kill_at is not None and now >= pp.kill_at:
                    _kill(pp)
                    pp.kill_at = None
                if pp.proc.poll() is not None:
                    self.draining.remove(pp)

    def _address_busy(self, pod_ip: str) -> bool:
        """kwok reuses a deleted pod's IP at once; wait until the process still draining there exits."""
        address = local_address(pod_ip)
        return any(pp.address == address for pp in [*self.draining, *self.running.values()])

    def _healthy(self, pp: PodProcess) -> bool:
        if pp.ready_file is not None and not pp.ready_file.exists():
            return False  # a Standby pod's startupProbe: the supervisor has not written its ready file
        path = "/health" if pp.role == "engine" else "/readyz"
        try:
            with urllib.request.urlopen(f"{self.url(pp)}{path}", timeout=0.5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _launch(self, pod: Any) -> PodProcess | None:
        container = pod.spec.containers[0]
        command = list(container.command or [])
        args = list(container.args or [])
        address = local_address(pod.status.pod_ip)
        env: dict[str, str] | None = None
        ready_file: Path | None = None
        speculative_port: int | None = None
        if command[-2:] == ["-m", VLLM_SERVER_MODULE]:
            extra = self._emulator_args(pod)
            argv = [sys.executable, "-m", "specfleet_runtime.emulator", *args, "--host", address, *extra]
            role, port = "engine", _port(args, ENGINE_PORT)
        elif command[-1:] == [standby.SUPERVISOR_PATH]:
            # The pod's standby emptyDir, filled as its init container does.
            home = self.logdir / f"{pod.metadata.name}.standby"
            standby.install(str(home / "standby.py"))
            supervised = standby_pod_args(args, address, self._emulator_args(pod), home)
            argv = [sys.executable, str(home / "standby.py"), *standby.build_standby_args(supervised)]
            role, port = "engine", standby.engine_port(supervised.plain) or ENGINE_PORT
            speculative_port = standby.engine_port(supervised.speculative)
            ready_file = Path(supervised.ready_file)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [str(self.vllm_stand_in), os.environ.get("PYTHONPATH")])
            )}  # fmt: skip
        elif command[:1] == ["specfleet-router"]:
            argv = [
                sys.executable,
                "-m",
                "specfleet_runtime.router",
                *args,
                "--host",
                address,
                "--kubeconfig",
                str(self.kubeconfig),
                *self.router_args,
            ]
            role, port = "router", _port(args, ROUTER_PORT)
            if self.router_pythonpath is not None:
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(self.router_pythonpath), os.environ.get("PYTHONPATH")])
                )}  # fmt: skip
        else:
            return None
        log = (self.logdir / f"{pod.metadata.name}.log").open("ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()
        self.started_total += 1
        grace = pod.spec.termination_grace_period_seconds
        return PodProcess(
            pod.metadata.name,
            role,
            address,
            port,
            proc,
            args=args,
            grace_seconds=30.0 if grace is None else grace,
            ready_file=ready_file,
            speculative_port=speculative_port,
        )

    def _emulator_args(self, pod: Any) -> list[str]:
        """The emulator's own options for an engine of `pod` (the acceptance set since, if any)."""
        extra = list(self.emulator_args)
        if self.acceptance is not None:
            extra += ["--acceptance", ",".join(str(a) for a in self.acceptance)]
        return extra

    @staticmethod
    def _reap(pp: PodProcess) -> None:
        """Wait for a signalled process; SIGKILL it after 15 s."""
        try:
            pp.proc.wait(15)
        except subprocess.TimeoutExpired:
            _kill(pp)
            pp.proc.wait(5)

    # ---- helpers for tests ---------------------------------------------------------------------

    def processes(self, role: str) -> list[PodProcess]:
        with self._lock:
            return [pp for pp in self.running.values() if pp.role == role]

    def url(self, pp: PodProcess) -> str:
        return f"http://{pp.address}:{pp.port}"

    def speculative_url(self, pp: PodProcess) -> str | None:
        """A Standby pod's speculative engine (None for any other pod)."""
        return None if pp.speculative_port is None else f"http://{pp.address}:{pp.speculative_port}"

    def set_acceptance(self, per_position: list[float]) -> None:
        """Content shift: change every engine's acceptance now, and that of engines started later."""
        self.acceptance = per_position
        for pp in self.processes("engine"):
            for url in (self.url(pp), self.speculative_url(pp)):
                if url is not None:
                    set_engine_acceptance(url, per_position)

    def logs(self) -> str:
        return "\n".join(
            f"----- {path.name} -----\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.logdir.glob("*.log"))
        )


def _kill(pp: PodProcess) -> None:
    """SIGKILL the pod's whole process group (started in its own session: a Standby supervisor's
    engines too), as the kubelet kills every process of a container. Only while the leader is not
    reaped: its PID, the group's id, cannot have been reused."""
    if pp.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pp.proc.pid, signal.SIGKILL)


def set_engine_acceptance(engine_url: str, per_position: list[float]) -> None:
    """Change one emulated engine's acceptance from its next step (the emulator's admin endpoint)."""
    body = json.dumps({"perPosition": per_position}).encode()
    request = urllib.request.Request(
        f"{engine_url}/admin/acceptance",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass
