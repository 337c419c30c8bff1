"""The emulated engine's paged KV cache: vLLM V1's block accounting and prefix cache, without tensors.

As vLLM's `BlockPool` (vllm/v1/core/block_pool.py): `num_gpu_blocks` blocks of `block_size` tokens, one
of them the null block no request gets, and usage = 1 - free / (num_gpu_blocks - 1). As its
`KVCacheManager.allocate_slots` (vllm/v1/core/kv_cache_manager.py): a request that needs slots for
`tokens` tokens (computed + new + lookahead, capped at max_model_len) holds ceil(tokens / block_size)
blocks; the missing ones are taken from the free blocks, or nothing is taken and the allocation fails.
Blocks are only given back all at once (`free`: finished, aborted or preempted).

Prefix caching (vLLM's automatic prefix caching): each full block of a prompt has a hash chained with
its parent's (`block_hashes`). A prompt's block, once computed, is cached under its hash (`cache_blocks`);
a later request whose leading blocks have the same hashes takes those blocks (`find_cached`, then
`allocate(..., cached=...)`) instead of new ones, and needs no prefill for them. A block is referenced
by every request holding it; one no request holds is free, but keeps its cached content until the pool
hands it out again: the free blocks form vLLM's free block queue, least recently freed first, so the
least recently used cached blocks are evicted first (a request frees its blocks tail first, as vLLM).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence

BlockHash = bytes
# The parent hash of a prompt's first block (vLLM seeds the chain with a fixed NONE_HASH).
_ROOT_HASH: BlockHash = b""


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The hash of each full block of `token_ids` (a partial last block has none), as vLLM's
    `hash_block_tokens`: sha256 (vLLM's default prefix_caching_hash_algo) over the parent's hash and
    the block's token ids, so two blocks share a hash only when all the tokens up to them match."""
    hashes: list[BlockHash] = []
    parent = _ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = array("q", token_ids[start : start + block_size]).tobytes()
        parent = hashlib.sha256(parent + block).digest()
        hashes.append(parent)
    return hashes


class BlockPool:
    """The blocks each request holds, the free block queue, and the prefix cache's hash -> block map."""

    def __init__(
        self, num_gpu_blocks: int, block_size: int, max_model_len: int, enable_caching: bool = True
    ) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("a KV cache needs at least 2 blocks (one is vLLM's null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        # Free blocks in eviction order (block 0 is the null block, never handed out).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self._ref = [0] * num_gpu_blocks
        self._hash_of: dict[int, BlockHash] = {}
        self._cached: dict[BlockHash, int] = {}
        self._held: dict[Hashable, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached or not): what new allocations can take."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content the prefix cache holds (held by requests or free)."""
        return len(self._cached)

    def blocks_needed(self, tokens: int) -> int:
        """Blocks that hold `tokens` slots (capped at max_model_len, as vLLM caps them)."""
        return -(-min(tokens, self.max_model_len) // self.block_size)

    def held(self, owner: Hashable) -> int:
        """Blocks `owner` holds now."""
        return len(self._held.get(owner, ()))

    def find_cached(self, hashes: Sequence[BlockHash], max_tokens: int) -> list[int]:
        """The cached blocks of the longest run of leading `hashes`, at most `max_tokens` tokens of them.

        vLLM looks up at most num_tokens - 1 tokens (the last one must be computed for its logits), so
        a prompt of exactly n full blocks hits at most n - 1 of them.
        """
        if not self.enable_caching:
            return []
        found: list[int] = []
        for h in hashes[: max(0, max_tokens) // self.block_size]:
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def allocate(self, owner: Hashable, tokens: int, cached: Sequence[int] = ()) -> bool:
        """Make `owner` hold slots for `tokens` tokens; False (and nothing taken) when too few are free.

        `cached` (from `find_cached`, for an owner that holds nothing yet) are its leading blocks: they
        are shared, not taken new; the free ones among them leave the free queue, so they count
        against the free blocks as in vLLM's `get_num_blocks_to_allocate`.
        """
        held = self._held.get(owner)
        prefix = list(cached) if not held else []
        missing = self.blocks_needed(tokens) - (len(held) if held else len(prefix))
        touched = sum(1 for b in prefix if self._ref[b] == 0)
        if max(0, missing) + touched > len(self._free):
            return False
        blocks = held if held else prefix
        for b in prefix:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
        for _ in range(missing):
            b, _ = self._free.popitem(last=False)
            self._evict(b)
            self._ref[b] = 1
            blocks.append(b)
        if blocks:
            self._held[owner] = blocks
        return True

    def cache_blocks(self, owner: Hashable, hashes: Sequence[BlockHash]) -> None:
        """Cache `owner`'s leading blocks under `hashes` (its computed full blocks).

        A hash already cached keeps its block (vLLM keeps a duplicate's content uncached too).
        """
        if not self.enable_caching:
            return
        for b, h in zip(self._held.get(owner, ()), hashes, strict=False):
            if b not in self._hash_of and h not in self._cached:
                self._hash_of[b] = h
                self._cached[h] = b

    def free(self, owner: Hashable) -> None:
        """Give back every block `owner` holds (a no-op when it holds none), tail first."""
        for b in reversed(self._held.pop(owner, [])):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def _evict(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._cached[h]

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks in use: vLLM's vllm:kv_cache_usage_perc."""
        return 1.0 - len(self._free) / (self.num_gpu_blocks - 1)
