"""One idempotent reconcile of a SpeculativeDeployment, with the Kubernetes API behind a seam.

Three steps, only the middle one with I/O: `desired_state` (pure) parses the resource, checks it can
work, decides each pool's `PoolPlan` and renders the children (or, when it cannot run, its final
Degraded status); `apply_children` writes only the children that differ from the live objects and
reads them back; `reported_status` (pure) turns what is live into the full new status and the events
worth emitting. `reconcile` chains them. Kopf handlers (handlers.py) call it from create, update,
resume and a timer, the policy after a flip; tests call it with a fake `Cluster`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from specfleet.api import reasons
from specfleet.api.conditions import ConditionStatus, set_condition
from specfleet.api.constants import ANNOTATION_RENDER_HASH, FIELD_MANAGER, LABEL_POOL, LABEL_TRACK, PoolName
from specfleet.api.fields import SpeculationMode
from specfleet.api.pools import PoolSpec
from specfleet.api.semantics import engine_schedules, find_problems
from specfleet.api.status import Condition, PoolStatus, PoolStatuses, SpeculativeDeploymentStatus
from specfleet.api.validation import (
    InvalidResourceError,
    SpeculativeDeployment,
    parse_resource,
    parse_status,
)
from specfleet.pod_failures import PoolFailure, pool_failure
from specfleet.render import (
    MANAGED_KINDS,
    POOLS,
    Manifest,
    PoolPlan,
    RenderOptions,
    owner_labels,
    render_children,
)
from specfleet.render.common import with_render_hash

EventType = Literal["Normal", "Warning"]


class ApplyRejectedError(Exception):
    """The API refused a child for good (invalid object, missing CRD): report it, do not retry hot."""


class Cluster(Protocol):
    """What reconcile needs from the Kubernetes API."""

    def get(self, manifest: Manifest) -> Manifest | None:
        """The live object with the manifest's kind, namespace and name, or None."""

    def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply under the operator's field manager; returns the live object."""

    def list_children(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[Manifest]:
        """Objects of one kind in a namespace carrying all `labels` ([] if the kind does not exist)."""

    def delete_child(self, manifest: Manifest) -> None:
        """Delete the object (gone already is fine)."""

    def hand_over_replicas(self, manifest: Manifest, replicas: int) -> None:
        """Server-side apply of only `spec.replicas` (at its live value) under `HANDOVER_MANAGER`."""


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


def decided_plan(
    sd: SpeculativeDeployment, status: SpeculativeDeploymentStatus | None = None
) -> dict[PoolName, PoolPlan]:
    """Each pool's plan: mode pinned by spec (On/Off) or, for Auto, the policy's last decision in
    `status` (default: the resource's own); K where the Goodput policy chose one (None: the drafter's)."""
    status = status if status is not None else sd.status
    limit = sd.spec.drafter.num_speculative_tokens
    plan: dict[PoolName, PoolPlan] = {}
    for pool in POOLS:
        setting = getattr(sd.spec.pools, pool).speculation
        decided = getattr(status.pools, pool)
        # Status is where runtime decisions live; a fresh resource starts speculating.
        mode: SpeculationMode = decided.speculation if setting == "Auto" else setting
        k = decided.num_speculative_tokens
        goodput = setting == "Auto" and sd.spec.policy.mode == "Goodput"
        plan[pool] = PoolPlan(
            mode,
            k if goodput and k is not None and 1 <= k <= limit else None,
            # Canaries of an Auto pool while off, where the policy scaled them (None: the spec's).
            decided.canary_replicas if setting == "Auto" else None,
            # The policy's Dynamic SD schedule, where policy.goodput.engineSchedule lets it choose one.
            tuple(decided.dynamic_schedule)
            if goodput and decided.dynamic_schedule and engine_schedules(sd.spec)
            else None,
        )
    return plan


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


def wanted_replicas(desired: Manifest, live: Manifest | None) -> int | None:
    """Replicas a Deployment asks for: the rendered count, or for an autoscaled one (rendered without
    `replicas`) the live count its autoscaler set; None when an autoscaled one does not exist yet."""
    if "replicas" in desired["spec"]:
        return int(desired["spec"]["replicas"])
    if live is None:
        return None
    return int((live.get("spec") or {}).get("replicas", 1))


def owns_replicas(live: Manifest, manager: str = FIELD_MANAGER) -> bool:
    """True when `manager` holds `spec.replicas` of the live object through server-side apply."""
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            return True
    return False


def deployment_settled(desired: Manifest, live: Manifest | None) -> bool:
    """The Deployment runs its current template on exactly the desired number of ready pods."""
    want = wanted_replicas(desired, live)
    if live is None or want is None:
        return False
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
            "desired_replicas": sum(wanted_replicas(d, live) or 0 for d, live in deployments),
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


@dataclass(frozen=True)
class DesiredState:
    """What one resource should have: its plan and children, or (`stopped`) why nothing can run."""

    generation: int
    previous: SpeculativeDeploymentStatus
    sd: SpeculativeDeployment | None = None
    plan: Mapping[PoolName, PoolPlan] = field(default_factory=dict)
    children: list[Manifest] = field(default_factory=list)
    # The final result when the resource cannot run (invalid or unsupported): nothing to apply.
    stopped: ReconcileResult | None = None


def desired_state(
    body: Mapping[str, Any] | SpeculativeDeployment,
    now: datetime,
    options: RenderOptions | None = None,
    status: SpeculativeDeploymentStatus | None = None,
) -> DesiredState:
    """Parse (unless given parsed), check, plan and render one resource (pure).

    `status` replaces the resource's own status as the starting point, e.g. the policy's just-recorded
    decision, which is then rendered without a round trip through the serialized status.
    """
    if isinstance(body, SpeculativeDeployment):
        sd = body
        generation, previous = sd.generation, status if status is not None else sd.status
    else:
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        previous = status if status is not None else parse_status(body.get("status"))
        try:
            sd = parse_resource(body)
        except InvalidResourceError as err:
            # The apiserver's schema normally stops this first; an older CRD or a bypass can still get here.
            message = reasons.with_link(str(err), reasons.INVALID_SPEC)
            degraded = _degraded_status(previous, generation, reasons.INVALID_SPEC, message, now)
            events = [] if _was_degraded(previous) else [Event("Warning", reasons.EVENT_DEGRADED, message)]
            return DesiredState(generation, previous, stopped=ReconcileResult(degraded.to_wire(), events))
    problems = find_problems(sd.spec)
    if problems:
        message = reasons.with_link("; ".join(problems), reasons.UNSUPPORTED_CONFIGURATION)
        degraded = _degraded_status(previous, generation, reasons.UNSUPPORTED_CONFIGURATION, message, now)
        same = any(c.type == reasons.DEGRADED and c.message == message for c in previous.conditions)
        events = [] if same else [Event("Warning", reasons.EVENT_DEGRADED, message)]
        return DesiredState(generation, previous, sd, stopped=ReconcileResult(degraded.to_wire(), events))
    plan = decided_plan(sd, previous)
    return DesiredState(generation, previous, sd, plan, render_children(sd, plan, options))


def _with_replicas(manifest: Manifest, replicas: int) -> Manifest:
    held = {**manifest, "spec": {**manifest["spec"], "replicas": replicas}}
    held["metadata"] = {
        **manifest["metadata"],
        "annotations": dict(manifest["metadata"].get("annotations") or {}),
    }
    return with_render_hash(held)


def _track(child: Manifest) -> str:
    return str((child["metadata"].get("labels") or {}).get(LABEL_TRACK, "stable"))


def hand_over(children: list[Manifest], live: Mapping[str, Manifest | None]) -> list[Manifest]:
    """Make before break between a pool's stable and canary Deployments (pure).

    Canaries come out of a pool's replicas, so scaling them moves replicas between two Deployments.
    Applied at once, the shrinking one stops pods while the growing one's are still starting, and the
    pool serves on fewer engines for a start-up. So the shrinking Deployment is held at its live count
    until the growing one is settled (its pods ready); the reconcile after that (a resync, or the
    policy's next change) lets it go. Meanwhile the pool runs up to that many pods more than its
    replicas, as a surge rollout does. `live` is by "Kind/name"; Deployments without both parts live
    (a first reconcile, an autoscaled stable one) are left as rendered.
    """
    held: dict[str, Manifest] = {}
    for pool in POOLS:
        tracks = {_track(child): (child, lv) for child, lv in _pool_deployments(children, live, pool)}
        if "stable" not in tracks or "canary" not in tracks:
            continue
        (stable, stable_live), (canary, canary_live) = tracks["stable"], tracks["canary"]
        if stable_live is None or canary_live is None or "replicas" not in stable["spec"]:
            continue
        for shrinking, shrinking_live, growing, growing_live in (
            (canary, canary_live, stable, stable_live),
            (stable, stable_live, canary, canary_live),
        ):
            running = int((shrinking_live.get("spec") or {}).get("replicas", 0))
            if int(shrinking["spec"]["replicas"]) < running and not deployment_settled(growing, growing_live):
                held[_describe(shrinking)] = _with_replicas(shrinking, running)
    return [held.get(_describe(child), child) for child in children]


def read_hand_over(
    desired: DesiredState, cluster: Cluster
) -> tuple[DesiredState, dict[str, Manifest | None]]:
    """`hand_over` on the live pool Deployments (the I/O step: reads the stable and canary
    Deployments of pools that have a canary); the held desired state and what was read."""
    read: dict[str, Manifest | None] = {}
    for pool in POOLS:
        deployments = [child for child, _ in _pool_deployments(desired.children, {}, pool)]
        if any(_track(child) == "canary" for child in deployments):
            read.update({_describe(child): cluster.get(child) for child in deployments})
    if not read:
        return desired, read
    return replace(desired, children=hand_over(desired.children, read)), read


@dataclass
class AppliedChildren:
    """What applying the children did: the live objects by kind/name, and what was written and why."""

    live: dict[str, Manifest | None] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    # Why a pool short of ready replicas is short, from its pods and Deployments (read only then).
    failures: dict[str, PoolFailure] = field(default_factory=dict)


def apply_children(
    children: list[Manifest],
    cluster: Cluster,
    *,
    reconciled_before: bool,
    read: Mapping[str, Manifest | None] | None = None,
) -> AppliedChildren:
    """Write only the children whose live object differs (the I/O step); read every one back.

    A resource never reconciled before has no children yet: they are applied without reading each
    first (server-side apply of an identical object changes nothing if one does exist), which halves
    the API calls when hundreds of resources arrive at once. `read`: live objects this reconcile has
    already read (by "Kind/name"), not read again.
    """
    out = AppliedChildren()
    read = read or {}
    for child in children:
        # An autoscaled Deployment is always read first: if one exists with replicas we own (status
        # lost, resource re-created over its children), an apply without them would reset the count.
        if _describe(child) in read:
            live = read[_describe(child)]
        else:
            live = cluster.get(child) if reconciled_before or _autoscaled_deployment(child) else None
        why = write_reason(child, live)
        if live is not None and _releases_replicas(child, live):
            # Autoscaling was just turned on: an apply that leaves out a field only we own resets it
            # (replicas to 1). A second manager takes the live count first, so ours is released
            # without a change; the autoscaler's first scale then takes it over from that manager.
            try:
                cluster.hand_over_replicas(child, int(live["spec"].get("replicas", 1)))
            except ApplyRejectedError as err:
                out.errors.append(f"{_describe(child)}: {err}")
                continue
            why = why or "changed"
        if why is not None:
            try:
                live = cluster.apply(child)
            except ApplyRejectedError as err:
                out.errors.append(f"{_describe(child)}: {err}")
                continue
            out.applied.append(_describe(child))
            # A child missing after we had reconciled before was deleted by hand: also drift.
            if why == "edited" or (why == "missing" and reconciled_before):
                out.drift.append(_describe(child))
        out.live[_describe(child)] = live
    return out


def _autoscaled_deployment(desired: Manifest) -> bool:
    return desired["kind"] == "Deployment" and "replicas" not in desired["spec"]


def _releases_replicas(desired: Manifest, live: Manifest) -> bool:
    """A Deployment rendered without replicas (autoscaled) whose live replicas are still ours."""
    return _autoscaled_deployment(desired) and owns_replicas(live)


def stale_children(rendered: list[Manifest], live: list[Manifest], owner_uid: str) -> list[Manifest]:
    """Live objects this resource owns that the render no longer produces (pure).

    Only objects whose owner reference names the resource's uid count: a look-alike someone else made
    with the same labels is never deleted.
    """
    wanted = {(m["kind"], m["metadata"]["name"]) for m in rendered}
    return [
        obj
        for obj in live
        if (obj.get("kind"), obj["metadata"]["name"]) not in wanted
        and any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or [])
    ]


