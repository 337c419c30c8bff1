"""Whether a pool's engines can start at all: vLLM refuses to start where the weights leave no KV cache
in its share of the GPU, or where the cache cannot hold one sequence of maxModelLen tokens (pure).

vLLM checks both after loading the weights and profiling one forward pass (`kv_cache.CapacityModel`
does the same arithmetic); this module says so before any pod is created, in vLLM's own words. The
model's and the drafter's layers and weights come from their own configs (`kv_cache.models_memory`:
the shipped table, or the caller's reader of local files), the GPU from the pool's nodeSelector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final

from specfleet.api.constants import POOLS, PoolName
from specfleet.api.effective import PoolEngine, pool_engine
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.policy.predict.known_models import known_architecture
from specfleet.policy.predict.kv_cache import ArchitectureOf, CapacityModel, models_memory
from specfleet_runtime.vllm_args import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

# The node label (NVIDIA's GPU feature discovery) that names a node's GPU; a pool's nodeSelector that
# sets it says which GPU its engines get.
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
# vLLM flags that change the memory a model's config describes (weights, KV dtype or budget): with
# one, the config no longer says the engine's memory.
_MEMORY_FLAGS: Final = (
    "--quantization",
    "-q",
    "--dtype",
    "--kv-cache-dtype",
    "--kv-cache-memory-bytes",
    "--cpu-offload-gb",
)
_GB: Final = 1e9
_GIB: Final = 2**30


def startup_memory_problem(
    model: CapacityModel,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    speculative: bool,
    max_model_len: int | None,
) -> str | None:
    """Why vLLM would refuse to start one engine with `model`'s memory (None: it starts)."""
    tp = max(1, tensor_parallel_size)
    if model.blocks(gpu_memory_utilization, tp, speculative) == 0:
        weights = (model.target_weight_bytes + (model.drafter_weight_bytes if speculative else 0.0)) / tp
        return (
            f"its weights{' and the drafter' if speculative else ''} take {weights / _GB:.1f} GB per GPU at "
            f"tensorParallelSize {tp}, and about {model.overhead_bytes / _GB:.1f} GB more go to activations, "
            f"of the {gpu_memory_utilization * model.gpu_bytes / _GB:.1f} GB that a gpu_memory_utilization "
            f"of {gpu_memory_utilization:g} gives vLLM on a {model.gpu_bytes / _GB:.1f} GB GPU: vLLM stops with "
            '"No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when '
            'initializing the engine." (raise gpuMemoryUtilizationPercent or tensorParallelSize)'
        )
    tokens = model.kv_tokens(gpu_memory_utilization, tp, speculative)
    if max_model_len is not None and max_model_len > tokens:
        layers = model.layers + (model.drafter_layers if speculative else 0)
        per_token = model.page_bytes(tp) / model.block_size * layers
        return (
            f"its KV cache holds {tokens} tokens per engine, fewer than one sequence of maxModelLen "
            f"{max_model_len}: vLLM stops with \"To serve at least one request with the model's max seq len "
            f"({max_model_len}), ({max_model_len * per_token / _GIB:.2f} GiB KV cache is needed, which is "
            "larger than the available KV cache memory "
            f"({model.kv_bytes(gpu_memory_utilization, tp, speculative) / _GIB:.2f} GiB). Based on the "
            f"available memory, the estimated maximum model length is {tokens}. Try increasing "
            '`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."'
        )
    return None


@dataclass(frozen=True)
class _Engine:
    """One engine a pool may start: with or without the drafter."""

    pool: PoolName
    settings: PoolEngine
    speculative: bool

    @property
    def gpu_memory_utilization(self) -> float:
        percent = self.settings.gpu_memory_utilization_percent
        return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if percent is None else percent / 100


def _engines(spec: SpeculativeDeploymentSpec) -> Iterator[_Engine]:
    """The engines each pool may run: an Off pool's without the drafter, an On pool's with it, an Auto
    pool's both (the policy may start either)."""
    for pool in POOLS:
        speculation = getattr(spec.pools, pool).speculation
        settings = pool_engine(spec, pool)
        if speculation != "On":
            yield _Engine(pool, settings, speculative=False)
        if speculation != "Off":
            yield _Engine(pool, settings, speculative=True)


def engine_problems(
    spec: SpeculativeDeploymentSpec,
    memory_of: Callable[[PoolName, PoolEngine], tuple[CapacityModel, str] | None],
) -> list[str]:
    """Every engine of `spec` that vLLM would refuse to start, one sentence each. `memory_of` gives a
    pool's memory model and where it runs (for the message), None where that is unknown."""
    # The same problem in both pools reads once; a pool whose engine without the drafter cannot start
    # is not told again that the one with it cannot either.
    pools_of: dict[str, list[str]] = {}
    failed: set[str] = set()
    for engine in _engines(spec):
        settings = engine.settings
        known = memory_of(engine.pool, settings)
        if known is None or engine.pool in failed:
            continue
        model, where = known
        if engine.speculative and spec.drafter.model is None:
            # A drafter without weights of its own (ngram, suffix, mtp): its memory is counted as none,
            # a lower bound (an engine that cannot start without a drafter cannot start with one either).
            model = replace(model, drafter_weight_bytes=0.0, drafter_layers=0)
        problem = startup_memory_problem(
            model,
            engine.gpu_memory_utilization,
            settings.tensor_parallel_size,
            engine.speculative,
            settings.max_model_len,
        )
        if problem is not None:
            failed.add(engine.pool)
            drafter = "with" if engine.speculative else "without"
            pools_of.setdefault(f"{spec.model.name} {drafter} the drafter {where}: {problem}", []).append(
                engine.pool
            )
    return [
        f"{'pool' if len(pools) == 1 else 'pools'} {' and '.join(pools)}: {problem}"
        for problem, pools in pools_of.items()
    ]


def engines_that_cannot_start(
    spec: SpeculativeDeploymentSpec, architecture_of: ArchitectureOf = known_architecture
) -> list[str]:
    """Every engine vLLM would refuse to start, where both the model (`architecture_of` knows it: the
    shipped table by default) and the GPU (the pool's nodeSelector names it by `GPU_PRODUCT_LABEL`) are
    known. Nothing is refused where either is unknown, or where the pool's extraArgs change the memory
    the model's config describes. A drafter not known is counted as none (a lower bound)."""

    def memory_of(pool: PoolName, settings: PoolEngine) -> tuple[CapacityModel, str] | None:
        product = settings.node_selector.get(GPU_PRODUCT_LABEL)
        flags = {arg.split("=", 1)[0] for arg in settings.extra_args}
        if flags.intersection(_MEMORY_FLAGS):
            return None
        model = models_memory(spec.model.name, spec.drafter.model, product, architecture_of)
        return (model, f"on {product}") if model is not None else None

    return engine_problems(spec, memory_of)
