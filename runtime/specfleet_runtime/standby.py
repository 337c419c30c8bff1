"""The supervisor of a Standby engine pod: two vLLM servers on the pod's GPUs, one parked asleep.

A pool with `rollout.flip: Standby` runs one engine container per pod (the device plugin gives a GPU to
one container only), whose command is this supervisor. It starts two vLLM OpenAI servers as children:

1. the speculative engine (with the drafter) on its own port, waits for its /health, and checks that
   it can sleep with a round trip through vLLM's own routes (POST /sleep?level=1, GET /is_sleeping ->
   true, POST /wake_up, GET /is_sleeping -> false, POST /sleep?level=1 again), leaving it asleep;
2. only then the plain engine (no drafter) on the engine port, which serves from the start.

The order matters: vLLM sizes its KV cache from the GPU memory free when it starts, so the engine that
will sleep must have slept (freeing everything but its CUDA context) before the other one starts. Once
the plain engine answers /health, the supervisor writes the ready file the pod's startupProbe checks.

An engine that cannot sleep (vLLM on CPU refuses --enable-sleep-mode at start; an old vLLM has no
/sleep route) is not a crash loop to be: the supervisor writes one line starting with `CANNOT_SLEEP`
to the container's termination message file and exits with `CANNOT_SLEEP_EXIT_CODE`; the operator reads
that from the pod's status, marks the pool Degraded (StandbyUnavailable) and renders it as a Restart pool.

After start-up it relays SIGTERM/SIGINT to both engines and exits when either engine exits (with that
engine's code and a `standby: the <engine> engine exited ...` termination message).

Standard library only, and it imports nothing of specfleet_runtime: the engine image is vLLM's, which
does not carry specfleet, so an init container copies this one file into the pod (`--install-to`) and
the engine container runs it with the image's python. Its command line is built and parsed here
(`build_standby_args`, `parse_standby_args`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Final

# The vLLM server module each engine runs (vllm_args.VLLM_SERVER_MODULE; a test holds them equal).
ENGINE_MODULE: Final = "vllm.entrypoints.openai.api_server"
# vLLM serves /sleep, /wake_up and /is_sleeping only with this set (vllm/envs.py).
SERVER_DEV_MODE_ENV: Final = "VLLM_SERVER_DEV_MODE"
# Where the init container puts this file and the supervisor its ready file (an emptyDir of the pod).
STANDBY_DIR: Final = "/specfleet-standby"
SUPERVISOR_PATH: Final = f"{STANDBY_DIR}/standby.py"
READY_FILE: Final = f"{STANDBY_DIR}/ready"
# Kubernetes' default terminationMessagePath.
TERMINATION_LOG: Final = "/dev/termination-log"
# The termination message of an engine that cannot sleep, and the exit code that goes with it
# (sysexits' EX_CONFIG: the platform or image cannot do what the spec asks). The operator matches both.
CANNOT_SLEEP: Final = "standby: the engine cannot sleep"
CANNOT_SLEEP_EXIT_CODE: Final = 78
# Separates the speculative engine's vLLM arguments from the plain engine's.
ENGINE_SEPARATOR: Final = "---"
# Seconds between two /health polls while an engine starts, and an engine's last output lines kept
# to tell why it exited during start-up.
POLL_SECONDS: Final = 0.5
TAIL_LINES: Final = 40
# Seconds an engine gets to stop after SIGTERM once the other one exited, before SIGKILL.
STOP_SECONDS: Final = 30.0


def _log(message: str) -> None:
    print(f"specfleet-standby: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class StandbyArgs:
    """The supervisor's command line: each engine's vLLM arguments and where its files are."""

    speculative: tuple[str, ...]
    plain: tuple[str, ...]
    ready_file: str = READY_FILE
    termination_log: str = TERMINATION_LOG
    startup_timeout_seconds: int = 1800


def build_standby_args(args: StandbyArgs) -> list[str]:
    """The argument list after `python3 standby.py` (the inverse of `parse_standby_args`)."""
    return [
        "--ready-file",
        args.ready_file,
        "--termination-log",
        args.termination_log,
        "--startup-timeout-seconds",
        str(args.startup_timeout_seconds),
        "--",
        *args.speculative,
        ENGINE_SEPARATOR,
        *args.plain,
    ]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="standby.py",
        description="Run a speculative and a plain vLLM engine on one pod's GPUs, the speculative one "
        "asleep: standby.py [options] -- SPECULATIVE_VLLM_ARGS --- PLAIN_VLLM_ARGS",
        allow_abbrev=False,
    )
    p.add_argument("--ready-file", default=READY_FILE, help="written once the plain engine serves")
    p.add_argument(
        "--termination-log", default=TERMINATION_LOG, help="the container's termination message file"
    )
    p.add_argument(
        "--startup-timeout-seconds", type=int, default=1800, help="both engines must serve by then"
    )
    p.add_argument("--install-to", help="copy this file to the path given and exit (the init container)")
    return p


def parse_standby_args(argv: Sequence[str]) -> StandbyArgs:
    """Parse `build_standby_args`' list; ValueError on a malformed one."""
    argv = list(argv)
    if "--" not in argv:
        raise ValueError("expected: [options] -- SPECULATIVE_VLLM_ARGS --- PLAIN_VLLM_ARGS")
    split = argv.index("--")
    engines = argv[split + 1 :]
    if engines.count(ENGINE_SEPARATOR) != 1:
        raise ValueError(f"expected exactly one {ENGINE_SEPARATOR!r} between the two engines' arguments")
    middle = engines.index(ENGINE_SEPARATOR)
    ns = _parser().parse_args(argv[:split])
    args = StandbyArgs(
        speculative=tuple(engines[:middle]),
        plain=tuple(engines[middle + 1 :]),
        ready_file=ns.ready_file,
        termination_log=ns.termination_log,
        startup_timeout_seconds=ns.startup_timeout_seconds,
    )
    for name, engine in (("speculative", args.speculative), ("plain", args.plain)):
        if engine_port(engine) is None:
            raise ValueError(f"the {name} engine's arguments name no --port")
    if engine_port(args.speculative) == engine_port(args.plain):
        raise ValueError("the two engines need different ports")
    return args


