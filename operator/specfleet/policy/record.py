"""Between status and policy, both ways (pure).

`pool_states` reads what the policy needs from status (mode, last flip, recent flips, rollout state,
last measured acceptance); `record` writes decisions and observations back: the flipped pool's mode,
a bounded history entry with the numbers behind it, the MetricsAvailable condition and the Events to
emit. Status is the operator's memory: a restarted operator resumes from it without a spurious flip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from specfleet.api import reasons
from specfleet.api.conditions import ConditionStatus, rfc3339, set_condition
from specfleet.api.constants import POOLS, PoolName
from specfleet.api.drafter import DynamicScheduleRange
from specfleet.api.effective import pool_engine
from specfleet.api.fields import MAX_CHANGES_PER_HOUR
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import (
    Condition,
    Decision,
    PoolRollout,
    PoolStatus,
    PoolStatuses,
    SpeculativeDeploymentStatus,
)
from specfleet.policy.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from specfleet.policy.decision import PoolDecision
from specfleet.policy.observations import MeasuredAcceptance, PoolObservation, PoolRolloutState, PoolState
from specfleet.policy.schedule import Schedule, drafted_by
from specfleet.policy.scraping import ScrapeSetup, not_scraping, not_scraping_message, unscraped_evaluations

HISTORY_LIMIT = 20
# Loads kept for the trend: the last few evaluations within this long.
LOAD_SAMPLES = 8
LOAD_MEMORY = timedelta(minutes=10)


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp from status, or None if absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def auto_pools(spec: SpeculativeDeploymentSpec) -> list[PoolName]:
    """Pools whose speculation the policy decides."""
    return [p for p in POOLS if getattr(spec.pools, p).speculation == "Auto"]


def _times(values: Sequence[str] | None) -> tuple[datetime, ...]:
    return tuple(t for v in values or () if (t := parse_time(v)) is not None)


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _loads(entries: Sequence[str] | None) -> tuple[tuple[datetime, float], ...]:
    out = []
    for entry in entries or ():
        when, _, value = entry.partition("=")
        t, v = parse_time(when), _float(value)
        if t is not None and v is not None:
            out.append((t, v))
    return tuple(sorted(out))


def schedule_rows(ranges: Sequence[DynamicScheduleRange] | None) -> Schedule | None:
    """A status schedule as the policy's (first, last batch size, K) rows (None: none)."""
    if not ranges:
        return None
    return tuple(
        (r.min_batch_size, r.max_batch_size, r.num_speculative_tokens)
        for r in sorted(ranges, key=lambda r: r.min_batch_size)
    )


def schedule_ranges(schedule: Schedule | None) -> list[DynamicScheduleRange] | None:
    """The policy's schedule rows as status ranges (None: none)."""
    if not schedule:
        return None
    return [
        DynamicScheduleRange(min_batch_size=a, max_batch_size=b, num_speculative_tokens=k)
        for a, b, k in schedule
    ]


def _memory(ps: PoolStatus) -> MeasuredAcceptance | None:
    measured_at = parse_time(ps.acceptance_measured_at)
    if not ps.acceptance_length or measured_at is None:
        return None
    try:
        per_position = tuple(float(x) for x in (ps.per_position_acceptance or "").split(",") if x)
        length = float(ps.acceptance_length)
    except ValueError:
        return None
    times = _times(ps.per_position_measured_at)
    if len(times) != len(per_position):
        times = ()
    return MeasuredAcceptance(
        acceptance_length=length, per_position=per_position, at=measured_at, per_position_at=times
    )


def _rollout(ps: PoolStatus) -> PoolRolloutState | None:
    ch = ps.rollout
    at = parse_time(ch.time) if ch is not None else None
    if ch is None or at is None:
        return None
    return PoolRolloutState(
        at=at,
        reason=ch.reason,
        from_mode=ch.from_mode,
        from_k=ch.from_num_speculative_tokens,
        from_canaries=ch.from_canary_replicas,
        from_schedule=schedule_rows(ch.from_dynamic_schedule),
        drafted_before=ch.drafted_before,
        drafted_after=ch.drafted_after,
        settled_at=parse_time(ch.settled_time),
    )


