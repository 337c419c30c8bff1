"""Processes the e2e tier and the sandbox start: the real operator (`specfleet run`) against a test
cluster, and records of detached processes; each stopped by PID, never by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from specfleet_testbed import process_start_time

T = TypeVar("T")


class OperatorProcess:
    """`python -m specfleet run` with its own kubeconfig and log file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        resync_seconds: float = 2.0,
        extra_env: dict[str, str] | None = None,
        verbose: bool = True,
        extra_args: list[str] | None = None,
        metrics_port: int = 0,
    ) -> None:
        self.kubeconfig = kubeconfig
        # 0: no metrics endpoint; otherwise the operator serves /metrics on 127.0.0.1:metrics_port.
        self.metrics_port = metrics_port
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.extra_env = extra_env or {}
        self.verbose = verbose
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.extra_env}
        log = self.log_path.open("ab")
        argv = [
            sys.executable,
            "-m",
            "specfleet",
            "run",
            "--resync-seconds",
            str(self.resync_seconds),
            "--liveness-port",
            "0",
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-address",
            "127.0.0.1",
            # The test bed's pod IPs are fake: a Standby flip dials each pod's loopback twin.
            "--engine-address-map",
            "10.0.0.0/8=127.0.0.0/8",
            *(["--verbose"] if self.verbose else []),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM exactly our process, then SIGKILL if it does not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL exactly our process (no shutdown handler runs) and reap it: a crash, for fault tests."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.5) -> T:
    """Poll until `probe` returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def wait_for_event(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], namespace: str, text: str, timeout: float = 30.0
) -> str:
    """Poll the namespace's events until one mentions `text` (a reason, usually); return them all.

    Kopf posts events from a background task, a moment after the change they report is visible, so
    a test that sees the change must still wait for its event.
    """
    events = ""

    def seen() -> bool:
        nonlocal events
        events = events_by_time(kubectl, namespace)
        return text in events

    try:
        wait_for(f"an event mentioning {text} in {namespace}", seen, timeout)
    except AssertionError:
        raise AssertionError(
            f"no event mentioning {text} in {namespace} after {timeout}s; events:\n{events}"
        ) from None
    return events


def events_by_time(kubectl: Callable[..., subprocess.CompletedProcess[str]], namespace: str) -> str:
    """The namespace's events sorted by time, one line each (dumped when a test fails)."""
    out = kubectl("get", "events", "-n", namespace, "-o", "json", check=False)
    try:
        items = json.loads(out.stdout)["items"]
    except (ValueError, KeyError):
        return out.stdout + out.stderr

    def stamp(e: dict[str, Any]) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])

    return "\n".join(
        f"{stamp(e)} {e.get('type')} {e.get('reason')} {e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e.get('message')}"
        for e in sorted(items, key=stamp)
    )


@dataclass(frozen=True)
class Detached:
    """A process started by one command and stopped by another: PID plus start time, never a name."""

    name: str
    pid: int
    start_time: int
    log: str

    @classmethod
    def of(cls, name: str, pid: int, log: Path) -> Detached:
        start = process_start_time(pid)
        if start is None:
            raise RuntimeError(f"{name} (pid {pid}) exited at once; see {log}")
        return cls(name, pid, start, str(log))

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM, then SIGKILL after `timeout`; only if the PID is still this process. True if stopped."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                return True
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
        return not self.alive()
