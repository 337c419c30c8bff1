"""One idempotent reconcile of a SpeculativeDeployment, with the Kubernetes API behind a seam.

`reconcile(body, cluster, now)` parses the resource, checks it can work, decides each pool's mode,
renders the children, applies only those that differ from the live objects, reads the pool
Deployments back and returns the full new status plus the events worth emitting. Kopf handlers
(handlers.py) call it from create, update, resume and a timer; tests call it with a fake `Cluster`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from specfleet.api import reasons
from specfleet.api.conditions import set_condition
from specfleet.api.constants import ANNOTATION_RENDER_HASH, LABEL_POOL
from specfleet.api.models import (
    Condition,
    PoolName,
    PoolStatus,
    SpeculationMode,
    SpeculativeDeploymentStatus,
)
from specfleet.api.semantics import find_problems
from specfleet.api.validation import (
    InvalidResourceError,
    SpeculativeDeployment,
    parse_resource,
    parse_status,
)
from specfleet.render import POOLS, Manifest, RenderOptions, render_children

EventType = Literal["Normal", "Warning"]


class ApplyRejectedError(Exception):
    """The API refused a child for good (invalid object, missing CRD): report it, do not retry hot."""


class Cluster(Protocol):
    """What reconcile needs from the Kubernetes API."""

    def get(self, manifest: Manifest) -> Manifest | None:
        """The live object with the manifest's kind, namespace and name, or None."""

    def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply under the operator's field manager; returns the live object."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to emit on the resource."""

    type: EventType
    reason: str
    message: str


