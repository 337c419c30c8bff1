"""What the policy reads from status (pure): each Auto pool's state (`pool_states`: mode, last flip,
recent flips and retunes, rollout state, last measured acceptance, recent loads and the engine settings
the spec gives), and the parsers status and record share (times, schedules).

Status is the operator's memory: a restarted operator resumes from it without a spurious flip.
`policy.decision.record` writes it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from specfleet.api.constants import POOLS, PoolName
from specfleet.api.drafter import DynamicScheduleRange
from specfleet.api.effective import pool_engine
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import (
    PoolStatus,
    SpeculativeDeploymentStatus,
)
from specfleet.policy.inputs.observation import (
    MeasuredAcceptance,
    PoolRolloutState,
    PoolState,
    RealizedRecord,
    Schedule,
)
from specfleet_runtime.vllm_args import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


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


def _realized(ps: PoolStatus) -> RealizedRecord | None:
    """The pool's realized check from status (None: none, or its time unreadable)."""
    check = ps.realized_check
    at = parse_time(check.sampled_at) if check is not None else None
    if check is None or at is None:
        return None
    return RealizedRecord(
        sampled_at=at,
        off_ratio=_float(check.off_ratio),
        on_ratio=_float(check.on_ratio),
        below_windows=check.below_windows,
        shortfall=_float(check.shortfall),
    )


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
            recent_tokens_per_second=_loads(ps.recent_tokens_per_second),
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
            flip=pool_spec.rollout.flip,
            standby_flip_seconds=ps.standby_flip_seconds,
            termination_grace_seconds=float(spec.engine.termination_grace_period_seconds),
            realized=_realized(ps),
        )
    return out
