"""Prefix affinity: which engine of a pool holds a request's prefix in its KV cache (pure: no I/O).

A request has a leading text (`body.prefix_text`: the system prompt through the first user message, a
completion's prompt) and, for a chat, a key at each message boundary from its first user message on
(messages 1..j hashed, for every j). `choose` tries, in order:

1. The conversation: the endpoint that last served its longest remembered key (the conversation table,
   `conversations.ConversationTable`, bounded, shared by the router's workers), under the
   conversation's limit. Turn n+1 repeats turn n's messages, so its longest key is turn n's last one:
   the engine that cached its history, wherever the bound had sent turn n.
2. Its leading text's engine (the same table: where the text was placed), under the home limit: a
   tenant's new conversations start where its system prompt is cached.
3. Past that, the first endpoint clockwise from the leading text's point on a ring where every endpoint
   holds `VIRTUAL_NODES` points, under the ring's limit: consistent hashing with bounded loads
   (Mirrokni, Thorup and Zadimoghaddam, 2018). A hot prefix spills onto the same next endpoints each
   time, which then cache it too, instead of overloading one.
4. A leading text seen for the first time is placed (`Ring.place`): under the ring's limit, on the
   endpoint holding the least of what the router's workers placed (`Placements`: the texts, each
   weighed by the size of the request that brought it), the first clockwise among equals, as a cache-aware router
   puts a new prefix where the least is cached. Hashed alone, the benchmark's tenants leave the busiest
   of 4 engines about 1.5x the mean share of the prompt tokens, placed about 1.1x
   (`benchmarks/prefix_bounds.py`), and the bound spills what is past it.

The limits (`load_limits`), with `m` requests outstanding on the `n` candidates and c the load bound:
the ring's `ceil(c * (m + 1) / n)`; the home's at least the mean plus `LOAD_BOUND_SLACK` (at a few
requests per engine 125% of the mean is less than one request above it, and a first turn would leave
its cached system prompt for a difference of one); the conversation's at least twice the percentage
(moving a conversation prefills its whole history again on an engine that never held it, where a
spilled leading text is prefilled once on the ring's next engine and cached there). Measured in
docs/benchmarks/prefix-routing.md.

The hashes are blake2b, not Python's `hash` (salted per process): every router worker and replica
builds the same ring from the same endpoints, and the workers of a replica share one table. A turn that
reaches another replica (which has not seen its conversation) goes by that replica's placement of its
leading text.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter, OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from specfleet_runtime.routing_config import LOAD_BOUND_SLACK

if TYPE_CHECKING:
    from specfleet_runtime.router.conversations import ConversationTable, PlacedBoard

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
    """What prefix affinity knows of a request: its leading text's ring position, for a chat the key of
    each message boundary from its first user message on (shortest first), and its size (the body's
    bytes: what a newly placed leading text brings into its engine's cache, as `Placements` weighs it)."""

    leading: int
    conversation: tuple[int, ...] = ()
    size: int = 1

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(self, leading: int, conversation: tuple[int, ...] = (), size: int = 1) -> None:
        object.__setattr__(self, "leading", leading)
        object.__setattr__(self, "conversation", conversation)
        object.__setattr__(self, "size", size)


# Leading texts repeat (a tenant's system prompt opens each of its requests), so the request path
# remembers, for the most recent of them, a leading text's ring position and the hash state after a chat's
# first message: a dict lookup (Python's string hash, several times faster than blake2b) instead of a
# blake2b over up to PREFIX_CHARS characters. Forgotten all at once past MEMO_TEXTS of each: at most
# 512 leading texts and first messages of up to 2 * PREFIX_CHARS characters, 3 MiB of ASCII a process
# (12 MiB at four bytes a character).
MEMO_TEXTS: Final = 512
_leading_keys: dict[str, int] = {}
_first_turns: dict[str, hashlib.blake2b] = {}


def _leading_key(text: str) -> int | None:
    """`prefix_key(text)`, remembered."""
    key = _leading_keys.get(text)
    if key is None:
        key = prefix_key(text)
        if key is None:
            return None
        if len(_leading_keys) >= MEMO_TEXTS:
            _leading_keys.clear()
        _leading_keys[text] = key
    return key


def _add_turn(digest: hashlib.blake2b, turn: str) -> None:
    data = turn.encode("utf-8", "surrogatepass")
    # The turn's length first, so turns that concatenate alike still hash apart.
    digest.update(len(data).to_bytes(4, "big"))
    digest.update(data)


def _after_first_turn(turn: str) -> hashlib.blake2b:
    """A new hash state holding a chat's first `turn` (from the state remembered for it)."""
    state = _first_turns.get(turn)
    if state is None:
        state = hashlib.blake2b(digest_size=8)
        _add_turn(state, turn)
        if len(_first_turns) >= MEMO_TEXTS:
            _first_turns.clear()
        _first_turns[turn] = state
    return state.copy()


def prefix_keys(
    text: str, turns: tuple[str, ...] = (), first_user: int = 0, size: int = 1
) -> PrefixKeys | None:
    """The keys of a request of `size` bytes with leading `text` and chat `turns` (see
    `body.BodyFields`); None where it has no leading text (least outstanding then). One incremental hash
    over the turns: bounded work."""
    leading = _leading_key(text)
    if leading is None:
        return None
    if not turns:
        return PrefixKeys(leading, (), max(1, size))
    digest = _after_first_turn(turns[0])
    conversation: list[int] = []
    for i in range(len(turns)):
        if i:
            _add_turn(digest, turns[i])
        if i >= first_user:
            conversation.append(int.from_bytes(digest.copy().digest(), "big"))
    return PrefixKeys(leading, tuple(conversation), max(1, size))


@dataclass(frozen=True)
class Limits:
    """An endpoint takes one more request while it has fewer outstanding than these."""

    ring: int  # a leading text spilled or placed by the ring
    home: int  # a leading text going to the engine that holds it
    conversation: int  # a turn going back to its conversation's engine

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(self, ring: int, home: int, conversation: int) -> None:
        object.__setattr__(self, "ring", ring)
        object.__setattr__(self, "home", home)
        object.__setattr__(self, "conversation", conversation)


# `outstanding` is a dict here and below, not any Mapping: mypyc calls a dict's `get` directly, a
# Mapping's through a method lookup on each call (several a request of a PrefixAffinity pool).
def load_limits(
    endpoints: tuple[str, ...],
    outstanding: dict[str, int],
    excluded: Collection[str],
    bound_percent: int,
    slack: int = LOAD_BOUND_SLACK,
) -> Limits:
    """The limits with `m` requests outstanding on the `n` candidates (those not `excluded`) and c =
    `bound_percent` / 100 (at least 1, so one candidate is always under; the arriving request counts):
    the ring's `ceil(c * (m + 1) / n)`; a leading text's home the larger of that and `ceil((m + 1) / n)
    + slack` (below `slack / (c - 1)` requests per engine, 32 at the defaults, it stays with its cache
    up to `slack` past the mean); a conversation's the larger of the home's and `ceil(2c * (m + 1) /
    n)`. All 0 where every endpoint is excluded."""
    candidates = 0
    total = 0
    for url in endpoints:
        if url not in excluded:
            candidates += 1
            total += outstanding.get(url, 0)
    if not candidates:
        return Limits(0, 0, 0)
    # In integers.
    ring = -(-(bound_percent * (total + 1)) // (100 * candidates))
    home = max(ring, -(-(total + 1) // candidates) + slack)
    return Limits(ring, home, max(home, -(-(2 * bound_percent * (total + 1)) // (100 * candidates))))


def load_limit(
    endpoints: tuple[str, ...], outstanding: dict[str, int], excluded: Collection[str], bound_percent: int
) -> int:
    """The ring's limit of `load_limits`: `ceil(c * (m + 1) / n)`."""
    return load_limits(endpoints, outstanding, excluded, bound_percent).ring


@dataclass(frozen=True)
class Choice:
    """Where prefix affinity sends a request, and why (the router's `choice` metric label):
    `conversation` (the engine that last served its conversation), `home` (its leading text's engine),
    `placed` (a leading text seen for the first time, on the endpoint holding the least), `spilled` (its
    leading text's engine was at the bound: the next one clockwise on the ring under it), `moved` (its
    conversation's engine was at the bound or gone: any of the last three)."""

    url: str
    how: str
    placed: bool = False  # its leading text was new: the caller records where it went

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(self, url: str, how: str, placed: bool = False) -> None:
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "how", how)
        object.__setattr__(self, "placed", placed)


class Placements:
    """The leading texts this worker placed, the most recent `capacity` of them, and how much each
    endpoint holds, weighed by the size of the request that brought each (a tenant's 16 KB system
    prompt weighs four of a 4 KB one): a new leading text goes where the least is (`choose`), as a
    cache-aware router puts a new prefix on the engine with the least cached text. With a `board` (the
    router's workers' shared `conversations.PlacedBoard`) this worker publishes its counts there and
    places by the whole pod's: each worker evening out only its own share leaves their sum uneven by up
    to a request per worker: with two workers on the simulator's 24-tenant traces, 24 ms of TTFT p99
    at 8 req/s and 43 at 14, the mean over 20 traces (`benchmarks/prefix_bounds.py`; a tenant's first
    request is a cold 1-4k-token prefill, and two of them on one engine queue)."""

    def __init__(self, capacity: int = 4096, board: PlacedBoard | None = None) -> None:
        self.capacity = capacity
        self.board = board
        self._where: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self.held: Counter[str] = Counter()

    def holding(self, endpoints: Collection[str]) -> Mapping[str, int]:
        """How much each endpoint holds: this worker's placements, plus the other workers' where they
        share a board."""
        if self.board is None:
            return self.held
        totals = self.board.others(endpoints)
        for url in totals:
            totals[url] += self.held.get(url, 0)
        return totals

    def add(self, key: int, url: str, size: int = 1) -> None:
        old = self._where.pop(key, None)
        if old is not None:
            self.held[old[0]] -= old[1]
        self._where[key] = (url, size)
        self.held[url] += size
        if len(self._where) > self.capacity:
            _, (gone, weight) = self._where.popitem(last=False)
            self.held[gone] -= weight
        if self.board is not None:
            self.board.publish(self.held)


def choose(
    ring: Ring,
    recent: ConversationTable,
    placements: Placements,
    prefix: PrefixKeys,
    outstanding: dict[str, int],
    excluded: Collection[str],
    bound_percent: int,
    slack: int = LOAD_BOUND_SLACK,
) -> Choice | None:
    """Where a request with `prefix` keys goes among `ring`'s endpoints (see the module's docstring);
    None if every endpoint is excluded. Records nothing (`Affinity.pick` does)."""
    limits = load_limits(ring.endpoints, outstanding, excluded, bound_percent, slack)
    if not limits.ring:
        return None
    remembered = False
    if prefix.conversation:
        url = recent.longest(prefix.conversation, ring.endpoints, outstanding, excluded, limits.conversation)
        if url is not None:
            return Choice(url, "conversation")
        remembered = recent.longest(prefix.conversation, ring.endpoints, {}, (), 1 << 62) is not None
    home = recent.endpoint(prefix.leading, ring.endpoints)
    if home is None:
        url = ring.place(
            prefix.leading, placements.holding(ring.endpoints), outstanding, excluded, limits.ring
        )
        how = "placed"
    elif home not in excluded and outstanding.get(home, 0) < limits.home:
        url, how = home, "home"
    else:
        url, how = ring.choose_under(prefix.leading, outstanding, excluded, limits.ring), "spilled"
    if url is None:
        return None
    return Choice(url, "moved" if remembered else how, how == "placed")


class Affinity:
    """A router worker's prefix affinity: the conversation table it shares with the other workers and
    its own placements; `pick` chooses and records."""

    def __init__(self, recent: ConversationTable, placements: Placements | None = None) -> None:
        self.recent = recent
        self.placements = placements if placements is not None else Placements()

    def pick(
        self,
        ring: Ring,
        prefix: PrefixKeys,
        outstanding: dict[str, int],
        excluded: Collection[str],
        bound_percent: int,
        slack: int = LOAD_BOUND_SLACK,
    ) -> Choice | None:
        """`choose`, then remember where the request went: its conversation keys' engine, and a newly
        placed leading text's (in the shared table, so every worker sends the text's next requests
        there)."""
        choice = choose(
            ring, self.recent, self.placements, prefix, outstanding, excluded, bound_percent, slack
        )
        if choice is None:
            return None
        if choice.placed:
            self.recent.record((prefix.leading,), choice.url)
            self.placements.add(prefix.leading, choice.url, prefix.size)
        if prefix.conversation:
            self.recent.record(prefix.conversation, choice.url)
        return choice


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
        outstanding: dict[str, int],
        excluded: Collection[str],
        bound_percent: int,
    ) -> str | None:
        """The first endpoint clockwise from `key` not in `excluded` and under the load bound; None if
        every endpoint is excluded."""
        return self.choose_under(
            key, outstanding, excluded, load_limit(self.endpoints, outstanding, excluded, bound_percent)
        )

    def place(
        self,
        key: int,
        placed: Mapping[str, int],
        outstanding: dict[str, int],
        excluded: Collection[str],
        limit: int,
    ) -> str | None:
        """A new leading text's endpoint: of those not in `excluded` with fewer than `limit`
        outstanding, the one holding the least `placed`, the first clockwise from `key` among equals (so
        replicas with equal counts agree)."""
        best: str | None = None
        least = 0
        for url in self.clockwise(key):
            if url in excluded or outstanding.get(url, 0) >= limit:
                continue
            held = placed.get(url, 0)
            if best is None or held < least:
                best, least = url, held
        return best

    def clockwise(self, key: int) -> list[str]:
        """Every endpoint once, in the order the ring meets them clockwise from `key`."""
        points = len(self.points)
        start = bisect.bisect_left(self.points, key)
        order: list[str] = []
        for step in range(points):
            url = self.owners[(start + step) % points]
            if url not in order:
                order.append(url)
                if len(order) == len(self.endpoints):
                    break
        return order

    def choose_under(
        self, key: int, outstanding: dict[str, int], excluded: Collection[str], limit: int
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
