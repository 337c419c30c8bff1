"""One simulated engine's prefix cache, as vLLM's automatic prefix caching, by named prefix segments.

The emulator's `kv_cache.py` hashes real token ids; here a request names its shared leading context
instead: its `prefix` is (key, end) segments, the prompt tokens [previous end, end) named by key, and
a full block belongs to the segment its last token is in. The cache remembers, per key, how many of
the segment's leading blocks it holds, least recently used first. A request takes the cached blocks of
the longest run of its leading segments (at most prompt - 1 tokens, as vLLM looks up); once prefilled,
its full prompt blocks are cached and held while it runs. Blocks a running request holds stay; the
others are the free blocks' content, so the engine evicts them, least recently used first (a
segment's tail first), when its free blocks no longer hold them (at each lookup, before a span's
growth and before a preemption).

Approximation: the engine counts a running request's KV whole (blocks shared between running
requests are not deduplicated), so memory with shared prefixes is overstated, never understated.
"""

from __future__ import annotations

import math
from collections import OrderedDict

EPS = 1e-9


class PrefixCache:
    """Cached blocks per prefix key, the running requests holding each key, and the block counts."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # key -> its segment's leading blocks cached, least recently used first
        self.blocks: OrderedDict[str, int] = OrderedDict()
        # key -> running requests holding its blocks
        self.holders: dict[str, int] = {}
        self.cached = 0  # blocks cached
        self.held = 0  # of them, those of keys a running request holds

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

    def take(self, prefix: tuple[tuple[str, int], ...], prompt: int) -> tuple[str, ...]:
        """Cache a just prefilled prompt's full blocks under its segments' keys and hold them; the keys
        held, for `release`."""
        size = self.block_size
        cache, holders = self.blocks, self.holders
        start = 0
        taken: list[str] = []
        for key, end in prefix:
            stop = min(end, prompt) // size
            blocks = stop - start
            if blocks <= 0:
                break
            start = stop
            have = cache.get(key, 0)
            held = key in holders
            if blocks > have:
                cache[key] = blocks
                self.cached += blocks - have
                if held:
                    self.held += blocks - have
            cache.move_to_end(key)
            if not held:
                holders[key] = 0
                self.held += cache[key]
            holders[key] += 1
            taken.append(key)
        return tuple(taken)

    def release(self, keys: tuple[str, ...]) -> None:
        """A request holding `keys` stopped running: their blocks are free (evictable) once nobody holds them."""
        holders = self.holders
        for key in keys:
            holders[key] -= 1
            if holders[key] == 0:
                del holders[key]
                self.held -= self.blocks.get(key, 0)

    def evict(self, free_blocks: float) -> None:
        """Evict cached blocks no running request holds, least recently used first (a segment's tail
        first), until `free_blocks` hold them."""
        excess = math.ceil(self.cached - self.held - max(0.0, free_blocks) - EPS)
        if excess <= 0:
            return
        cache, holders = self.blocks, self.holders
        emptied: list[str] = []
        for key, blocks in cache.items():
            if key in holders:
                continue
            take = min(blocks, excess)
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
