"""The I/O step: write the children that differ, hand replicas over between a pool's stable and
canary Deployments, prune what the spec no longer asks for, and read why a pool is short."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from specfleet.api import reasons
from specfleet.api.constants import LABEL_POOL
from specfleet.reconcile.children import (
    deployment_settled,
    describe,
    needed_replicas,
    owns_replicas,
    pool_deployments,
    track,
    write_reason,
)
from specfleet.reconcile.desired import DesiredState
from specfleet.reconcile.pod_failures import PoolFailure, pool_failure
from specfleet.reconcile.pod_startup import pool_startup_seconds
from specfleet.reconcile.result import ApplyRejectedError, Cluster
from specfleet.reconcile.standby_flip import replica_of
from specfleet.reconcile.standby_flip import settled as standby_settled
from specfleet.render import GATEWAY_KINDS, MANAGED_KINDS, POOLS, Manifest, owner_labels
from specfleet.render.common import with_render_hash


def _with_replicas(manifest: Manifest, replicas: int) -> Manifest:
    held = {**manifest, "spec": {**manifest["spec"], "replicas": replicas}}
    held["metadata"] = {
        **manifest["metadata"],
        "annotations": dict(manifest["metadata"].get("annotations") or {}),
    }
    return with_render_hash(held)


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
        tracks = {track(child): (child, lv) for child, lv in pool_deployments(children, live, pool)}
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
                held[describe(shrinking)] = _with_replicas(shrinking, running)
    return [held.get(describe(child), child) for child in children]


def read_hand_over(
    desired: DesiredState, cluster: Cluster
) -> tuple[DesiredState, dict[str, Manifest | None]]:
    """`hand_over` on the live pool Deployments (the I/O step: reads the stable and canary
    Deployments of pools that have a canary); the held desired state and what was read."""
    read: dict[str, Manifest | None] = {}
    for pool in POOLS:
        deployments = [child for child, _ in pool_deployments(desired.children, {}, pool)]
        if any(track(child) == "canary" for child in deployments):
            read.update({describe(child): cluster.get(child) for child in deployments})
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
    # Each pool's engines' start-up measured from the pods listed (`pod_startup`; only where listed).
    startups: dict[str, int] = field(default_factory=dict)
    # Standby pools whose pods do not all serve the decided mode yet (a flip the driver carries out).
    standby_flipping: set[str] = field(default_factory=set)


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
        if describe(child) in read:
            live = read[describe(child)]
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
                out.errors.append(f"{describe(child)}: {err}")
                continue
            why = why or "changed"
        if why is not None:
            try:
                live = cluster.apply(child)
            except ApplyRejectedError as err:
                out.errors.append(f"{describe(child)}: {err}")
                continue
            out.applied.append(describe(child))
            # A child missing after we had reconciled before was deleted by hand: also drift.
            if why == "edited" or (why == "missing" and reconciled_before):
                out.drift.append(describe(child))
        out.live[describe(child)] = live
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
    kinds = MANAGED_KINDS
    if sd.spec.routing.gateway is not None or any(
        c.type == reasons.GATEWAY_ACCEPTED for c in desired.previous.conditions
    ):  # in gateway mode, or leaving it (its condition is still there)
        kinds += GATEWAY_KINDS
    for api_version, kind in kinds:
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
                errors.append(f"{describe(obj)}: {err}")
                continue
            pruned.append(describe(obj))
    return pruned, errors


def read_pool_pods(desired: DesiredState, applied: AppliedChildren, cluster: Cluster) -> None:
    """For each pool short of ready replicas or still rolling out, why, and how long its engines took
    to start (pods are listed only then, or once for a pool with Ready pods and no start-up measured
    yet: a healthy, settled fleet costs nothing). A surge rollout whose new pods fail (a drafter that
    does not fit) keeps the old pods ready: only the rollout shows it. A Standby pool's pods are listed
    every time: its flips change no template, so only their labels say whether a flip is done."""
    assert desired.sd is not None
    sd = desired.sd
    for pool in POOLS:
        pairs = pool_deployments(desired.children, applied.live, pool)
        deployments = [live for _, live in pairs]
        ready = sum(int(((d or {}).get("status") or {}).get("readyReplicas", 0)) for d in deployments)
        settled = all(deployment_settled(child, live) for child, live in pairs)
        unmeasured = ready > 0 and getattr(desired.previous.pools, pool).startup_seconds is None
        standby = desired.plan[pool].standby
        quiet = (
            ready >= needed_replicas(sd, pool, desired.children, applied.live) and settled and not unmeasured
        )
        if quiet and not standby:
            continue
        try:
            pods = cluster.list_children("v1", "Pod", sd.namespace, {**owner_labels(sd), LABEL_POOL: pool})
        except ApplyRejectedError:
            pods = []  # no permission to read pods: the Deployments alone still tell a deadline
        if standby and not standby_settled(desired.plan[pool].mode, [replica_of(p) for p in pods]):
            applied.standby_flipping.add(pool)
        if quiet:
            continue
        failure = pool_failure(pods, deployments)
        if failure is not None:
            applied.failures[pool] = failure
        startup = pool_startup_seconds(pods)
        if startup is not None:
            applied.startups[pool] = startup
