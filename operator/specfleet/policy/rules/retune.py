"""Retunes (pure): a better K for a speculating Goodput pool (`retune_k`), or a better Dynamic SD
schedule for one whose K follows the batch size inside the engine (`retune_schedule`); both keep the
mode and pass the adjustment gate, not the flip gates. Each answers the retune's predicted throughput
over the current setting's too: a retune restarts the pool's engines, so where that rollout takes
capacity out (Replace) it must repay its dip like a flip (`policy.rules.dip`).
"""

from __future__ import annotations

from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolState, Schedule
from specfleet.policy.inputs.settings import goodput_margin, pool_k
from specfleet.policy.predict.dynamic_sd import best_schedule
from specfleet.policy.predict.throughput import SCHEDULE, PoolModel
from specfleet.policy.rules.goodput import GoodputPrediction
from specfleet.policy.rules.results import Wanted


def retune_k(
    policy: PolicySpec, state: PoolState, current_k: int, wanted: Wanted, g: GoodputPrediction | None
) -> tuple[int, str, float] | None:
    """A better K for a speculating Goodput pool, why, and its throughput over the current K's; None to
    keep its K."""
    if g is None or state.mode != "On" or wanted.mode != "On" or g.gain_now is None:
        return None
    if g.best == current_k:
        return None
    margin = policy.goodput.retune_margin_percent / 100
    over_now = g.gain_best / g.gain_now if g.gain_now > 0 else g.gain_best
    if g.gain_now < 1 - goodput_margin(policy):
        why = f"K {current_k} no longer pays ({g.gain_now:.2f}x) but K {g.best} does ({g.gain_best:.2f}x)"
        return g.best, why, over_now
    if g.gain_best > g.gain_now * (1 + margin):
        why = (
            f"K {g.best} predicts {g.gain_best:.2f}x against {g.gain_now:.2f}x at K {current_k} "
            f"(margin {margin:.0%})"
        )
        return g.best, why, over_now
    return None


def retune_schedule(
    policy: PolicySpec,
    state: PoolState,
    k: int,
    wanted: Wanted,
    g: GoodputPrediction | None,
    model: PoolModel | None,
    demand: float | None,
) -> tuple[int, Schedule, str, float] | None:
    """A better Dynamic SD schedule for a speculating pool (K ceiling, schedule, why, its throughput over
    the current setting's); None to keep it.

    The schedule follows load inside the engine, so only a new acceptance makes a better one; it is
    rolled out when it predicts more than the retune margin above the pool's now, by the pool's model
    at the demand `g` was predicted at (or the pool's no longer pays while the new one does).
    """
    if g is None or model is None or state.mode != "On" or wanted.mode != "On" or g.gain_now is None:
        return None
    new = best_schedule(model.profile, g.per_position, k)
    top = max(kk for _, _, kk in new)
    if new == state.schedule or top == 0:
        return None
    gain_new = model.with_schedule(new).gain(SCHEDULE, g.per_position, demand)
    margin = policy.goodput.retune_margin_percent / 100
    now_text = "its schedule" if state.schedule else f"K {pool_k(policy, state, k)}"
    over_now = gain_new / g.gain_now if g.gain_now > 0 else gain_new
    if g.gain_now < 1 - goodput_margin(policy) <= gain_new:
        return (
            top,
            new,
            f"{now_text} no longer pays ({g.gain_now:.2f}x) but a new schedule does ({gain_new:.2f}x)",
            over_now,
        )
    if gain_new > g.gain_now * (1 + margin):
        return (
            top,
            new,
            (
                f"a schedule for the measured acceptance predicts {gain_new:.2f}x against {g.gain_now:.2f}x "
                f"for {now_text} at {model.demand if demand is None else demand:.1f} requests per replica "
                f"(margin {margin:.0%})"
            ),
            over_now,
        )
    return None
