"""KV cache of one vLLM engine from its settings, as vLLM sizes it (pure; the simulator and the policy
both take capacities from here).

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from specfleet_runtime.cost_profile import MemoryProfile

# What nvidia-smi reports for an H100 80GB HBM3: 81559 MiB.
H100_80GB_BYTES: Final = 81559 * 2**20
# vLLM's --gpu-memory-utilization where the engine does not set it.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION: Final = 0.9
# vLLM's KV block size on GPUs where the engine does not say otherwise.
DEFAULT_BLOCK_SIZE: Final = 16
# A fitted model reproduces its measurement up to float noise: a block count within this of a whole
# number is that number.
_WHOLE: Final = 1e-6


def eagle3_drafter_params(hidden: int, intermediate: int, kv_heads: int, head_dim: int, vocab: int) -> float:
    """Weights of an EAGLE-3 drafter for a Llama target: one decoder layer whose q, k, v read 2 x hidden
    (embedding and fused hidden state), the 3 x hidden -> hidden fusion layer and the draft-vocabulary
    head (the embedding is the target's)."""
    kv = kv_heads * head_dim
    attention = 2 * hidden * hidden + 2 * (2 * hidden * kv) + hidden * hidden
    return attention + 3 * hidden * intermediate + 3 * hidden * hidden + vocab * hidden


@dataclass(frozen=True)
class CapacityModel:
    """One model's memory on one GPU kind (defaults: Llama-3.1-8B with EAGLE-3 on an H100 80GB).

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
        return replace(model, overhead_bytes=overhead, drafter_weight_bytes=max(0.0, free_off - free_on) * tp)


LLAMA31_8B_EAGLE3_H100: Final = CapacityModel()

# Llama-3.1-70B (80 layers, 8 KV heads of 128, hidden 8192, MLP 28672, 70.6e9 parameters in bf16)
# with an EAGLE-3 drafter of its width (one decoder layer, 32k draft vocabulary: about 1.4e9
# parameters), on H100 80GB GPUs: it needs TP 2 or more (140 GB of weights).
LLAMA31_70B_EAGLE3_H100: Final = CapacityModel(
    name="Llama-3.1-70B + EAGLE-3 on H100 80GB",
    target_weight_bytes=70.6e9 * 2,
    layers=80,
    drafter_weight_bytes=eagle3_drafter_params(8192, 28672, 8, 128, 32000) * 2,
)


def preset(model: str | None) -> CapacityModel:
    """The preset for a model name: the 70B one where the name says 70B, else the 8B one."""
    return LLAMA31_70B_EAGLE3_H100 if model and "70b" in model.lower() else LLAMA31_8B_EAGLE3_H100


def profile_capacity(memory: MemoryProfile) -> CapacityModel:
    """The model a profile's `memory` section calibrates (the preset its `model` names)."""
    return preset(memory.model).calibrated(memory)
