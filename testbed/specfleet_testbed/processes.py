"""The test bed's process helpers: identify a process for good, find a free port, tie a child to us.

A process is identified by its PID and its start time (``process_start_time``), so a reused PID is
never taken for the process it was: ``ProcessRecord`` keeps both, and ``is_zombie`` tells one that
is gone or exited unreaped. ``die_with_parent`` (a ``preexec_fn``) has a child SIGKILLed when the
Python process that started it dies; ``free_port`` picks a loopback port and ``tail`` reads the end
of a log.
"""

from __future__ import annotations

import ctypes
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ProcessRecord",
    "die_with_parent",
    "free_port",
    "is_zombie",
    "process_start_time",
    "tail",
]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass
class ProcessRecord:
    """One process a ``Cluster`` started: enough to find it again, and to never hit another one."""

    name: str
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat: a reused PID has another start time
    argv: list[str]
    log: str


def free_port() -> int:
    """Ask the kernel for a free loopback port (a tiny race is acceptable for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if there is no such process.

    With the PID it identifies a process for good: a reused PID has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 overall; fields[0] is field 3


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def _load_libc() -> ctypes.CDLL | None:
    """Load libc once in the parent, so the child (after fork) only has to call prctl."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it if the Python process dies.

    SIGKILL rather than SIGTERM: all components would get the signal at once, and an apiserver
    shutting down gracefully while etcd is already gone can hang for minutes.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