def prune_children(desired: DesiredState, cluster: Cluster) -> tuple[list[str], list[str]]:
    """Delete what the resource owns but no longer renders (the I/O step); (pruned, errors)."""
    assert desired.sd is not None
    sd = desired.sd
    pruned: list[str] = []
    errors: list[str] = []
    for api_version, kind in MANAGED_KINDS:
        try:
            listed = cluster.list_children(api_version, kind, sd.namespace, owner_labels(sd))
        except ApplyRejectedError as err:
            errors.append(f"listing {kind}: {err}")
            continue
        if kind == "Job" and sd.spec.drafter.retrain is not None:
            continue  # retrain Jobs are never rendered: pruned only once the spec drops drafter.retrain
        live = [{**obj, "kind": kind, "apiVersion": api_version} for obj in listed]
        for obj in stale_children(desired.children, live, sd.uid):
            try:
                cluster.delete_child(obj)
            except ApplyRejectedError as err:
                errors.append(f"{_describe(obj)}: {err}")
                continue
            pruned.append(_describe(obj))
    return pruned, errors


def read_pool_failures(desired: DesiredState, applied: AppliedChildren, cluster: Cluster) -> None:
    """For each pool short of ready replicas or still rolling out, why (pods are listed only then: a
    healthy, settled fleet costs nothing). A surge rollout whose new pods fail (a drafter that does not
    fit) keeps the old pods ready: only the rollout shows it."""
    assert desired.sd is not None
    sd = desired.sd
    for pool in POOLS:
        pairs = _pool_deployments(desired.children, applied.live, pool)
        deployments = [live for _, live in pairs]
        ready = sum(int(((d or {}).get("status") or {}).get("readyReplicas", 0)) for d in deployments)
        settled = all(deployment_settled(child, live) for child, live in pairs)
        if ready >= _needed_replicas(sd, pool, desired.children, applied.live) and settled:
            continue
        try:
            pods = cluster.list_children("v1", "Pod", sd.namespace, {**owner_labels(sd), LABEL_POOL: pool})
        except ApplyRejectedError:
            pods = []  # no permission to read pods: the Deployments alone still tell a deadline
        failure = pool_failure(pods, deployments)
        if failure is not None:
            applied.failures[pool] = failure


