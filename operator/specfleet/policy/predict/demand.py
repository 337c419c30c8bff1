"""The load a change is decided for (pure): the running requests per replica measured, projected
along their recent trend to when a change decided now takes effect (`expected_load`), and the path a
flip commits the pool to over its rollout and dwell (`commit_path`). Why, in docs/policy.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.predict.rollout_time import RolloutTime

# The load's trend is fitted over this many windows of past evaluations.
TREND_SPAN_WINDOWS = 1.0
# A fitted slope within this many standard errors of zero is not told apart from noise.
TREND_SIGNIFICANCE = 2.0


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


def expected_load(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime, rollout: RolloutTime
) -> float:
    """Requests per replica (running + waiting) to decide with: the demand when a change decided now
    takes effect.

    The observed value is an average over the window, so on a ramp it trails the demand by half a
    window, and a change takes effect only after its rollout. The trend of the last evaluations
    (least squares over one window, `demand_trend`) projects the observed value over both
    (`rollout_horizon`). The pool's count fluctuates by about its square root (Poisson), so a
    projection within that band (per replica: sqrt(count) / replicas) is noise and is dropped, as is
    that much of a larger one. The waiting requests
    are in it: a queue that grows is the first sign that the setting cannot serve the arrivals.
    """
    load = measured_demand(obs)
    trend = demand_trend(policy, state, obs, now)
    if trend is None:
        return load
    slope, fitted = trend
    projection = slope * rollout_horizon(policy, rollout)
    band = demand_band(fitted, obs.replicas_reporting)
    return max(0.0, load + math.copysign(max(0.0, abs(projection) - band), projection))


def demand_band(per_replica: float, replicas: int) -> float:
    """The demand's own noise per replica: the pool's count of requests is Poisson, so it fluctuates by
    about its square root (at least one request's worth), sqrt(count) / replicas."""
    return math.sqrt(max(per_replica, 1.0) / max(1, replicas))


def demand_trend(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime
) -> tuple[float, float] | None:
    """The demand's trend (requests per replica per second) and its fitted value now: least squares
    over the last window of evaluations (None: fewer than three points)."""
    fit = demand_fit(policy, state, obs, now)
    return None if fit is None else (fit.slope, fit.fitted)


@dataclass(frozen=True)
class TrendFit:
    """A least-squares line over the last window of evaluations: the demand's (requests per replica)
    or the served tokens' (tokens per second per replica)."""

    slope: float  # per second
    fitted: float  # the line's value now
    stderr: float  # the slope's standard error, from the residuals
    span: float  # seconds from the oldest point to now

    def significant(self, policy: PolicySpec) -> bool:
        """A rise told apart from noise: fitted over (nearly) a whole window, so not over a pool's
        first, filling window, and more than `TREND_SIGNIFICANCE` standard errors above zero."""
        whole = self.span >= policy.window_seconds - policy.evaluation_interval_seconds
        return whole and self.slope > TREND_SIGNIFICANCE * self.stderr

    def falling(self, policy: PolicySpec) -> bool:
        """A fall told apart from noise, as `significant` a rise."""
        whole = self.span >= policy.window_seconds - policy.evaluation_interval_seconds
        return whole and -self.slope > TREND_SIGNIFICANCE * self.stderr

    def ahead(self, policy: PolicySpec, seconds: float) -> float:
        """The line's value `seconds` from now with its slope one standard error nearer zero (a rise
        or a fall only as steep as the noise allows), or the fitted value where the trend is not told
        apart from noise."""
        if self.significant(policy):
            return self.fitted + (self.slope - self.stderr) * seconds
        if self.falling(policy):
            return max(0.0, self.fitted + (self.slope + self.stderr) * seconds)
        return self.fitted


def demand_fit(policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime) -> TrendFit | None:
    """`demand_trend` with the slope's standard error and the span of the points (None: fewer than
    three points)."""
    return _line_fit(policy, state.recent_load, now, measured_demand(obs))


def served_fit(policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime) -> TrendFit | None:
    """The generated tokens per second per replica served, fitted over the last window of
    evaluations as `demand_fit` (None: not measured, or fewer than three points). Along a ramp below
    the pool's capacity what is served is what arrives, half a window late. None too over a window
    an engine's series began in (`PoolObservation.whole_window`): its rate counts part of the window,
    so it rises over the next ones with no rise in what arrives (such windows are not recorded either,
    `policy.decision.record`)."""
    gen = obs.generation_tokens_per_second
    if gen is None or obs.replicas_reporting < 1 or not obs.whole_window:
        return None
    return _line_fit(policy, state.recent_tokens_per_second, now, gen / obs.replicas_reporting)


def _line_fit(
    policy: PolicySpec, recent: tuple[tuple[datetime, float], ...], now: datetime, value: float
) -> TrendFit | None:
    """The least-squares line through the samples of the last window and `value` now."""
    span = timedelta(seconds=TREND_SPAN_WINDOWS * policy.window_seconds + 1)
    points = [(t, v) for t, v in recent if timedelta(0) < now - t <= span]
    points.append((now, value))
    if len(points) < 3:
        return None
    xs = [(t - now).total_seconds() for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    fitted = my - slope * mx
    residuals = sum((y - fitted - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return TrendFit(slope, fitted, math.sqrt(residuals / (len(xs) - 2) / sxx), -min(xs))


def rollout_horizon(policy: PolicySpec, rollout: RolloutTime) -> float:
    """Seconds from the middle of the window measured to when a change decided now serves: half a
    window, then until the average engine runs the new setting (`RolloutTime.mean_switch_seconds`),
    at most one window (a trend is not extrapolated further than it was fitted over)."""
    return policy.window_seconds / 2 + min(float(policy.window_seconds), rollout.mean_switch_seconds)


def commit_path(policy: PolicySpec, rollout: RolloutTime, observed: float, expected: float) -> list[float]:
    """Running requests per replica over the period a flip decided now commits the pool to.

    A flip is locked for its rollout plus `minDwellSeconds`, so it pays only if speculation's
    speedup averaged over that period is past break-even, not only at the projected instant: a short
    spike's projected peak is reached, if at all, at the end of the projection's horizon (half a
    window plus the rollout), after the load has spent the rollout below it. The path is one load
    per evaluation interval: from the observed load along the trend to the projection (`expected`,
    reached at that horizon) and held there after (no extrapolation beyond the trend's horizon).
    """
    horizon = max(1.0, rollout_horizon(policy, rollout))
    step = max(1, policy.evaluation_interval_seconds)
    n = max(1, int((min(float(policy.window_seconds), rollout.seconds) + policy.min_dwell_seconds) // step))
    return [observed + (expected - observed) * min(1.0, (i + 0.5) * step / horizon) for i in range(n)]
