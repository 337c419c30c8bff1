"""Several router processes on one port: a supervisor starts `--workers` copies with SO_REUSEPORT.

One asyncio process uses one core; the kernel spreads new connections over the workers' listening
sockets. What each worker keeps is its own: its engine connections, its outstanding-request counts
(least-outstanding, and prefix affinity's load bound, are per worker; affinity's ring is the same in
every worker, a pure function of the endpoints, and its conversation table and placements board are
files of the shared directory below, mapped by every worker: router/conversations.py), its auto-segmentation view and its config source
(every worker watches the ConfigMap or polls the file, so a reload reaches each). Process-wide caps (connections,
requests and body bytes in flight) are divided among the workers, so the pod's total stays as set.

Metrics use prometheus_client's multiprocess mode: each worker writes its samples to files in a
directory of the supervisor's (on /dev/shm, writable under a read-only root), and `/metrics` in any
worker reads them all, so a scrape that lands on any worker sees the pod's totals. The supervisor
forwards SIGTERM/SIGINT to the workers (each drains), exits 0 when all did, and stops them all and
exits 1 when one dies on its own (Kubernetes restarts the pod); a supervisor killed outright takes its
workers with it (they get SIGTERM from the kernel: PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from specfleet_runtime.names import MULTIPROC_ENV, WORKER_INDEX_ENV
from specfleet_runtime.router.conversations import PLACEMENTS_FILE

log = logging.getLogger("specfleet_runtime.router")

# More workers than this gain little for a proxy and each one costs its own memory.
MAX_AUTO_WORKERS = 4


def cpu_count(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its cgroup's CPU limit if one is set, else its CPU affinity."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup_cpu_max.read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def auto_workers() -> int:
    return max(1, min(cpu_count(), MAX_AUTO_WORKERS))


def _share(total: int, workers: int) -> int:
    """A worker's part of a process-wide cap (0 stays 0: no cap)."""
    return 0 if total == 0 else max(1, total // workers)


def worker_argv(argv: Sequence[str], workers: int, caps: dict[str, int]) -> list[str]:
    """The command line of one worker: the supervisor's, one worker, SO_REUSEPORT, caps divided."""
    out = [sys.executable, "-m", "specfleet_runtime.router", *argv, "--workers", "1", "--reuse-port"]
    for flag, total in caps.items():
        out += [flag, str(_share(total, workers))]
    return out


def _die_with_parent() -> None:
    """In a worker before exec: SIGTERM it (it drains) if the supervisor dies, even by SIGKILL."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def metrics_dir() -> str | None:
    """A fresh directory for the workers' metric files (PROMETHEUS_MULTIPROC_DIR), or None if none
    can be made (no writable /dev/shm or temp dir): then the router runs as a single process."""
    if os.environ.get(MULTIPROC_ENV):
        return os.environ[MULTIPROC_ENV]
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    try:
        return tempfile.mkdtemp(prefix="specfleet-router-metrics-", dir=base)
    except OSError as err:
        log.warning("no writable directory for worker metrics (%s): running one router process", err)
        return None


def supervise(argv: Sequence[str], workers: int, caps: dict[str, int], metrics_dir: str) -> int:
    """Run `workers` router processes until a signal (exit code 0) or until one dies (exit code 1)."""
    from prometheus_client import multiprocess

    own_dir = MULTIPROC_ENV not in os.environ
    env = {**os.environ, MULTIPROC_ENV: metrics_dir}
    cmd = worker_argv(argv, workers, caps)
    children: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # Prefix affinity's placements board has one row per worker index: rows of an earlier supervisor's
    # workers (a directory given from outside) are not this one's.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(metrics_dir, PLACEMENTS_FILE))
    try:
        for index in range(workers):
            worker_env = {**env, WORKER_INDEX_ENV: str(index)}
            child = subprocess.Popen(cmd, env=worker_env, preexec_fn=_die_with_parent)  # noqa: PLW1509
            children[child.pid] = child
        log.info("router supervisor: %d worker(s) (pids %s)", workers, ", ".join(map(str, children)))
        code = 0
        while children:
            pid, status = os.wait()
            if pid not in children:
                continue
            child = children.pop(pid)
            child.returncode = os.waitstatus_to_exitcode(status)
            multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]
            if not stopping:
                log.error("router worker %d exited with %d; stopping the others", pid, child.returncode)
                code = 1
                forward(signal.SIGTERM, None)
            elif child.returncode not in (0, -signal.SIGTERM):
                # (A worker still starting when the signal came dies of it: nothing to drain there.)
                code = 1
        return code
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
