"""Acceptance drift: each Auto pool's baseline, how far below it the pool measures, and when to retrain (pure).

"Drafters are per model: when the target or the usage shifts, acceptance falls." The baseline is the
per-position median of the first `baselineSamples` windows that measured acceptance (windows that do not
overlap: samples are at least `policy.windowSeconds` apart); it is set once and
measured again only every `baselineRefreshSeconds`, and only while the pool is not drifting, so it never
follows a falling acceptance down (a median also ignores a few odd windows). Drift is the percent by
which the measured mean acceptance length is below the baseline's, both over the positions both
measured: a pool the policy retuned to a lower K drafts fewer positions, which is not drift.

Drift past `thresholdPercent` for `forSeconds` makes the AcceptanceDrift condition True and, where
`drafter.retrain` is set, asks for a retrain Job at most once per `retrain.periodSeconds` per pool. A
pool that stops measuring (turned off by the policy, no canaries) keeps its last drift: its acceptance
did not come back. Another drafter in the spec (method or model) starts a new baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from specfleet.api import reasons
from specfleet.api.conditions import ConditionStatus, rfc3339, set_condition
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import PoolStatus, SpeculativeDeploymentStatus
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.status import auto_pools, parse_time
from specfleet.policy.predict.acceptance import trusted_positions


@dataclass(frozen=True)
class RetrainTrigger:
    """A retrain Job to start for one pool, with the numbers that caused it."""

    pool: str
    at: datetime
    baseline: tuple[float, ...]
    baseline_length: float
    current_length: float
    drift_percent: float


@dataclass
class DriftRecorded:
    """The status with baselines and drift updated, the events, and the retrain Jobs to start."""

    status: SpeculativeDeploymentStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)
    retrain: list[RetrainTrigger] = field(default_factory=list)


def parse_vector(text: str | None) -> tuple[float, ...]:
    """Comma-separated per-position values from status (empty when absent or unreadable)."""
    try:
        return tuple(min(1.0, max(0.0, float(x))) for x in (text or "").split(",") if x)
    except ValueError:
        return ()


def _vector_text(values: Sequence[float]) -> str:
    return ",".join(f"{p:.3f}" for p in values)


def _samples(entries: Sequence[str] | None) -> list[tuple[str, tuple[float, ...]]]:
    out = []
    for entry in entries or ():
        when, _, values = entry.partition("=")
        vector = parse_vector(values)
        if parse_time(when) is not None and vector:
            out.append((when, vector))
    return out


def median_baseline(samples: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Per-position median over the positions every sample measured."""
    depth = min((len(s) for s in samples), default=0)
    return tuple(statistics.median(s[i] for s in samples) for i in range(depth))


def acceptance_length(per_position: Sequence[float], positions: int) -> float:
    """Mean acceptance length (tokens per step) of the first `positions` positions."""
    return 1.0 + sum(per_position[:positions])


def drift_percent(baseline: Sequence[float], current: Sequence[float]) -> float:
    """Percent by which `current` is below `baseline` over the positions both have (negative: above)."""
    n = min(len(baseline), len(current))
    base = acceptance_length(baseline, n)
    return (base - acceptance_length(current, n)) / base * 100.0


def _measured(
    state: PoolState | None, obs: PoolObservation | None, now: datetime, window: int
) -> tuple[float, ...]:
    """The positions this window measured and the policy trusts (empty: nothing measured)."""
    if state is None or obs is None or not obs.usable or obs.acceptance_length is None:
        return ()
    n = trusted_positions(state, obs, now, window)
    return tuple(min(1.0, max(0.0, p)) for p in obs.per_position[:n])


# What a new drafter resets (the last retrain is kept: its period still holds).
_BASELINE_FIELDS = (
    "acceptance_baseline",
    "acceptance_baseline_time",
    "acceptance_baseline_drafter",
    "acceptance_baseline_samples",
    "acceptance_drift_percent",
    "acceptance_drift_since",
    "acceptance_drift_positions",
    "acceptance_compared_length",
)


