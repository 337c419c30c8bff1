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
from specfleet.api.constants import POOLS
from specfleet.api.models import Decision, PoolName, SpeculativeDeploymentSpec, SpeculativeDeploymentStatus
from specfleet.policy.decide import PoolDecision
from specfleet.policy.observations import MeasuredAcceptance, PoolObservation, PoolState

HISTORY_LIMIT = 20


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


def pool_states(
    spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus, now: datetime
) -> dict[str, PoolState]:
    """The policy's view of each Auto pool, from status."""
    hour_ago = now - timedelta(hours=1)
    out: dict[str, PoolState] = {}
    for pool in auto_pools(spec):
        ps = getattr(status.pools, pool)
        flips = tuple(
            t
            for d in status.history
            if d.pool == pool and (t := parse_time(d.time)) is not None and t > hour_ago
        )
        memory = None
        measured_at = parse_time(ps.acceptance_measured_at)
        if ps.acceptance_length and measured_at is not None:
            try:
                memory = MeasuredAcceptance(
                    acceptance_length=float(ps.acceptance_length),
                    per_position=tuple(float(x) for x in (ps.per_position_acceptance or "").split(",") if x),
                    at=measured_at,
                )
            except ValueError:
                memory = None
        out[pool] = PoolState(
            mode=ps.speculation,
            last_transition=parse_time(ps.last_transition_time),
            recent_flips=flips,
            settled=ps.settled,
            last_acceptance=memory,
            k=ps.num_speculative_tokens,
        )
    return out


@dataclass
class Recorded:
    """The new status and what to tell the world about it."""

    status: SpeculativeDeploymentStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    flipped: list[PoolDecision] = field(default_factory=list)


def _numbers(decision: PoolDecision) -> str:
    keys = ("acceptanceLength", "runningPerReplica", "predictedSpeedup", "acceptanceSource")
    shown = [f"{k}={decision.observations[k]}" for k in keys if k in decision.observations]
    return f" [{', '.join(shown)}]" if shown else ""


def record(
    status: SpeculativeDeploymentStatus,
    decisions: Sequence[PoolDecision],
    observations: Mapping[str, PoolObservation],
    generation: int,
    now: datetime,
) -> Recorded:
    """Fold one evaluation into status."""
    pools = status.pools.model_copy(deep=True)
    history = list(status.history)
    out = Recorded(status=status)
    for pool, obs in observations.items():
        if not obs.usable:
            continue
        ps = getattr(pools, pool)
        update: dict[str, object] = {}
        if obs.running_per_replica is not None:
            update["running_per_replica"] = f"{obs.running_per_replica:.3g}"
        if obs.generation_tokens_per_second is not None:
            update["generation_tokens_per_second"] = f"{obs.generation_tokens_per_second:.4g}"
        if obs.acceptance_length is not None:
            update["acceptance_length"] = f"{obs.acceptance_length:.2f}"
            update["per_position_acceptance"] = ",".join(f"{p:.3f}" for p in obs.per_position)
            update["acceptance_measured_at"] = rfc3339(now)
        setattr(pools, pool, ps.model_copy(update=update))
    for decision in decisions:
        if not decision.changes:
            continue
        out.flipped.append(decision)
        ps = getattr(pools, decision.pool)
        change: dict[str, object] = {
            "speculation": decision.target,
            "last_transition_time": rfc3339(now),
            "reason": decision.reason,
            "message": decision.message,
            "settled": False,
        }
        numbers = dict(decision.observations)
        if decision.target_k is not None:
            change["num_speculative_tokens"] = decision.target_k
            numbers["numSpeculativeTokens"] = f"{decision.current_k}->{decision.target_k}"
        setattr(pools, decision.pool, ps.model_copy(update=change))
        history.append(
            Decision.model_validate(
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
        )
        if decision.flip:
            on = decision.target == "On"
            event_reason = reasons.EVENT_SPECULATION_ON if on else reasons.EVENT_SPECULATION_OFF
            what = f"speculation {decision.current} -> {decision.target}"
        else:
            event_reason = reasons.EVENT_SPECULATION_RETUNED
            what = f"K {decision.current_k} -> {decision.target_k}"
        out.events.append(
            (
                "Normal",
                event_reason,
                f"pool {decision.pool}: {what} ({decision.reason}): {decision.message}{_numbers(decision)}",
            )
        )
    problems = [f"{pool}: {obs.problem}" for pool, obs in observations.items() if not obs.usable]
    previous_ok = next((c.status for c in status.conditions if c.type == reasons.METRICS_AVAILABLE), None)
    ok: ConditionStatus
    if not observations:
        ok, why, message = "True", reasons.NO_AUTO_POOLS, "no pool is Auto: nothing to observe"
    elif problems:
        ok, why = "False", reasons.METRICS_UNAVAILABLE
        message = "; ".join(problems) + " (holding every pool in its current mode)"
        if previous_ok != "False":
            out.events.append(("Warning", reasons.EVENT_METRICS_UNAVAILABLE, message))
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
    out.status = status.model_copy(
        update={"pools": pools, "history": history[-HISTORY_LIMIT:], "conditions": conditions}
    )
    return out
