"""The last, pure step: the full new status (pools and conditions) from the live children, and the
events worth emitting."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specfleet.api import reasons
from specfleet.api.conditions import ConditionStatus, set_condition
from specfleet.api.constants import LABEL_POOL
from specfleet.api.fields import SpeculationMode
from specfleet.api.status import Condition, PoolStatus, PoolStatuses, StandbyStatus
from specfleet.reconcile.apply import AppliedChildren
from specfleet.reconcile.children import (
    deployment_settled,
    describe,
    needed_replicas,
    pool_deployments,
    wanted_replicas,
)
from specfleet.reconcile.desired import DesiredState, standby_unavailable, was_degraded
from specfleet.reconcile.gateway_status import gateway_condition
from specfleet.reconcile.result import Event, ReconcileResult
from specfleet.render import POOLS, Manifest


def pool_status_from_deployments(
    previous: PoolStatus, mode: SpeculationMode, deployments: list[tuple[Manifest, Manifest | None]]
) -> PoolStatus:
    """A pool's status from its Deployments (stable, and canary if any): counts summed, settled if all are."""
    lives = [(live or {}).get("status") or {} for _, live in deployments]
    return previous.model_copy(
        update={
            "speculation": mode,
            "replicas": sum(int(s.get("replicas", 0)) for s in lives),
            "desired_replicas": sum(wanted_replicas(d, live) or 0 for d, live in deployments),
            "ready_replicas": sum(int(s.get("readyReplicas", 0)) for s in lives),
            "updated_replicas": sum(int(s.get("updatedReplicas", 0)) for s in lives),
            "settled": all(deployment_settled(d, live) for d, live in deployments),
        }
    )


def _pool_statuses(desired: DesiredState, applied: AppliedChildren) -> PoolStatuses:
    """Each pool's status from its live Deployments (stable and canary)."""
    pools = desired.previous.pools.model_copy()
    for pool in POOLS:
        deployments = pool_deployments(desired.children, applied.live, pool)
        plan = desired.plan[pool]
        updated = pool_status_from_deployments(getattr(pools, pool), plan.mode, deployments)
        if pool in applied.standby_flipping:  # the driver still flips its pods (no template change)
            updated.settled = False
        if desired.sd is not None:  # the K the engines are rendered with (kubectl's K column)
            drafted = plan.k if plan.k is not None else desired.sd.spec.drafter.num_speculative_tokens
            updated.k = drafted if plan.mode == "On" else 0
        if pool in applied.startups:  # measured from the pods this reconcile listed; else kept
            updated.startup_seconds = applied.startups[pool]
        updated.standby = _standby(updated.standby, plan.standby, applied, pool, desired.generation)
        setattr(pools, pool, updated)
    return pools


def _standby(
    previous: StandbyStatus | None, standby: bool, applied: AppliedChildren, pool: str, generation: int
) -> StandbyStatus | None:
    """A pool's Standby status: a failure its Standby pods report now, recorded with the generation; a
    recorded one kept while the generation holds (a spec change tries Standby again)."""
    failure = applied.failures.get(pool)
    if standby and failure is not None and failure.reason == reasons.STANDBY_UNAVAILABLE:
        return StandbyStatus(available=False, message=failure.message, observed_generation=generation)
    return previous if standby_unavailable(previous, generation) else None


def _standby_degraded(pools: PoolStatuses, generation: int) -> str | None:
    """The Degraded=StandbyUnavailable message, or None when every Standby pool can sleep."""
    down = [(p, getattr(pools, p).standby) for p in POOLS]
    parts = [
        f"pool {p} runs as a Restart pool (flips restart its engines): its engines cannot sleep: {s.message}"
        for p, s in down
        if s is not None and standby_unavailable(s, generation)
    ]
    return reasons.with_link("; ".join(parts), reasons.STANDBY_UNAVAILABLE) if parts else None


