"""The speculation policy: observations in, per-pool decisions out. Pure and deterministic.

Per pool, the rule (Goodput or Threshold) says what the numbers ask for; `decide` then applies the
stability gates and changes a pool only when every gate is open. There are three kinds of change:

- a **flip** (speculation On <-> Off): gated by usable observations, the pool's rollout finished,
  minimum dwell since its last flip, the deployment's cooldown since any flip, the per-pool hourly
  flip budget, and one pool of a deployment changing at a time;
- an **adjustment** that keeps the mode: a new K (Goodput), or the canaries of an Off pool scaled
  (up where a measurement could change a decision, down far past break-even). Adjustments have their own, lighter budget
  (`minRetuneIntervalSeconds` since the pool's last change, `maxRetunesPerHour`) and never spend
  dwell, cooldown or flips, so a K retune cannot delay a needed flip;
- a **revert**: a change whose rollout has not settled after `rolloutDeadlineSeconds` (a surge pod
  that finds no free GPU) is undone, with reason RolloutFailed, whatever the gates say. A revert
  counts as a flip (or an adjustment), so the same change is retried only after dwell and cooldown.

Goodput mode predicts the speedup of every K the profile measured (up to the drafter's) from the
per-position acceptance and the observed load. A speculating pool turns off only when even its best
K does not pay (below 1 - margin); when another K beats its current one by more than the margin, or
its current K no longer pays while another does, it is retuned. A pool turning on starts at the best
K; a pool turning off records the best K, which its canaries draft while it is off. A flip locks the
pool for its rollout and the dwell, so it is judged on each K's speedup averaged over that period
along the load's expected path (`commit_path`: the observed load, along its trend to the projection,
held there), not at the projected instant alone: a short spike whose trend projects past break-even
does not lock the pool off. A retune (not locked) is judged at the projected load.

K inside the engine (`decide(..., engine_schedule=True)`, where `policy.goodput.engineSchedule` and
the image allow it; see `specfleet.policy.schedule`): a speculating pool drafts up to the best K at
batch 1 under a Dynamic SD schedule made from the profile and the acceptance it turned on with, so K
follows the batch size without a rollout. Such a pool is retuned only when a new acceptance makes a
better schedule (by the retune margin at the projected load), and it turns off only once the load
measured, not only its projection, is within the margin of break-even: while the load stays up,
turning off gains at most the in-engine K 0 cost, and it locks the pool off if a spike falls back.

A window whose acceptance is still moving (`acceptance_moving`: the first position moved since the
last evaluation by more than sampling noise and by more than twice the margin of its value) averages
the acceptance before and after a shift; a change decided on that mix is followed by a second once
the window holds only the new acceptance (measured: a K retune, then a flip, two rollouts). So while
it moves, the policy judges a flip (which locks the pool) on the newest interval's acceptance
(`newest_acceptance`: the move between two overlapping windows is the newest interval's acceptance
minus the oldest's, scaled by interval/window). Retunes and canaries are still judged on the window,
and the window's measurement is what the pool remembers: a new K stops measuring deeper positions,
and a retune judged on the extrapolation was measured to churn K on held-out shifts.

Acceptance is per position and never shrinks (see `specfleet.policy.acceptance`): positions a pool
does not draft now come from memory, and positions unknown or older than
`reentry.maxAcceptanceAgeSeconds` are extrapolated, so a lowered K is raised again when load falls.

Re-entry (a pool without speculation cannot measure acceptance): the policy uses the acceptance the
pool remembers while it is younger than `reentry.maxAcceptanceAgeSeconds`. Canary replicas
(`reentry.canaryReplicas`) keep measuring it where that can change a decision: a pool turning off
near break-even keeps them (a drafter that gets better makes it pay again, and they see that long
before the memory expires; not when the load it turns off for, projected, is already far past),
far past break-even (below 1 - 2 x margin) they go down, and they come back once the pool is within
one margin of break-even again (and its projected load is not far past), once the memory expires,
or while a gate holds the flip of a pool that wants to turn on (they serve their share at the setting
it wants until the gate opens; a canary scaling is an adjustment, with its own gate). Without
canaries, or when they get no traffic for a whole window, the policy judges with the published
acceptance and, if that says speculation pays, turns the pool on to measure ("probe"; the dwell
bounds how often). A canary scaling moves replicas between the pool's two Deployments, the growing
one first (`specfleet.reconcile.hand_over`), so it costs GPU-seconds, not serving capacity.

Threshold mode compares acceptance length and running requests per replica with fixed values; any
value left unset is derived from the cost profile's break-even point (`threshold_values`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.acceptance import Estimate, estimate
from specfleet.policy.memory import MemoryView, memory_view
from specfleet.policy.observations import MeasuredAcceptance, PoolObservation, PoolState
from specfleet.policy.schedule import Schedule, best_schedule, observed_under_schedule, schedule_speedup
from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    StepTimeProfile,
    best_k,
    break_even_concurrency,
    speedup,
)

# Re-exported for callers that used the names from here (the values live in specfleet.api.reasons).
METRICS_UNAVAILABLE = r.METRICS_UNAVAILABLE
ROLLOUT_IN_PROGRESS = r.ROLLOUT_IN_PROGRESS
MIN_DWELL = r.MIN_DWELL
COOLDOWN = r.COOLDOWN
FLIP_BUDGET_EXHAUSTED = r.FLIP_BUDGET_EXHAUSTED
OTHER_POOL_FLIPPING = r.OTHER_POOL_FLIPPING
GOODPUT_RETUNE = r.GOODPUT_RETUNE


@dataclass(frozen=True)
class Wanted:
    """What the numbers ask for, before the stability gates."""

    mode: str
    reason: str
    message: str
    numbers: dict[str, str] = field(default_factory=dict)
    # K to run after a flip (Goodput: the best K; None keeps the pool's).
    k: int | None = None


@dataclass(frozen=True)
class PoolDecision:
    """The outcome for one pool: flip (to `target`), adjust (K, canaries), revert, or hold; and why."""

    pool: str
    current: str
    target: str
    flip: bool
    reason: str
    message: str
    observations: dict[str, str] = field(default_factory=dict)
    current_k: int | None = None
    target_k: int | None = None
    # Canary replicas the pool runs while off after this decision (None: unchanged).
    canary_replicas: int | None = None
    # The acceptance to remember (None: nothing new was measured in a window the policy trusts).
    acceptance: MeasuredAcceptance | None = None
    # The pool's Dynamic SD schedule after this decision (None: unchanged; empty: none).
    target_schedule: Schedule | None = None

    @property
    def changes(self) -> bool:
        """The decision rolls the pool out (a flip, a new K, canaries scaled, or a revert)."""
        return (
            self.flip
            or self.target_k is not None
            or self.canary_replicas is not None
            or self.target_schedule is not None
        )

    @property
    def adjusts(self) -> bool:
        """A change that keeps the mode (spends the adjustment budget, not a flip)."""
        return self.changes and not self.flip


# ---- shared numbers ----------------------------------------------------------------------------


def predicted_speedup(
    profile: StepTimeProfile, concurrency: float, k: int, per_position: Sequence[float]
) -> float:
    """Goodput with K drafts over no speculation, at `concurrency` running requests per engine."""
    return speedup(profile, max(1.0, concurrency), k, list(per_position))


def candidate_ks(profile: StepTimeProfile, max_k: int) -> list[int]:
    """K values the policy may choose: those the profile measured (interpolation is a guess), <= max_k."""
    return [c for c in profile.speculative_tokens if 1 <= c <= max_k] or [max_k]


# The load's trend is fitted over this many windows of past evaluations.
TREND_SPAN_WINDOWS = 1.0


def rollout_seconds(policy: PolicySpec, state: PoolState) -> float:
    """How long the pool's last rollout took (0 when unknown), capped at one window."""
    rollout = state.rollout
    if rollout is None or rollout.settled_at is None:
        return 0.0
    return min(float(policy.window_seconds), max(0.0, (rollout.settled_at - rollout.at).total_seconds()))


