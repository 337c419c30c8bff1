"""One simulated engine's prefix cache, as vLLM's automatic prefix caching, by named prefix segments.

The emulator's `kv_cache.py` hashes real token ids; here a request names its shared leading context
instead: its `prefix` is (key, end) segments, the prompt tokens [previous end, end) named by key, and
a full block belongs to the segment its last token is in. The cache remembers, per key, how many of
the segment's leading blocks it holds, least recently used first. A request takes the cached blocks of
the longest run of its leading segments (at most prompt - 1 tokens, as vLLM looks up); once prefilled,
its full prompt blocks are cached and held while it runs. A key's held blocks are counted once
(`held`: per key, the most any running request holds), as vLLM's block pool shares a cached block
among the requests using it; the engine counts each request's own KV apart. Blocks a running request
holds stay; the others (a held segment's tail past its longest holder's too) are the free blocks'
content, so the engine evicts them, least recently used first (a segment's tail first), when its free
blocks no longer hold them (at each lookup, before a span's growth and before a preemption).

Approximation: blocks are shared by key, not by content: every request naming a key is taken to have
the same tokens in that segment's leading blocks, and requests of different keys share none.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator

EPS = 1e-9


class PrefixCache:
    """Cached blocks per prefix key, the blocks running requests hold of each key, and the block counts."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # key -> its segment's leading blocks cached, least recently used first
        self.blocks: OrderedDict[str, int] = OrderedDict()
        # key -> {leading blocks a running request holds: how many running requests hold that many}
        self.holders: dict[str, dict[int, int]] = {}
        # key -> its leading blocks some running request holds (the most any holder holds)
        self.held_blocks: dict[str, int] = {}
        self.cached = 0  # blocks cached
        self.held = 0  # of them, those a running request holds, each once

    @property
    def free_blocks_cached(self) -> int:
        """Cached blocks no running request holds (they live in the free blocks)."""
        return self.cached - self.held

    def lookup(self, prefix: tuple[tuple[str, int], ...], prompt: int) -> int:
        """Prompt tokens the cache holds for a prompt of `prompt` tokens and this `prefix`: the cached
        blocks of its longest run of leading segments, within its first prompt - 1 tokens (vLLM computes
        the last one for its logits)."""
        size = self.block_size
        limit = prompt - 1
        cache = self.blocks
        blocks = start = 0
        for key, end in prefix:
            stop = min(end, limit) // size
            wanted = stop - start
            if wanted <= 0:
                break
            have = cache.get(key, 0)
            if have < wanted:
                blocks += have
                break
            blocks += wanted
            start = stop
        return blocks * size

    def to_hold(self, prefix: tuple[tuple[str, int], ...], prompt: int) -> tuple[int, int]:
        """What `take` would hold for this prompt: its full prefix blocks, and of them those no running
        request holds yet (which the engine must find room for)."""
        held_blocks = self.held_blocks
        total = new = 0
        for key, blocks in self._segment_blocks(prefix, prompt):
            total += blocks
            new += max(0, blocks - held_blocks.get(key, 0))
        return total, new

    def _segment_blocks(self, prefix: tuple[tuple[str, int], ...], prompt: int) -> Iterator[tuple[str, int]]:
        """Each leading segment's full blocks within a prompt of `prompt` tokens, (key, blocks) in order,
        up to the first with none."""
        size = self.block_size
        start = 0
        for key, end in prefix:
            stop = min(end, prompt) // size
            if stop <= start:
                return
            yield key, stop - start
            start = stop

    def take(self, prefix: tuple[tuple[str, int], ...], prompt: int) -> tuple[tuple[str, int], ...]:
        """Cache a just prefilled prompt's full blocks under its segments' keys and hold them; the
        (key, blocks) held, for `release`."""
        cache, holders, held_blocks = self.blocks, self.holders, self.held_blocks
        taken: list[tuple[str, int]] = []
        for key, blocks in self._segment_blocks(prefix, prompt):
            have = cache.get(key, 0)
            if blocks > have:
                cache[key] = blocks
                self.cached += blocks - have
            cache.move_to_end(key)
            counts = holders.get(key)
            if counts is None:
                counts = holders[key] = {}
            counts[blocks] = counts.get(blocks, 0) + 1
            most = held_blocks.get(key, 0)
            if blocks > most:
                held_blocks[key] = blocks
                self.held += blocks - most
            taken.append((key, blocks))
        return tuple(taken)

    def release(self, taken: tuple[tuple[str, int], ...]) -> None:
        """A request holding `taken` stopped running: blocks nobody else holds are free (evictable)."""
        holders, held_blocks = self.holders, self.held_blocks
        for key, blocks in taken:
            counts = holders[key]
            counts[blocks] -= 1
            if counts[blocks]:
                continue
            del counts[blocks]
            most = held_blocks[key]
            if blocks < most:
                continue
            # The longest holder left: what the others hold stays held.
            rest = max(counts) if counts else 0
            self.held -= most - rest
            if counts:
                held_blocks[key] = rest
            else:
                del holders[key], held_blocks[key]

    def evict(self, free_blocks: float) -> None:
        """Evict cached blocks no running request holds, least recently used first (a segment's tail
        first), until `free_blocks` hold them."""
        excess = math.ceil(self.cached - self.held - max(0.0, free_blocks) - EPS)
        if excess <= 0:
            return
        cache, held_blocks = self.blocks, self.held_blocks
        emptied: list[str] = []
        for key, blocks in cache.items():
            floor = held_blocks.get(key, 0)
            if blocks <= floor:
                continue
            take = min(blocks - floor, excess)
            excess -= take
            self.cached -= take
            if take == blocks:
                emptied.append(key)
            else:
                cache[key] = blocks - take  # an existing key: the iteration is not disturbed
            if excess <= 0:
                break
        for key in emptied:
            del cache[key]