def _pool_deployments(
    children: list[Manifest], live: Mapping[str, Manifest | None], pool: PoolName
) -> list[tuple[Manifest, Manifest | None]]:
    return [
        (child, live.get(_describe(child)))
        for child in children
        if child["kind"] == "Deployment" and child["metadata"]["labels"].get(LABEL_POOL) == pool
    ]


def _needed_replicas(
    sd: SpeculativeDeployment, pool: PoolName, children: list[Manifest], live: Mapping[str, Manifest | None]
) -> int:
    """Ready engines the pool needs to be Ready: its fixed `replicas`, or for an autoscaled pool what
    its Deployments ask for now (the autoscaler's count plus canaries), at least `minReplicas`."""
    spec: PoolSpec = getattr(sd.spec.pools, pool)
    if spec.autoscaling is None:
        return spec.replicas
    asked = sum(wanted_replicas(d, lv) or 0 for d, lv in _pool_deployments(children, live, pool))
    return max(asked, spec.autoscaling.min_replicas)


def _pool_statuses(desired: DesiredState, applied: AppliedChildren) -> PoolStatuses:
    """Each pool's status from its live Deployments (stable and canary)."""
    pools = desired.previous.pools.model_copy()
    for pool in POOLS:
        deployments = _pool_deployments(desired.children, applied.live, pool)
        plan = desired.plan[pool]
        updated = pool_status_from_deployments(getattr(pools, pool), plan.mode, deployments)
        if desired.sd is not None:  # the K the engines are rendered with (kubectl's K column)
            drafted = plan.k if plan.k is not None else desired.sd.spec.drafter.num_speculative_tokens
            updated.k = drafted if plan.mode == "On" else 0
        setattr(pools, pool, updated)
    return pools


