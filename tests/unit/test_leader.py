"""Leader election on an in-memory Lease: one holder, renewals, take-over after expiry or release,
and optimistic concurrency (a conflicting write loses). The cluster tier runs two real processes."""

from __future__ import annotations

import copy
import threading
from datetime import UTC, datetime
from typing import Any

from specfleet.controller.leader import LeaderElector, run_as_leader


class MemoryLease:
    """A Lease store with resourceVersion checks, like the apiserver's."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def get(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    def create(self, lease: dict[str, Any]) -> bool:
        if self.lease is not None:
            return False
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return True

    def replace(self, lease: dict[str, Any]) -> bool:
        assert self.lease is not None
        if lease["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            return False
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _spec(store: MemoryLease) -> dict[str, Any]:
    assert store.lease is not None
    spec: dict[str, Any] = store.lease["spec"]
    return spec


def _elector(store: MemoryLease, identity: str, clock: Clock) -> LeaderElector:
    # The wall clock moves with the monotonic one so each renewal writes a new renewTime.
    return LeaderElector(
        store,
        "specfleet-operator",
        "ops",
        identity,
        lease_seconds=15,
        monotonic=clock,
        wall=lambda: datetime.fromtimestamp(clock.now, UTC),
    )


def test_exactly_one_holds_and_the_other_waits_while_it_renews():
    store, clock = MemoryLease(), Clock()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(10):  # 50 s of renewals every 5 s: b never takes over
        clock.now += 5
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert a.holder() == "a"
    assert _spec(store)["leaseTransitions"] == 0


def test_a_standby_takes_over_once_the_leader_stops_renewing():
    store, clock = MemoryLease(), Clock()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b first sees a's record now
    clock.now += 14
    assert not b.try_acquire_or_renew()
    clock.now += 1  # unchanged for the full 15 s on b's clock
    assert b.try_acquire_or_renew()
    assert b.holder() == "b"
    assert _spec(store)["leaseTransitions"] == 1
    # The old leader comes back: it no longer holds it and cannot renew.
    assert not a.try_acquire_or_renew()


def test_release_hands_over_at_once():
    store, clock = MemoryLease(), Clock()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew()
    b.release()
    a.release()  # not the holder: changes nothing
    assert _spec(store)["holderIdentity"] is None


def test_of_two_simultaneous_take_overs_only_one_wins():
    store, clock = MemoryLease(), Clock()
    old = _elector(store, "old", clock)
    assert old.try_acquire_or_renew()
    b, c = _elector(store, "b", clock), _elector(store, "c", clock)
    b.try_acquire_or_renew(), c.try_acquire_or_renew()
    clock.now += 20
    stale = store.get()
    assert b.try_acquire_or_renew()
    # c read the Lease before b wrote it: its write conflicts.
    store_get = store.get
    store.get = lambda: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert not c.try_acquire_or_renew()
    store.get = store_get  # type: ignore[method-assign]
    assert b.holder() == "b"


def test_run_as_leader_runs_until_stopped_and_releases():
    store, clock = MemoryLease(), Clock()
    a = _elector(store, "a", clock)
    ran = threading.Event()

    def run() -> None:
        ran.set()
        assert _spec(store)["holderIdentity"] == "a"

    assert run_as_leader(a, run, retry_seconds=0.01) == 0
    assert ran.is_set()
    assert _spec(store)["holderIdentity"] is None


def test_run_as_leader_stops_when_the_lease_is_lost():
    store, clock = MemoryLease(), Clock()
    a = _elector(store, "a", clock)

    stopped = threading.Event()

    def run() -> None:
        # Someone else takes the Lease from under us; renewals fail until the deadline stops us.
        _spec(store)["holderIdentity"] = "intruder"
        assert stopped.wait(10)

    assert run_as_leader(a, run, on_lost=stopped.set, retry_seconds=0.01, renew_deadline_seconds=0.05) == 1
    assert _spec(store)["holderIdentity"] == "intruder"
