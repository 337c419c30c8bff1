"""The speculation policy: observations in, per-pool decisions out. Pure and deterministic.

Two steps per pool. `wanted_mode` says what the numbers ask for (Threshold or Goodput rule, with
hysteresis). `decide` then applies the stability gates, in this order, and flips only when every gate
is open: usable observations, the pool's rollout finished, minimum dwell since its last flip, the
deployment's cooldown since any flip, the per-pool flip budget for the last hour, and one pool of a
deployment changing at a time.

Goodput mode also chooses K: a speculating pool whose best K (among the profile's measured K values,
up to the drafter's) beats its current K by more than the margin is retuned to it, through the
same gates; a pool turning speculation on starts at the best K for its load.

Re-entry (a pool without speculation cannot measure acceptance): the policy uses, in order, the
acceptance of canary replicas that keep speculating (`reentry.canaryReplicas`), else the last
acceptance the pool measured while it speculated, if younger than `reentry.maxAcceptanceAgeSeconds`.
When neither exists and load is low enough, it turns speculation back on to measure ("probe"); the
dwell time then bounds how often a probe can happen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from specfleet.api.models import PolicySpec
from specfleet.policy.observations import PoolObservation, PoolState
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, StepTimeProfile, best_k, speedup

# Reasons (CamelCase, shown in status history and Events).
METRICS_UNAVAILABLE = "MetricsUnavailable"
ROLLOUT_IN_PROGRESS = "RolloutInProgress"
MIN_DWELL = "MinDwell"
COOLDOWN = "Cooldown"
FLIP_BUDGET_EXHAUSTED = "FlipBudgetExhausted"
OTHER_POOL_FLIPPING = "OtherPoolFlipping"
ACCEPTANCE_BELOW_THRESHOLD = "AcceptanceBelowThreshold"
CONCURRENCY_ABOVE_THRESHOLD = "ConcurrencyAboveThreshold"
CONDITIONS_RECOVERED = "ConditionsRecovered"
ACCEPTANCE_STILL_LOW = "AcceptanceStillLow"
CONCURRENCY_STILL_HIGH = "ConcurrencyStillHigh"
PROBE_ACCEPTANCE = "ProbeAcceptance"
SPECULATION_PAYS = "SpeculationPays"
GOODPUT_BELOW_BREAK_EVEN = "GoodputBelowBreakEven"
GOODPUT_ABOVE_BREAK_EVEN = "GoodputAboveBreakEven"
GOODPUT_WITHIN_MARGIN = "GoodputWithinMargin"
GOODPUT_RETUNE = "GoodputRetune"


@dataclass(frozen=True)
class Wanted:
    """What the numbers ask for, before the stability gates."""

    mode: str
    reason: str
    message: str
    numbers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolDecision:
    """The outcome for one pool: flip (to `target`), retune K (to `target_k`), or hold; and why."""

    pool: str
    current: str
    target: str
    flip: bool
    reason: str
    message: str
    observations: dict[str, str] = field(default_factory=dict)
    current_k: int | None = None
    target_k: int | None = None

    @property
    def changes(self) -> bool:
        """The decision rolls the pool out (a flip, or a new K while speculating)."""
        return self.flip or self.target_k is not None


def _acceptance_for_reentry(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime
) -> tuple[float | None, tuple[float, ...], str]:
    """Acceptance to judge a pool that runs without speculation: canary, else recent memory."""
    if obs.acceptance_length is not None:
        return obs.acceptance_length, obs.per_position, obs.acceptance_source or "canary"
    last = state.last_acceptance
    max_age = timedelta(seconds=policy.reentry.max_acceptance_age_seconds)
    if last is not None and now - last.at <= max_age:
        return last.acceptance_length, last.per_position, "lastMeasured"
    return None, (), "none"


def _threshold(policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime) -> Wanted:
    t = policy.thresholds
    stop_accept = t.stop_below_acceptance_length_milli / 1000
    resume_accept = t.resume_above_acceptance_length_milli / 1000
    load = obs.running_per_replica or 0.0
    if state.mode == "On":
        accept = obs.acceptance_length
        if accept is not None and accept < stop_accept:
            return Wanted(
                "Off",
                ACCEPTANCE_BELOW_THRESHOLD,
                f"mean acceptance length {accept:.2f} fell below {stop_accept:.2f}",
            )
        if load > t.stop_above_concurrency_per_replica:
            return Wanted(
                "Off",
                CONCURRENCY_ABOVE_THRESHOLD,
                f"{load:.1f} running requests per replica exceed {t.stop_above_concurrency_per_replica}",
            )
        return Wanted("On", SPECULATION_PAYS, "acceptance and concurrency are inside the stop thresholds")
    accept, _, source = _acceptance_for_reentry(policy, state, obs, now)
    numbers = {"reentryAcceptanceSource": source}
    if load >= t.resume_below_concurrency_per_replica:
        return Wanted(
            "Off",
            CONCURRENCY_STILL_HIGH,
            f"{load:.1f} running requests per replica, resume below {t.resume_below_concurrency_per_replica}",
            numbers,
        )
    if accept is None:
        return Wanted(
            "On", PROBE_ACCEPTANCE, "load is low and acceptance is unknown: speculate to measure it", numbers
        )
    if accept <= resume_accept:
        return Wanted(
            "Off",
            ACCEPTANCE_STILL_LOW,
            f"acceptance length {accept:.2f} ({source}) not above {resume_accept:.2f}",
            numbers,
        )
    return Wanted(
        "On",
        CONDITIONS_RECOVERED,
        f"load {load:.1f} per replica below {t.resume_below_concurrency_per_replica} and acceptance "
        f"{accept:.2f} ({source}) above {resume_accept:.2f}",
        numbers,
    )


def predicted_speedup(
    profile: StepTimeProfile, concurrency: float, k: int, per_position: Sequence[float]
) -> float:
    """Goodput with K drafts over no speculation, at `concurrency` running requests per engine."""
    return speedup(profile, max(1.0, concurrency), k, list(per_position))


def _goodput(
    policy: PolicySpec,
    k: int,
    state: PoolState,
    obs: PoolObservation,
    now: datetime,
    profile: StepTimeProfile,
    max_k: int,
) -> Wanted:
    margin = policy.goodput.margin_percent / 100
    load = obs.running_per_replica or 0.0
    if state.mode == "On":
        per_position, source = obs.per_position, "pool"
    else:
        _, per_position, source = _acceptance_for_reentry(policy, state, obs, now)
    if not per_position:
        if state.mode == "On":
            return Wanted("On", SPECULATION_PAYS, "no drafts in the window: nothing says speculation hurts")
        # Prior: the published acceptance profile; a probe measures the real one.
        per_position, source = PUBLISHED_ACCEPTANCE, "publishedPrior"
    # Only K values the profile measured (interpolated columns are a guess), and no more than the spec's K.
    measured = [c for c in profile.speculative_tokens if 1 <= c <= max_k] or [k]
    best = best_k(profile, max(1.0, load), list(per_position), candidates=measured)
    # Off -> On is judged at the best K (what turning on would run); On at the K the pool runs.
    gain = predicted_speedup(profile, load, best if state.mode == "Off" else k, per_position)
    numbers = {
        "predictedSpeedup": f"{gain:.3f}",
        "bestK": str(best),
        "acceptanceSource": source,
    }
    if state.mode == "On" and gain < 1 - margin:
        return Wanted(
            "Off",
            GOODPUT_BELOW_BREAK_EVEN,
            f"predicted speedup {gain:.2f}x at {load:.1f} running per replica is below {1 - margin:.2f}",
            numbers,
        )
    if state.mode == "Off" and gain > 1 + margin:
        reason = PROBE_ACCEPTANCE if source == "publishedPrior" else GOODPUT_ABOVE_BREAK_EVEN
        return Wanted(
            "On",
            reason,
            f"predicted speedup {gain:.2f}x at {load:.1f} running per replica is above {1 + margin:.2f}",
            numbers,
        )
    return Wanted(
        state.mode,
        GOODPUT_WITHIN_MARGIN,
        f"predicted speedup {gain:.2f}x keeps the pool {state.mode} (margin {margin:.0%})",
        numbers,
    )


def wanted_mode(
    policy: PolicySpec,
    k: int,
    state: PoolState,
    obs: PoolObservation,
    now: datetime,
    profile: StepTimeProfile,
    max_k: int | None = None,
) -> Wanted:
    """The mode the numbers ask for, with hysteresis, before any stability gate.

    `k` is the K the pool drafts now; `max_k` (default `k`) bounds the best K that Goodput reports.
    """
    if policy.mode == "Goodput":
        return _goodput(policy, k, state, obs, now, profile, max_k or k)
    return _threshold(policy, state, obs, now)


def _gate(
    policy: PolicySpec,
    state: PoolState,
    now: datetime,
    last_flip_any: datetime | None,
    other_pool_busy: bool,
) -> tuple[str, str] | None:
    """The first closed stability gate (reason, message), or None when a flip may proceed."""
    if not state.settled:
        return ROLLOUT_IN_PROGRESS, "the pool's last rollout has not finished"
    if state.last_transition is not None:
        dwell = timedelta(seconds=policy.min_dwell_seconds)
        if now - state.last_transition < dwell:
            return MIN_DWELL, f"the pool flipped less than {policy.min_dwell_seconds}s ago"
    if last_flip_any is not None and now - last_flip_any < timedelta(seconds=policy.cooldown_seconds):
        return COOLDOWN, f"a pool of this deployment flipped less than {policy.cooldown_seconds}s ago"
    hour_ago = now - timedelta(hours=1)
    if sum(1 for t in state.recent_flips if t > hour_ago) >= policy.max_flips_per_hour:
        return FLIP_BUDGET_EXHAUSTED, f"already {policy.max_flips_per_hour} flips in the last hour"
    if other_pool_busy:
        return OTHER_POOL_FLIPPING, "another pool of this deployment is flipping"
    return None


def decide(
    policy: PolicySpec,
    k: int,
    states: Mapping[str, PoolState],
    observations: Mapping[str, PoolObservation],
    now: datetime,
    profile: StepTimeProfile,
) -> list[PoolDecision]:
    """Decisions for the given (Auto) pools, in order; at most one of them flips."""
    flips = [t for s in states.values() for t in s.recent_flips]
    last_flip_any = max(flips, default=None)
    busy = any(not s.settled for s in states.values())
    changed = False
    out: list[PoolDecision] = []
    for pool, state in states.items():
        obs = observations[pool]
        current_k = state.k or k
        if not obs.usable:
            out.append(
                PoolDecision(pool, state.mode, state.mode, False, METRICS_UNAVAILABLE, obs.problem or "")
            )
            continue
        wanted = wanted_mode(policy, current_k, state, obs, now, profile, max_k=k)
        numbers = {**obs.as_text(), **wanted.numbers}
        retune = _retune(policy, state, obs, current_k, wanted, profile)
        if wanted.mode == state.mode and retune is None:
            out.append(
                PoolDecision(
                    pool, state.mode, state.mode, False, wanted.reason, wanted.message, numbers, current_k
                )
            )
            continue
        what = f"K {current_k} -> {retune}" if wanted.mode == state.mode else wanted.mode
        gate = _gate(policy, state, now, last_flip_any, changed or (busy and state.settled))
        if gate is not None:
            reason, why = gate
            message = f"wants {what} ({wanted.reason}: {wanted.message}) but holds: {why}"
            out.append(PoolDecision(pool, state.mode, state.mode, False, reason, message, numbers, current_k))
            continue
        changed = True
        if wanted.mode == state.mode:
            message = f"K {current_k} -> {retune}: {wanted.message}"
            out.append(
                PoolDecision(
                    pool, state.mode, state.mode, False, GOODPUT_RETUNE, message, numbers, current_k, retune
                )
            )
            continue
        # Turning speculation on in Goodput mode starts at the best K for the load.
        start_k = int(numbers["bestK"]) if wanted.mode == "On" and "bestK" in numbers else None
        out.append(
            PoolDecision(
                pool,
                state.mode,
                wanted.mode,
                True,
                wanted.reason,
                wanted.message,
                numbers,
                current_k,
                start_k,
            )
        )
    return out


def _retune(
    policy: PolicySpec,
    state: PoolState,
    obs: PoolObservation,
    current_k: int,
    wanted: Wanted,
    profile: StepTimeProfile,
) -> int | None:
    """A better K for a speculating Goodput pool, if it beats the current K by more than the margin."""
    if policy.mode != "Goodput" or state.mode != "On" or wanted.mode != "On" or not obs.per_position:
        return None
    best = int(wanted.numbers.get("bestK", current_k))
    if best == current_k:
        return None
    load = obs.running_per_replica or 0.0
    gain_best = predicted_speedup(profile, load, best, obs.per_position)
    gain_now = predicted_speedup(profile, load, current_k, obs.per_position)
    margin = policy.goodput.margin_percent / 100
    return best if gain_best > gain_now * (1 + margin) else None