def _conditions(
    desired: DesiredState, applied: AppliedChildren, pools: PoolStatuses, now: datetime
) -> list[Condition]:
    """Degraded, Progressing, SpeculationSettled and Ready from what was applied and what is live."""
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
    if applied.errors:
        conditions = set_(conditions, reasons.DEGRADED, True, reasons.APPLY_FAILED, _apply_failed(applied))
    else:
        conditions = set_(conditions, reasons.DEGRADED, False, reasons.AS_EXPECTED, "")
    modes = {pool: desired.plan[pool].mode for pool in POOLS}
    states = [(p, getattr(pools, p)) for p in POOLS]
    unsettled = [p for p, s in states if not s.settled]
    needed = {p: _needed_replicas(sd, p, desired.children, applied.live) for p in POOLS}
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
    return _autoscaling_condition(conditions, desired, applied, generation, now)


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
        live = applied.live.get(_describe(child)) or {}
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


def _events(desired: DesiredState, applied: AppliedChildren) -> list[Event]:
    """Degraded on a new apply error, Recovered, ChildrenApplied, DriftCorrected, ChildrenPruned."""
    events: list[Event] = []
    previous = desired.previous
    if applied.errors:
        message = _apply_failed(applied)
        if not any(c.type == reasons.DEGRADED and c.message == message for c in previous.conditions):
            events.append(Event("Warning", reasons.EVENT_DEGRADED, message))
    elif _was_degraded(previous):
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
    return ReconcileResult(status.to_wire(), _events(desired, applied), list(applied.applied))


