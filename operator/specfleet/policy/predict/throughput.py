"""One prediction, priced like the engines (pure): the generated tokens per second per replica of each
setting a pool could run (no drafter, each K, the in-engine schedule) at the demand it sees.

Every term an engine pays is in one formula, and each goes to zero where it does not apply, so the
prediction moves smoothly with load (no model switched at a threshold). For a setting drafting K:

    batch   = min(demand, max_num_seqs, fits)     demand = running + waiting per replica
    fits    = requests its KV cache holds: (kv_cache // block) // ceil((footprint + lookahead) / block)
    T       = batch x m_K / (step(batch, K) + batch x m_K x r x (1 - h) x prefill x (1 + f))
    T'      = T / (1 + rho x recompute x T)      where memory bounds the batch (else rho is 0)

with m_K = 1 + p_0 + ... + p_{K-1} tokens per step, r prompt tokens per generated token, h the
pool's measured prefix-cache hit rate (vllm:prefix_cache_hits over vllm:prefix_cache_queries in the
window; 0 where no lookup was counted), f the drafter's share of the prefill (engines started with
the drafter pay it even at K 0), rho preemptions per generated token and recompute the engine time of
one preemption (a prefill of the request's footprint). A setting's gain is its T' over the engine
without the drafter at the same demand: where neither is memory-bound it is `cost_profile.speedup`
with the prefill priced; where the drafter's cache holds fewer requests than the demand asks for, it
is throughput at the batch each holds. The KV cache is measured (`vllm:cache_config_info`), else the
profile's `memory` section, else unknown (no bound); the footprint comes from the measured lengths
(else KV usage), else unknown (no bound).

The measured preemption rate belongs to the setting the pool runs now, at the overflow it has now (the
share of its wanted batch that does not fit); another setting pays it in proportion to its own overflow,
so the charge also goes to zero as a setting's batch comes to fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from specfleet.policy.inputs.observation import PoolObservation, Schedule
from specfleet.policy.predict.dynamic_sd import IN_ENGINE_K0_PENALTY, k_at
from specfleet.policy.predict.kv_cache import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_SEQS,
    capacities,
    footprint_tokens,
    recompute_seconds_per_token,
)
from specfleet_runtime.cost_profile import StepTimeProfile, expected_tokens_per_step

# The name of the setting without the drafter, and of the in-engine schedule.
OFF = "off"
SCHEDULE = "schedule"
# The least overflow the measured preemption rate is referred to: a pool that preempts while its mean
# request fits (lengths vary) charges settings that overflow by this share its whole measured rate.
MIN_REFERENCE_OVERFLOW = 0.1
# The demand a gain at no demand is priced at (`PoolModel.gain`): one request per replica.
ONE_REQUEST = 1.0


def setting_name(k: int) -> str:
    return f"K{k}"


@dataclass(frozen=True)
class Setting:
    """One way to run the pool's engines, and the requests its KV cache holds."""

    name: str
    lookahead: int  # KV slots each running request reserves (0: no drafter)
    speculative: bool  # started with the drafter (pays its weights, KV and prefill)
    kv_cache_tokens: float  # KV cache of one engine (inf: unknown)
    kv_cache_source: str  # "measured", "profile" or "unknown"
    fits: float  # requests the cache holds at the mean footprint (inf: unknown)