def measured_load(obs: PoolObservation) -> float:
    """Running requests per replica measured; raises for an observation without one (`decide` holds
    such a pool first, MetricsUnavailable): no data is never zero load."""
    problem = obs.decision_problem
    if problem is not None or obs.running_per_replica is None:
        raise ValueError(f"no decision without a measured load: {problem}")
    return obs.running_per_replica


def expected_load(policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime) -> float:
    """Running requests per replica to decide with: the load when a change decided now takes effect.

    The observed value is an average over the window, so on a ramp it trails the load by half a
    window, and a change takes effect only after its rollout. The trend of the last evaluations
    (least squares over one window) projects the observed value over both (the rollout's duration
    is the pool's last one). A running count fluctuates by about its square root (Poisson), so a
    projection within that band is noise and is dropped, as is that much of a larger one.
    """
    load = measured_load(obs)
    span = timedelta(seconds=TREND_SPAN_WINDOWS * policy.window_seconds + 1)
    points = [(t, v) for t, v in state.recent_load if timedelta(0) < now - t <= span]
    points.append((now, load))
    if len(points) < 3:
        return load
    xs = [(t - now).total_seconds() for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    fitted = my - slope * mx
    projection = slope * (policy.window_seconds / 2 + rollout_seconds(policy, state))
    band = math.sqrt(max(fitted, 1.0))
    return max(0.0, load + math.copysign(max(0.0, abs(projection) - band), projection))


# Sampling noise of a per-position acceptance, in standard errors, that a move must exceed.
MOVING_Z = 4.0


def acceptance_moving(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime
) -> str | None:
    """Why the window's acceptance is still moving (None: it is not, or nothing to compare).

    Two evaluations `evaluationIntervalSeconds` apart see windows that share all but that interval,
    so the first position's change between them is the newest interval's acceptance minus the
    oldest's, scaled by interval/window. It counts as moving when the change it implies for the
    acceptance (change x window/interval) exceeds both `MOVING_Z` standard errors of binomial
    sampling over the drafts of those two intervals and twice the Goodput margin of its value (a
    move that small changes no decision). Compared only with a memory the last evaluation wrote.
    """
    memory = state.last_acceptance
    if memory is None or not obs.per_position or obs.acceptance_length is None or not memory.per_position:
        return None
    every = float(policy.evaluation_interval_seconds)
    if now - memory.measured_at(0) > timedelta(seconds=1.5 * every):
        return None
    fraction = min(1.0, every / max(1.0, float(policy.window_seconds)))
    new, old = obs.per_position[0], memory.per_position[0]
    implied = (new - old) / fraction
    p = min(max((new + old) / 2, 0.01), 0.99)
    drafts = max(1.0, obs.drafts_in_window * fraction)
    noise = MOVING_Z * math.sqrt(2 * p * (1 - p) / drafts) / fraction
    material = 2 * _margin(policy) * max(old, new)
    if abs(implied) <= max(noise, material):
        return None
    return (
        f"first-position acceptance moved {old:.3f} -> {new:.3f} in {every:.0f}s (the window's "
        f"acceptance is still changing: {implied:+.3f} over a window)"
    )


def newest_acceptance(policy: PolicySpec, state: PoolState, obs: PoolObservation) -> tuple[float, ...]:
    """The newest interval's per-position acceptance, while the window's is moving (see the module
    docstring): the last evaluation's value plus the move scaled by window/interval, for each
    position both measured, clamped to [0, 1] and non-increasing. Exact on the first evaluation
    after a step change; later in the same window it overshoots by up to interval/window of the step."""
    memory = state.last_acceptance
    assert memory is not None
    fraction = min(1.0, policy.evaluation_interval_seconds / max(1.0, float(policy.window_seconds)))
    n = min(len(obs.per_position), len(memory.per_position))
    out: list[float] = []
    ceiling = 1.0
    for i in range(n):
        if memory.measured_at(i) != memory.measured_at(0):
            break
        old, new = memory.per_position[i], obs.per_position[i]
        value = min(ceiling, max(0.0, old + (new - old) / fraction))
        out.append(value)
        ceiling = value
    return tuple(out)


def _margin(policy: PolicySpec) -> float:
    return policy.goodput.margin_percent / 100


def _estimate(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime, length: int
) -> Estimate | None:
    return estimate(
        state,
        obs,
        now,
        window_seconds=policy.window_seconds,
        max_age_seconds=policy.reentry.max_acceptance_age_seconds,
        length=length,
    )


def _estimate_numbers(est: Estimate | None) -> dict[str, str]:
    if est is None:
        return {}
    out = {"acceptanceEstimate": ",".join(f"{p:.2f}" for p in est.per_position)}
    if est.extrapolated:
        out["extrapolatedPositions"] = str(est.extrapolated)
    return out


# ---- Threshold mode ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ThresholdValues:
    """Threshold mode's four values, as used (spec values, or derived from break-even)."""

    stop_acceptance: float
    resume_acceptance: float
    stop_concurrency: float
    resume_concurrency: float
    derived: tuple[str, ...] = ()


def threshold_values(
    policy: PolicySpec,
    k: int,
    profile: StepTimeProfile,
    acceptance: Sequence[float] | None = None,
) -> ThresholdValues:
    """Threshold mode's values: the spec's where set, else derived from the profile's break-even point.

    Acceptance: drafting K pays at batch size 1 when the acceptance length exceeds
    step(1, K) / step(1, 0); stop below that times 1 - margin, resume above it times 1 + margin.
    Concurrency: where `acceptance` (default the published one) predicts a speedup of 1 - margin
    (stop) and 1 + margin (resume) at the drafter's K (`break_even_concurrency`, which `specfleet plan`
    uses too).
    """
    t = policy.thresholds
    m = _margin(policy)
    derived: list[str] = []
    break_even = profile.step_time_ms(1, k) / profile.step_time_ms(1, 0)
    if t.stop_below_acceptance_length_milli is not None:
        stop_a = t.stop_below_acceptance_length_milli / 1000
    else:
        stop_a = break_even * (1 - m)
        derived.append("stopBelowAcceptanceLength")
    if t.resume_above_acceptance_length_milli is not None:
        resume_a = t.resume_above_acceptance_length_milli / 1000
    else:
        resume_a = max(break_even * (1 + m), stop_a + 0.01)
        derived.append("resumeAboveAcceptanceLength")
    acc = tuple(PUBLISHED_ACCEPTANCE if acceptance is None else acceptance)
    if t.stop_above_concurrency_per_replica is not None:
        stop_c = float(t.stop_above_concurrency_per_replica)
    else:
        stop_c = max(1.0, break_even_concurrency(profile, acc, [k], 1 - m))
        derived.append("stopAboveConcurrency")
    if t.resume_below_concurrency_per_replica is not None:
        resume_c = float(t.resume_below_concurrency_per_replica)
    else:
        resume_c = break_even_concurrency(profile, acc, [k], 1 + m)
        derived.append("resumeBelowConcurrency")
    resume_c = min(resume_c, stop_c * 0.9)  # a derived value never closes the hysteresis band
    return ThresholdValues(stop_a, resume_a, stop_c, resume_c, tuple(derived))


def _threshold_acceptance_length(
    est: Estimate | None, obs: PoolObservation, k: int
) -> tuple[float | None, str]:
    """Mean acceptance length at K: as measured when the window measured every position, else estimated."""
    if est is None:
        return None, "none"
    if obs.acceptance_length is not None and est.measured == len(obs.per_position) and est.measured > 0:
        return obs.acceptance_length, est.source
    return 1 + sum(est.per_position[:k]), est.source


def _threshold(
    policy: PolicySpec,
    k: int,
    state: PoolState,
    obs: PoolObservation,
    est: Estimate | None,
    profile: StepTimeProfile,
) -> Wanted:
    v = threshold_values(policy, k, profile)
    load = measured_load(obs)
    accept, source = _threshold_acceptance_length(est, obs, k)
    numbers = {
        "stopAboveConcurrency": f"{v.stop_concurrency:.0f}",
        "resumeBelowConcurrency": f"{v.resume_concurrency:.0f}",
        "stopBelowAcceptanceLength": f"{v.stop_acceptance:.2f}",
        "resumeAboveAcceptanceLength": f"{v.resume_acceptance:.2f}",
    }
    if v.derived:
        numbers["derivedFromBreakEven"] = ",".join(v.derived)
    if state.mode == "On":
        if accept is not None and accept < v.stop_acceptance:
            return Wanted(
                "Off",
                r.ACCEPTANCE_BELOW_THRESHOLD,
                f"mean acceptance length {accept:.2f} fell below {v.stop_acceptance:.2f}",
                numbers,
            )
        if load > v.stop_concurrency:
            return Wanted(
                "Off",
                r.CONCURRENCY_ABOVE_THRESHOLD,
                f"{load:.1f} running requests per replica exceed {v.stop_concurrency:.0f}",
                numbers,
            )
        return Wanted(
            "On", r.SPECULATION_PAYS, "acceptance and concurrency are inside the stop thresholds", numbers
        )
    numbers["reentryAcceptanceSource"] = source
    if load >= v.resume_concurrency:
        return Wanted(
            "Off",
            r.CONCURRENCY_STILL_HIGH,
            f"{load:.1f} running requests per replica, resume below {v.resume_concurrency:.0f}",
            numbers,
        )
    if accept is None:
        return Wanted(
            "On",
            r.PROBE_ACCEPTANCE,
            "load is low and acceptance is unknown: speculate to measure it",
            numbers,
        )
    if accept <= v.resume_acceptance:
        return Wanted(
            "Off",
            r.ACCEPTANCE_STILL_LOW,
            f"acceptance length {accept:.2f} ({source}) not above {v.resume_acceptance:.2f}",
            numbers,
        )
    return Wanted(
        "On",
        r.CONDITIONS_RECOVERED,
        f"load {load:.1f} per replica below {v.resume_concurrency:.0f} and acceptance "
        f"{accept:.2f} ({source}) above {v.resume_acceptance:.2f}",
        numbers,
    )


# ---- Goodput mode ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Goodput:
    """Goodput mode's prediction for one pool."""

    per_position: tuple[float, ...]
    source: str
    best: int
    gain_best: float
    gain_now: float | None


def _acceptance_of(est: Estimate | None) -> tuple[tuple[float, ...], str]:
    """The per-position acceptance to predict with, and where it comes from."""
    if est is None:
        # Prior: the published acceptance profile; a probe measures the real one.
        return tuple(PUBLISHED_ACCEPTANCE), "publishedPrior"
    return est.per_position, est.source


def _speedup_now(
    profile: StepTimeProfile,
    load: float,
    k_now: int,
    schedule: Schedule | None,
    per_position: Sequence[float],
) -> float:
    """The speculating pool's predicted speedup: at its K, or following its Dynamic SD schedule."""
    if schedule:
        return schedule_speedup(profile, load, schedule, per_position)
    return predicted_speedup(profile, load, k_now, per_position)


def _goodput_prediction(
    k_now: int | None,
    load: float,
    est: Estimate | None,
    profile: StepTimeProfile,
    max_k: int,
    schedule: Schedule | None = None,
) -> _Goodput:
    per_position, source = _acceptance_of(est)
    best = best_k(profile, max(1.0, load), list(per_position), candidates=candidate_ks(profile, max_k))
    gain_best = predicted_speedup(profile, load, best, per_position)
    gain_now = None if k_now is None else _speedup_now(profile, load, k_now, schedule, per_position)
    return _Goodput(per_position, source, best, gain_best, gain_now)


def _at_memory(g: _Goodput, mem: MemoryView, profile: StepTimeProfile, max_k: int) -> _Goodput:
    """The prediction as throughput at the batch each setting's KV cache holds (`policy.memory`)."""
    best, gain_best, gain_now = mem.gains(candidate_ks(profile, max_k), g.per_position)
    return replace(g, best=best, gain_best=gain_best, gain_now=gain_now)


def commit_path(policy: PolicySpec, state: PoolState, observed: float, expected: float) -> list[float]:
    """Running requests per replica over the period a flip decided now commits the pool to.

    A flip is locked for its rollout plus `minDwellSeconds`, so it pays only if speculation's
    speedup averaged over that period is past break-even, not only at the projected instant: a short
    spike's projected peak is reached, if at all, at the end of the projection's horizon (half a
    window plus the rollout), after the load has spent the rollout below it. The path is one load
    per evaluation interval: from the observed load along the trend to the projection (`expected`,
    reached at that horizon) and held there after (no extrapolation beyond the trend's horizon).
    """
    rollout = rollout_seconds(policy, state)
    horizon = max(1.0, policy.window_seconds / 2 + rollout)
    step = max(1, policy.evaluation_interval_seconds)
    n = max(1, int((rollout + policy.min_dwell_seconds) // step))
    return [observed + (expected - observed) * min(1.0, (i + 0.5) * step / horizon) for i in range(n)]


def _goodput_over(
    k_now: int | None,
    loads: Sequence[float],
    est: Estimate | None,
    profile: StepTimeProfile,
    max_k: int,
    schedule: Schedule | None = None,
) -> _Goodput:
    """Like `_goodput_prediction`, with each K's speedup averaged over a path of loads."""
    per_position, source = _acceptance_of(est)

    def mean(kk: int) -> float:
        return sum(predicted_speedup(profile, c, kk, per_position) for c in loads) / len(loads)

    ks = candidate_ks(profile, max_k)
    gains = {kk: mean(kk) for kk in ks}
    best = max(ks, key=lambda kk: (gains[kk], -kk))  # the smaller K on a tie, as best_k
    now = None
    if k_now is not None:
        now = sum(_speedup_now(profile, c, k_now, schedule, per_position) for c in loads) / len(loads)
    return _Goodput(per_position, source, best, gains[best], now)


def _goodput(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, g: _Goodput, est: Estimate | None
) -> Wanted:
    margin = _margin(policy)
    load = measured_load(obs)
    shown = g.gain_now if state.mode == "On" and g.gain_now is not None else g.gain_best
    numbers = {
        "predictedSpeedup": f"{shown:.3f}",
        "bestK": str(g.best),
        "bestKSpeedup": f"{g.gain_best:.3f}",
        "acceptanceSource": g.source,
        **_estimate_numbers(est),
    }
    if state.mode == "On" and g.gain_best < 1 - margin:
        return Wanted(
            "Off",
            r.GOODPUT_BELOW_BREAK_EVEN,
            f"predicted speedup {g.gain_best:.2f}x at the best K ({g.best}) at {load:.1f} running per "
            f"replica is below {1 - margin:.2f}",
            numbers,
            k=g.best,
        )
    if state.mode == "Off" and g.gain_best > 1 + margin:
        reason = r.PROBE_ACCEPTANCE if g.source == "publishedPrior" else r.GOODPUT_ABOVE_BREAK_EVEN
        return Wanted(
            "On",
            reason,
            f"predicted speedup {g.gain_best:.2f}x at K {g.best} at {load:.1f} running per replica is "
            f"above {1 + margin:.2f}",
            numbers,
            k=g.best,
        )
    return Wanted(
        state.mode,
        r.GOODPUT_WITHIN_MARGIN,
        f"predicted speedup {shown:.2f}x keeps the pool {state.mode} (margin {margin:.0%})",
        numbers,
    )


def _pool_k(policy: PolicySpec, state: PoolState, k: int) -> int:
    """The K the pool drafts while speculating (Goodput may have chosen one; Threshold runs the drafter's)."""
    if policy.mode == "Goodput" and state.k is not None and 1 <= state.k <= k:
        return state.k
    return k


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

    `k` is the K the pool drafts now; `max_k` (default `k`) bounds the K that Goodput may choose.
    """
    limit = max_k or k
    est = _estimate(policy, state, obs, now, limit)
    if policy.mode == "Goodput":
        load = measured_load(obs)
        g = _goodput_prediction(k if state.mode == "On" else None, load, est, profile, limit)
        return _goodput(policy, state, obs, g, est)
    return _threshold(policy, k, state, obs, est, profile)


# ---- gates -------------------------------------------------------------------------------------


def _flip_gate(
    policy: PolicySpec,
    state: PoolState,
    now: datetime,
    last_flip_any: datetime | None,
    other_pool_busy: bool,
) -> tuple[str, str] | None:
    """The first closed gate for a flip (reason, message), or None when it may proceed."""
    if not state.settled:
        return r.ROLLOUT_IN_PROGRESS, "the pool's last rollout has not finished"
    if state.last_transition is not None:
        dwell = timedelta(seconds=policy.min_dwell_seconds)
        if now - state.last_transition < dwell:
            return r.MIN_DWELL, f"the pool flipped less than {policy.min_dwell_seconds}s ago"
    if last_flip_any is not None and now - last_flip_any < timedelta(seconds=policy.cooldown_seconds):
        return r.COOLDOWN, f"a pool of this deployment flipped less than {policy.cooldown_seconds}s ago"
    hour_ago = now - timedelta(hours=1)
    if sum(1 for t in state.recent_flips if t > hour_ago) >= policy.max_flips_per_hour:
        return r.FLIP_BUDGET_EXHAUSTED, f"already {policy.max_flips_per_hour} flips in the last hour"
    if other_pool_busy:
        return r.OTHER_POOL_FLIPPING, "another pool of this deployment is changing"
    return None


def _adjust_gate(
    policy: PolicySpec, state: PoolState, now: datetime, other_pool_busy: bool
) -> tuple[str, str] | None:
    """The first closed gate for an adjustment (new K, canaries), or None when it may proceed."""
    if not state.settled:
        return r.ROLLOUT_IN_PROGRESS, "the pool's last rollout has not finished"
    last = state.last_change
    interval = policy.min_retune_interval_seconds
    if last is not None and now - last < timedelta(seconds=interval):
        return r.MIN_RETUNE_INTERVAL, f"the pool changed less than {interval}s ago"
    hour_ago = now - timedelta(hours=1)
    if sum(1 for t in state.recent_retunes if t > hour_ago) >= policy.max_retunes_per_hour:
        return (
            r.RETUNE_BUDGET_EXHAUSTED,
            f"already {policy.max_retunes_per_hour} adjustments in the last hour",
        )
    if other_pool_busy:
        return r.OTHER_POOL_FLIPPING, "another pool of this deployment is changing"
    return None


def _revert(
    policy: PolicySpec, pool: str, state: PoolState, now: datetime, k: int, numbers: dict[str, str]
) -> PoolDecision | None:
    """Undo the policy's last change when its rollout missed the deadline (None: no revert due)."""
    rollout = state.rollout
    if state.settled or rollout is None or rollout.settled_at is not None:
        return None
    if now - rollout.at <= timedelta(seconds=policy.rollout_deadline_seconds):
        return None
    if rollout.reason == r.ROLLOUT_FAILED:
        return None  # a revert that does not settle either: hold (RolloutInProgress), never ping-pong
    current_k = _pool_k(policy, state, k)
    target_k = rollout.from_k if rollout.from_k is not None else k
    canaries = rollout.from_canaries
    if canaries is None and state.canary_replicas is not None:
        canaries = policy.reentry.canary_replicas
    flip = rollout.from_mode != state.mode
    schedule = rollout.from_schedule if rollout.from_mode == "On" else None
    waited = int((now - rollout.at).total_seconds())
    message = (
        f"the change at {rollout.at:%H:%M:%S} ({rollout.reason or 'policy'}) has not finished rolling out "
        f"after {waited}s (deadline {policy.rollout_deadline_seconds}s): back to {rollout.from_mode}"
        + (f" at K {target_k}" if rollout.from_mode == "On" else "")
    )
    return PoolDecision(
        pool,
        state.mode,
        rollout.from_mode,
        flip,
        r.ROLLOUT_FAILED,
        message,
        numbers,
        current_k,
        target_k if (target_k != current_k or flip) else None,
        canaries if canaries != state.canary_replicas else None,
        target_schedule=(schedule or ()) if schedule != state.schedule else None,
    )


# ---- adjustments -------------------------------------------------------------------------------


def _retune(
    policy: PolicySpec, state: PoolState, current_k: int, wanted: Wanted, g: _Goodput | None
) -> tuple[int, str] | None:
    """A better K for a speculating Goodput pool, and why; None to keep its K."""
    if g is None or state.mode != "On" or wanted.mode != "On" or g.gain_now is None:
        return None
    if g.best == current_k:
        return None
    margin = policy.goodput.retune_margin_percent / 100
    if g.gain_now < 1 - _margin(policy):
        return g.best, (
            f"K {current_k} no longer pays ({g.gain_now:.2f}x) but K {g.best} does ({g.gain_best:.2f}x)"
        )
    if g.gain_best > g.gain_now * (1 + margin):
        return g.best, (
            f"K {g.best} predicts {g.gain_best:.2f}x against {g.gain_now:.2f}x at K {current_k} "
            f"(margin {margin:.0%})"
        )
    return None


def _retune_schedule(
    policy: PolicySpec,
    state: PoolState,
    k: int,
    wanted: Wanted,
    g: _Goodput | None,
    load: float,
    profile: StepTimeProfile,
) -> tuple[int, Schedule, str] | None:
    """A better Dynamic SD schedule for a speculating pool (K ceiling, schedule, why); None to keep it.

    The schedule follows load inside the engine, so only a new acceptance makes a better one; it is
    rolled out when it predicts more than the retune margin above the pool's now, at the expected load
    (or the pool's no longer pays while the new one does).
    """
    if g is None or state.mode != "On" or wanted.mode != "On" or g.gain_now is None:
        return None
    new = best_schedule(profile, g.per_position, k)
    top = max(kk for _, _, kk in new)
    if new == state.schedule or top == 0:
        return None
    gain_new = schedule_speedup(profile, load, new, g.per_position)
    margin = policy.goodput.retune_margin_percent / 100
    now_text = "its schedule" if state.schedule else f"K {_pool_k(policy, state, k)}"
    if g.gain_now < 1 - _margin(policy) <= gain_new:
        return (
            top,
            new,
            f"{now_text} no longer pays ({g.gain_now:.2f}x) but a new schedule does ({gain_new:.2f}x)",
        )
    if gain_new > g.gain_now * (1 + margin):
        return (
            top,
            new,
            (
                f"a schedule for the measured acceptance predicts {gain_new:.2f}x against {g.gain_now:.2f}x "
                f"for {now_text} at {load:.1f} running per replica (margin {margin:.0%})"
            ),
        )
    return None


def _settling(policy: PolicySpec, state: PoolState, now: datetime) -> bool:
    """The pool's last change has not been measured over a whole window since it settled."""
    rollout = state.rollout
    if rollout is None:
        return False
    settled = rollout.settled_at
    return settled is None or now - settled < timedelta(seconds=policy.window_seconds)


def _active_canaries(policy: PolicySpec, state: PoolState) -> int:
    spec = policy.reentry.canary_replicas
    return spec if state.canary_replicas is None else max(0, min(state.canary_replicas, spec))


def _far_past_break_even(
    policy: PolicySpec,
    k: int,
    loads: tuple[float, float],
    gains: tuple[_Goodput, _Goodput] | None,
    profile: StepTimeProfile,
    slack: float = 2.0,
    at: int = 1,
) -> str | None:
    """Why an Off pool is far past break-even (its canaries would only cost), or None when it is not.

    Goodput: the best K's speedup at the load is below 1 - slack x margin. Threshold: the load is
    above the stop value plus `slack` / 2 hysteresis bands. `at` picks the load: 1 the measured one
    (the default: a canary scaling locks nothing and costs no serving capacity, `hand_over`, so a
    trend that has not happened yet is no reason to stop measuring), 0 the projected one.
    """
    load = "measured" if at == 1 else "projected"
    if gains is not None:
        limit = 1 - slack * _margin(policy)
        g = gains[at]
        if g.gain_best < limit:
            return (
                f"predicted speedup {g.gain_best:.2f}x at the best K and the {load} load is below"
                f" {limit:.2f}: far past break-even"
            )
        return None
    v = threshold_values(policy, k, profile)
    far_load = v.stop_concurrency + slack / 2 * (v.stop_concurrency - v.resume_concurrency)
    if loads[at] > far_load:
        return f"{loads[at]:.1f} running per replica ({load}) is above {far_load:.0f}: far past break-even"
    return None


def _canary_target(
    policy: PolicySpec,
    k: int,
    state: PoolState,
    wanted: Wanted,
    loads: tuple[float, float],
    gains: tuple[_Goodput, _Goodput] | None,
    profile: StepTimeProfile,
    known: bool = True,
) -> tuple[int, str, str] | None:
    """Scale an Off pool's canaries: (replicas, reason, why), or None to keep them.

    Canaries run where a measurement can change a decision: while the remembered acceptance has
    expired (or was never measured), and while the pool is near break-even, where a drafter that got
    better would make speculation pay again. They go down once the pool is far past break-even at
    the load measured (speedup of the best K below 1 - 2 x margin; Threshold mode: load above the stop
    value plus the hysteresis band) and come back once it is within one margin of it again (the band
    between is hysteresis) while the projected load is not far past it: on a load racing away they
    would go down again once it gets there. A pool turning off keeps them unless the load measured or
    the load projected (the one the flip is decided on) is far past break-even (`_flip`). A scaling
    moves replicas between two Deployments, made before broken (`reconcile.hand_over`).
    """
    spec = policy.reentry.canary_replicas
    if spec == 0 or state.mode != "Off" or wanted.mode != "Off":
        return None
    active = _active_canaries(policy, state)
    if not known:
        # Acceptance unknown (memory expired while the canaries were down): measure it with them.
        if active < spec:
            return spec, r.CANARIES_SCALED_UP, "acceptance is unknown: the canaries measure it"
        return None
    if active > 0:
        far = _far_past_break_even(policy, k, loads, gains, profile)
        return None if far is None else (0, r.CANARIES_SCALED_DOWN, far)
    if (
        active < spec
        and _far_past_break_even(policy, k, loads, gains, profile, slack=1.0) is None
        and _far_past_break_even(policy, k, loads, gains, profile, at=0) is None
    ):
        return spec, r.CANARIES_SCALED_UP, "near break-even again: the canaries measure acceptance"
    return None


# ---- decide ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pool:
    """Everything decided about one pool before the gates."""

    pool: str
    state: PoolState
    obs: PoolObservation  # with the expected load
    current_k: int
    est: Estimate | None
    wanted: Wanted
    loads: tuple[float, float]  # (expected, observed)
    gains: tuple[_Goodput, _Goodput] | None  # Goodput: (at the expected load, at the observed load)
    numbers: dict[str, str]
    # The policy gives speculating pools Dynamic SD schedules (policy.goodput.engineSchedule).
    schedules: bool = False

    @property
    def memory(self) -> MeasuredAcceptance | None:
        return self.est.remember if self.est is not None else None

    def decision(
        self,
        reason: str,
        message: str,
        *,
        target: str | None = None,
        target_k: int | None = None,
        canaries: int | None = None,
        schedule: Schedule | None = None,
    ) -> PoolDecision:
        mode = self.state.mode
        to = target or mode
        return PoolDecision(
            self.pool,
            mode,
            to,
            to != mode,
            reason,
            message,
            self.numbers,
            self.current_k,
            target_k,
            canaries,
            self.memory,
            schedule,
        )


def _assess(
    policy: PolicySpec,
    k: int,
    pool: str,
    state: PoolState,
    observed: PoolObservation,
    now: datetime,
    profile: StepTimeProfile,
    schedules: bool = False,
) -> _Pool:
    current_k = _pool_k(policy, state, k)
    schedule = state.schedule if schedules and state.mode == "On" else None
    est = _estimate(policy, state, observed, now, k)
    # A flip is judged on the newest interval's acceptance while the window's is moving.
    est_flip = est
    moving = acceptance_moving(policy, state, observed, now) if policy.mode == "Goodput" else None
    if moving is not None and est is not None:
        newest = newest_acceptance(policy, state, observed)
        fresh = _estimate(
            policy, state, replace(observed, per_position=newest, acceptance_length=1 + sum(newest)), now, k
        )
        if fresh is not None:
            est_flip = replace(fresh, source="newestInterval", remember=est.remember)
    measured = measured_load(observed)
    load = expected_load(policy, state, observed, now)
    obs = replace(observed, running_per_replica=load)
    gains = None
    if policy.mode == "Goodput":
        g = _goodput_prediction(current_k if state.mode == "On" else None, load, est, profile, k, schedule)
        g_observed = _goodput_prediction(None, measured, est, profile, k)
        gains = (g, g_observed)
        # A flip is judged over the period it locks the pool (see `commit_path`); a retune (not
        # locked, lighter budget) and the canaries on the projected load (`gains`).
        path = commit_path(policy, state, measured, load)
        g_commit = _goodput_over(
            current_k if state.mode == "On" else None, path, est_flip, profile, k, schedule
        )
        # Where memory, not compute, is the bound: each setting's throughput at the batch it holds.
        mem = memory_view(
            profile,
            observed,
            candidate_ks(profile, k),
            mode=state.mode,
            current_k=current_k,
            schedule=schedule,
            max_num_seqs=state.max_num_seqs,
        )
        if mem is not None and mem.bound:
            g, g_observed, g_commit = (_at_memory(x, mem, profile, k) for x in (g, g_observed, g_commit))
            gains = (g, g_observed)
        wanted = _goodput(policy, state, obs, g_commit, est_flip)
        if schedule and wanted.mode == "Off" and g_observed.gain_best > 1 + _margin(policy):
            # A pool following a schedule already drafts less (or nothing) as batches grow, so turning
            # it off gains at most the in-engine K 0 cost while the load stays up, and locks it off
            # when the load falls again: it turns off once the load measured is near break-even too
            # (within the margin), not on a projected peak alone.
            wanted = Wanted(
                "On",
                r.GOODPUT_WITHIN_MARGIN,
                f"{measured:.1f} running per replica measured is not near "
                f"break-even yet ({g_observed.gain_best:.2f}x at K {g_observed.best}); the schedule "
                "drafts less as batches grow",
                wanted.numbers,
            )
        if mem is not None and mem.bound:
            why = mem.why(g_commit.best, g_commit.per_position) + "; " if wanted.mode == "Off" else ""
            shown = {**wanted.numbers, **mem.numbers(g_commit.per_position)}
            reason = r.GOODPUT_MEMORY_BOUND if why else wanted.reason
            wanted = replace(wanted, reason=reason, message=why + wanted.message, numbers=shown)
    else:
        wanted = _threshold(policy, k, state, obs, est, profile)
    numbers = {**observed.as_text(), **wanted.numbers}
    if moving is not None:
        numbers["acceptanceMoving"] = moving
    if load != measured:
        numbers["expectedRunningPerReplica"] = f"{load:.3g}"
    if (
        est is None
        and state.mode == "Off"
        and wanted.mode == "On"
        and policy.reentry.canary_replicas
        and (
            _active_canaries(policy, state) < policy.reentry.canary_replicas or _settling(policy, state, now)
        )
    ):
        # Acceptance unknown: canaries measure it (brought back up if they are down) before the pool
        # turns on to probe; the probe stays for when they cannot (no traffic in a whole window).
        wanted = Wanted(
            "Off", r.PROBE_ACCEPTANCE, "acceptance is unknown: the canaries measure it first", wanted.numbers
        )
    loads = (load, measured)
    return _Pool(pool, state, obs, current_k, est, wanted, loads, gains, numbers, schedules)


def _flip(
    policy: PolicySpec,
    k: int,
    p: _Pool,
    now: datetime,
    last_flip_any: datetime | None,
    other_busy: bool,
    profile: StepTimeProfile,
) -> PoolDecision:
    wanted = p.wanted
    gate = _flip_gate(policy, p.state, now, last_flip_any, other_busy)
    if gate is not None:
        reason, why = gate
        held = f"wants {wanted.mode} ({wanted.reason}: {wanted.message}) but holds: {why}"
        spec = policy.reentry.canary_replicas
        # Meanwhile the canaries speculate as the pool would: their share of it is served at the
        # better setting until the gate opens (an adjustment: its own gate and budget).
        canaries_up = wanted.mode == "On" and spec and _active_canaries(policy, p.state) < spec
        if canaries_up and _adjust_gate(policy, p.state, now, other_busy) is None:
            return p.decision(
                r.CANARIES_SCALED_UP, f"canaries -> {spec} while {reason}: {held}", canaries=spec
            )
        return p.decision(reason, held)
    message = wanted.message
    canaries = None
    if wanted.mode == "Off" and policy.reentry.canary_replicas:
        # Near break-even a change of acceptance decides whether the pool should speculate again, so
        # its canaries keep measuring it (they come out of the same rollout). Far past it, measured
        # or where the load this flip is decided for is heading, they would only cost; they start
        # when the remembered acceptance expires or the load comes back near.
        far = _far_past_break_even(policy, k, p.loads, p.gains, profile) or _far_past_break_even(
            policy, k, p.loads, p.gains, profile, at=0
        )
        canaries = 0 if far else policy.reentry.canary_replicas
        message += (
            "; canaries stay to measure acceptance" if not far else "; no canaries: far past break-even"
        )
    target_k = wanted.k if policy.mode == "Goodput" else None
    schedule = None
    if wanted.mode == "On" and p.schedules and p.gains is not None:
        # K follows the batch size inside the engine, from the acceptance the pool turned on with.
        schedule = best_schedule(profile, p.gains[0].per_position, k)
        top = max(kk for _, _, kk in schedule)
        if top > 0:
            target_k = top
            message += f"; K up to {top} by batch size (Dynamic SD schedule)"
        else:
            schedule = None
    return p.decision(
        wanted.reason, message, target=wanted.mode, target_k=target_k, canaries=canaries, schedule=schedule
    )


def _adjust(
    policy: PolicySpec, k: int, p: _Pool, now: datetime, other_busy: bool, profile: StepTimeProfile
) -> PoolDecision | None:
    """A retune or a canary scaling for a pool that keeps its mode; None when neither is wanted."""
    g = p.gains[0] if p.gains else None
    schedule: Schedule | None = None
    retune = None if p.schedules else _retune(policy, p.state, p.current_k, p.wanted, g)
    by_schedule = (
        _retune_schedule(policy, p.state, k, p.wanted, g, p.loads[0], profile) if p.schedules else None
    )
    if by_schedule is not None:
        top, schedule, message = by_schedule
        target_k = top if top != p.current_k else None
        what, reason = "new Dynamic SD schedule", r.GOODPUT_RETUNE
        canaries = None
    elif retune is not None:
        target_k, why = retune
        what, reason, message = f"K {p.current_k} -> {target_k}", r.GOODPUT_RETUNE, why
        canaries = None
    else:
        canary = _canary_target(
            policy, k, p.state, p.wanted, p.loads, p.gains, profile, known=p.est is not None
        )
        if canary is None:
            return None
        target_k = None
        canaries, reason, message = canary
        what = f"canaries -> {canaries}"
    gate = _adjust_gate(policy, p.state, now, other_busy)
    if gate is not None:
        held, why_held = gate
        return p.decision(held, f"wants {what} ({reason}: {message}) but holds: {why_held}")
    return p.decision(reason, f"{what}: {message}", target_k=target_k, canaries=canaries, schedule=schedule)


def decide(
    policy: PolicySpec,
    k: int,
    states: Mapping[str, PoolState],
    observations: Mapping[str, PoolObservation],
    now: datetime,
    profile: StepTimeProfile,
    engine_schedule: bool = False,
) -> list[PoolDecision]:
    """Decisions for the given (Auto) pools, in order; at most one of them changes its pool.

    `k` is the drafter's K (spec.drafter.numSpeculativeTokens), the most a pool may draft;
    `engine_schedule` lets Goodput give speculating pools Dynamic SD schedules
    (`specfleet.api.semantics.engine_schedules`; see `specfleet.policy.schedule`).
    """
    schedules = engine_schedule and policy.mode == "Goodput"
    last_flip_any = max((s.last_transition for s in states.values() if s.last_transition), default=None)
    busy = any(not s.settled for s in states.values())
    changed = False
    out: list[PoolDecision] = []
    for pool, state in states.items():
        obs = observations[pool]
        revert = _revert(policy, pool, state, now, k, obs.as_text() if obs.usable else {})
        if revert is not None:
            changed = True
            out.append(revert)
            continue
        problem = obs.decision_problem
        if problem is not None:
            out.append(PoolDecision(pool, state.mode, state.mode, False, r.METRICS_UNAVAILABLE, problem))
            continue
        p = _assess(
            policy, k, pool, state, observed_under_schedule(obs, state, schedules), now, profile, schedules
        )
        other_busy = changed or (busy and state.settled)
        if p.wanted.mode != state.mode:
            decision = _flip(policy, k, p, now, last_flip_any, other_busy, profile)
        else:
            adjusted = _adjust(policy, k, p, now, other_busy, profile)
            decision = adjusted or p.decision(p.wanted.reason, p.wanted.message)
        changed = changed or decision.changes
        out.append(decision)
    return out
