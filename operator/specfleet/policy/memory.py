"""What memory the pool's engines have and its requests take (pure): the KV cache of an engine with and
without the drafter, the mean KV footprint of a request, and the engine time a preemption costs.
`policy.throughput` turns them into the batch each setting holds and what it serves.

The physics (vLLM's paged allocator): a request holds its prompt and the tokens generated so far in
blocks of `block_size` tokens, plus K lookahead slots while speculating. Over its life it holds on
average its prompt plus half its output (the footprint). A preemption frees a request's KV and
recomputes its prefill later: each costs a prefill over prompt + output / 2 tokens of engine time.

Capacity of a setting: measured (`vllm:cache_config_info` of the pool's pods of that setting:
num_gpu_blocks x block_size), else what vLLM would size for the pool's own utilisation and tensor
parallel (`policy.capacity`, calibrated by the cost profile's `memory` section: kvCacheTokens without
the drafter, kvCacheTokensWithDrafter with it, at the utilisation and TP it was measured with), else
unknown: then no batch is bound by memory.
"""

from __future__ import annotations

import math

from specfleet.policy.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, profile_capacity
from specfleet.policy.observations import PoolObservation
from specfleet_runtime.cost_profile import StepTimeProfile

# vLLM's --max-num-seqs where the spec leaves it unset (as the fleet simulator assumes).
DEFAULT_MAX_NUM_SEQS = 256


def capacities(
    profile: StepTimeProfile,
    obs: PoolObservation,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
) -> tuple[tuple[int, str], tuple[int, str]] | None:
    """((tokens, source) without the drafter, (tokens, source) with it), or None when one is unknown.

    A setting not measured gets the profile-calibrated prediction for the pool's engines at
    `gpu_memory_utilization` and `tensor_parallel_size` (None: as the profile was measured)."""
    memory = profile.memory
    predicted: dict[bool, int] = {}
    if memory is not None:
        model = profile_capacity(memory)
        util = gpu_memory_utilization or memory.gpu_memory_utilization or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        tp = tensor_parallel_size or memory.tensor_parallel_size or 1
        predicted = {speculative: model.kv_tokens(util, tp, speculative) for speculative in (False, True)}
    out = []
    for measured, speculative in ((obs.kv_capacity_tokens_off, False), (obs.kv_capacity_tokens_on, True)):
        if measured is not None and measured > 0:
            out.append((measured, "measured"))
        elif speculative in predicted:
            out.append((predicted[speculative], "profile"))
        else:
            return None
    return out[0], out[1]


def recompute_seconds_per_token(profile: StepTimeProfile) -> float:
    """Engine seconds to prefill one token again after a preemption: the profile's prefill cost, else
    the marginal cost of one more token in a step (K 0) at its largest measured batches."""
    if profile.prefill_ms_per_token > 0:
        return profile.prefill_ms_per_token / 1000
    b = profile.batch_sizes
    if len(b) < 2:
        return 0.0
    slope = (profile.step_time_ms(b[-1], 0) - profile.step_time_ms(b[-2], 0)) / (b[-1] - b[-2])
    return max(0.0, slope) / 1000


def footprint_tokens(obs: PoolObservation, capacity_now: float, lookahead_now: int) -> float | None:
    """Mean KV tokens a request holds over its life (prompt + output / 2); from the mean lengths
    measured, else from KV usage (usage x capacity / running, less the lookahead; a known capacity
    only); None: unknown."""
    if obs.mean_prompt_tokens is not None and obs.mean_output_tokens is not None:
        return obs.mean_prompt_tokens + obs.mean_output_tokens / 2
    running = obs.running_per_replica
    usage = obs.kv_usage
    if (
        usage is not None
        and running is not None
        and running >= 1
        and usage > 0
        and math.isfinite(capacity_now)
    ):
        return max(1.0, usage * capacity_now / running - lookahead_now)
    return None
