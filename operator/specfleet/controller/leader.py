"""Leader election on a coordination.k8s.io Lease: of several operator replicas, exactly one runs.

The standby replicas do not start Kopf at all (no watches, no handlers, no scheduler), so two replicas
can never reconcile or flip the same resource. The leader renews the Lease every few seconds; if it
cannot renew within the renew deadline it stops (and exits non-zero, so Kubernetes restarts it as a
standby). A standby takes over once the Lease's record has not changed for its duration, measured on
the standby's own clock (as client-go does: no trust in clocks across machines), or at once when the
leader released it on a clean shutdown.

Kopf's own peering is not used: operators of equal priority all pause there instead of electing one.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

logger = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
RENEW_DEADLINE_SECONDS = 10.0
RETRY_SECONDS = 2.0


class LeaseApi(Protocol):
    """One Lease object (kube.py implements it over the API; tests in memory)."""

    def get(self) -> dict[str, Any] | None:
        """The Lease, or None when it does not exist."""

    def create(self, lease: Mapping[str, Any]) -> bool:
        """Create it; False when someone else created it first."""

    def replace(self, lease: Mapping[str, Any]) -> bool:
        """Replace it at its resourceVersion; False on a conflict (someone else wrote it)."""


def micro_time(t: datetime) -> str:
    """Kubernetes MicroTime."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    """Acquire, renew and release one Lease for `identity`."""

    api: LeaseApi
    name: str
    namespace: str
    identity: str
    lease_seconds: float = LEASE_SECONDS
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    _observed: tuple[Any, Any] | None = field(default=None, init=False)
    _observed_at: float = field(default=0.0, init=False)

    def _spec(self, previous: Mapping[str, Any], *, take_over: bool) -> dict[str, Any]:
        now = micro_time(self.wall())
        spec = dict(previous)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self.lease_seconds), renewTime=now)
        if take_over:
            spec.update(acquireTime=now, leaseTransitions=int(previous.get("leaseTransitions") or 0) + 1)
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this identity holds the Lease afterwards."""
        lease = self.api.get()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**self._spec({}, take_over=True), "leaseTransitions": 0},
            }
            return self.api.create(body)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        record = (holder, spec.get("renewTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        if holder == self.identity:
            return self.api.replace({**lease, "spec": self._spec(spec, take_over=False)})
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and self.monotonic() - self._observed_at < duration:
            return False  # held, and renewed within its duration as far as we have seen
        return self.api.replace({**lease, "spec": self._spec(spec, take_over=True)})

    def release(self) -> None:
        """Give the Lease up (clean shutdown), so a standby takes over without waiting it out."""
        lease = self.api.get()
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        spec = {**lease["spec"], "holderIdentity": None, "renewTime": micro_time(self.wall())}
        self.api.replace({**lease, "spec": spec})

    def holder(self) -> str | None:
        lease = self.api.get()
        return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")


def _terminate_self() -> None:
    """Stop Kopf the way Kubernetes would: SIGTERM to this process (Kopf shuts down gracefully)."""
    os.kill(os.getpid(), signal.SIGTERM)


def run_as_leader(
    elector: LeaderElector,
    run: Callable[[], None],
    *,
    on_lost: Callable[[], None] = _terminate_self,
    retry_seconds: float = RETRY_SECONDS,
    renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
) -> int:
    """Wait to become leader, then `run()` while renewing; 0 on a clean stop, 1 if the Lease was lost.

    When renewal fails past the deadline, `on_lost()` must make `run` return (by default SIGTERM,
    which Kopf handles; a stop flag would leave Kopf waiting on it in a thread at exit).
    """
    logger.info(
        "waiting for leadership of lease %s/%s as %s", elector.namespace, elector.name, elector.identity
    )
    while True:
        try:
            if elector.try_acquire_or_renew():
                break
        except Exception as err:  # the API may be briefly away; keep trying
            logger.warning("lease %s/%s: %s", elector.namespace, elector.name, err)
        time.sleep(retry_seconds)
    logger.info("became leader (lease %s/%s, identity %s)", elector.namespace, elector.name, elector.identity)
    stop, lost = threading.Event(), threading.Event()

    def renew() -> None:
        last_renewed = time.monotonic()
        while not stop.wait(retry_seconds):
            try:
                renewed = elector.try_acquire_or_renew()
            except Exception as err:
                logger.warning("lease renewal failed: %s", err)
                renewed = False
            if renewed:
                last_renewed = time.monotonic()
            elif time.monotonic() - last_renewed > renew_deadline_seconds:
                logger.error("lost leadership of lease %s/%s: stopping", elector.namespace, elector.name)
                lost.set()
                stop.set()
                on_lost()

    renewer = threading.Thread(target=renew, name="lease-renewer", daemon=True)
    renewer.start()
    try:
        run()
    finally:
        stop.set()
        renewer.join(retry_seconds + 5)
        if not lost.is_set():
            try:
                elector.release()
                logger.info("released lease %s/%s", elector.namespace, elector.name)
            except Exception as err:
                logger.warning("could not release the lease: %s", err)
    return 1 if lost.is_set() else 0
