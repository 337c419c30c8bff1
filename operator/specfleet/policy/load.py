"""The load a change is decided for (pure): the running requests per replica measured, projected
along their recent trend to when a change decided now takes effect (`expected_load`), and the path a
flip commits the pool to over its rollout and dwell (`commit_path`). Why, in docs/policy.md.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from specfleet.api.policy import PolicySpec
from specfleet.policy.observations import PoolObservation, PoolState

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


def measured_demand(obs: PoolObservation) -> float:
    """Requests in the pool per replica measured (running + waiting); raises as `measured_load`."""
    measured_load(obs)
    return obs.demand_per_replica or 0.0


def expected_load(policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime) -> float:
    """Requests per replica (running + waiting) to decide with: the demand when a change decided now
    takes effect.

    The observed value is an average over the window, so on a ramp it trails the demand by half a
    window, and a change takes effect only after its rollout. The trend of the last evaluations
    (least squares over one window) projects the observed value over both (the rollout's duration
    is the pool's last one). A count fluctuates by about its square root (Poisson), so a projection
    within that band is noise and is dropped, as is that much of a larger one. The waiting requests
    are in it: a queue that grows is the first sign that the setting cannot serve the arrivals.
    """
    load = measured_demand(obs)
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
