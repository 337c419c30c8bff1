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

from specfleet_runtime.names import MULTIPROC_ENV

# 2^14 sets of 4: 65,536 keys (a conversation has one per message: the recent turns of thousands of
# conversations, more than a pool's KV caches hold), 1.5 MiB.
SETS: Final = 1 << 14
WAYS: Final = 4
_ENTRY: Final = struct.Struct("<QQQ")  # key, endpoint hash, written at (ns)
_SET: Final = struct.Struct("<" + "QQQ" * WAYS)
SIZE: Final = SETS * _SET.size
TABLE_FILE: Final = "prefix-affinity-conversations"


def shared_table(environ: Mapping[str, str] = os.environ) -> ConversationTable:
    """The table of this router process: in the workers' shared directory where a supervisor started
    several (`names.MULTIPROC_ENV`, which their metrics use too), else its own."""
    directory = environ.get(MULTIPROC_ENV)
    return ConversationTable(os.path.join(directory, TABLE_FILE) if directory else None)


def endpoint_hash(url: str) -> int:
    """An endpoint as the table stores it (never 0: 0 marks an empty entry)."""
    return int.from_bytes(hashlib.blake2b(url.encode(), digest_size=8).digest(), "big") or 1


class ConversationTable:
    """Which endpoint last served each conversation key; shared by every process that maps `path`
    (None: this process's own)."""

    def __init__(self, path: str | None = None, sets: int = SETS) -> None:
        self.sets = sets
        size = sets * _SET.size
        if path is None:
            self._map = mmap.mmap(-1, size)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < size:  # the first worker sizes it; zeros are empty entries
                    os.ftruncate(fd, size)
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self._urls: tuple[Collection[str], dict[int, str]] = ((), {})

    def _slot(self, key: int) -> int:
        return (key % self.sets) * _SET.size

    def endpoint(self, key: int, endpoints: Collection[str]) -> str | None:
        """The endpoint of `endpoints` that last served `key`, or None."""
        key = key or 1
        values = _SET.unpack_from(self._map, self._slot(key))
        for way in range(WAYS):
            if values[3 * way] == key:
                return self._by_hash(endpoints).get(values[3 * way + 1])
        return None

    def _by_hash(self, endpoints: Collection[str]) -> dict[int, str]:
        known, by_hash = self._urls
        if known is not endpoints and known != endpoints:
            by_hash = {endpoint_hash(url): url for url in endpoints}
            self._urls = (endpoints, by_hash)
        return by_hash

    def longest(
        self,
        keys: tuple[int, ...],
        endpoints: Collection[str],
        outstanding: Mapping[str, int],
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
            values = _SET.unpack_from(self._map, offset)
            way = next((w for w in range(WAYS) if values[3 * w] == key), None)
            if way is None:  # the set's oldest entry (an empty one is oldest of all)
                way = min(range(WAYS), key=lambda w: values[3 * w + 2])
            _ENTRY.pack_into(self._map, offset + way * _ENTRY.size, key, served, now)

    def close(self) -> None:
        self._map.close()