def engine_port(vllm_args: Sequence[str]) -> int | None:
    """The --port a vLLM argument list names (the last one wins, as in argparse), or None."""
    port: int | None = None
    for i, arg in enumerate(vllm_args):
        value: str | None = None
        if arg == "--port" and i + 1 < len(vllm_args):
            value = vllm_args[i + 1]
        elif arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                port = int(value)
            except ValueError:
                return None
    return port


def engine_host(vllm_args: Sequence[str]) -> str:
    """The address to dial an engine at: its --host (the last one wins), or loopback where it names
    none or a wildcard (vLLM then listens on every address of the pod)."""
    host = ""
    for i, arg in enumerate(vllm_args):
        if arg == "--host" and i + 1 < len(vllm_args):
            host = vllm_args[i + 1]
        elif arg.startswith("--host="):
            host = arg.split("=", 1)[1]
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


class CannotSleepError(Exception):
    """The engine does not do vLLM's sleep round trip (the message says which step failed)."""


class Engine:
    """One vLLM server child: its process, its port and the last lines it printed."""

    def __init__(self, name: str, vllm_args: Sequence[str]) -> None:
        self.name = name
        port = engine_port(vllm_args)
        assert port is not None
        self.port = port
        self.host = engine_host(vllm_args)
        env = {**os.environ, SERVER_DEV_MODE_ENV: "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", ENGINE_MODULE, *vllm_args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.told_to_stop = False  # SIGTERM or SIGINT sent
        self._relay = threading.Thread(target=self._copy_output, name=f"relay-{name}", daemon=True)
        self._relay.start()

    def _copy_output(self) -> None:
        """Each line the engine prints, to the container's log with the engine's name in front."""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            sys.stdout.write(f"[{self.name}] {line}\n")
            sys.stdout.flush()

    def exit_code(self) -> int | None:
        """None while running; the code it exited with (128 + the signal if killed by one)."""
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)

    def url(self, path: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            self.told_to_stop = self.told_to_stop or signum in (signal.SIGTERM, signal.SIGINT)

    def stop(self, seconds: float = STOP_SECONDS) -> None:
        """SIGTERM (unless the engine was told to stop already), then SIGKILL after `seconds`. Never a
        second SIGTERM: a server may take it as "stop now" and cut the requests it is still finishing
        (the engine emulator's aiohttp server cancels them), the requests a pod's stop gives time to."""
        if not self.told_to_stop:
            self.signal(signal.SIGTERM)
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._relay.join(timeout=1.0)

    def output_mentions_sleep(self) -> str | None:
        """The last line the engine printed about sleep mode (vLLM on CPU: "Sleep mode is not
        supported on current platform."), or None."""
        self._relay.join(timeout=1.0)
        return next((line.strip() for line in reversed(self.tail) if "sleep mode" in line.lower()), None)


def _request(method: str, url: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; an HTTP error status is an answer, not an exception."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=max(timeout, 0.1)) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def check_can_sleep(engine: Engine, timeout: float) -> None:
    """vLLM's level-1 sleep round trip, leaving the engine asleep; CannotSleepError names the step
    that failed (an HTTP status, a connection error, or /is_sleeping's wrong answer)."""

    def call(method: str, path: str) -> bytes:
        try:
            status, body = _request(method, engine.url(path), timeout)
        except (OSError, ValueError) as err:
            raise CannotSleepError(f"{method} {path} failed: {err}") from None
        if status != 200:
            raise CannotSleepError(f"{method} {path} answered {status}")
        return body

    def expect_sleeping(wanted: bool, after: str) -> None:
        body = call("GET", "/is_sleeping")
        try:
            sleeping = json.loads(body)["is_sleeping"]
        except (ValueError, KeyError, TypeError):
            raise CannotSleepError(f"GET /is_sleeping answered {body[:80]!r}") from None
        if sleeping is not wanted:
            raise CannotSleepError(f"GET /is_sleeping answered {sleeping} after {after}")

    call("POST", "/sleep?level=1")
    expect_sleeping(True, "POST /sleep?level=1")
    call("POST", "/wake_up")
    expect_sleeping(False, "POST /wake_up")
    call("POST", "/sleep?level=1")
    expect_sleeping(True, "the second POST /sleep?level=1")


class Supervisor:
    """Runs the start-up sequence and then watches both engines (one instance per container)."""

    def __init__(self, args: StandbyArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self.args = args
        self.clock = clock
        self.engines: list[Engine] = []
        self.stopping: int | None = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = signum
        for engine in self.engines:
            engine.signal(signum)

    def _terminate(self, message: str) -> None:
        """The one line the kubelet reports as the container's termination message."""
        _log(message)
        try:
            with open(self.args.termination_log, "w", encoding="utf-8") as out:
                out.write(message + "\n")
        except OSError as err:
            _log(f"cannot write {self.args.termination_log}: {err}")

    def _start(self, name: str, vllm_args: Sequence[str]) -> Engine:
        engine = Engine(name, vllm_args)
        self.engines.append(engine)
        _log(f"started the {name} engine on port {engine.port} (pid {engine.proc.pid})")
        return engine

    def _wait_healthy(self, engine: Engine, deadline: float) -> str | None:
        """None once the engine answers /health; else why not (it exited, or the deadline passed)."""
        while self.stopping is None:
            code = engine.exit_code()
            if code is not None:
                return f"exited with code {code} during start-up"
            try:
                if _request("GET", engine.url("/health"), POLL_SECONDS)[0] == 200:
                    _log(f"the {engine.name} engine serves")
                    return None
            except (OSError, ValueError):
                pass
            if self.clock() >= deadline:
                return f"did not answer /health within {self.args.startup_timeout_seconds} s"
            time.sleep(POLL_SECONDS)
        return "start-up interrupted by a signal"

    def _fail(self, code: int, message: str) -> int:
        self._terminate(message)
        for engine in self.engines:
            engine.stop()
        return code

    def _stopped(self) -> int:
        """Told to stop during start-up: stop the engines, no termination message."""
        _log(f"stopped on signal {self.stopping} during start-up")
        for engine in self.engines:
            engine.stop()
        return 0

    def run(self) -> int:
        """The start-up sequence, then watch both engines; the container's exit code."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        with contextlib.suppress(FileNotFoundError):  # left by a previous run: an emptyDir outlives it
            os.remove(self.args.ready_file)
        deadline = self.clock() + self.args.startup_timeout_seconds
        speculative = self._start("speculative", self.args.speculative)
        why = self._wait_healthy(speculative, deadline)
        if self.stopping is not None:
            return self._stopped()
        if why is not None:
            about_sleep = speculative.output_mentions_sleep() if speculative.exit_code() is not None else None
            if about_sleep is not None:
                return self._fail(CANNOT_SLEEP_EXIT_CODE, f"{CANNOT_SLEEP}: {about_sleep}")
            return self._fail(speculative.exit_code() or 1, f"standby: the speculative engine {why}")
        _log("checking that the speculative engine can sleep (level 1 round trip)")
        try:
            check_can_sleep(speculative, max(deadline - self.clock(), 1.0))
        except CannotSleepError as err:
            return self._fail(CANNOT_SLEEP_EXIT_CODE, f"{CANNOT_SLEEP}: {err}")
        _log("the speculative engine sleeps (level 1); starting the plain engine")
        plain = self._start("plain", self.args.plain)
        why = self._wait_healthy(plain, deadline)
        if self.stopping is not None:
            return self._stopped()
        if why is not None:
            return self._fail(plain.exit_code() or 1, f"standby: the plain engine {why}")
        ready_dir = os.path.dirname(self.args.ready_file)
        if ready_dir:
            os.makedirs(ready_dir, exist_ok=True)
        with open(self.args.ready_file, "w", encoding="utf-8") as out:
            out.write("ready\n")
        _log(f"ready: the plain engine serves on port {plain.port}, the speculative one sleeps")
        return self._watch()

    def _watch(self) -> int:
        """Until an engine exits: then stop the other and exit with the first one's code."""
        while True:
            for engine in self.engines:
                code = engine.exit_code()
                if code is None:
                    continue
                for other in self.engines:
                    if other is not engine:
                        other.stop()
                if self.stopping is not None:
                    _log(f"stopped on signal {self.stopping}")
                    return 0 if code in (0, 128 + self.stopping) else code
                self._terminate(f"standby: the {engine.name} engine exited with code {code}")
                return code or 1
            time.sleep(POLL_SECONDS / 5)


def install(path: str) -> None:
    """Copy this file to `path` (the init container's job), readable by the engine's user."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    shutil.copyfile(__file__, path)
    os.chmod(path, 0o644)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        ns = _parser().parse_args(argv)
        if ns.install_to:
            install(ns.install_to)
            _log(f"installed to {ns.install_to}")
            return 0
    try:
        args = parse_standby_args(argv)
    except ValueError as err:
        print(f"standby.py: {err}", file=sys.stderr)
        return 2
    return Supervisor(args).run()


if __name__ == "__main__":
    sys.exit(main())
