"""The simulator's event queue: run in time order and, at one instant, in the order of their kind."""

from __future__ import annotations

import heapq
import itertools

from specfleet.sim.engine import Replica

# Kinds, in the order they run at one instant (KILL: a draining pod's grace period ran out).
POD_READY, SCRAPE, BIN, EVAL, REPLICA, TICK, ARRIVAL, KILL = range(8)

Event = tuple[float, int, int, int, int]


class Events:
    """A heap of (time, kind, sequence, a, b); `a` and `b` are the kind's arguments."""

    def __init__(self) -> None:
        self.heap: list[Event] = []
        self.seq = itertools.count()
        # Per replica, the version of its one pending REPLICA event; an older one is stale.
        self.versions: dict[int, int] = {}

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.seq), a, b))

    def pop(self) -> Event:
        return heapq.heappop(self.heap)

    def schedule_replica(self, rep: Replica) -> None:
        """The replica's next step end or arrival, replacing the one it had."""
        at = rep.next_event()
        version = self.versions.get(rep.serial, 0) + 1
        self.versions[rep.serial] = version
        if at is not None:
            self.push(at, REPLICA, rep.serial, version)

    def current(self, serial: int, version: int) -> bool:
        return self.versions.get(serial) == version
