"""Per-pool engine settings after overrides: what a pool actually runs.

Kept beside the models (pure) because both the semantic checks and the renderer need the merged view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from specfleet.api.constants import PoolName
from specfleet.api.engine import GpuResources, Toleration
from specfleet.api.spec import SpeculativeDeploymentSpec

T = TypeVar("T")


def _pick(override: T | None, default: T) -> T:
    return default if override is None else override


@dataclass(frozen=True)
class PoolEngine:
    """Engine settings of one pool, overrides applied."""

    tensor_parallel_size: int
    max_num_seqs: int | None
    max_model_len: int | None
    gpu_memory_utilization_percent: int | None
    extra_args: tuple[str, ...]
    resources: GpuResources
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...]


def pool_engine(spec: SpeculativeDeploymentSpec, pool: PoolName) -> PoolEngine:
    """Merge spec.engine with spec.pools.<pool>.engine (a set override replaces the base value whole)."""
    base = spec.engine
    over = getattr(spec.pools, pool).engine

    if over is None:
        return PoolEngine(
            tensor_parallel_size=base.tensor_parallel_size,
            max_num_seqs=base.max_num_seqs,
            max_model_len=base.max_model_len,
            gpu_memory_utilization_percent=base.gpu_memory_utilization_percent,
            extra_args=tuple(base.extra_args),
            resources=base.resources,
            node_selector=dict(base.node_selector),
            tolerations=tuple(base.tolerations),
        )
    return PoolEngine(
        tensor_parallel_size=_pick(over.tensor_parallel_size, base.tensor_parallel_size),
        max_num_seqs=_pick(over.max_num_seqs, base.max_num_seqs),
        max_model_len=_pick(over.max_model_len, base.max_model_len),
        gpu_memory_utilization_percent=_pick(
            over.gpu_memory_utilization_percent, base.gpu_memory_utilization_percent
        ),
        extra_args=tuple(_pick(over.extra_args, base.extra_args)),
        resources=_pick(over.resources, base.resources),
        node_selector=dict(_pick(over.node_selector, base.node_selector)),
        tolerations=tuple(_pick(over.tolerations, base.tolerations)),
    )
