"""Periodic reconcile of every resource, scheduled by the operator itself rather than by Kopf timers.

A Kopf timer puts Kopf's finalizer on every resource (it must stop the timer before the object goes),
so once the operator is uninstalled, deleting a SpeculativeDeployment would hang forever. Nothing
here needs a finalizer: children go with their owner through owner references. One thread keeps
each tracked resource's next due time and hands due ones to a small pool; a resource is never queued
twice, and a change (Kopf's create/update handlers) never waits behind a resync.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
# Called in the pool with the resource's last seen body.
ReconcileFn = Callable[[Mapping[str, Any]], None]
TICK_SECONDS = 1.0


class ResyncScheduler:
    """Reconciles each tracked resource every `interval` seconds, at most `workers` at a time."""

    def __init__(
        self,
        interval: float,
        reconcile: ReconcileFn,
        *,
        workers: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._reconcile = reconcile
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="resync")
        self._bodies: dict[Key, Mapping[str, Any]] = {}
        self._due: dict[Key, float] = {}
        self._running: set[Key] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def track(self, body: Mapping[str, Any]) -> None:
        """Remember (or refresh) a resource; a new one is first due one interval from now."""
        meta = body["metadata"]
        key = (meta.get("namespace") or "default", meta["name"])
        with self._lock:
            self._bodies[key] = body
            self._due.setdefault(key, self._clock() + self.interval)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._bodies.pop((namespace, name), None)
            self._due.pop((namespace, name), None)

    def tracked(self) -> int:
        with self._lock:
            return len(self._bodies)

    def submit_due(self) -> int:
        """Hand every due resource that is not already running to the pool; returns how many."""
        now = self._clock()
        with self._lock:
            due = [k for k, t in self._due.items() if t <= now and k not in self._running]
            for key in due:
                self._due[key] = now + self.interval
                self._running.add(key)
            bodies = [(key, self._bodies[key]) for key in due]
        for key, body in bodies:
            self._pool.submit(self._run, key, body)
        return len(bodies)

    def _run(self, key: Key, body: Mapping[str, Any]) -> None:
        try:
            self._reconcile(body)
        except Exception:  # one resource's failure must not stop the others' resyncs
            logger.exception("resync of %s/%s failed", *key)
        finally:
            with self._lock:
                self._running.discard(key)

    def run(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self.submit_due()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="resync-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