def _conditions(
    desired: DesiredState, applied: AppliedChildren, pools: PoolStatuses, now: datetime
) -> list[Condition]:
    """Degraded, Progressing, SpeculationSettled, Ready, AutoscalingActive and GatewayAccepted from
    what was applied and what is live."""
    sd, previous, generation = desired.sd, desired.previous, desired.generation
    assert sd is not None

    def set_(conditions: list[Condition], type_: str, ok: bool, reason: str, message: str) -> list[Condition]:
        status: ConditionStatus = "True" if ok else "False"
        return set_condition(
            conditions,
            type_=type_,
            status=status,
            reason=reason,
            message=message,
            generation=generation,
            now=now,
        )

    conditions = list(previous.conditions)
    standby_degraded = _standby_degraded(pools, generation)
    if applied.errors:
        conditions = set_(conditions, reasons.DEGRADED, True, reasons.APPLY_FAILED, _apply_failed(applied))
    elif standby_degraded is not None:
        conditions = set_(conditions, reasons.DEGRADED, True, reasons.STANDBY_UNAVAILABLE, standby_degraded)
    else:
        conditions = set_(conditions, reasons.DEGRADED, False, reasons.AS_EXPECTED, "")
    modes = {pool: desired.plan[pool].mode for pool in POOLS}
    states = [(p, getattr(pools, p)) for p in POOLS]
    unsettled = [p for p, s in states if not s.settled]
    needed = {p: needed_replicas(sd, p, desired.children, applied.live) for p in POOLS}
    not_ready = [f"{p} {s.ready_replicas}/{needed[p]}" for p, s in states if s.ready_replicas < needed[p]]
    # Why a rollout does not finish (its new pods fail while the old ones keep serving).
    stuck = [(p, applied.failures[p]) for p in unsettled if p in applied.failures]
    progressing_reason = stuck[0][1].reason if stuck else reasons.ROLLING_OUT
    progressing_message = f"rolling out: {', '.join(unsettled)}" + "".join(
        f"; {p}: {f.message}" for p, f in stuck
    )
    if stuck:
        progressing_message = reasons.with_link(progressing_message, progressing_reason)
    conditions = set_(
        conditions,
        reasons.PROGRESSING,
        bool(unsettled),
        progressing_reason if unsettled else reasons.ROLLOUT_COMPLETE,
        progressing_message if unsettled else "every pool runs its current template",
    )
    conditions = set_(
        conditions,
        reasons.SPECULATION_SETTLED,
        not unsettled,
        reasons.POOLS_TRANSITIONING if unsettled else reasons.POOLS_SETTLED,
        "still moving to their decided mode: " + ", ".join(f"{p} ({modes[p]})" for p in unsettled)
        if unsettled
        else "every pool runs its decided mode: " + ", ".join(f"{p} {modes[p]}" for p in POOLS),
    )
    ready = not not_ready and not applied.errors
    short = {p for p, s in states if s.ready_replicas < getattr(sd.spec.pools, p).replicas}
    failures = {p: f for p, f in applied.failures.items() if p in short}
    failure = next(iter(failures.values()), None)
    if ready:
        reason, message = reasons.ALL_POOLS_READY, "all pools have their replicas ready"
    elif not not_ready:
        reason, message = reasons.POOLS_NOT_READY, "some children could not be applied"
    elif failure is not None:
        # Kubernetes' own words for why: the scheduler's message, the image pull error, the deadline.
        reason = failure.reason
        message = reasons.with_link(
            "ready replicas: "
            + ", ".join(not_ready)
            + "; "
            + "; ".join(f"{pool}: {f.message}" for pool, f in failures.items()),
            reason,
        )
    else:
        reason, message = reasons.POOLS_NOT_READY, "ready replicas: " + ", ".join(not_ready)
    conditions = set_(conditions, reasons.READY, ready, reason, message)
    conditions = _autoscaling_condition(conditions, desired, applied, generation, now)
    return gateway_condition(conditions, sd, desired.children, applied.live, generation, now)


# What each autoscaler kind reports when it can scale: the HPA's ScalingActive (False when it cannot
# read its metric, e.g. no metrics adapter), KEDA's Ready on the ScaledObject.
_AUTOSCALER_CONDITION = {"HorizontalPodAutoscaler": "ScalingActive", "ScaledObject": "Ready"}


