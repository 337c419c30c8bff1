"""What Threshold mode asks for (pure): acceptance length and running requests per replica compared
with fixed values, each one the spec leaves unset derived from the cost profile's break-even point
(`threshold_values`, which `specfleet plan` and the alert rules use too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.predict.acceptance import Estimate
from specfleet.policy.predict.demand import measured_load
from specfleet.policy.rules.results import Wanted
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, StepTimeProfile, break_even_concurrency


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
    m = goodput_margin(policy)
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


def threshold_wanted(
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
                f"{load:.1f} running requests per replica expected (running + waiting, projected) exceed "
                f"{v.stop_concurrency:.0f}",
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
            f"{load:.1f} running requests per replica expected, resume below {v.resume_concurrency:.0f}",
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
