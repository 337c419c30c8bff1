"""Per-position acceptance the policy can trust (pure): measured in the window, remembered (memory
never shrinks; deeper positions rescaled), or extrapolated where unknown or too old (`estimate`), and
whether the window's acceptance is still moving after a shift (`acceptance_moving`,
`newest_acceptance`). The rules and their reasons are in docs/policy.md ("Acceptance memory").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from specfleet.api.fields import MAX_SPECULATIVE_TOKENS
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import MeasuredAcceptance, PoolObservation, PoolState
from specfleet.policy.inputs.settings import goodput_margin

# The most positions remembered (the API's largest K).
MAX_POSITIONS = MAX_SPECULATIVE_TOKENS


@dataclass(frozen=True)
class Estimate:
    """The per-position acceptance to decide with, and where it came from."""

    per_position: tuple[float, ...]
    # "pool", "canary" (measured in the window), "lastMeasured" (memory only).
    source: str
    # Positions taken from this window's measurement.
    measured: int
    # Positions extrapolated (never measured, or measured too long ago).
    extrapolated: int
    # What to remember after this evaluation (None: nothing new was measured).
    remember: MeasuredAcceptance | None = None


def trusted_positions(state: PoolState, obs: PoolObservation, now: datetime, window_seconds: int) -> int:
    """How many leading positions of the observation measure acceptance (see docs/policy.md)."""
    n = len(obs.per_position) if obs.acceptance_length is not None else 0
    rollout = state.rollout
    if n == 0 or rollout is None:
        return n
    clean = rollout.settled_at is not None and now - rollout.settled_at >= timedelta(seconds=window_seconds)
    if clean:
        return n
    for drafted in (rollout.drafted_before, rollout.drafted_after):
        if drafted > 0:
            n = min(n, drafted)
    return n


def merge(
    memory: MeasuredAcceptance | None,
    measured: Sequence[float],
    now: datetime,
    acceptance_length: float,
) -> MeasuredAcceptance:
    """The memory after a measurement of the first `len(measured)` positions (never shorter)."""
    n = len(measured)
    values = [min(1.0, max(0.0, float(p))) for p in measured]
    times = [now] * n
    if memory is not None and len(memory.per_position) > n:
        old = memory.per_position[:MAX_POSITIONS]
        scale = values[-1] / old[n - 1] if n and old[n - 1] > 0 else (1.0 if n == 0 else 0.0)
        ceiling = values[-1] if n else 1.0
        for i in range(n, len(old)):
            values.append(min(ceiling, old[i] * scale))
            times.append(memory.measured_at(i))
            ceiling = values[-1]
    return MeasuredAcceptance(acceptance_length, tuple(values), now, tuple(times))


def extend(values: Sequence[float], length: int) -> tuple[float, ...]:
    """`values` continued to `length` positions with their last conditional acceptance."""
    out = [min(1.0, max(0.0, float(p))) for p in values[:length]]
    if not out:
        return ()
    ratio = out[-1] / out[-2] if len(out) >= 2 and out[-2] > 0 else out[0]
    ratio = min(1.0, max(0.0, ratio))
    while len(out) < length:
        out.append(out[-1] * ratio)
    return tuple(out)


def estimate(
    state: PoolState,
    obs: PoolObservation,
    now: datetime,
    *,
    window_seconds: int,
    max_age_seconds: int,
    length: int,
) -> Estimate | None:
    """Acceptance for `length` positions from this window and the memory; None when nothing is fresh."""
    n = min(trusted_positions(state, obs, now, window_seconds), length)
    memory = state.last_acceptance
    remember = None
    if n > 0:
        source = obs.acceptance_source or "pool"
        remember = merge(memory, obs.per_position[:n], now, obs.acceptance_length or 1.0)
        known = remember
    elif memory is not None:
        source = "lastMeasured"
        known = memory
    else:
        return None
    max_age = timedelta(seconds=max_age_seconds)
    fresh: list[float] = []
    for i, p in enumerate(known.per_position[:length]):
        if now - known.measured_at(i) > max_age:
            break
        fresh.append(p)
    if not fresh:
        return None
    per_position = extend(fresh, length)
    return Estimate(
        per_position=per_position,
        source=source,
        measured=min(n, length),
        extrapolated=max(0, length - len(fresh)),
        remember=remember,
    )


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
    material = 2 * goodput_margin(policy) * max(old, new)
    if abs(implied) <= max(noise, material):
        return None
    return (
        f"first-position acceptance moved {old:.3f} -> {new:.3f} in {every:.0f}s (the window's "
        f"acceptance is still changing: {implied:+.3f} over a window)"
    )


def newest_acceptance(policy: PolicySpec, state: PoolState, obs: PoolObservation) -> tuple[float, ...]:
    """The newest interval's per-position acceptance, while the window's is moving (see
    docs/policy.md): the last evaluation's value plus the move scaled by window/interval, for each
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


def estimate_for(
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
