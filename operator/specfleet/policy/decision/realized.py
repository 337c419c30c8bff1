"""What followed each change (pure): a flip's or a retune's history entry gains the pool's measured
tokens per second per replica before it and over the first whole policy window after its rollout
settled, and their ratio (`realizedSpeedup`) beside the speedup it predicted.

Status only: no decision reads it back. A before/after ratio under whatever load came, not a controlled
measurement; the running requests per replica of both windows are kept so a reader can judge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from specfleet.api.conditions import rfc3339
from specfleet.api.status import Decision, PoolStatuses, RealizedChange
from specfleet.policy.inputs.observation import PoolObservation
from specfleet.policy.inputs.status import parse_time


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


# The observation a flip or a retune records its predicted throughput over the current setting in: the
# number its realized speedup (status.history's realized, after over before) is set beside.
CHANGE_GAIN = "predictedChangeSpeedup"


def predicted_change(observations: Mapping[str, str]) -> str | None:
    """The speedup a history entry's change predicted over the setting it left, as recorded (entries
    written before CHANGE_GAIN existed: their predictedSpeedup; None: not predicted)."""
    return observations.get(CHANGE_GAIN, observations.get("predictedSpeedup"))


def is_change_of_setting(entry: Decision) -> bool:
    """A flip (the mode changed) or a retune (K or the Dynamic SD schedule changed): the changes whose
    throughput is worth comparing (not a canary count, not a hold)."""
    numbers = entry.observations
    return (
        entry.from_mode != entry.to_mode or "numSpeculativeTokens" in numbers or "dynamicSchedule" in numbers
    )


def tokens_per_replica_before(entry: Decision) -> float | None:
    """Generated tokens per second per reporting replica over the window the decision acted on (None:
    not recorded, or no replica reported)."""
    total = _number(entry.observations.get("generationTokensPerSecond"))
    replicas = _number(entry.observations.get("replicasReporting"))
    if total is None or replicas is None or replicas < 1:
        return None
    return total / replicas


def realized_change(
    entry: Decision,
    pools: PoolStatuses,
    observation: PoolObservation | None,
    window_seconds: float,
    now: datetime,
) -> RealizedChange | None:
    """What followed `entry`, when it can be told now (None: not a change of setting, already told, not
    the pool's last change, its rollout not settled, no whole window measured since, or a side not
    measured)."""
    if entry.realized is not None or not is_change_of_setting(entry):
        return None
    rollout = getattr(pools, entry.pool).rollout
    # The pool's rollout is its last change: an entry a later change superseded is never measured.
    if rollout is None or rollout.time != entry.time:
        return None
    settled = parse_time(rollout.settled_time)
    if settled is None or now - timedelta(seconds=window_seconds) < settled:
        return None
    before = tokens_per_replica_before(entry)
    if before is None or before <= 0 or observation is None or observation.decision_problem is not None:
        return None
    total = observation.generation_tokens_per_second
    if total is None or not math.isfinite(total) or total < 0 or observation.replicas_reporting < 1:
        return None
    after = total / observation.replicas_reporting
    running_after = observation.running_per_replica
    return RealizedChange(
        time=rfc3339(now),
        tokens_per_second_per_replica_before=f"{before:.4g}",
        tokens_per_second_per_replica_after=f"{after:.4g}",
        running_per_replica_before=entry.observations.get("runningPerReplica"),
        running_per_replica_after=None if running_after is None else f"{running_after:.3g}",
        realized_speedup=f"{after / before:.3f}",
    )


def with_realized_changes(
    history: Sequence[Decision],
    pools: PoolStatuses,
    observations: Mapping[str, PoolObservation],
    window_seconds: float,
    now: datetime,
) -> list[Decision]:
    """`history` with what followed written into each entry that can be told now (once per entry: an
    entry that has it keeps it)."""
    out = []
    for entry in history:
        told = realized_change(entry, pools, observations.get(entry.pool), window_seconds, now)
        out.append(entry if told is None else entry.model_copy(update={"realized": told}))
    return out
