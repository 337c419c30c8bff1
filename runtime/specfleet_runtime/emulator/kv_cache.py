"""The emulated engine's paged KV cache: vLLM V1's block accounting, without the tensors.

As vLLM's `BlockPool` (vllm/v1/core/block_pool.py): `num_gpu_blocks` blocks of `block_size` tokens, one
of them the null block no request gets, and usage = 1 - free / (num_gpu_blocks - 1). As its
`KVCacheManager.allocate_slots` (vllm/v1/core/kv_cache_manager.py): a request that needs slots for
`tokens` tokens (computed + new + lookahead, capped at max_model_len) holds ceil(tokens / block_size)
blocks; the missing ones are taken from the free blocks, or nothing is taken and the allocation fails.
Blocks are only given back all at once (`free`: finished, aborted or preempted). No prefix caching.
"""

from __future__ import annotations

from collections.abc import Hashable


class BlockPool:
    """Counts the blocks each request holds."""

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("a KV cache needs at least 2 blocks (one is vLLM's null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_free_blocks = num_gpu_blocks - 1
        self._held: dict[Hashable, int] = {}

    def blocks_needed(self, tokens: int) -> int:
        """Blocks that hold `tokens` slots (capped at max_model_len, as vLLM caps them)."""
        return -(-min(tokens, self.max_model_len) // self.block_size)

    def held(self, owner: Hashable) -> int:
        """Blocks `owner` holds now."""
        return self._held.get(owner, 0)

    def allocate(self, owner: Hashable, tokens: int) -> bool:
        """Make `owner` hold slots for `tokens` tokens; False (and nothing taken) when too few are free."""
        missing = self.blocks_needed(tokens) - self.held(owner)
        if missing > self.num_free_blocks:
            return False
        if missing > 0:
            self._held[owner] = self.held(owner) + missing
            self.num_free_blocks -= missing
        return True

    def free(self, owner: Hashable) -> None:
        """Give back every block `owner` holds (a no-op when it holds none)."""
        self.num_free_blocks += self._held.pop(owner, 0)

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks in use: vLLM's vllm:kv_cache_usage_perc."""
        return 1.0 - self.num_free_blocks / (self.num_gpu_blocks - 1)