def reconcile(
    body: Mapping[str, Any] | SpeculativeDeployment,
    cluster: Cluster,
    now: datetime,
    options: RenderOptions | None = None,
    *,
    status: SpeculativeDeploymentStatus | None = None,
) -> ReconcileResult:
    """Bring the children of one resource (its body, or already parsed) to the rendered state and
    compute its new status."""
    desired = desired_state(body, now, options, status)
    if desired.stopped is not None:
        return desired.stopped
    reconciled_before = desired.previous.observed_generation is not None
    read: dict[str, Manifest | None] = {}
    if reconciled_before:
        # Canaries scaled: the shrinking Deployment waits for the growing one (make before break).
        desired, read = read_hand_over(desired, cluster)
    applied = apply_children(desired.children, cluster, reconciled_before=reconciled_before, read=read)
    if reconciled_before and desired.previous.observed_generation != desired.generation:
        # Only a spec change can make the render produce fewer children: prune then, not every resync
        # (a list per managed kind per resource would dominate the API load of a large fleet).
        applied.pruned, prune_errors = prune_children(desired, cluster)
        applied.errors += prune_errors
    if reconciled_before:  # a first reconcile has just created the pods' Deployments
        read_pool_failures(desired, applied, cluster)
    return reported_status(desired, applied, now)


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level status keys whose value changed (lists assigned whole: merge-patch replaces lists)."""
    current = current or {}
    return {k: v for k, v in desired.items() if current.get(k) != v}
