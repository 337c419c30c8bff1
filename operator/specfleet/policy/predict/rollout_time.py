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

A Standby pool (`pools.<pool>.rollout.flip: Standby`) flips without a restart: each engine pod holds
an engine with the drafter and one without, one asleep in host memory (vLLM sleep mode, level 1). A
flip goes one replica at a time, so it takes R batches of one replica's flip:

    flip = drain + sleep + wake + check

- drain: the replica leaves the pool's Service, hands the requests queued in it that have not streamed
  a token back to the router (sent to another engine: a memory-bound engine's queue would take minutes
  at the slow setting) and finishes the ones it runs: about a whole request's output at their current
  decode rate (the last of them to finish is about as long as a request), at most the pod's
  `terminationGracePeriodSeconds` (past it the kubelet's rules apply);
- sleep and wake: the awake engine's weights per GPU copied to host RAM, the other engine's back
  (`specfleet_runtime.sleep_mode.transfer_seconds`: target + drafter weights / TP one way, the
  target's / TP the other), weights from the same model the KV cache is sized with (`kv_cache`);
- check: one completion on the woken engine before it serves again (`STANDBY_CHECK_SECONDS`).

One replica at a time because the flip's cost is the capacity it takes out (one engine for seconds)
while the whole flip is short next to a policy window; more at once would halve a few seconds at the
price of a deeper dip. What the operator measures of the pool's own flips (one replica's switch: sleep,
wake and check, `status.pools.<pool>.standbyFlipSeconds`) replaces the estimate's switch; the drain
is estimated at each flip (it is the load's). A
Standby pool never pays a restart's start-up for a flip. It still does for a spec change, a retune
or a scale-up, which start new pods, and a Standby pod's start-up is two engines' and a sleep check
(`standby_startup_seconds`): about twice a Restart pod's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.predict.kv_cache import ASSUMED_MEMORY, CapacityModel, profile_capacity
from specfleet_runtime.cost_profile import StepTimeProfile
from specfleet_runtime.sleep_mode import transfer_seconds

FIXED_STARTUP_SECONDS: Final = 45.0
CACHE_READ_BYTES_PER_SECOND: Final = 1.0e9
# One check completion on a woken engine before it serves again: a short prompt and a few dozen
# tokens (enough drafts to compare acceptance after a flip On), a second or two at a 70B's step
# times; an assumption until the pool's measured flips replace it.
STANDBY_CHECK_SECONDS: Final = 2.0
STANDBY = "Standby"


def estimated_startup_seconds(
    model: CapacityModel, tensor_parallel_size: int = 1, drafter: bool = True
) -> float:
    """One engine's start-up estimated from the weights each GPU loads (see the module docstring)."""
    weights = model.target_weight_bytes + (model.drafter_weight_bytes if drafter else 0.0)
    return FIXED_STARTUP_SECONDS + weights / max(1, tensor_parallel_size) / CACHE_READ_BYTES_PER_SECOND


def standby_switch_seconds(model: CapacityModel, tensor_parallel_size: int = 1) -> float:
    """One Standby replica's sleep plus wake: the engine with the drafter's weights per GPU one way,
    the engine without it's the other (the same sum whichever way the flip goes)."""
    tp = max(1, tensor_parallel_size)
    with_drafter = (model.target_weight_bytes + model.drafter_weight_bytes) / tp
    return transfer_seconds(with_drafter) + transfer_seconds(model.target_weight_bytes / tp)


def standby_startup_seconds(one_engine: float, model: CapacityModel, tensor_parallel_size: int = 1) -> float:
    """A Standby pod's start-up from one engine's (`one_engine`): its supervisor starts the engine that
    will be parked, checks that it can sleep (sleep, wake, sleep again: three copies of its weights per
    GPU over the host link, the engine with the drafter's as the bound) and only then starts the one
    that serves (vLLM sizes its KV cache from the memory free at start). Each engine's start-up is taken
    as `one_engine`: the drafter is a few percent of the weights, and the second engine reads the same
    files (from the node's page cache if its RAM still holds them, which the parked weights compete
    for: not assumed)."""
    tp = max(1, tensor_parallel_size)
    with_drafter = (model.target_weight_bytes + model.drafter_weight_bytes) / tp
    return 2 * one_engine + 3 * transfer_seconds(with_drafter)


def standby_drain_seconds(obs: PoolObservation, grace_seconds: float) -> float:
    """How long one replica takes to finish the requests it runs once it leaves the Service (its
    unstarted ones go back to the router; see the module docstring): with N running per replica, a
    mean output of L tokens and T tokens/s per replica, a whole request at the per-request rate,
    L / (T / N), at most `grace_seconds`. Nothing running: 0; running but its rate not measured: the
    grace period (the bound)."""
    running = max(0.0, obs.running_per_replica or 0.0)
    if running <= 0:
        return 0.0
    gen, output = obs.generation_tokens_per_second, obs.mean_output_tokens
    if not gen or gen <= 0 or not output or output <= 0 or not math.isfinite(gen + output):
        return float(grace_seconds)
    per_request = gen / max(1, obs.replicas_reporting) / running
    return min(float(grace_seconds), output / per_request)


@dataclass(frozen=True)
class RolloutTime:
    """A rollout of one pool: one batch's duration, the batches, and where the duration comes from
    ("measured", "lastRollout" or "estimate": a start-up; "standbyMeasured" or "standbyEstimate": one
    Standby replica's drain + sleep + wake + check)."""

    batch_seconds: float
    batches: int
    source: str

    @property
    def seconds(self) -> float:
        """From the flip to the last new engine serving."""
        return self.batches * self.batch_seconds

    @property
    def mean_switch_seconds(self) -> float:
        """From the flip to when the average engine serves the new setting."""
        return (self.batches + 1) / 2 * self.batch_seconds

    @property
    def standby(self) -> bool:
        """A Standby flip (one replica at a time, no restart)."""
        return self.source.startswith("standby")


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


def pool_model_weights(state: PoolState, profile: StepTimeProfile) -> tuple[CapacityModel, int]:
    """The model whose weights the pool's engines load (the one the profile's memory section
    calibrates, the assumed engine where it names no known model) and the pool's tensor parallel size."""
    memory = profile.memory
    model = (profile_capacity(memory) if memory is not None else None) or ASSUMED_MEMORY
    tp = state.tensor_parallel_size or (memory.tensor_parallel_size if memory else None) or 1
    return model, tp


def standby_rollout(state: PoolState, obs: PoolObservation, profile: StepTimeProfile) -> RolloutTime:
    """A Standby pool's next flip: one replica at a time, each its drain at the load now and the switch
    (sleep + wake + check) measured from the pool's own flips (`standbyFlipSeconds`), else estimated.
    The switch is the pool's; the drain is the load's (a flip under a queue drains for as long as the
    queue lasts), so a drain measured under one load would misprice a flip at another."""
    replicas = max(1, state.replicas if state.replicas is not None else obs.replicas_reporting)
    drain = standby_drain_seconds(obs, state.termination_grace_seconds)
    measured = state.standby_flip_seconds
    if measured is not None and measured > 0:
        return RolloutTime(drain + float(measured), replicas, "standbyMeasured")
    model, tp = pool_model_weights(state, profile)
    return RolloutTime(
        drain + standby_switch_seconds(model, tp) + STANDBY_CHECK_SECONDS, replicas, "standbyEstimate"
    )


def restart_rollout(state: PoolState, obs: PoolObservation, profile: StepTimeProfile) -> RolloutTime:
    """A rollout that restarts the pool's engines (every flip of a Restart pool; a spec change or a
    scale-up of any): its strategy's batch, its measured start-up or last rollout, else the estimate
    for the pool's model at its tensor parallel size."""
    replicas = state.replicas if state.replicas is not None else obs.replicas_reporting
    per_batch = state.max_unavailable if state.rollout_strategy == "Replace" else state.max_surge
    last = state.rollout
    last_seconds = None
    if last is not None and last.settled_at is not None and last.settled_at > last.at:
        last_seconds = (last.settled_at - last.at).total_seconds()
    model, tp = pool_model_weights(state, profile)
    estimate = estimated_startup_seconds(model, tp)
    if state.flip == STANDBY:
        estimate = standby_startup_seconds(estimate, model, tp)
    return rollout_time(max(1, replicas), per_batch, state.startup_seconds, last_seconds, estimate)


def pool_rollout(state: PoolState, obs: PoolObservation, profile: StepTimeProfile) -> RolloutTime:
    """The rollout a flip of the pool decided now takes: a Standby flip where the pool's flips are
    Standby (never a restart's start-up), else a restart."""
    if state.flip == STANDBY:
        return standby_rollout(state, obs, profile)
    return restart_rollout(state, obs, profile)
