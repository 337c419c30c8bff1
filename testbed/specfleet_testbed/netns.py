"""A network namespace of the test's own, for a real program that dials the test bed's fake pod IPs.

kwok's pod IPs (10.244.0.0/16) are fake and must never be dialled from the host's network. A program
that dials them (the Inference Extension's endpoint picker scrapes every pod it picks from) runs inside
a `NetworkNamespace` instead: only a loopback interface, no route out, so a pod IP answers only if the
test added it to that loopback (and put a process, an engine emulator say, behind it) and fails at once
otherwise. A `Bridge` joins the namespace's loopback to the host's, port by port, through a pair of
`specfleet_testbed.forward` processes and a unix socket between them: a program inside reaches the
apiserver on the same 127.0.0.1 address and port (TLS end to end, so its certificate's IP:127.0.0.1
name still verifies), and the test reaches a port inside (metrics) on a free host port.
Every process is tracked by its Popen (PID) and stopped exactly.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from specfleet_testbed.processes import die_with_parent

__all__ = ["Bridge", "NetnsError", "NetworkNamespace", "Spawned"]

# testbed/specfleet_testbed/netns.py -> testbed/ (on the forwarder's PYTHONPATH)
TESTBED_DIR = Path(__file__).resolve().parents[1]


class NetnsError(RuntimeError):
    """The namespace or a process in it could not be set up."""


def _ip_program() -> str:
    """iproute2's `ip`, from PATH (a system package the test bed does not install: it needs root anyway)."""
    program = shutil.which("ip")
    if program is None:
        raise NetnsError("network namespaces need iproute2's `ip` on PATH")
    return program


def _ip(*args: str) -> None:
    result = subprocess.run([_ip_program(), *args], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass
class Spawned:
    """One process this module started: stopped by its own PID, never by name."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.is_file() else ""


class NetworkNamespace:
    """A named network namespace (``ip netns``) with only its loopback up; deleted on exit."""

    def __init__(self, prefix: str = "specfleet") -> None:
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self._created = False

    def create(self) -> NetworkNamespace:
        _ip("netns", "add", self.name)
        self._created = True
        _ip("-n", self.name, "link", "set", "lo", "up")
        return self

    def add_address(self, address: str) -> None:
        """Answer on `address` inside the namespace (its loopback holds it; nothing outside sees it)."""
        _ip("-n", self.name, "address", "add", f"{address}/32", "dev", "lo")

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace (``ip netns exec`` enters it, then execs: same PID)."""
        return [_ip_program(), "netns", "exec", self.name, *argv]

    def spawn(
        self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None, inside: bool = True
    ) -> Spawned:
        """Start `argv` (inside the namespace unless `inside` is False), its output to `log`."""
        with log.open("ab") as out:
            popen = subprocess.Popen(
                self.command(argv) if inside else argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl, safe after fork)
            )
        return Spawned(name, popen, log)

    def delete(self) -> None:
        if self._created:
            _ip("netns", "delete", self.name)
            self._created = False

    def __enter__(self) -> NetworkNamespace:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Bridge:
    """Loopback ports joined across the namespace boundary; `close()` stops every forwarder."""

    netns: NetworkNamespace
    forwarders: list[Spawned] = field(default_factory=list)
    # Unix socket paths are limited to 107 bytes: a short directory of its own, not pytest's tmp_path.
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sf-bridge-")))

    def _forward(self, listen: str, connect: str, inside: bool, timeout: float = 30.0) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTBED_DIR), os.environ.get("PYTHONPATH")])),
        }
        argv = [sys.executable, "-m", "specfleet_testbed.forward", listen, connect]
        popen = subprocess.Popen(
            self.netns.command(argv) if inside else argv,
            stdout=subprocess.PIPE,
            env=env,
            preexec_fn=die_with_parent,  # noqa: PLW1509 (only prctl, safe after fork)
        )
        spawned = Spawned(f"forward {listen} -> {connect}", popen)
        self.forwarders.append(spawned)
        stdout: IO[bytes] | None = popen.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        if not ready or stdout.readline().strip() != b"ready":
            raise NetnsError(f"{spawned.name} did not start (exit code {popen.poll()})")

    def inward(self, port: int) -> None:
        """Inside the namespace, 127.0.0.1:`port` reaches the host's 127.0.0.1:`port`."""
        sock = self.directory / f"in-{port}.sock"
        self._forward(f"unix:{sock}", f"tcp:127.0.0.1:{port}", inside=False)
        self._forward(f"tcp:127.0.0.1:{port}", f"unix:{sock}", inside=True)

    def outward(self, port: int) -> int:
        """A free host port whose 127.0.0.1 reaches 127.0.0.1:`port` inside the namespace."""
        sock = self.directory / f"out-{port}.sock"
        host_port = _free_port()
        self._forward(f"unix:{sock}", f"tcp:127.0.0.1:{port}", inside=True)
        self._forward(f"tcp:127.0.0.1:{host_port}", f"unix:{sock}", inside=False)
        return host_port

    def close(self) -> None:
        for spawned in reversed(self.forwarders):
            spawned.stop()
        self.forwarders.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
