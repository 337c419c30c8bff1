"""Decisions and observations written back to status (pure): the flipped pool's mode, a bounded
history entry with the numbers behind it, the MetricsAvailable condition and the Events to emit
(`record`). `policy.inputs.status` reads it back at the next evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from specfleet.api import reasons
from specfleet.api.conditions import ConditionStatus, rfc3339, set_condition
from specfleet.api.constants import POOLS
from specfleet.api.fields import MAX_CHANGES_PER_HOUR
from specfleet.api.status import (
    Condition,
    Decision,
    PoolRollout,
    PoolStatus,
    PoolStatuses,
    RealizedCheck,
    SpeculativeDeploymentStatus,
)
from specfleet.policy.decision.realized import with_realized_changes
from specfleet.policy.inputs.observation import (
    MeasuredAcceptance,
    PoolObservation,
    RealizedRecord,
    Schedule,
)
from specfleet.policy.inputs.scraping import (
    ScrapeSetup,
    not_scraping,
    not_scraping_message,
    unscraped_evaluations,
)
from specfleet.policy.inputs.slo_attainment import SloAttainment
from specfleet.policy.inputs.status import parse_time, schedule_ranges, schedule_rows
from specfleet.policy.predict.dynamic_sd import drafted_by
from specfleet.policy.rules.results import PoolDecision

HISTORY_LIMIT = 20
# Loads kept for the trend: the last few evaluations within this long.
LOAD_SAMPLES = 8
LOAD_MEMORY = timedelta(minutes=10)


@dataclass
class Recorded:
    """The new status and what to tell the world about it."""

    status: SpeculativeDeploymentStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    flipped: list[PoolDecision] = field(default_factory=list)


def _rows_text(schedule: Schedule | None) -> str:
    """A schedule as batch ranges and K (`1-52:3,53-171:1,172-65536:0`; `none`)."""
    return ",".join(f"{a}-{b}:{k}" for a, b, k in schedule) if schedule else "none"


def _numbers(decision: PoolDecision) -> str:
    keys = (
        "acceptanceLength",
        "runningPerReplica",
        "expectedRunningPerReplica",
        "predictedSpeedup",
        "acceptanceSource",
        # Memory-bound decisions (`specfleet.policy.predict.kv_cache`).
        "demandPerReplica",
        "kvCacheTokens",
        "memoryBatch",
        "memoryTokensPerSecond",
    )
    shown = [f"{k}={decision.observations[k]}" for k in keys if k in decision.observations]
    return f" [{', '.join(shown)}]" if shown else ""


def _drafted(mode: str, k: int | None, canaries: int | None, schedule: Schedule | None = None) -> int:
    """Fewest positions any speculating engine drafts in this state (0: none speculates).

    Canaries (while the pool is off) draft the pool's K; `canaries` None means the spec's count. A
    pool following a Dynamic SD schedule drafts its smallest K above 0 in some steps.
    """
    if mode == "On" and schedule:
        return drafted_by(schedule, k or 0)
    if mode == "On" or canaries is None or canaries > 0:
        return k or 0
    return 0


def _recent(times: Sequence[str] | None, now: datetime) -> list[str]:
    """`times` within the last hour, plus now, at most as many as the hourly budgets allow."""
    hour_ago = now - timedelta(hours=1)
    kept = [t for t in times or [] if (p := parse_time(t)) is not None and p > hour_ago]
    return [*kept, rfc3339(now)][-MAX_CHANGES_PER_HOUR:]


def _within(entry: str, now: datetime) -> bool:
    """A trend sample ('RFC3339=value') taken within `LOAD_MEMORY` of now."""
    t = parse_time(entry.partition("=")[0])
    return t is not None and now - t <= LOAD_MEMORY


def _with_measurements(ps: PoolStatus, obs: PoolObservation, now: datetime) -> PoolStatus:
    """The pool's status with this evaluation's load (and its trend's samples) and throughput."""
    update: dict[str, object] = {}
    if obs.running_per_replica is not None:
        update["running_per_replica"] = f"{obs.running_per_replica:.3g}"
        kept = [e for e in ps.recent_load or [] if _within(e, now)]
        # Every evaluation's demand (running + waiting per replica): the trend needs them all (sparser
        # samples measurably delayed the down-ramp decision on the fleet simulator), at the cost of one
        # status write per evaluation; a queue that grows is the first sign of an overloaded setting.
        demand = obs.demand_per_replica or 0.0
        update["recent_load"] = [*kept, f"{rfc3339(now)}={demand:.4g}"][-LOAD_SAMPLES:]
    if obs.generation_tokens_per_second is not None:
        update["generation_tokens_per_second"] = f"{obs.generation_tokens_per_second:.4g}"
        if obs.replicas_reporting >= 1 and obs.whole_window:
            # Served tokens per replica, for the arrivals' trend (`policy.rules.load_guards`): a rate
            # rises along a ramp where the requests in the engines curve up as they near a capacity.
            # Not over a window an engine's series began in: its rate counts only part of the window,
            # and the windows after it would read as a rise.
            served = obs.generation_tokens_per_second / obs.replicas_reporting
            recent = [e for e in ps.recent_tokens_per_second or [] if _within(e, now)]
            update["recent_tokens_per_second"] = [*recent, f"{rfc3339(now)}={served:.4g}"][-LOAD_SAMPLES:]
    return ps.model_copy(update=update)


def _percent_text(share: float | None) -> str | None:
    """A share (0..1) as a percent rounded down to 0.1, so 99.96% never reads as 100.0."""
    return None if share is None else f"{math.floor(share * 1000 + 1e-9) / 10:.1f}"


def _with_attainment(ps: PoolStatus, measured: SloAttainment | None) -> PoolStatus:
    """The pool's status with its SLO attainment over this window (None: no SLO; unmeasured shares are
    cleared, never left over from an older window)."""
    measured = measured or SloAttainment()
    update = {
        "slo_attainment_percent": _percent_text(measured.attainment),
        "ttft_attainment_percent": _percent_text(measured.ttft),
        "tpot_attainment_percent": _percent_text(measured.tpot),
    }
    return ps.model_copy(update=update)


def _with_settled_rollout(ps: PoolStatus, now: datetime) -> PoolStatus | None:
    """The pool's status with its rollout's settle time, once the pool reads settled (None: no change)."""
    if ps.rollout is not None and ps.rollout.settled_time is None and ps.settled:
        rollout = ps.rollout.model_copy(update={"settled_time": rfc3339(now)})
        return ps.model_copy(update={"rollout": rollout})
    return None


def _with_realized_check(ps: PoolStatus, check: RealizedRecord) -> PoolStatus:
    """The pool's status with the policy's new check of its prediction (`policy.rules.realized_guard`)."""

    def text(value: float | None) -> str | None:
        return None if value is None else f"{value:.3f}"

    realized = RealizedCheck(
        sampled_at=rfc3339(check.sampled_at),
        off_ratio=text(check.off_ratio),
        on_ratio=text(check.on_ratio),
        realized_over_predicted=text(check.realized_over_predicted),
        below_windows=check.below_windows,
        shortfall=text(check.shortfall),
    )
    return ps.model_copy(update={"realized_check": realized})


def _with_acceptance(ps: PoolStatus, memory: MeasuredAcceptance) -> PoolStatus:
    """The pool's status remembering the acceptance the policy measured."""
    update = {
        "acceptance_length": f"{memory.acceptance_length:.2f}",
        "per_position_acceptance": ",".join(f"{p:.3f}" for p in memory.per_position),
        "acceptance_measured_at": rfc3339(memory.at),
        "per_position_measured_at": [rfc3339(memory.measured_at(i)) for i in range(len(memory.per_position))],
    }
    return ps.model_copy(update=update)


@dataclass(frozen=True)
class _Change:
    """A change applied to a pool's status, and what the history entry and the Event show of it."""

    status: PoolStatus
    numbers: dict[str, str]
    schedule_before: Schedule | None
    schedule_after: Schedule | None


def _with_change(ps: PoolStatus, decision: PoolDecision, now: datetime) -> _Change:
    """The pool's status after a decision that changes it: mode, K, schedule, canaries, the budgets
    it spends and the rollout to watch (what to revert to, what each side drafts)."""
    change: dict[str, object] = {
        "speculation": decision.target,
        "reason": decision.reason,
        "message": decision.message,
        "settled": False,
    }
    numbers = dict(decision.observations)
    if decision.flip:
        change["last_transition_time"] = rfc3339(now)
        change["recent_flip_times"] = _recent(ps.recent_flip_times, now)
        # Canaries start again at the spec's count on every flip (the pool is near break-even).
        change["canary_replicas"] = None
    else:
        change["last_retune_time"] = rfc3339(now)
        change["recent_retune_times"] = _recent(ps.recent_retune_times, now)
    if decision.target_k is not None:
        change["num_speculative_tokens"] = decision.target_k
        numbers["numSpeculativeTokens"] = f"{decision.current_k}->{decision.target_k}"
    after_schedule = ps_schedule = schedule_rows(ps.dynamic_schedule)
    if decision.target == "Off" and not decision.in_place:
        after_schedule = None
    elif decision.target_schedule is not None:
        after_schedule = decision.target_schedule or None
    if after_schedule != ps_schedule:
        change["dynamic_schedule"] = schedule_ranges(after_schedule)
        numbers["dynamicSchedule"] = f"{_rows_text(ps_schedule)}->{_rows_text(after_schedule)}"
    if decision.canary_replicas is not None:
        change["canary_replicas"] = decision.canary_replicas
        before = "spec" if ps.canary_replicas is None else str(ps.canary_replicas)
        numbers["canaryReplicas"] = f"{before}->{decision.canary_replicas}"
    after_k = decision.target_k if decision.target_k is not None else decision.current_k
    after_canaries = change.get("canary_replicas", ps.canary_replicas)
    change["rollout"] = PoolRollout(
        time=rfc3339(now),
        reason=decision.reason,
        from_mode=decision.current,
        from_num_speculative_tokens=ps.num_speculative_tokens,
        from_canary_replicas=ps.canary_replicas,
        from_dynamic_schedule=ps.dynamic_schedule,
        drafted_before=_drafted(decision.current, decision.current_k, ps.canary_replicas, ps_schedule),
        drafted_after=_drafted(
            decision.target,
            after_k,
            after_canaries if isinstance(after_canaries, int) else None,
            after_schedule,
        ),
    )
    return _Change(ps.model_copy(update=change), numbers, ps_schedule, after_schedule)


def _history_entry(decision: PoolDecision, numbers: dict[str, str], now: datetime) -> Decision:
    return Decision.model_validate(
        {
            "time": rfc3339(now),
            "pool": decision.pool,
            "from": decision.current,
            "to": decision.target,
            "reason": decision.reason,
            "message": decision.message,
            "observations": numbers,
        }
    )


def _change_event(decision: PoolDecision, change: _Change) -> tuple[str, str, str]:
    """The Event a change emits: (type, reason, message)."""
    event_type = "Normal"
    if decision.reason == reasons.ROLLOUT_FAILED:
        event_type, event_reason = "Warning", reasons.EVENT_ROLLOUT_FAILED
        what = f"speculation {decision.current} -> {decision.target}"
    elif decision.flip:
        on = decision.target == "On"
        event_reason = reasons.EVENT_SPECULATION_ON if on else reasons.EVENT_SPECULATION_OFF
        what = f"speculation {decision.current} -> {decision.target}"
    elif decision.target_k is not None or decision.target_schedule is not None:
        event_reason = reasons.EVENT_SPECULATION_RETUNED
        what = (
            f"K {decision.current_k} -> {decision.target_k}"
            if decision.target_schedule is None
            else f"schedule {_rows_text(change.schedule_before)} -> {_rows_text(change.schedule_after)}"
        )
    else:
        event_reason = reasons.EVENT_CANARIES_SCALED
        what = f"canaries -> {decision.canary_replicas}"
    message = f"pool {decision.pool}: {what} ({decision.reason}): {decision.message}{_numbers(decision)}"
    return event_type, event_reason, message


def _metrics_condition(
    status: SpeculativeDeploymentStatus,
    pools: PoolStatuses,
    observations: Mapping[str, PoolObservation],
    scrape: ScrapeSetup,
    generation: int,
    now: datetime,
) -> tuple[list[Condition], tuple[str, str, str] | None]:
    """The MetricsAvailable condition, and the Warning to emit when metrics have just gone missing (or
    have just been found missing because Prometheus does not scrape a pool's Ready pods).

    `pools` carries this evaluation's unscrapedEvaluations counts."""
    unscraped = {
        pool: not_scraping_message(scrape, pool, obs.ready_without_series or 0)
        for pool, obs in observations.items()
        if not_scraping(getattr(pools, pool).unscraped_evaluations, obs)
    }
    problems = [
        unscraped.get(pool) or f"{pool}: {problem}"
        for pool, obs in observations.items()
        if (problem := obs.decision_problem)
    ]
    previous = next((c for c in status.conditions if c.type == reasons.METRICS_AVAILABLE), None)
    warning = None
    ok: ConditionStatus
    if not observations:
        ok, why, message = "True", reasons.NO_AUTO_POOLS, "no pool is Auto: nothing to observe"
    elif unscraped:
        ok, why = "False", reasons.PROMETHEUS_NOT_SCRAPING
        message = reasons.with_link("; ".join(problems) + " (holding every pool in its current mode)", why)
        if previous is None or previous.reason != why:
            warning = ("Warning", reasons.EVENT_PROMETHEUS_NOT_SCRAPING, message)
    elif problems:
        ok, why = "False", reasons.METRICS_UNAVAILABLE
        message = "; ".join(problems) + " (holding every pool in its current mode)"
        if previous is None or previous.status != "False":
            warning = ("Warning", reasons.EVENT_METRICS_UNAVAILABLE, message)
    else:
        ok, why, message = "True", reasons.METRICS_OK, "every Auto pool has fresh engine metrics"
    conditions = set_condition(
        status.conditions,
        type_=reasons.METRICS_AVAILABLE,
        status=ok,
        reason=why,
        message=message,
        generation=generation,
        now=now,
    )
    return conditions, warning


def record(
    status: SpeculativeDeploymentStatus,
    decisions: Sequence[PoolDecision],
    observations: Mapping[str, PoolObservation],
    generation: int,
    now: datetime,
    scrape: ScrapeSetup,
    attainment: Mapping[str, SloAttainment] | None = None,
    *,
    window_seconds: float,
) -> Recorded:
    """Fold one evaluation into status: measurements, settled rollouts, what followed earlier changes,
    acceptance memory, changes (with their history entries and Events), how long Prometheus has not
    scraped a pool's Ready pods, and the MetricsAvailable condition (`scrape` says what should make it
    scrape them).

    `attainment`: each pool with an SLO, what share of its requests met it (any mode, Auto or not).
    `window_seconds`: the policy window, the span measured after a change's rollout settled."""
    pools = status.pools.model_copy(deep=True)
    for name in POOLS:
        ps = getattr(pools, name)
        count = unscraped_evaluations(ps.unscraped_evaluations, observations.get(name))
        if count != ps.unscraped_evaluations:
            setattr(pools, name, ps.model_copy(update={"unscraped_evaluations": count}))
    for pool, obs in observations.items():
        if obs.decision_problem is None:
            setattr(pools, pool, _with_measurements(getattr(pools, pool), obs, now))
    for pool in POOLS:
        setattr(pools, pool, _with_attainment(getattr(pools, pool), (attainment or {}).get(pool)))
    for pool in POOLS:
        if (settled := _with_settled_rollout(getattr(pools, pool), now)) is not None:
            setattr(pools, pool, settled)
    for decision in decisions:
        if (memory := decision.acceptance) is not None:
            setattr(pools, decision.pool, _with_acceptance(getattr(pools, decision.pool), memory))
        if (check := decision.realized) is not None:
            setattr(pools, decision.pool, _with_realized_check(getattr(pools, decision.pool), check))
    out = Recorded(status=status)
    history = with_realized_changes(status.history, pools, observations, window_seconds, now)
    for decision in decisions:
        if not decision.changes:
            continue
        change = _with_change(getattr(pools, decision.pool), decision, now)
        setattr(pools, decision.pool, change.status)
        out.flipped.append(decision)
        history.append(_history_entry(decision, change.numbers, now))
        out.events.append(_change_event(decision, change))
    conditions, warning = _metrics_condition(status, pools, observations, scrape, generation, now)
    if warning is not None:
        out.events.append(warning)
    out.status = status.model_copy(
        update={"pools": pools, "history": history[-HISTORY_LIMIT:], "conditions": conditions}
    )
    return out
