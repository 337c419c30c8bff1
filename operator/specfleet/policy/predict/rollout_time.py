"""How long a pool's rollout takes (pure): one engine's start-up, measured or estimated from the
model's size, times the batches the rollout starts engines in.

The start-up is the pool's measured one (`status.pools.<pool>.startupSeconds`: pod created to Ready,
`reconcile.pod_startup`) as soon as the operator has seen its pods Ready. Before that, an estimate:
a fixed part and the weights each GPU reads from the model cache,

    startup = FIXED_STARTUP_SECONDS + (target + drafter weights) / TP / CACHE_READ_BYTES_PER_SECOND

The fixed part (45 s) is the container's and CUDA's start, torch.compile loading its cached graphs
and CUDA graph capture, the stages vLLM's start-up log times after "Loading weights took"; the
weights come from a shared model cache at 1 GB/s per GPU (a network PersistentVolume; node-local
NVMe reads faster, an emptyDir cache downloads them first and is far slower). For Llama-3.1-8B with
its EAGLE-3 drafter that is 62 s, for Llama-3.1-70B in FP8 on one H100 or in BF16 over two 117-118 s.
Both parts are assumptions written down, not measurements: the measured start-up replaces them.

A Surge rollout starts `maxSurge` engines at a time, a Replace rollout `maxUnavailable`, so a pool of
R replicas rolls out in ceil(R / batch) batches, each one start-up long (a pod's drain overlaps the
next batch's start). The new setting serves batch by batch: on average from (batches + 1) / 2
start-ups after the flip, all of it after `batches`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from specfleet.policy.inputs.observation import PoolState
from specfleet.policy.predict.kv_cache import LLAMA31_8B_EAGLE3_H100, CapacityModel, profile_capacity
from specfleet_runtime.cost_profile import StepTimeProfile

FIXED_STARTUP_SECONDS: Final = 45.0
CACHE_READ_BYTES_PER_SECOND: Final = 1.0e9


def estimated_startup_seconds(
    model: CapacityModel, tensor_parallel_size: int = 1, drafter: bool = True
) -> float:
    """One engine's start-up estimated from the weights each GPU loads (see the module docstring)."""
    weights = model.target_weight_bytes + (model.drafter_weight_bytes if drafter else 0.0)
    return FIXED_STARTUP_SECONDS + weights / max(1, tensor_parallel_size) / CACHE_READ_BYTES_PER_SECOND


@dataclass(frozen=True)
class RolloutTime:
    """A rollout of one pool: one engine's start-up, the batches it starts engines in, and where the
    start-up comes from ("measured", "lastRollout" or "estimate")."""

    startup_seconds: float
    batches: int
    source: str

    @property
    def seconds(self) -> float:
        """From the flip to the last new engine serving."""
        return self.batches * self.startup_seconds

    @property
    def mean_switch_seconds(self) -> float:
        """From the flip to when the average engine serves the new setting."""
        return (self.batches + 1) / 2 * self.startup_seconds


def rollout_batches(replicas: int, per_batch: int) -> int:
    """Batches a rollout of `replicas` engines, `per_batch` at a time, takes (at least one)."""
    return max(1, math.ceil(max(1, replicas) / max(1, per_batch)))


def rollout_time(
    replicas: int,
    per_batch: int,
    measured_startup: float | None,
    last_rollout_seconds: float | None,
    estimate: float,
) -> RolloutTime:
    """The pool's next rollout: from the measured start-up, else the last rollout's duration spread
    over its batches, else the estimate."""
    batches = rollout_batches(replicas, per_batch)
    if measured_startup is not None and measured_startup > 0:
        return RolloutTime(float(measured_startup), batches, "measured")
    if last_rollout_seconds is not None and last_rollout_seconds > 0:
        return RolloutTime(last_rollout_seconds / batches, batches, "lastRollout")
    return RolloutTime(estimate, batches, "estimate")


def pool_rollout(state: PoolState, replicas_reporting: int, profile: StepTimeProfile) -> RolloutTime:
    """The next rollout of a pool: its strategy's batch, its measured start-up or last rollout, else
    the estimate for the model the profile's memory section names (the 8B preset without one) at the
    pool's tensor parallel size."""
    replicas = state.replicas if state.replicas is not None else replicas_reporting
    per_batch = state.max_unavailable if state.rollout_strategy == "Replace" else state.max_surge
    last = state.rollout
    last_seconds = None
    if last is not None and last.settled_at is not None and last.settled_at > last.at:
        last_seconds = (last.settled_at - last.at).total_seconds()
    memory = profile.memory
    model = profile_capacity(memory) if memory is not None else LLAMA31_8B_EAGLE3_H100
    tp = state.tensor_parallel_size or (memory.tensor_parallel_size if memory else None) or 1
    estimate = estimated_startup_seconds(model, tp)
    return rollout_time(max(1, replicas), per_batch, state.startup_seconds, last_seconds, estimate)