def pool_states(
    spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus, now: datetime
) -> dict[str, PoolState]:
    """The policy's view of each Auto pool, from status."""
    hour_ago = now - timedelta(hours=1)
    out: dict[str, PoolState] = {}
    for pool in auto_pools(spec):
        ps = getattr(status.pools, pool)
        engine = pool_engine(spec, pool)
        pool_spec = getattr(spec.pools, pool)
        if ps.recent_flip_times is not None:
            flips = tuple(t for t in _times(ps.recent_flip_times) if t > hour_ago)
        else:  # a status written before the pool kept its own flip memory: read the history
            flips = tuple(
                t
                for d in status.history
                if d.pool == pool
                and d.from_mode != d.to_mode
                and (t := parse_time(d.time)) is not None
                and t > hour_ago
            )
        out[pool] = PoolState(
            mode=ps.speculation,
            last_transition=parse_time(ps.last_transition_time),
            recent_flips=flips,
            settled=ps.settled,
            last_acceptance=_memory(ps),
            k=ps.num_speculative_tokens,
            schedule=schedule_rows(ps.dynamic_schedule),
            last_retune=parse_time(ps.last_retune_time),
            recent_retunes=tuple(t for t in _times(ps.recent_retune_times) if t > hour_ago),
            canary_replicas=ps.canary_replicas,
            rollout=_rollout(ps),
            recent_load=_loads(ps.recent_load),
            max_num_seqs=engine.max_num_seqs,
            gpu_memory_utilization=(
                engine.gpu_memory_utilization_percent / 100
                if engine.gpu_memory_utilization_percent
                else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
            ),
            tensor_parallel_size=engine.tensor_parallel_size,
            rollout_strategy=pool_spec.rollout.strategy,
            max_unavailable=pool_spec.rollout.max_unavailable,
            replicas=pool_spec.replicas if pool_spec.autoscaling is None else None,
            max_surge=pool_spec.max_surge,
            startup_seconds=ps.startup_seconds,
        )
    return out


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
        "predictedSpeedup",
        "acceptanceSource",
        # Memory-bound decisions (`specfleet.policy.memory`).
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


def _with_measurements(ps: PoolStatus, obs: PoolObservation, now: datetime) -> PoolStatus:
    """The pool's status with this evaluation's load (and its trend's samples) and throughput."""
    update: dict[str, object] = {}
    if obs.running_per_replica is not None:
        update["running_per_replica"] = f"{obs.running_per_replica:.3g}"
        kept = [
            e
            for e in ps.recent_load or []
            if (t := parse_time(e.partition("=")[0])) and now - t <= LOAD_MEMORY
        ]
        # Every evaluation's demand (running + waiting per replica): the trend needs them all (sparser
        # samples measurably delayed the down-ramp decision on the fleet simulator), at the cost of one
        # status write per evaluation; a queue that grows is the first sign of an overloaded setting.
        demand = obs.demand_per_replica or 0.0
        update["recent_load"] = [*kept, f"{rfc3339(now)}={demand:.4g}"][-LOAD_SAMPLES:]
    if obs.generation_tokens_per_second is not None:
        update["generation_tokens_per_second"] = f"{obs.generation_tokens_per_second:.4g}"
    return ps.model_copy(update=update)


def _with_settled_rollout(ps: PoolStatus, now: datetime) -> PoolStatus | None:
    """The pool's status with its rollout's settle time, once the pool reads settled (None: no change)."""
    if ps.rollout is not None and ps.rollout.settled_time is None and ps.settled:
        rollout = ps.rollout.model_copy(update={"settled_time": rfc3339(now)})
        return ps.model_copy(update={"rollout": rollout})
    return None


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
    if decision.target == "Off":
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
) -> Recorded:
    """Fold one evaluation into status: measurements, settled rollouts, acceptance memory, changes
    (with their history entries and Events), how long Prometheus has not scraped a pool's Ready pods,
    and the MetricsAvailable condition (`scrape` says what should make it scrape them)."""
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
        if (settled := _with_settled_rollout(getattr(pools, pool), now)) is not None:
            setattr(pools, pool, settled)
    for decision in decisions:
        if (memory := decision.acceptance) is not None:
            setattr(pools, decision.pool, _with_acceptance(getattr(pools, decision.pool), memory))
    out = Recorded(status=status)
    history = list(status.history)
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