def _autoscaling_condition(
    conditions: list[Condition],
    desired: DesiredState,
    applied: AppliedChildren,
    generation: int,
    now: datetime,
) -> list[Condition]:
    """AutoscalingActive from the autoscalers' own conditions (absent when no pool is autoscaled)."""
    scalers = [c for c in desired.children if c["kind"] in _AUTOSCALER_CONDITION]
    if not scalers:
        return [c for c in conditions if c.type != reasons.AUTOSCALING_ACTIVE]
    failing: list[tuple[str, str]] = []
    pending: list[str] = []
    for child in scalers:
        pool, kind = child["metadata"]["labels"].get(LABEL_POOL, ""), child["kind"]
        live = applied.live.get(describe(child)) or {}
        wanted = _AUTOSCALER_CONDITION[kind]
        found = next(
            (c for c in (live.get("status") or {}).get("conditions") or [] if c.get("type") == wanted), None
        )
        if found is None:
            pending.append(f"{pool}: the {kind} has not reported {wanted} yet (is its controller running?)")
        elif found.get("status") != "True":
            why = str(found.get("reason") or reasons.AUTOSCALER_INACTIVE)
            failing.append(
                (why, f"{pool}: {kind} {wanted}={found.get('status')} ({why}): {found.get('message', '')}")
            )
    status: ConditionStatus
    if failing:
        # An autoscaler's own reason (e.g. the HPA's FailedGetPodsMetric) has no entry of ours.
        message = reasons.with_link("; ".join(m for _, m in failing), reasons.AUTOSCALER_INACTIVE)
        status, reason = "False", failing[0][0]
    elif pending:
        message = reasons.with_link("; ".join(pending), reasons.AUTOSCALER_PENDING)
        status, reason = "Unknown", reasons.AUTOSCALER_PENDING
    else:
        pools = ", ".join(f"{c['metadata']['labels'].get(LABEL_POOL)} ({c['kind']})" for c in scalers)
        status, reason, message = "True", reasons.AUTOSCALERS_ACTIVE, f"every autoscaler can scale: {pools}"
    return set_condition(
        conditions,
        type_=reasons.AUTOSCALING_ACTIVE,
        status=status,
        reason=reason,
        message=message,
        generation=generation,
        now=now,
    )


def _apply_failed(applied: AppliedChildren) -> str:
    """The Degraded=ApplyFailed message, the same on the condition and its Event."""
    return reasons.with_link("; ".join(applied.errors), reasons.APPLY_FAILED)


def _events(desired: DesiredState, applied: AppliedChildren, pools: PoolStatuses) -> list[Event]:
    """Degraded on a new apply error or Standby failure, Recovered, ChildrenApplied, DriftCorrected,
    ChildrenPruned."""
    events: list[Event] = []
    previous = desired.previous
    degraded = _apply_failed(applied) if applied.errors else _standby_degraded(pools, desired.generation)
    if degraded is not None:
        if not any(c.type == reasons.DEGRADED and c.message == degraded for c in previous.conditions):
            events.append(Event("Warning", reasons.EVENT_DEGRADED, degraded))
    elif was_degraded(previous):
        events.append(Event("Normal", reasons.EVENT_RECOVERED, "the resource is no longer degraded"))
    if applied.applied:
        message = f"applied {len(applied.applied)}: {', '.join(applied.applied)}"
        events.append(Event("Normal", reasons.EVENT_APPLIED, message))
    if applied.drift:
        message = f"restored children changed by hand: {', '.join(applied.drift)}"
        events.append(Event("Normal", reasons.EVENT_RESTORED, message))
    for pool, failure in applied.failures.items():
        seen = any(
            c.type in (reasons.READY, reasons.PROGRESSING) and failure.message in c.message
            for c in previous.conditions
        )
        if not seen:
            events.append(Event("Warning", reasons.EVENT_POOL_FAILING, f"{pool}: {failure.message}"))
    if applied.pruned:
        message = f"deleted {len(applied.pruned)} the spec no longer asks for: {', '.join(applied.pruned)}"
        events.append(Event("Normal", reasons.EVENT_PRUNED, message))
    return events


def reported_status(desired: DesiredState, applied: AppliedChildren, now: datetime) -> ReconcileResult:
    """The full new status from the live children, and the events worth emitting (pure)."""
    pools = _pool_statuses(desired, applied)
    status = desired.previous.model_copy(
        update={
            "observed_generation": desired.generation,
            "conditions": _conditions(desired, applied, pools, now),
            "pools": pools,
        }
    )
    return ReconcileResult(status.to_wire(), _events(desired, applied, pools), list(applied.applied))


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) of the top-level status keys whose value changed, each sent whole
    (lists are assigned whole), with null for every field an object of it no longer has: a merge patch
    keeps what it leaves out, so an optional field the operator unset would otherwise stay (and the
    status would differ from what the operator wants at every evaluation)."""
    current = current or {}
    return {k: _with_removals(current.get(k), v) for k, v in desired.items() if current.get(k) != v}


def _with_removals(current: Any, desired: Any) -> Any:
    if not (isinstance(current, Mapping) and isinstance(desired, Mapping)):
        return desired
    out = {k: _with_removals(current.get(k), v) for k, v in desired.items()}
    out.update({k: None for k in current if k not in desired})
    return out