def _drifting_for(ps: PoolStatus, now: datetime) -> float | None:
    since = parse_time(ps.acceptance_drift_since)
    return None if since is None else (now - since).total_seconds()


def track_drift(
    spec: SpeculativeDeploymentSpec,
    status: SpeculativeDeploymentStatus,
    states: Mapping[str, PoolState],
    observations: Mapping[str, PoolObservation],
    generation: int,
    now: datetime,
) -> DriftRecorded:
    """Fold one evaluation's measurements into each Auto pool's baseline and drift; the condition."""
    config = spec.policy.acceptance_drift
    pools = status.pools.model_copy(deep=True)
    out = DriftRecorded(status=status)
    auto = auto_pools(spec)
    drafter = f"{spec.drafter.method}:{spec.drafter.model or ''}"
    for pool in auto:
        ps: PoolStatus = getattr(pools, pool)
        if ps.acceptance_baseline_drafter != drafter and (
            ps.acceptance_baseline or ps.acceptance_baseline_samples
        ):
            # Another drafter (a retrained one under a new name): its acceptance is measured afresh.
            ps = ps.model_copy(update=dict.fromkeys(_BASELINE_FIELDS))
            setattr(pools, pool, ps)
        measured = _measured(states.get(pool), observations.get(pool), now, spec.policy.window_seconds)
        if not measured:
            continue
        update: dict[str, object] = {}
        baseline = parse_vector(ps.acceptance_baseline)
        drifting = False
        if baseline:
            drift = drift_percent(baseline, measured)
            drifting = drift > config.threshold_percent
            update["acceptance_drift_percent"] = f"{drift:.1f}"
            n = min(len(baseline), len(measured))
            update["acceptance_drift_positions"] = n
            update["acceptance_compared_length"] = f"{acceptance_length(measured, n):.3f}"
            update["acceptance_drift_since"] = (
                (ps.acceptance_drift_since or rfc3339(now)) if drifting else None
            )
        set_at = parse_time(ps.acceptance_baseline_time)
        due = (
            not baseline
            or set_at is None
            or now - set_at >= timedelta(seconds=config.baseline_refresh_seconds)
        )
        kept = _samples(ps.acceptance_baseline_samples)
        last = parse_time(kept[-1][0]) if kept else None
        # Samples from windows that do not overlap: each measures other drafts.
        spaced = last is None or now - last >= timedelta(seconds=spec.policy.window_seconds)
        if due and not drifting and spaced:
            samples = [*kept, (rfc3339(now), measured)]
            samples = samples[-config.baseline_samples :]
            if len(samples) >= config.baseline_samples:
                new = median_baseline([v for _, v in samples])
                update.update(
                    acceptance_baseline=_vector_text(new),
                    acceptance_baseline_time=rfc3339(now),
                    acceptance_baseline_drafter=drafter,
                    acceptance_baseline_samples=None,
                    acceptance_drift_percent=f"{drift_percent(new, measured):.1f}",
                    acceptance_drift_positions=min(len(new), len(measured)),
                    acceptance_compared_length=f"{acceptance_length(measured, min(len(new), len(measured))):.3f}",
                    acceptance_drift_since=None,
                )
                n = len(new)
                out.events.append(
                    (
                        "Normal",
                        reasons.EVENT_ACCEPTANCE_BASELINE,
                        f"pool {pool}: acceptance baseline {acceptance_length(new, n):.2f} tokens per step "
                        f"over {n} positions (per position {_vector_text(new)}; median of {len(samples)} "
                        "measured windows)",
                    )
                )
            else:
                update["acceptance_baseline_samples"] = [f"{t}={_vector_text(v)}" for t, v in samples]
                update["acceptance_baseline_drafter"] = drafter
        elif drifting and ps.acceptance_baseline_samples:
            # A refresh never takes in a drifting acceptance: what it had collected is dropped.
            update["acceptance_baseline_samples"] = None
        setattr(pools, pool, ps.model_copy(update=update))
    out.status = status.model_copy(update={"pools": pools})
    _condition_and_retrain(spec, out, auto, observations, generation, now)
    return out