@dataclass(frozen=True)
class PoolModel:
    """The pool's settings and workload: tokens per second per replica of each at any demand."""

    profile: StepTimeProfile
    settings: dict[str, Setting]
    current: str | None  # the setting the pool runs now while speculating (None: off)
    demand: float  # running + waiting per replica measured (the default demand of every method)
    footprint_tokens: float | None  # mean KV tokens a request holds (None: unknown)
    max_num_seqs: float
    prompt_per_output: float = 0.0  # mean prompt tokens per generated token (0: prefill not priced)
    prefill_hit_share: float = 0.0  # share of prompt tokens served from the prefix cache (0: unmeasured)
    schedule: Schedule | None = None
    preemptions_per_token: float | None = None
    recompute_seconds: float = 0.0  # engine time one preemption costs
    reference_overflow: float = 0.0  # the current setting's overflow when the preemptions were measured
    block_size: int = DEFAULT_BLOCK_SIZE

    def with_schedule(self, schedule: Schedule) -> PoolModel:
        """The same pool with the in-engine `schedule` as its SCHEDULE setting (a retune's candidate)."""
        lookahead = max(k for _, _, k in schedule)
        base = next(s for n, s in self.settings.items() if n != OFF)
        fits = _fits(base.kv_cache_tokens, self.footprint_tokens, lookahead, self.block_size)
        setting = Setting(SCHEDULE, lookahead, True, base.kv_cache_tokens, base.kv_cache_source, fits)
        return replace(self, schedule=schedule, settings={**self.settings, SCHEDULE: setting})

    @property
    def memory_known(self) -> bool:
        return self.footprint_tokens is not None and math.isfinite(self.settings[OFF].kv_cache_tokens)

    def _demand(self, demand: float | None) -> float:
        return self.demand if demand is None else max(0.0, demand)

    def wanted(self, demand: float | None = None) -> float:
        """The batch compute alone would run: min(demand, max_num_seqs)."""
        return min(self._demand(demand), self.max_num_seqs)

    def batch(self, name: str, demand: float | None = None) -> float:
        """Requests setting `name` runs at once: min(demand, max_num_seqs, fits)."""
        return min(self.wanted(demand), self.settings[name].fits)

    def overflow(self, name: str, demand: float | None = None) -> float:
        """The share of the wanted batch that setting `name`'s KV cache does not hold (0..1)."""
        wanted = self.wanted(demand)
        return 0.0 if wanted <= 0 else max(0.0, wanted - self.settings[name].fits) / wanted

    def memory_bound(self, name: str, demand: float | None = None) -> bool:
        return self.overflow(name, demand) > 1e-9

    def bound(self, demand: float | None = None) -> bool:
        """Memory, not compute, is the bound: a speculating setting holds fewer requests than the demand
        asks for while the engine without the drafter holds more."""
        off = self.settings[OFF]
        return any(
            self.memory_bound(n, demand) and s.fits < off.fits for n, s in self.settings.items() if n != OFF
        )

    def tokens_per_second(
        self, name: str, per_position: Sequence[float], demand: float | None = None
    ) -> float:
        """Generated tokens per second per replica of setting `name` (the module's formula)."""
        s = self.settings[name]
        b = self.batch(name, demand)
        if b <= 0:
            return 0.0
        c = max(1.0, b)
        k = s.lookahead
        if name == SCHEDULE:
            assert self.schedule is not None
            k = k_at(self.schedule, c)
        m = expected_tokens_per_step(list(per_position), k)
        step = self.profile.step_time_s(c, k)
        if name == SCHEDULE and k == 0:
            step /= 1 - IN_ENGINE_K0_PENALTY  # K 0 inside a speculating engine (vLLM's Dynamic SD)
        r = self.prompt_per_output * (1 - self.prefill_hit_share)
        prefill = c * m * self.profile.prefill_s_per_output(r, s.speculative)
        tps = b * m / (step + prefill)
        rho = self.preemptions_per_token
        if rho:
            share = self.overflow(name, demand) / max(self.reference_overflow, MIN_REFERENCE_OVERFLOW)
            tps /= 1 + rho * share * self.recompute_seconds * tps
        return tps

    def capacity(self, name: str, per_position: Sequence[float]) -> float:
        """The most tokens per second per replica setting `name` serves: at the largest batch it runs
        (min(max_num_seqs, fits)), whatever the demand."""
        return self.tokens_per_second(name, per_position, min(self.max_num_seqs, self.settings[name].fits))

    def requests_for(self, name: str, per_position: Sequence[float], tokens_per_second: float) -> float:
        """Requests per replica setting `name` runs to serve `tokens_per_second` (generated) per replica:
        the smallest batch whose `tokens_per_second` reaches it (inf: beyond its `capacity`). By
        Little's law, of two settings serving the same arrivals the one that needs fewer requests in
        the engine serves each sooner."""
        top = min(self.max_num_seqs, self.settings[name].fits)
        if tokens_per_second <= 0:
            return 0.0
        if self.tokens_per_second(name, per_position, top) < tokens_per_second:
            return math.inf
        low, high = 0.0, top
        for _ in range(40):
            mid = (low + high) / 2
            if self.tokens_per_second(name, per_position, mid) < tokens_per_second:
                low = mid
            else:
                high = mid
        return high

    def gain(self, name: str, per_position: Sequence[float], demand: float | None = None) -> float:
        """Throughput of `name` over the engine without the drafter, at the same demand.

        At no demand both serve nothing; the gain there is its limit as the demand falls to zero, what
        the next request to arrive sees: the gain at a batch of one (below one request the batch's
        step is one request's, so the ratio no longer moves).
        """
        if self._demand(demand) <= 0:
            demand = ONE_REQUEST
        off = self.tokens_per_second(OFF, per_position, demand)
        return self.tokens_per_second(name, per_position, demand) / off if off > 0 else 1.0

    def numbers(self, per_position: Sequence[float], demand: float | None = None) -> dict[str, str]:
        """What a memory-bound decision shows (status.history, the Event)."""
        s = self.settings
        on = next((v for n, v in s.items() if n != OFF), None)

        def cap(v: Setting) -> str:
            return f"{v.kv_cache_tokens:.0f}({v.kv_cache_source})"

        out = {
            "memoryBound": str(self.bound(demand)).lower(),
            "demandPerReplica": f"{self._demand(demand):.3g}",
            "requestKvTokens": f"{self.footprint_tokens or 0:.0f}",
            "kvCacheTokens": f"off={cap(s[OFF])}" + (f",on={cap(on)}" if on else ""),
            "memoryBatch": ",".join(f"{n}={self.batch(n, demand):.3g}" for n in s),
            "memoryTokensPerSecond": ",".join(
                f"{n}={self.tokens_per_second(n, per_position, demand):.0f}" for n in s
            ),
        }
        if self.preemptions_per_token is not None:
            out["preemptionsPerToken"] = f"{self.preemptions_per_token:.3g}"
        return out

    def why(self, k: int, per_position: Sequence[float], demand: float | None = None) -> str:
        """One sentence: why the engine without the drafter serves more (for the decision's message)."""
        off, spec = self.settings[OFF], self.settings[setting_name(k)]
        t_off, t_spec = (self.tokens_per_second(n, per_position, demand) for n in (OFF, spec.name))
        return (
            f"memory-bound: {self._demand(demand):.1f} requests per replica of ~{self.footprint_tokens or 0:.0f}"
            f" KV tokens each; the KV cache holds {spec.fits:.0f} with the drafter at K {k} "
            f"({spec.kv_cache_tokens:.0f} tokens) against {off.fits:.0f} without "
            f"({off.kv_cache_tokens:.0f}): {t_spec:.0f} against {t_off:.0f} tokens/s per replica "
            f"({t_spec / t_off:.2f}x)"
        )


