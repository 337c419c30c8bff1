"""The KV cache of one vLLM engine, as vLLM sizes it, and what the pool's requests take of it (pure; the
simulator and the policy both take KV capacities from here).

vLLM (V1) profiles one forward pass at start-up and gives the KV cache what is left on each GPU of
`gpu_memory_utilization` x its memory after the weights, the activation peak and the memory outside
torch. With tensor parallel TP every rank holds 1/TP of the weights (the drafter's too: its TP is the
target's) and KV heads / TP of every layer's KV; the cache is cut into whole blocks, one page of
`2 x block_size x kv_heads/TP x head_dim x dtype` bytes per attention layer (the drafter's layers
included, as they share the target's page size):

    blocks = floor((u x gpu - weights/TP - drafter/TP - overhead) / (page x (layers + drafter_layers)))

`num_gpu_blocks` in `vllm:cache_config_info` is that per-rank count (every rank holds every block for
its own heads) and the engine's KV cache is blocks x block_size tokens.

Two terms no spec sheet gives, the overhead (activation peak, CUDA graphs, allocator) and the
drafter's weights as loaded, come from a measurement where there is one: a cost profile's `memory`
section, taken at its own (utilisation, TP), fits the overhead from the capacity without the drafter
and the drafter's weights from the one with it (`calibrated`), so the model reproduces the measurement
there and predicts every other setting from it.

What the pool's requests take of it: the KV cache of an engine with and without the drafter
(`capacities`), the mean KV footprint of a request (`footprint_tokens`) and the engine time a
preemption costs (`recompute_seconds_per_token`); `policy.predict.throughput` turns them into the batch
each setting holds and what it serves.

The physics (vLLM's paged allocator): a request holds its prompt and the tokens generated so far in
blocks of `block_size` tokens, plus K lookahead slots while speculating. Over its life it holds on
average its prompt plus half its output (the footprint). A preemption frees a request's KV and
recomputes its prefill later: each costs a prefill over prompt + output / 2 tokens of engine time.

Capacity of a setting: measured (`vllm:cache_config_info` of the pool's pods of that setting:
num_gpu_blocks x block_size), else what vLLM would size for the pool's own utilisation and tensor
parallel (`CapacityModel` above, calibrated by the cost profile's `memory` section: kvCacheTokens without
the drafter, kvCacheTokensWithDrafter with it, at the utilisation and TP it was measured with), else
unknown: then no batch is bound by memory.

Which model and GPU: the ones the `memory` section names (`model`, `drafter`, `gpu`), their layers, KV
heads and weights from the model's own config (`model_architecture`; the policy reads the shipped table
`known_models`, the CLI also a checkpoint's local files) and the GPU's memory from `gpu_products`.
Where the model or the GPU is not known, the measurement holds at its own setting and no other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from specfleet.policy.inputs.observation import PoolObservation
from specfleet.policy.predict.gpu_products import H100_80GB_BYTES, gpu_memory_bytes
from specfleet.policy.predict.known_models import known_architecture
from specfleet.policy.predict.model_architecture import ModelArchitecture
from specfleet_runtime.cost_profile import MemoryProfile, StepTimeProfile
from specfleet_runtime.vllm_args import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

# Where a model's architecture comes from: a model id (or path) to its architecture, None if unknown.
ArchitectureOf = Callable[[str], ModelArchitecture | None]
# vLLM's KV block size on GPUs where the engine does not say otherwise.
DEFAULT_BLOCK_SIZE: Final = 16
# A fitted model reproduces its measurement up to float noise: a block count within this of a whole
# number is that number.
_WHOLE: Final = 1e-6


@dataclass(frozen=True)
class CapacityModel:
    """One model's memory on one GPU kind (`models_memory` builds one from the models' architectures;
    the defaults are the published cost profile's engine, Llama-3.1-8B with EAGLE-3 on an H100 80GB).

    - Target: 8.03e9 parameters in bf16; 32 layers of 8 KV heads x 128 head dim: 128 KiB of KV per
      token over all layers.
    - Drafter (EAGLE-3, yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's shape): one decoder layer of the
      target's width and a 32k-token draft head, about 0.42e9 parameters, 0.85 GB in bf16; its KV is
      one layer's.
    - Overhead 2 GiB per GPU: activation peak, CUDA graphs and allocator (an estimate until a profile
      measures it).
    """

    name: str = "Llama-3.1-8B + EAGLE-3 on H100 80GB"
    gpu_bytes: float = H100_80GB_BYTES
    target_weight_bytes: float = 8.03e9 * 2
    layers: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    drafter_weight_bytes: float = 0.85e9
    drafter_layers: int = 1
    overhead_bytes: float = 2 * 2**30
    block_size: int = DEFAULT_BLOCK_SIZE
    # vLLM's --kv-cache-memory-bytes (VLLM_CPU_KVCACHE_SPACE GiB on CPU): a set KV budget per rank
    # that replaces the one from utilisation, weights and overhead (None: not set).
    kv_cache_memory_bytes: float | None = None

    def page_bytes(self, tensor_parallel_size: int) -> int:
        """One block of one attention layer on one rank: K and V of block_size tokens."""
        heads = max(1, self.kv_heads // max(1, tensor_parallel_size))
        return 2 * self.block_size * heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, gpu_memory_utilization: float, tensor_parallel_size: int, speculative: bool) -> float:
        """Bytes one rank leaves to the KV cache (negative: the engine does not fit)."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        tp = max(1, tensor_parallel_size)
        free = gpu_memory_utilization * self.gpu_bytes - self.target_weight_bytes / tp - self.overhead_bytes
        return free - self.drafter_weight_bytes / tp if speculative else free

    def blocks(self, gpu_memory_utilization: float, tensor_parallel_size: int, speculative: bool) -> int:
        """vLLM's num_gpu_blocks of one engine (per rank; 0 where the weights leave nothing)."""
        layers = self.layers + (self.drafter_layers if speculative else 0)
        per_block = self.page_bytes(tensor_parallel_size) * layers
        free = self.kv_bytes(gpu_memory_utilization, tensor_parallel_size, speculative)
        return max(0, math.floor(free / per_block + _WHOLE))

    def kv_tokens(self, gpu_memory_utilization: float, tensor_parallel_size: int, speculative: bool) -> int:
        """Tokens of KV cache one engine holds: its blocks x block_size."""
        return self.blocks(gpu_memory_utilization, tensor_parallel_size, speculative) * self.block_size

    def calibrated(self, memory: MemoryProfile) -> CapacityModel:
        """This model fitted to a measurement: the overhead from its capacity without the drafter, the
        drafter's weights from the one with it, both at the measurement's own utilisation and TP (where
        the section does not say: vLLM's default 0.9 and TP 1)."""
        util = memory.gpu_memory_utilization or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        tp = memory.tensor_parallel_size or 1
        model = replace(self, block_size=memory.block_size or self.block_size)
        per_token = model.page_bytes(tp) / model.block_size
        free_off = memory.kv_cache_tokens * per_token * model.layers
        free_on = memory.kv_cache_tokens_with_drafter * per_token * (model.layers + model.drafter_layers)
        overhead = util * model.gpu_bytes - model.target_weight_bytes / tp - free_off
        drafter = max(0.0, free_off - free_on) * tp
        if overhead < 0:
            # The model's weights do not fit beside the measured cache: the engine loaded fewer bytes
            # (a quantized checkpoint, e.g. a 70B in FP8 on one GPU). Its weights are then at most what
            # the measurement leaves, with no overhead: the same KV cache at this TP, and weights (which
            # a Standby flip copies) that are an upper bound rather than twice too many.
            return replace(
                model,
                overhead_bytes=0.0,
                target_weight_bytes=(util * model.gpu_bytes - free_off) * tp,
                drafter_weight_bytes=drafter,
            )
        return replace(model, overhead_bytes=overhead, drafter_weight_bytes=drafter)


# What the simulator and the policy's time estimates assume where neither a profile's memory section
# nor the model's config says anything: the published cost profile's engine (the defaults above).
ASSUMED_MEMORY: Final = CapacityModel()


def engine_memory(
    target: ModelArchitecture | None, drafter: ModelArchitecture | None, gpu_bytes: float | None, name: str
) -> CapacityModel | None:
    """The memory model of an engine of `target` (with `drafter`, where known, else none) on a GPU of
    `gpu_bytes`; None where the target's architecture, its weights or the GPU is unknown."""
    if target is None or target.weight_bytes is None or gpu_bytes is None:
        return None
    known_drafter = drafter is not None and drafter.weight_bytes is not None
    return CapacityModel(
        name=name,
        gpu_bytes=gpu_bytes,
        target_weight_bytes=target.weight_bytes,
        layers=target.layers,
        kv_heads=target.kv_heads,
        head_dim=target.head_dim,
        dtype_bytes=target.dtype_bytes,
        drafter_weight_bytes=(drafter.weight_bytes or 0.0) if known_drafter and drafter else 0.0,
        drafter_layers=drafter.layers if known_drafter and drafter else 0,
    )


def models_memory(
    model: str | None,
    drafter: str | None,
    gpu_product: str | None,
    architecture_of: ArchitectureOf = known_architecture,
) -> CapacityModel | None:
    """The memory model of `model` with `drafter` on `gpu_product`, their architectures from
    `architecture_of` (the shipped table unless the caller can read a model's own files); None where
    the model or the GPU is unknown."""
    target = architecture_of(model) if model else None
    helper = architecture_of(drafter) if drafter else None
    name = f"{model}{f' + {drafter}' if drafter else ''} on {gpu_product}"
    return engine_memory(target, helper, gpu_memory_bytes(gpu_product), name)


def profile_capacity(memory: MemoryProfile) -> CapacityModel | None:
    """The model a profile's `memory` section calibrates: the model, drafter and GPU it names, from
    the shipped table; None where the model or the GPU is not known there."""
    model = models_memory(memory.model, memory.drafter, memory.gpu)
    return model.calibrated(memory) if model is not None else None


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
        measured_util = memory.gpu_memory_utilization or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        measured_tp = memory.tensor_parallel_size or 1
        util = gpu_memory_utilization or measured_util
        tp = tensor_parallel_size or measured_tp
        if model is not None:
            predicted = {speculative: model.kv_tokens(util, tp, speculative) for speculative in (False, True)}
        elif math.isclose(util, measured_util) and tp == measured_tp:
            # A model or GPU not known: the measurement holds at its own setting only.
            predicted = {False: memory.kv_cache_tokens, True: memory.kv_cache_tokens_with_drafter}
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