def _condition_and_retrain(
    spec: SpeculativeDeploymentSpec,
    out: DriftRecorded,
    auto: Sequence[str],
    observations: Mapping[str, PoolObservation],
    generation: int,
    now: datetime,
) -> None:
    config = spec.policy.acceptance_drift
    retrain = spec.drafter.retrain
    status = out.status
    pools = status.pools.model_copy(deep=True)
    drifted: list[str] = []
    calm: list[str] = []
    changed: list[str] = []  # the live numbers of the drifting pools, for the Event
    for pool in auto:
        ps: PoolStatus = getattr(pools, pool)
        baseline = parse_vector(ps.acceptance_baseline)
        if not baseline:
            have = len(_samples(ps.acceptance_baseline_samples))
            calm.append(f"{pool}: no baseline yet ({have}/{config.baseline_samples} measured windows)")
            continue
        try:
            drift = float(ps.acceptance_drift_percent or 0.0)
        except ValueError:
            drift = 0.0
        lasting = _drifting_for(ps, now)
        n = min(ps.acceptance_drift_positions or len(baseline), len(baseline))
        base_len = acceptance_length(baseline, n)
        try:
            cur_len = float(ps.acceptance_compared_length or "")
        except ValueError:
            cur_len = base_len * (1 - drift / 100)
        # The condition's message names only what is stable between evaluations (the baseline, the
        # threshold, since when), so the same state writes no status; the live numbers are in the pool's
        # status fields and in the Event sent when the condition changes.
        numbers = f"acceptance length {cur_len:.2f} is {drift:.1f}% below its baseline {base_len:.2f}"
        if lasting is None or lasting < config.for_seconds:
            calm.append(f"{pool}: within {config.threshold_percent}% of its baseline {base_len:.2f}")
            continue
        since = ps.acceptance_drift_since or rfc3339(now)
        drifted.append(
            f"{pool}: acceptance length more than {config.threshold_percent}% below its baseline "
            f"{base_len:.2f} since {since}"
        )
        changed.append(f"{pool}: {numbers} for {lasting:.0f} s")
        if retrain is None:
            continue
        last = parse_time(ps.last_retrain_time)
        if last is not None and now - last < timedelta(seconds=retrain.period_seconds):
            continue
        out.retrain.append(
            RetrainTrigger(
                pool=pool,
                at=now,
                baseline=baseline[:n],
                baseline_length=base_len,
                current_length=cur_len,
                drift_percent=drift,
            )
        )
        setattr(pools, pool, ps.model_copy(update={"last_retrain_time": rfc3339(now)}))
    previous = next((c for c in status.conditions if c.type == reasons.ACCEPTANCE_DRIFT), None)
    state: ConditionStatus
    if not auto:
        state, why, message = "False", reasons.NO_AUTO_POOLS, "no pool is Auto: no acceptance to watch"
    elif drifted:
        state, why, message = "True", reasons.ACCEPTANCE_BELOW_BASELINE, "; ".join(drifted + calm)
        if previous is None or previous.status != "True":
            out.events.append(("Warning", reasons.EVENT_ACCEPTANCE_DRIFT, "; ".join(changed)))
    else:
        state, why = "False", reasons.ACCEPTANCE_NEAR_BASELINE
        message = "; ".join(calm) or "no Auto pool measured acceptance yet"
        if previous is not None and previous.status == "True":
            out.events.append(("Normal", reasons.EVENT_ACCEPTANCE_RECOVERED, message))
    conditions = set_condition(
        status.conditions,
        type_=reasons.ACCEPTANCE_DRIFT,
        status=state,
        reason=why,
        message=message,
        generation=generation,
        now=now,
    )
    out.status = status.model_copy(update={"pools": pools, "conditions": conditions})
