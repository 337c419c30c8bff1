"""What one simulated run is asked to do: the strategy for the Auto pools, and settings not in the resource.

The strategies are described in docs/architecture.md ("The fleet simulator").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.validation import parse_spec
from specfleet.policy.predict.known_models import known_architecture
from specfleet.policy.predict.kv_cache import ASSUMED_MEMORY, CapacityModel, engine_memory, profile_capacity
from specfleet.policy.predict.rollout_time import estimated_startup_seconds
from specfleet_runtime import names
from specfleet_runtime.cost_profile import H100_LLAMA31_8B_PREFILL_MS_PER_TOKEN, StepTimeProfile

POOLS: tuple[str, ...] = names.POOLS
# How the simulated router picks an engine of a pool (`SimOptions.routing`; by default each pool's
# `spec.routing.endpointSelection`, as the router does): the fewest outstanding requests; or, for a
# request with a prefix, the router's own PrefixAffinity choice with the pool's load bound
# (`traffic.PrefixRouting`).
LEAST_OUTSTANDING = "leastOutstanding"
PREFIX_AFFINITY = "prefixAffinity"
# The wall-clock time of a run's t=0, for the policy's timestamps.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# Prefill cost when the profile has none: the published profile's (2 x 8.03e9 FLOPs per prompt token on
# an H100, 989 dense bf16 TFLOPS, at 40% utilisation: 0.04 ms per token).
DEFAULT_PREFILL_MS_PER_TOKEN = H100_LLAMA31_8B_PREFILL_MS_PER_TOKEN


@dataclass(frozen=True)
class Strategy:
    """How the Auto pools' speculation is set during a run."""

    name: str
    kind: str  # "policy", "static", "engineDynamicSD", "schedule"
    mode: str = "On"
    k: int | None = None
    # kind "schedule": (time in seconds, pool, "On"/"Off", K or None); those at time 0 set the start.
    schedule: tuple[tuple[float, str, str, int | None], ...] = ()


@dataclass(frozen=True)
class SimOptions:
    """Simulation settings that are not in the resource, and overrides of the cost profile's fields.

    An override left None takes the profile's own value (`prefill_ms_per_token_of` and its siblings), so
    a profile reaches the simulated engines whole unless a setting here says otherwise.
    """

    seed: int = 0
    scrape_interval: float = 15.0
    # One engine's start-up (pod created to Ready); None: estimated from the resource's model size and
    # tensor parallel size (`specfleet.policy.predict.rollout_time`), resolved by `resolved`.
    startup_seconds: float | None = None
    # The target's prefill per prompt token (None: the profile's; see `prefill_ms_per_token_of`).
    prefill_ms_per_token: float | None = None
    k0_penalty: float = 0.10
    acceptance: tuple[float, ...] = (0.68, 0.39, 0.20, 0.10, 0.05)
    # The engines' memory (None: the profile's `memory` section calibrating the model it names, else
    # the assumed engine); `policy.predict.kv_cache` sizes the KV cache from utilisation and TP.
    memory: CapacityModel | None = None
    # The drafter's pass over each prompt token, as a share of the target's (None: the profile's
    # drafterPrefillFraction, which the policy prices too, so it prices what the simulated engines pay).
    drafter_prefill_fraction: float | None = None
    default_max_num_seqs: int = 256
    default_gpu_memory_utilization: float = 0.9
    # Bin width of the timeline and of the oracle's per-window choice (None: the evaluation interval).
    bin_seconds: float | None = None
    # LEAST_OUTSTANDING or PREFIX_AFFINITY for every pool; None: each pool's endpointSelection.
    routing: str | None = None
    # The cost profile the policy decides with, where it is not the engines' own (a profile measured
    # on another GPU, drafter or vLLM version); None: the engines' profile, as a measured one would be.
    policy_profile: StepTimeProfile | None = None

    @property
    def startup(self) -> float:
        """The engines' start-up (after `resolved`)."""
        if self.startup_seconds is None:
            raise ValueError("SimOptions.startup_seconds is not resolved: see SimOptions.resolved")
        return self.startup_seconds

    def prefill_ms_per_token_of(self, profile: StepTimeProfile) -> float:
        """The target's prefill per prompt token: this option, else the profile's, else (a profile that
        measured none) the published estimate."""
        if self.prefill_ms_per_token is not None:
            return self.prefill_ms_per_token
        return profile.prefill_ms_per_token or DEFAULT_PREFILL_MS_PER_TOKEN

    def drafter_prefill_fraction_of(self, profile: StepTimeProfile) -> float:
        """The drafter's prefill as a share of the target's: this option, else the profile's."""
        if self.drafter_prefill_fraction is not None:
            return self.drafter_prefill_fraction
        return profile.drafter_prefill_fraction

    def memory_of(self, profile: StepTimeProfile) -> CapacityModel:
        """The engines' memory: this option, else the model, drafter and GPU the profile's `memory`
        section names, calibrated by it; where it names none the table knows, the assumed engine
        (`kv_cache.ASSUMED_MEMORY`), calibrated by the section where there is one, so that the simulated
        engines hold what was measured at its own setting (a simulation needs some KV cache)."""
        if self.memory is not None:
            return self.memory
        if profile.memory is None:
            return ASSUMED_MEMORY
        known = profile_capacity(profile.memory)
        if known is not None:
            return known
        name = f"{profile.memory.model or 'the profiled model'} (not in the table: the published engine's layers)"
        return replace(ASSUMED_MEMORY.calibrated(profile.memory), name=name)

    def resolved(self, spec: SpeculativeDeploymentSpec) -> SimOptions:
        """These options with the start-up estimated for `spec`'s model where none is given (its weights
        from the shipped table; the assumed engine's for a model not in it)."""
        if self.startup_seconds is not None:
            return self
        tp = spec.engine.tensor_parallel_size or 1
        target = known_architecture(spec.model.name)
        drafter = known_architecture(spec.drafter.model)
        # The start-up reads the weights, whatever the GPU: the assumed engine's stands in for it.
        known = engine_memory(target, drafter, ASSUMED_MEMORY.gpu_bytes, spec.model.name)
        return replace(self, startup_seconds=estimated_startup_seconds(known or ASSUMED_MEMORY, tp))


def strategy_spec(
    spec: SpeculativeDeploymentSpec, strategy: Strategy, schedule: Sequence[tuple[int, int, int]] = ()
) -> SpeculativeDeploymentSpec:
    """The resource a strategy runs: the policy's is the user's; a baseline pins the Auto pools."""
    if strategy.kind == "policy":
        return spec
    doc = spec.model_dump(by_alias=True, exclude_none=True)
    if strategy.kind == "schedule":
        # The pools stay Auto and take mode and K from status, as under the Goodput policy.
        doc["drafter"].pop("dynamicSchedule", None)
        doc["policy"]["mode"] = "Goodput"
        return parse_spec(doc)
    for pool in POOLS:
        if doc["pools"][pool]["speculation"] == "Auto":
            doc["pools"][pool]["speculation"] = "Off" if strategy.mode == "Off" else "On"
    if strategy.kind == "static":
        doc["drafter"].pop("dynamicSchedule", None)
        if strategy.k is not None:
            doc["drafter"]["numSpeculativeTokens"] = strategy.k
    elif strategy.kind == "engineDynamicSD" and not doc["drafter"].get("dynamicSchedule"):
        doc["drafter"]["dynamicSchedule"] = [
            {"minBatchSize": a, "maxBatchSize": b, "numSpeculativeTokens": k} for a, b, k in schedule
        ]
    return parse_spec(doc)