@dataclass
class ReconcileResult:
    """The full new status (wire form), the events to emit and the children written."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)


def decided_modes(sd: SpeculativeDeployment) -> dict[PoolName, SpeculationMode]:
    """Each pool's mode: pinned by spec (On/Off) or, for Auto, the policy's last decision in status."""
    modes: dict[PoolName, SpeculationMode] = {}
    for pool in POOLS:
        setting = getattr(sd.spec.pools, pool).speculation
        if setting == "Auto":
            # Status is where runtime decisions live; a fresh resource starts speculating.
            modes[pool] = getattr(sd.status.pools, pool).speculation
        else:
            modes[pool] = setting
    return modes


def decided_ks(sd: SpeculativeDeployment) -> dict[PoolName, int | None]:
    """The K each Auto pool drafts, where the Goodput policy chose one (None: the drafter's K)."""
    limit = sd.spec.drafter.num_speculative_tokens
    ks: dict[PoolName, int | None] = {}
    for pool in POOLS:
        k = getattr(sd.status.pools, pool).num_speculative_tokens
        auto_goodput = getattr(sd.spec.pools, pool).speculation == "Auto" and sd.spec.policy.mode == "Goodput"
        ks[pool] = k if auto_goodput and k is not None and 1 <= k <= limit else None
    return ks


def decided_canaries(sd: SpeculativeDeployment) -> dict[PoolName, int | None]:
    """Canary replicas of each Auto pool while off, where the policy scaled them (None: the spec's)."""
    out: dict[PoolName, int | None] = {}
    for pool in POOLS:
        auto = getattr(sd.spec.pools, pool).speculation == "Auto"
        out[pool] = getattr(sd.status.pools, pool).canary_replicas if auto else None
    return out


def _describe(manifest: Manifest) -> str:
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def _is_subset(desired: Any, live: Any) -> bool:
    """True when every field we render has the same value on the live object (defaults may add more)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and _is_subset(v, live[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(_is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    if isinstance(desired, int | float) and not isinstance(desired, bool) and isinstance(live, str):
        # The apiserver returns quantities as strings ("1" for nvidia.com/gpu: 1).
        return str(desired) == live
    return bool(desired == live)


def write_reason(desired: Manifest, live: Manifest | None) -> Literal["missing", "changed", "edited"] | None:
    """Why the child must be written, or None when the live object already matches.

    missing: not there; changed: rendered from other input (render hash differs); edited: same input
    but someone changed a field we own by hand (drift).
    """
    if live is None:
        return "missing"
    live_hash = (live.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RENDER_HASH)
    if live_hash != desired["metadata"]["annotations"][ANNOTATION_RENDER_HASH]:
        return "changed"
    if not _is_subset({k: v for k, v in desired.items() if k != "status"}, live):
        return "edited"
    return None


def deployment_settled(desired: Manifest, live: Manifest | None) -> bool:
    """The Deployment runs its current template on exactly the desired number of ready pods."""
    if live is None:
        return False
    want = int(desired["spec"]["replicas"])
    status = live.get("status") or {}
    generation = live.get("metadata", {}).get("generation", 0)
    return (
        status.get("observedGeneration", -1) >= generation
        and int(status.get("updatedReplicas", 0)) == want
        and int(status.get("readyReplicas", 0)) >= want
        and int(status.get("replicas", 0)) == want
    )


def pool_status_from_deployments(
    previous: PoolStatus, mode: SpeculationMode, deployments: list[tuple[Manifest, Manifest | None]]
) -> PoolStatus:
    """A pool's status from its Deployments (stable, and canary if any): counts summed, settled if all are."""
    lives = [(live or {}).get("status") or {} for _, live in deployments]
    return previous.model_copy(
        update={
            "speculation": mode,
            "replicas": sum(int(s.get("replicas", 0)) for s in lives),
            "ready_replicas": sum(int(s.get("readyReplicas", 0)) for s in lives),
            "updated_replicas": sum(int(s.get("updatedReplicas", 0)) for s in lives),
            "settled": all(deployment_settled(d, live) for d, live in deployments),
        }
    )


def _degraded_status(
    previous: SpeculativeDeploymentStatus,
    generation: int,
    reason: str,
    message: str,
    now: datetime,
) -> SpeculativeDeploymentStatus:
    conditions: list[Condition] = list(previous.conditions)
    for type_, status, why in (
        (reasons.DEGRADED, "True", reason),
        (reasons.READY, "False", reason),
        (reasons.PROGRESSING, "False", reason),
    ):
        conditions = set_condition(
            conditions,
            type_=type_,
            status=status,  # type: ignore[arg-type]
            reason=why,
            message=message,
            generation=generation,
            now=now,
        )
    return previous.model_copy(update={"conditions": conditions, "observed_generation": generation})


def _was_degraded(status: SpeculativeDeploymentStatus) -> bool:
    return any(c.type == reasons.DEGRADED and c.status == "True" for c in status.conditions)


def reconcile(
    body: Mapping[str, Any],
    cluster: Cluster,
    now: datetime,
    options: RenderOptions | None = None,
) -> ReconcileResult:
    """Bring the children of one resource to the rendered state and compute its new status."""
    meta = body.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    previous = parse_status(body.get("status"))
    was_degraded = _was_degraded(previous)

    try:
        sd = parse_resource(body)
    except InvalidResourceError as err:
        # The apiserver's schema normally stops this first; an older CRD or a bypass can still get here.
        status = _degraded_status(previous, generation, reasons.INVALID_SPEC, str(err), now)
        events = [] if was_degraded else [Event("Warning", reasons.EVENT_DEGRADED, str(err))]
        return ReconcileResult(status=status.to_wire(), events=events)

    problems = find_problems(sd.spec)
    if problems:
        message = "; ".join(problems)
        status = _degraded_status(previous, generation, reasons.UNSUPPORTED_CONFIGURATION, message, now)
        same = any(c.type == reasons.DEGRADED and c.message == message for c in previous.conditions)
        events = [] if same else [Event("Warning", reasons.EVENT_DEGRADED, message)]
        return ReconcileResult(status=status.to_wire(), events=events)

    modes = decided_modes(sd)
    children = render_children(sd, modes, options, decided_ks(sd), decided_canaries(sd))
    result = ReconcileResult(status={})
    live_by_name: dict[str, Manifest | None] = {}
    apply_errors: list[str] = []
    drift: list[str] = []
    for child in children:
        live = cluster.get(child)
        why = write_reason(child, live)
        if why is not None:
            try:
                live = cluster.apply(child)
            except ApplyRejectedError as err:
                apply_errors.append(f"{_describe(child)}: {err}")
                continue
            result.applied.append(_describe(child))
            # A child missing after we had reconciled before was deleted by hand: also drift.
            if why == "edited" or (why == "missing" and previous.observed_generation is not None):
                drift.append(_describe(child))
        live_by_name[_describe(child)] = live

    pools = previous.pools.model_copy()
    for pool in POOLS:
        deployments = [
            (child, live_by_name.get(_describe(child)))
            for child in children
            if child["kind"] == "Deployment" and child["metadata"]["labels"].get(LABEL_POOL) == pool
        ]
        updated = pool_status_from_deployments(getattr(pools, pool), modes[pool], deployments)
        setattr(pools, pool, updated)

    conditions = list(previous.conditions)
    if apply_errors:
        message = "; ".join(apply_errors)
        conditions = set_condition(
            conditions,
            type_=reasons.DEGRADED,
            status="True",
            reason=reasons.APPLY_FAILED,
            message=message,
            generation=generation,
            now=now,
        )
        if not any(c.type == reasons.DEGRADED and c.message == message for c in previous.conditions):
            result.events.append(Event("Warning", reasons.EVENT_DEGRADED, message))
    else:
        conditions = set_condition(
            conditions,
            type_=reasons.DEGRADED,
            status="False",
            reason=reasons.AS_EXPECTED,
            message="",
            generation=generation,
            now=now,
        )
        if was_degraded:
            result.events.append(
                Event("Normal", reasons.EVENT_RECOVERED, "the resource is no longer degraded")
            )

    pool_states = [(p, getattr(pools, p)) for p in POOLS]
    unsettled = [p for p, s in pool_states if not s.settled]
    not_ready = [
        f"{p} {s.ready_replicas}/{getattr(sd.spec.pools, p).replicas}"
        for p, s in pool_states
        if s.ready_replicas < getattr(sd.spec.pools, p).replicas
    ]
    conditions = set_condition(
        conditions,
        type_=reasons.PROGRESSING,
        status="True" if unsettled else "False",
        reason=reasons.ROLLING_OUT if unsettled else reasons.ROLLOUT_COMPLETE,
        message=f"rolling out: {', '.join(unsettled)}"
        if unsettled
        else "every pool runs its current template",
        generation=generation,
        now=now,
    )
    conditions = set_condition(
        conditions,
        type_=reasons.SPECULATION_SETTLED,
        status="False" if unsettled else "True",
        reason=reasons.POOLS_TRANSITIONING if unsettled else reasons.POOLS_SETTLED,
        message=(
            "still moving to their decided mode: " + ", ".join(f"{p} ({modes[p]})" for p in unsettled)
            if unsettled
            else "every pool runs its decided mode: " + ", ".join(f"{p} {modes[p]}" for p in POOLS)
        ),
        generation=generation,
        now=now,
    )
    ready = not not_ready and not apply_errors
    conditions = set_condition(
        conditions,
        type_=reasons.READY,
        status="True" if ready else "False",
        reason=reasons.ALL_POOLS_READY if ready else reasons.POOLS_NOT_READY,
        message="all pools have their replicas ready"
        if ready
        else "ready replicas: " + ", ".join(not_ready)
        if not_ready
        else "some children could not be applied",
        generation=generation,
        now=now,
    )
    if result.applied:
        result.events.append(
            Event(
                "Normal", reasons.EVENT_APPLIED, f"applied {len(result.applied)}: {', '.join(result.applied)}"
            )
        )
    if drift:
        result.events.append(
            Event("Normal", reasons.EVENT_RESTORED, f"restored children changed by hand: {', '.join(drift)}")
        )
    status = previous.model_copy(
        update={"observed_generation": generation, "conditions": conditions, "pools": pools}
    )
    result.status = status.to_wire()
    return result


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level status keys whose value changed (lists assigned whole: merge-patch replaces lists)."""
    current = current or {}
    return {k: v for k, v in desired.items() if current.get(k) != v}
