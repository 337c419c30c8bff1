"""Speculation costs memory too: the batch each setting's KV cache holds, and what it serves (pure).

An engine started with the drafter has less KV cache (the drafter's weights and KV take part of it),
and every speculating request reserves K lookahead slots. Where a pool's demand (running + waiting
requests per replica) does not fit the speculating engine's cache, vLLM runs fewer requests at once
and preempts the newest when a step cannot allocate; the engine without the drafter runs more. Then
what decides is throughput at the batch memory allows, not per-request speed at today's batch.

The physics (vLLM's paged allocator): a request holds its prompt and the tokens generated so far in
blocks of `block_size` tokens, plus K lookahead slots while speculating. Over its life it holds on
average its prompt plus half its output, so a setting drafting K holds

    fits(K) = (capacity // block_size) // ceil((prompt + output / 2 + K) / block_size)

requests, and runs batch(K) = min(demand, max_num_seqs, fits(K)). Its throughput per replica is

    T(K) = batch x goodput(batch, K)      (cost_profile: decode, and prefill where the lengths are known)

(the in-engine schedule drafts k_at(batch); K 0 inside the engine pays its penalty). A preemption
frees a request's KV and recomputes its prefill later: each costs a prefill over prompt + output / 2
tokens of engine time. A setting whose batch memory bounds is charged the preemptions per generated
token measured now (vllm:num_preemptions_total over vllm:generation_tokens_total):
T' = T / (1 + rho x recompute_s x T).

Capacity of a setting: measured (`vllm:cache_config_info` of the pool's pods of that setting:
num_gpu_blocks x block_size), else the cost profile's `memory` section (kvCacheTokens without the
drafter, kvCacheTokensWithDrafter with it), else unknown: then there is no memory reasoning, and the
policy behaves as without memory metrics. The pool is memory-bound when some speculating setting
holds fewer requests than the demand asks for (up to max_num_seqs) while the engine without the
drafter holds more; `decide` then compares the settings by T' (see the policy docs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specfleet.policy.observations import PoolObservation
from specfleet.policy.schedule import Schedule, schedule_speedup
from specfleet_runtime.cost_profile import StepTimeProfile, goodput, speedup

# vLLM's KV block size on GPUs where the engine does not say otherwise.
DEFAULT_BLOCK_SIZE = 16
# vLLM's --max-num-seqs where the spec leaves it unset (as the fleet simulator assumes).
DEFAULT_MAX_NUM_SEQS = 256
# The name of the setting without the drafter, and of the in-engine schedule.
OFF = "off"
SCHEDULE = "schedule"


def setting_name(k: int) -> str:
    return f"K{k}"


@dataclass(frozen=True)
class SettingMemory:
    """One setting at the demand seen: its KV cache and the requests it holds."""

    name: str
    lookahead: int  # K slots each running request reserves (0: no drafter)
    capacity_tokens: int
    capacity_source: str  # "measured" or "profile"
    fits: int  # requests the cache holds at the average footprint
    batch: float  # min(demand, max_num_seqs, fits)
    wanted: float  # min(demand, max_num_seqs): the batch compute alone would allow

    @property
    def memory_bound(self) -> bool:
        """The cache holds fewer requests than the demand asks for."""
        return self.batch < self.wanted - 1e-9


@dataclass(frozen=True)
class MemoryView:
    """Every setting of one pool at its demand; `bound` when memory, not compute, is the bound."""

    profile: StepTimeProfile
    demand: float  # running + waiting requests per replica
    footprint_tokens: float  # prompt + output / 2, before block rounding and lookahead
    settings: dict[str, SettingMemory]
    current: str | None  # the setting the pool runs now while speculating (None: off)
    schedule: Schedule | None = None
    preemptions_per_token: float | None = None
    recompute_seconds: float = 0.0  # engine time one preemption costs
    prompt_per_output: float = 0.0  # mean prompt tokens per generated token (0: prefill not priced)

    @property
    def bound(self) -> bool:
        off = self.settings[OFF]
        return any(s.memory_bound and s.fits < off.fits for n, s in self.settings.items() if n != OFF)

    def tokens_per_second(self, name: str, per_position: Sequence[float]) -> float:
        """Generated tokens per second per replica of setting `name` at the batch it holds, less the
        engine time of its preemptions where memory bounds it (0 when not one request fits)."""
        s = self.settings[name]
        if s.batch <= 0:
            return 0.0
        b = max(1.0, s.batch)
        r = self.prompt_per_output
        if name == OFF:
            gain = 1.0
        elif name == SCHEDULE:
            assert self.schedule is not None
            gain = schedule_speedup(self.profile, b, self.schedule, per_position, r)
        else:
            gain = speedup(self.profile, b, s.lookahead, list(per_position), r)
        tps = s.batch * gain * goodput(self.profile, b, 0, per_position, r)
        rho = self.preemptions_per_token
        if rho and s.memory_bound:
            tps /= 1 + rho * self.recompute_seconds * tps
        return tps

    def gain(self, name: str, per_position: Sequence[float]) -> float:
        """Throughput of `name` over the engine without the drafter, at the batch each holds."""
        return self.tokens_per_second(name, per_position) / self.tokens_per_second(OFF, per_position)

    def gains(self, ks: Sequence[int], per_position: Sequence[float]) -> tuple[int, float, float | None]:
        """(best K, its gain, the current setting's gain or None when off): as `GoodputPrediction` holds them."""
        by_k = {k: self.gain(setting_name(k), per_position) for k in ks}
        best = max(ks, key=lambda k: (by_k[k], -k))
        now = None if self.current is None else self.gain(self.current, per_position)
        return best, by_k[best], now

    def numbers(self, per_position: Sequence[float]) -> dict[str, str]:
        """What the decision shows (status.history, the Event)."""
        s = self.settings
        on = next((v for n, v in s.items() if n != OFF), None)
        out = {
            "memoryBound": str(self.bound).lower(),
            "demandPerReplica": f"{self.demand:.3g}",
            "requestKvTokens": f"{self.footprint_tokens:.0f}",
            "kvCacheTokens": f"off={s[OFF].capacity_tokens}({s[OFF].capacity_source})"
            + (f",on={on.capacity_tokens}({on.capacity_source})" if on else ""),
            "memoryBatch": ",".join(f"{n}={v.batch:.3g}" for n, v in s.items()),
            "memoryTokensPerSecond": ",".join(
                f"{n}={self.tokens_per_second(n, per_position):.0f}" for n in s
            ),
        }
        if self.preemptions_per_token is not None:
            out["preemptionsPerToken"] = f"{self.preemptions_per_token:.3g}"
        return out

    def why(self, k: int, per_position: Sequence[float]) -> str:
        """One sentence: why the engine without the drafter serves more (for the decision's message)."""
        off, spec = self.settings[OFF], self.settings[setting_name(k)]
        t_off, t_spec = (self.tokens_per_second(n, per_position) for n in (OFF, spec.name))
        return (
            f"memory-bound: {self.demand:.1f} requests per replica of ~{self.footprint_tokens:.0f} KV "
            f"tokens each; the KV cache holds {spec.fits} with the drafter at K {k} "
            f"({spec.capacity_tokens} tokens) against {off.fits} without ({off.capacity_tokens}): "
            f"{t_spec:.0f} against {t_off:.0f} tokens/s per replica ({t_spec / t_off:.2f}x)"
        )


def capacities(
    profile: StepTimeProfile, obs: PoolObservation
) -> tuple[tuple[int, str], tuple[int, str]] | None:
    """((tokens, source) without the drafter, (tokens, source) with it), or None when one is unknown."""
    out = []
    for measured, speculative in ((obs.kv_capacity_tokens_off, False), (obs.kv_capacity_tokens_on, True)):
        if measured is not None and measured > 0:
            out.append((measured, "measured"))
        elif profile.memory is not None:
            out.append((profile.memory.kv_tokens(speculative), "profile"))
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


def _footprint(obs: PoolObservation, capacity_now: int, lookahead_now: int) -> float | None:
    """Mean KV tokens a request holds over its life (prompt + output / 2); from the mean lengths
    measured, else from KV usage (usage x capacity / running, less the lookahead); None: unknown."""
    if obs.mean_prompt_tokens is not None and obs.mean_output_tokens is not None:
        return obs.mean_prompt_tokens + obs.mean_output_tokens / 2
    running = obs.running_per_replica
    if obs.kv_usage is not None and running is not None and running >= 1 and obs.kv_usage > 0:
        return max(1.0, obs.kv_usage * capacity_now / running - lookahead_now)
    return None


def memory_view(
    profile: StepTimeProfile,
    obs: PoolObservation,
    ks: Sequence[int],
    *,
    mode: str,
    current_k: int,
    schedule: Schedule | None = None,
    max_num_seqs: int | None = None,
) -> MemoryView | None:
    """Each setting (off, each K of `ks`, the pool's `schedule`) at the pool's demand; None when the
    demand, the request size or a capacity is not known (no memory reasoning then).

    `mode` and `current_k` say what the pool runs now (On at K `current_k`, or following `schedule`)."""
    caps = capacities(profile, obs)
    running, waiting, replicas = obs.running_per_replica, obs.waiting, obs.replicas_reporting
    if caps is None or running is None or waiting is None or replicas < 1:
        return None
    (cap_off, src_off), (cap_on, src_on) = caps
    lookahead_now = (max(k for _, _, k in schedule) if schedule else current_k) if mode == "On" else 0
    base = _footprint(obs, cap_on if mode == "On" else cap_off, lookahead_now)
    if base is None:
        return None
    demand = running + waiting / replicas
    block = (profile.memory.block_size if profile.memory else None) or DEFAULT_BLOCK_SIZE
    wanted = min(demand, float(max_num_seqs or DEFAULT_MAX_NUM_SEQS))
    rho = None
    gen = obs.generation_tokens_per_second
    if obs.preemptions_per_second is not None and gen:
        rho = obs.preemptions_per_second / gen

    def setting(name: str, lookahead: int, cap: int, src: str) -> SettingMemory:
        blocks = math.ceil((base + lookahead) / block)
        fits = (cap // block) // max(1, blocks)
        return SettingMemory(name, lookahead, cap, src, fits, min(wanted, float(fits)), wanted)

    settings = {OFF: setting(OFF, 0, cap_off, src_off)}
    for k in ks:
        settings[setting_name(k)] = setting(setting_name(k), k, cap_on, src_on)
    if schedule:
        settings[SCHEDULE] = setting(SCHEDULE, max(k for _, _, k in schedule), cap_on, src_on)
    if settings[OFF].fits < 1:
        return None  # not one request fits even without the drafter: nothing to compare
    current = None
    if mode == "On":
        current = SCHEDULE if schedule else setting_name(current_k)
        if current not in settings:
            settings[current] = setting(current, current_k, cap_on, src_on)
    recompute = base * recompute_seconds_per_token(profile)
    return MemoryView(
        profile, demand, base, settings, current, schedule, rho, recompute, obs.prompt_per_output
    )
