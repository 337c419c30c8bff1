"""Canaries (pure): how many canary replicas an Off pool runs to keep measuring acceptance where a
measurement could change a decision (near break-even, or the remembered acceptance expired), and when
it is far enough past break-even, or they cost the pool enough, that they would only cost. The rules
are in docs/policy.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolState
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.rules.goodput import GoodputPrediction
from specfleet.policy.rules.results import Wanted
from specfleet.policy.rules.threshold import threshold_values
from specfleet_runtime.cost_profile import StepTimeProfile


def settling(policy: PolicySpec, state: PoolState, now: datetime) -> bool:
    """The pool's last change has not been measured over a whole window since it settled."""
    rollout = state.rollout
    if rollout is None:
        return False
    settled = rollout.settled_at
    return settled is None or now - settled < timedelta(seconds=policy.window_seconds)


def active_canaries(policy: PolicySpec, state: PoolState) -> int:
    spec = policy.reentry.canary_replicas
    return spec if state.canary_replicas is None else max(0, min(state.canary_replicas, spec))


def canary_share(policy: PolicySpec, state: PoolState) -> float | None:
    """The share of the pool's replicas (so of its requests) its canaries serve when they run, or None
    where the pool's replicas are not declared (autoscaled)."""
    if state.replicas is None or state.replicas < 1:
        return None
    return min(1.0, policy.reentry.canary_replicas / state.replicas)


# Canaries may cost the pool this share of the margin per unit of slack: at the default slack of two,
# half the margin (the least gain a flip must predict), so measuring whether to flip costs less than
# half what a flip would have to win.
CANARY_COST_OF_MARGIN = 0.25


def far_past_break_even(
    policy: PolicySpec,
    k: int,
    loads: tuple[float, float],
    gains: tuple[GoodputPrediction, GoodputPrediction] | None,
    profile: StepTimeProfile,
    slack: float = 2.0,
    at: int = 1,
    share: float | None = None,
) -> str | None:
    """Why an Off pool is far past break-even (its canaries would only cost), or None when it is not.

    Goodput: the best K's speedup at the load is below 1 - slack x margin, or what the canaries would
    cost the pool, their `share` of its requests times the speedup's shortfall below 1, is above
    `CANARY_COST_OF_MARGIN` x slack x margin (one canary of three at 0.91x costs the pool 3%: more
    than half the 5% margin, though 0.91x is within two margins of break-even). Threshold: the load is
    above the stop value plus `slack` / 2 hysteresis bands. `at` picks the load: 1 the measured one
    (the default: a canary scaling locks nothing and costs no serving capacity, `hand_over`, so a
    trend that has not happened yet is no reason to stop measuring), 0 the projected one.
    """
    load = "measured" if at == 1 else "projected"
    if gains is not None:
        margin = goodput_margin(policy)
        limit = 1 - slack * margin
        g = gains[at]
        if g.gain_best < limit:
            return (
                f"predicted speedup {g.gain_best:.2f}x at the best K and the {load} load is below"
                f" {limit:.2f}: far past break-even"
            )
        budget = CANARY_COST_OF_MARGIN * slack * margin
        if share is not None and share * (1 - g.gain_best) > budget:
            return (
                f"predicted speedup {g.gain_best:.2f}x at the best K and the {load} load: the canaries "
                f"would serve {share:.0%} of the pool's requests that much slower, costing it "
                f"{share * (1 - g.gain_best):.1%}, more than {budget:.1%}"
            )
        return None
    v = threshold_values(policy, k, profile)
    far_load = v.stop_concurrency + slack / 2 * (v.stop_concurrency - v.resume_concurrency)
    if loads[at] > far_load:
        return f"{loads[at]:.1f} running per replica ({load}) is above {far_load:.0f}: far past break-even"
    return None


def canary_target(
    policy: PolicySpec,
    k: int,
    state: PoolState,
    wanted: Wanted,
    loads: tuple[float, float],
    gains: tuple[GoodputPrediction, GoodputPrediction] | None,
    profile: StepTimeProfile,
    now: datetime,
    known: bool = True,
) -> tuple[int, str, str] | None:
    """Scale an Off pool's canaries: (replicas, reason, why), or None to keep them.

    Up while the acceptance is unknown, or once the pool is within one margin of break-even (and the
    projected load is not far past it); down once it is far past break-even at the load measured, or
    once they have measured a whole window and would cost the pool more than half the margin. The
    band between is hysteresis (docs/policy.md, "Re-entry and canaries").
    """
    spec = policy.reentry.canary_replicas
    if spec == 0 or state.mode != "Off" or wanted.mode != "Off":
        return None
    active = active_canaries(policy, state)
    if not known:
        # Acceptance unknown (memory expired while the canaries were down): measure it with them.
        if active < spec:
            return spec, r.CANARIES_SCALED_UP, "acceptance is unknown: the canaries measure it"
        return None
    if wanted.reason in r.SLO_REASONS:
        # The SLO holds the pool off: canaries would serve part of its requests with the drafter.
        return (
            (0, r.CANARIES_SCALED_DOWN, "the SLO holds the pool off: " + wanted.message) if active else None
        )
    share = canary_share(policy, state)
    if active > 0:
        # What they cost is judged once they have measured: canaries that came up (near break-even,
        # or to measure an acceptance unknown) keep one whole window after their rollout settles.
        judged = None if settling(policy, state, now) else share
        far = far_past_break_even(policy, k, loads, gains, profile, share=judged)
        return None if far is None else (0, r.CANARIES_SCALED_DOWN, far)
    if (
        active < spec
        and far_past_break_even(policy, k, loads, gains, profile, slack=1.0, share=share) is None
        and far_past_break_even(policy, k, loads, gains, profile, at=0, share=share) is None
    ):
        return spec, r.CANARIES_SCALED_UP, "near break-even again: the canaries measure acceptance"
    return None
