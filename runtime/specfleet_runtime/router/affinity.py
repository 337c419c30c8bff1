"""Prefix affinity: consistent hashing with bounded loads over a pool's endpoints (pure: no I/O).

A request's leading text (`body.prefix_text`) hashes to a point on a ring where every endpoint holds
`VIRTUAL_NODES` points; the request goes to the first endpoint clockwise that is not excluded (tried,
ejected) and has fewer outstanding requests than the bound: `ceil(c * (m + 1) / n)` with `m` requests
outstanding on the `n` candidates and `c` the load bound (Mirrokni, Thorup and Zadimoghaddam, "Consistent
Hashing with Bounded Loads", 2018). So the turns of one conversation reach the engine that holds its KV
prefix while that engine has room, a hot prefix spills onto the next endpoints of the ring instead of
overloading one, and an endpoint joining or leaving moves only the keys next to its own points (~1/n).

The hash is blake2b, not Python's `hash` (salted per process): every router worker and replica builds the
same ring from the same endpoints, so they agree where a prefix goes without sharing any state; only the
load bound uses each worker's own outstanding counts.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection, Mapping
from typing import Final

# Points per endpoint: with 100 the keys an endpoint owns stay within ~10% of an even share.
VIRTUAL_NODES: Final = 100


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prefix_key(text: str) -> int | None:
    """The ring position of a request's leading text; None where it has none (least outstanding then)."""
    if not text:
        return None
    # surrogatepass: a string cut inside an escaped surrogate pair still hashes.
    return _point(text.encode("utf-8", "surrogatepass"))


class Ring:
    """The ring of one pool's endpoints (sorted, as `Backends` keeps them)."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.endpoints = endpoints
        placed = sorted(
            (_point(f"{url}#{i}".encode()), url) for url in endpoints for i in range(VIRTUAL_NODES)
        )
        self.points: list[int] = [point for point, _ in placed]
        self.owners: list[str] = [url for _, url in placed]

    def owner(self, key: int) -> str | None:
        """The endpoint that owns `key` when nothing is excluded or loaded."""
        if not self.points:
            return None
        return self.owners[bisect.bisect_left(self.points, key) % len(self.points)]

    def choose(
        self,
        key: int,
        outstanding: Mapping[str, int],
        excluded: Collection[str],
        bound_percent: int,
    ) -> str | None:
        """The first endpoint clockwise from `key` not in `excluded` and under the load bound; None if
        every endpoint is excluded. `bound_percent` is c in percent (at least 100, so one is always under)."""
        candidates = 0
        total = 0
        for url in self.endpoints:
            if url not in excluded:
                candidates += 1
                total += outstanding.get(url, 0)
        if not candidates:
            return None
        # ceil(c * (total + 1) / candidates) in integers: the arriving request counts.
        limit = -(-(bound_percent * (total + 1)) // (100 * candidates))
        points = len(self.points)
        start = bisect.bisect_left(self.points, key)
        passed: set[str] = set()
        for step in range(points):
            url = self.owners[(start + step) % points]
            if url in passed:
                continue
            if url not in excluded and outstanding.get(url, 0) < limit:
                return url
            passed.add(url)
            if len(passed) == len(self.endpoints):
                break
        return None
