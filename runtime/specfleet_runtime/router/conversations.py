"""Prefix affinity's conversation table, shared by the router's worker processes.

Which endpoint last served each conversation key (`affinity.PrefixKeys.conversation`), and where each
leading text was placed (`affinity.PrefixKeys.leading`). The kernel
spreads a client's connections over the workers (SO_REUSEPORT), so a conversation's next turn reaches
any of them: with a table of each worker's own, a returning turn of a client that opens new
connections reaches the worker that served its conversation about 1/W of the time with W workers; the
others fall back to the ring and prefill their history again where the load bound had moved the
conversation off its ring position. So the table lives
in shared memory, as nginx keeps its upstreams' state in a zone all its workers map: a file in the
workers' shared directory (`names.MULTIPROC_ENV`, on /dev/shm), mapped by every worker, or an
anonymous mapping for a single process (and the simulator).

The layout is a set-associative cache: `SETS` sets of `WAYS` entries, each entry the key, the
endpoint's hash and when it was written (CLOCK_MONOTONIC, the same clock in every process); a key lives
in the set its value picks, and a new key replaces the set's oldest entry (least recently written, an
LRU within the set). No locks: an entry is one 24-byte write, and a reader that meets a half-written
one sees a key or an endpoint that does not match and treats it as unknown, so the worst a race costs
is one request sent by the ring rather than back to its conversation's engine.

Beside it, in a second file, `PlacedBoard`: how much of the leading texts each worker placed each
endpoint holds (`affinity.Placements`), one row per worker, so that a worker places a new leading text
where the least is for the whole pod rather than for its own share. Each row has one writer (the
worker whose index it is, `names.WORKER_INDEX_ENV`), which rewrites it whole after each placement, and
the readers sum the rows; a row read mid-write is off by one placement for one choice.

Across router replicas (pods) nothing is shared: a turn reaching another replica goes by that
replica's placement of its leading text.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
from collections.abc import Collection, Mapping
from typing import Final

from specfleet_runtime.names import MULTIPROC_ENV, WORKER_INDEX_ENV

# 2^14 sets of 4: 65,536 keys (a conversation has one per message: the recent turns of thousands of
# conversations, more than a pool's KV caches hold), 1.5 MiB.
SETS: Final = 1 << 14
WAYS: Final = 4
# In the machine's byte order ("="): the table is shared only by the processes of one host, and a
# lookup reads its words through a memoryview (`ConversationTable._words`), which has no other.
_ENTRY: Final = struct.Struct("=QQQ")  # key, endpoint hash, written at (ns)
_ENTRY_WORDS: Final = 3
_SET: Final = struct.Struct("=" + "QQQ" * WAYS)
_SET_WORDS: Final = _ENTRY_WORDS * WAYS
SIZE: Final = SETS * _SET.size
TABLE_FILE: Final = "prefix-affinity-conversations"

# The placements board: a row per worker (more workers than rows share rows: the supervisor starts at
# most `workers.MAX_AUTO_WORKERS` unless told otherwise), each a count then up to `SLOTS` (endpoint hash,
# bytes held) pairs: 4 KiB a row, 256 KiB in all.
ROWS: Final = 64
SLOTS: Final = 255
_ROW_SIZE: Final = 8 * (1 + 2 * SLOTS)
# Every row's count in one read (the rest of each row skipped as padding).
_COUNTS: Final = struct.Struct("<" + f"Q{_ROW_SIZE - 8}x" * (ROWS - 1) + "Q")
PLACEMENTS_FILE: Final = "prefix-affinity-placements"


def shared_table(environ: Mapping[str, str] = os.environ) -> ConversationTable:
    """The table of this router process: in the workers' shared directory where a supervisor started
    several (`names.MULTIPROC_ENV`, which their metrics use too), else its own."""
    directory = environ.get(MULTIPROC_ENV)
    return ConversationTable(os.path.join(directory, TABLE_FILE) if directory else None)


def shared_board(environ: Mapping[str, str] = os.environ) -> PlacedBoard | None:
    """This worker's row of the placements board in the workers' shared directory, or None for a
    router process of its own (its placements are all there is)."""
    directory = environ.get(MULTIPROC_ENV)
    if not directory:
        return None
    return PlacedBoard(os.path.join(directory, PLACEMENTS_FILE), int(environ.get(WORKER_INDEX_ENV, "0")))


def _mapped(path: str | None, size: int) -> mmap.mmap:
    """`size` bytes of shared memory: the file at `path` (created, sized by the first process to map it;
    zeros are empty entries), or an anonymous mapping of this process's own."""
    if path is None:
        return mmap.mmap(-1, size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


# Endpoint hashes by URL, each computed once rather than on every record and publish; forgotten past
# this many (pods come and go with new addresses).
_HASHES_MAX: Final = 4096
_hashes: dict[str, int] = {}


def endpoint_hash(url: str) -> int:
    """An endpoint as the table stores it (never 0: 0 marks an empty entry)."""
    found = _hashes.get(url)
    if found is None:
        if len(_hashes) >= _HASHES_MAX:
            _hashes.clear()
        found = int.from_bytes(hashlib.blake2b(url.encode(), digest_size=8).digest(), "big") or 1
        _hashes[url] = found
    return found


class _ByHash:
    """The endpoints of the last lookup by their hash, rebuilt only when the endpoints change (a pool's
    tuple is the same object from one request to the next)."""

    def __init__(self) -> None:
        self._known: Collection[str] = ()
        self._by_hash: dict[int, str] = {}

    def of(self, endpoints: Collection[str]) -> dict[int, str]:
        if self._known is not endpoints and self._known != endpoints:
            self._by_hash = {endpoint_hash(url): url for url in endpoints}
            self._known = endpoints
        return self._by_hash


def _way_to_write(values: tuple[int, ...], key: int) -> int:
    """The way of a set (its `_SET` values) to write `key` into: the one holding it, else the set's
    oldest (an empty one is oldest of all; the first among equals)."""
    oldest = 0
    for way in range(WAYS):
        if values[3 * way] == key:
            return way
        if values[3 * way + 2] < values[3 * oldest + 2]:
            oldest = way
    return oldest


class ConversationTable:
    """Which endpoint last served each conversation key; shared by every process that maps `path`
    (None: this process's own)."""

    def __init__(self, path: str | None = None, sets: int = SETS) -> None:
        self.sets = sets
        self._map = _mapped(path, sets * _SET.size)
        # The table as 64-bit words: a lookup (every request of a PrefixAffinity pool) reads the keys
        # of its set one word at a time, then the matching entry's endpoint, with no struct call and
        # no tuple per request.
        self._words = memoryview(self._map).cast("Q")
        self._endpoints = _ByHash()

    def _slot(self, key: int) -> int:
        return (key % self.sets) * _SET.size

    def endpoint(self, key: int, endpoints: Collection[str]) -> str | None:
        """The endpoint of `endpoints` that last served `key`, or None."""
        key = key or 1
        words = self._words
        first = (key % self.sets) * _SET_WORDS
        for entry in range(first, first + _SET_WORDS, _ENTRY_WORDS):
            if words[entry] == key:
                return self._endpoints.of(endpoints).get(words[entry + 1])
        return None

    def longest(
        self,
        keys: tuple[int, ...],
        endpoints: Collection[str],
        outstanding: dict[str, int],
        excluded: Collection[str],
        limit: int,
    ) -> str | None:
        """The endpoint of the longest key remembered whose endpoint is still in `endpoints`, not
        `excluded` and has fewer than `limit` outstanding; None where no key has one."""
        for key in reversed(keys):
            url = self.endpoint(key, endpoints)
            if url is not None and url not in excluded and outstanding.get(url, 0) < limit:
                return url
        return None

    def record(self, keys: tuple[int, ...], url: str) -> None:
        """Remember that `url` serves every key of `keys` (its cache now holds them all)."""
        served = endpoint_hash(url)
        now = time.monotonic_ns()
        for given in keys:
            key = given or 1
            offset = self._slot(key)
            way = _way_to_write(_SET.unpack_from(self._map, offset), key)
            _ENTRY.pack_into(self._map, offset + way * _ENTRY.size, key, served, now)

    def close(self) -> None:
        self._words.release()  # the mapping cannot close while a view of it exists
        self._map.close()


class PlacedBoard:
    """How many bytes of placed leading texts each endpoint holds, by worker: one row per worker in
    shared memory (`path`, None for an anonymous mapping), this worker's row `row`."""

    def __init__(self, path: str | None, row: int) -> None:
        self.row = row % ROWS
        self._map = _mapped(path, ROWS * _ROW_SIZE)
        self._endpoints = _ByHash()
        self.publish({})  # what an earlier process of this index left is not this one's

    def publish(self, held: Mapping[str, int]) -> None:
        """This worker's row: what it placed on each endpoint (the first `SLOTS` endpoints it holds
        something on; a router sending to more keeps the rest to itself)."""
        values: list[int] = []
        for url, size in held.items():
            if size > 0:
                values += (endpoint_hash(url), size)
                if len(values) == 2 * SLOTS:
                    break
        offset = self.row * _ROW_SIZE
        # The pairs first, then the count, so a reader meets at most the old count over the new pairs.
        struct.pack_into(f"<{len(values)}Q", self._map, offset + 8, *values)
        struct.pack_into("<Q", self._map, offset, len(values) // 2)

    def others(self, endpoints: Collection[str]) -> dict[str, int]:
        """What the other workers' rows say each of `endpoints` holds (0 for none)."""
        by_hash = self._endpoints.of(endpoints)
        totals = dict.fromkeys(endpoints, 0)
        for row, count in enumerate(_COUNTS.unpack_from(self._map, 0)):
            if not count or row == self.row:
                continue
            offset = row * _ROW_SIZE
            values = struct.unpack_from(f"<{2 * min(count, SLOTS)}Q", self._map, offset + 8)
            for i in range(0, len(values), 2):
                url = by_hash.get(values[i])
                if url is not None:
                    totals[url] += values[i + 1]
        return totals

    def close(self) -> None:
        self._map.close()
