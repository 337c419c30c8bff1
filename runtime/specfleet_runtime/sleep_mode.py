"""How long vLLM's sleep mode takes: the weights' bytes over the host link.

At level 1 vLLM copies the weights from the GPU to host RAM when it falls asleep and back when it wakes
(the KV cache is dropped, never copied), so each direction takes about

    seconds = weight bytes (per GPU) / host-link bandwidth

Level 2 copies nothing (it discards the weights; they must be reloaded from the model's source), and
level 0 only pauses the scheduler. The product uses level 1 only: level 2 with an EAGLE-3 drafter loses
the drafter's weights (vllm#52479) and faults on CUDA-graph replay after a wake (vllm#55013).

Pure: the emulator times its sleep and wake with it, and the policy can price a standby flip with it.
"""

from __future__ import annotations

import math
from typing import Final

# One figure for both directions: ~3 s to wake 64 GiB of weights at level 1, as published by
# llm-d-incubation/llm-d-fast-model-actuation (README, via llm-d#1973; shared/reference/
# serving-ecosystem.md), i.e. ~21.3 GiB/s effective, a third of PCIe Gen5 x16's 64 GB/s per direction
# (theoretical). Falling asleep was measured slower elsewhere (vllm#28714: 7.56 GiB offloaded in 3.15 s,
# ~2.4 GiB/s, which includes allocating the host buffers), so this under-prices the sleep direction.
HOST_LINK_BYTES_PER_S: Final = 64 * 2**30 / 3.0

# Llama-3.1-8B's weights in bf16 (8.03e9 parameters x 2 B), as the published profile's memory section
# counts them (cost_profile.PUBLISHED_H100_LLAMA31_8B_MEMORY).
LLAMA31_8B_WEIGHT_BYTES: Final = 8.03e9 * 2
# Its EAGLE-3 drafter's weights in bf16 (one decoder layer, the fusion layer and a 32k-token draft
# head), as the same memory section counts them.
EAGLE3_LLAMA31_8B_DRAFTER_WEIGHT_BYTES: Final = 0.85e9


def transfer_seconds(weight_bytes: float, bytes_per_s: float = HOST_LINK_BYTES_PER_S) -> float:
    """Seconds to copy `weight_bytes` over the host link one way (a level-1 sleep, or a wake)."""
    if not (math.isfinite(weight_bytes) and weight_bytes >= 0):
        raise ValueError(f"weight bytes must be >= 0, got {weight_bytes}")
    if not (math.isfinite(bytes_per_s) and bytes_per_s > 0):
        raise ValueError(f"host-link bandwidth must be > 0, got {bytes_per_s}")
    return weight_bytes / bytes_per_s
