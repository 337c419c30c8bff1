"""Prefix affinity: which engine of a pool holds a request's prefix in its KV cache (pure: no I/O).

Two maps, tried in order:

- A conversation goes back to the engine that last served it. A chat has a key at each message
  boundary from its first user message on (messages 1..j hashed, for every j); the conversation table
  (`conversations.ConversationTable`, bounded, shared by the router's workers) remembers which
  endpoint last served each key, and a request goes to the endpoint
  of its longest remembered key that is usable (not excluded, under the load bound). Turn n+1 repeats
  turn n's messages, so its longest key is turn n's last one: the engine that cached its history, even
  where the load bound had sent turn n off its ring position. A conversation moves only when its
  engine is loaded past the bound or gone, and then sticks to where it moved.
- Everything else (a conversation's first turn, a completion, a conversation this worker has not
  seen) hashes its leading text (`body.prefix_text`: the system prompt, through the first user
  message) to a ring where every endpoint holds `VIRTUAL_NODES` points, and goes to the first endpoint
  clockwise that is usable: consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
  2018), a limit of `ceil(c * (m + 1) / n)` with `m` requests outstanding on the `n` candidates and `c`
  the load bound. So a tenant's new conversations start where its system prompt is cached, a hot
  prefix spills onto the next endpoints of the ring instead of overloading one, and an endpoint joining
  or leaving moves only the keys next to its own points (~1/n); the table moves nothing but the
  conversations of an endpoint that left.

Why both (measured in docs/benchmarks/prefix-routing.md): keyed on the leading text alone, every
conversation of a tenant shares one key, so under the bound a spilled conversation's later turns land
wherever the ring has room that moment and prefill their whole history again.

Why a conversation's limit has a slack (`load_limits`): at a few requests per engine 125% of the mean
is less than one request above it, and a turn left its cached history for a difference of one or two:
20% of the turns with a remembered engine at 4 req/s in `benchmarks/prefix_spills.py`. It may run up to
`LOAD_BOUND_SLACK` requests past the mean; from 16 per engine on the percentage binds again, and the
ring (first turns, a hot system prompt) keeps the percentage alone, so a hot prefix still spreads.

The hashes are blake2b, not Python's `hash` (salted per process): every router worker and replica
builds the same ring from the same endpoints, and the workers of a replica share one table. A turn that
reaches another replica (which has not seen its conversation) falls back to the ring, which every
replica agrees on.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from specfleet_runtime.routing_config import LOAD_BOUND_SLACK

if TYPE_CHECKING:
    from specfleet_runtime.router.conversations import ConversationTable

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


@dataclass(frozen=True)
class PrefixKeys:
    """What prefix affinity knows of a request: its leading text's ring position and, for a chat, the
    key of each message boundary from its first user message on, shortest first."""

    leading: int
    conversation: tuple[int, ...] = ()


def prefix_keys(text: str, turns: tuple[str, ...] = (), first_user: int = 0) -> PrefixKeys | None:
    """The keys of a request with leading `text` and chat `turns` (see `body.BodyFields`); None where it
    has no leading text (least outstanding then). One incremental hash over the turns: bounded work."""
    leading = prefix_key(text)
    if leading is None:
        return None
    digest = hashlib.blake2b(digest_size=8)
    conversation: list[int] = []
    for i, turn in enumerate(turns):
        data = turn.encode("utf-8", "surrogatepass")
        # Each turn's length first, so turns that concatenate alike still hash apart.
        digest.update(len(data).to_bytes(4, "big"))
        digest.update(data)
        if i >= first_user:
            conversation.append(int.from_bytes(digest.copy().digest(), "big"))
    return PrefixKeys(leading, tuple(conversation))


def load_limits(
    endpoints: tuple[str, ...],
    outstanding: Mapping[str, int],
    excluded: Collection[str],
    bound_percent: int,
    slack: int = LOAD_BOUND_SLACK,
) -> tuple[int, int]:
    """An endpoint takes one more request while it has fewer outstanding than these: (for a request
    placed on the ring, for a conversation going back to its engine). With `m` requests outstanding on
    the `n` candidates and c = `bound_percent` / 100 (at least 1, so one candidate is always under): the
    ring's is `ceil(c * (m + 1) / n)`; a conversation's is the larger of that and `ceil((m + 1) / n) +
    slack`, so below `slack / (c - 1)` requests per engine (16 at the defaults) a conversation stays
    with its cache up to `slack` requests past the mean, and above it the percentage binds for both.
    (0, 0) where every endpoint is excluded."""
    candidates = 0
    total = 0
    for url in endpoints:
        if url not in excluded:
            candidates += 1
            total += outstanding.get(url, 0)
    if not candidates:
        return 0, 0
    # In integers; the arriving request counts.
    ring = -(-(bound_percent * (total + 1)) // (100 * candidates))
    return ring, max(ring, -(-(total + 1) // candidates) + slack)


def load_limit(
    endpoints: tuple[str, ...], outstanding: Mapping[str, int], excluded: Collection[str], bound_percent: int
) -> int:
    """The ring's limit of `load_limits`: `ceil(c * (m + 1) / n)`."""
    return load_limits(endpoints, outstanding, excluded, bound_percent)[0]


def choose(
    ring: Ring,
    recent: ConversationTable,
    prefix: PrefixKeys,
    outstanding: Mapping[str, int],
    excluded: Collection[str],
    bound_percent: int,
    slack: int = LOAD_BOUND_SLACK,
) -> str | None:
    """The endpoint of `ring` for a request with `prefix` keys: its conversation's under the
    conversation limit, else the first clockwise from its leading text under the ring's; None if every
    endpoint is excluded. Records nothing (the caller records where the request went)."""
    ring_limit, conversation_limit = load_limits(ring.endpoints, outstanding, excluded, bound_percent, slack)
    if not ring_limit:
        return None
    if prefix.conversation:
        url = recent.longest(prefix.conversation, ring.endpoints, outstanding, excluded, conversation_limit)
        if url is not None:
            return url
    return ring.choose_under(prefix.leading, outstanding, excluded, ring_limit)


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
        every endpoint is excluded."""
        return self.choose_under(
            key, outstanding, excluded, load_limit(self.endpoints, outstanding, excluded, bound_percent)
        )

    def choose_under(
        self, key: int, outstanding: Mapping[str, int], excluded: Collection[str], limit: int
    ) -> str | None:
        """The first endpoint clockwise from `key` not in `excluded` with fewer than `limit` outstanding."""
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