def _fits(kv_cache: float, footprint: float | None, lookahead: int, block: int) -> float:
    """Requests a cache of `kv_cache` tokens holds at `footprint` tokens each plus the lookahead slots,
    in whole blocks as vLLM's allocator hands them out (inf: cache size or footprint unknown)."""
    if footprint is None or not math.isfinite(kv_cache):
        return math.inf
    blocks = math.ceil((footprint + lookahead) / block)
    return float((int(kv_cache) // block) // max(1, blocks))


def pool_model(
    profile: StepTimeProfile,
    obs: PoolObservation,
    ks: Sequence[int],
    *,
    mode: str,
    current_k: int,
    schedule: Schedule | None = None,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
) -> PoolModel:
    """The model of one pool from what is measured of it (the profile where nothing is).

    `mode` and `current_k` say what the pool runs now (On at K `current_k`, or following `schedule`);
    `gpu_memory_utilization` and `tensor_parallel_size` are its engines' (None: as the profile's memory
    was measured), for the capacity of a setting not measured."""
    caps = capacities(profile, obs, gpu_memory_utilization, tensor_parallel_size)
    (cap_off, src_off), (cap_on, src_on) = caps or ((math.inf, "unknown"), (math.inf, "unknown"))
    lookahead_now = (max(k for _, _, k in schedule) if schedule else current_k) if mode == "On" else 0
    cap_now = cap_on if mode == "On" else cap_off
    base = footprint_tokens(obs, cap_now, lookahead_now)
    block = (profile.memory.block_size if profile.memory else None) or DEFAULT_BLOCK_SIZE
    replicas = max(1, obs.replicas_reporting)
    running = obs.running_per_replica or 0.0
    if base is not None and running >= 1 and _fits(cap_now, base, lookahead_now, block) < math.floor(running):
        # The engines run more requests than the model says their cache holds (a profile's capacity
        # that is not this cluster's, lengths that skew the mean): what is measured wins, so the
        # footprint is the largest at which the setting running now holds what it runs.
        blocks = max(1, (int(cap_now) // block) // math.floor(running))
        base = max(1.0, float(blocks * block - lookahead_now))
    demand = running + (obs.waiting or 0.0) / replicas

    def setting(name: str, lookahead: int, speculative: bool) -> Setting:
        cap, src = (cap_on, src_on) if speculative else (cap_off, src_off)
        return Setting(name, lookahead, speculative, cap, src, _fits(cap, base, lookahead, block))

    settings = {OFF: setting(OFF, 0, False)}
    for k in ks:
        settings[setting_name(k)] = setting(setting_name(k), k, True)
    if schedule:
        settings[SCHEDULE] = setting(SCHEDULE, max(k for _, _, k in schedule), True)
    current = None
    if mode == "On":
        current = SCHEDULE if schedule else setting_name(current_k)
        if current not in settings:
            settings[current] = setting(current, current_k, True)
    rho = None
    gen = obs.generation_tokens_per_second
    if obs.preemptions_per_second is not None and gen:
        rho = obs.preemptions_per_second / gen
    model = PoolModel(
        profile=profile,
        settings=settings,
        current=current,
        demand=demand,
        footprint_tokens=base,
        max_num_seqs=float(max_num_seqs or DEFAULT_MAX_NUM_SEQS),
        prompt_per_output=obs.prompt_per_output,
        prefill_hit_share=obs.prefill_hit_share,
        schedule=schedule,
        preemptions_per_token=rho,
        recompute_seconds=(base or 0.0) * recompute_seconds_per_token(profile),
        block_size=block,
    )
    return replace(model, reference_overflow=model.overflow(current or OFF))


def memory_view(
    profile: StepTimeProfile, obs: PoolObservation, ks: Sequence[int], **settings: Any
) -> PoolModel | None:
    """The pool's model (`pool_model`, the same keyword settings) where its memory is known (demand,
    request size and both capacities), else None; also None when not one request fits even without
    the drafter (nothing to compare)."""
    if capacities(profile, obs) is None or obs.running_per_replica is None or obs.waiting is None:
        return None
    if obs.replicas_reporting < 1:
        return None
    model = pool_model(profile, obs, ks, **settings)
    if not model.memory_known or model.settings[OFF].fits < 1:
        return None
    return model
