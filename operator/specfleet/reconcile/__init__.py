"""One idempotent reconcile of a SpeculativeDeployment, with the Kubernetes API behind a seam.

Three steps, only the middle one with I/O: `desired_state` (desired.py, pure) parses the resource,
checks it can work, decides each pool's `PoolPlan` and renders the children (or, when it cannot run,
its final Degraded status); `apply_children` (apply.py) writes only the children that differ from the
live objects and reads them back; `reported_status` (report.py, pure) turns what is live into the full
new status and the events worth emitting. children.py compares rendered and live objects; result.py
holds the `Cluster` seam and what a reconcile returns. `reconcile` chains the steps. Kopf handlers call
it from create, update, resume and a resync, the policy after a flip; tests call it with a fake `Cluster`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment
from specfleet.reconcile.apply import apply_children, prune_children, read_hand_over, read_pool_pods
from specfleet.reconcile.desired import decided_plan, desired_state
from specfleet.reconcile.report import reported_status, status_patch
from specfleet.reconcile.result import ApplyRejectedError, Cluster, Event, ReconcileResult
from specfleet.render import Manifest, RenderOptions

# What callers outside the package use; the steps' helpers are imported from their modules.
__all__ = [
    "ApplyRejectedError",
    "Cluster",
    "Event",
    "ReconcileResult",
    "decided_plan",
    "desired_state",
    "reconcile",
    "status_patch",
]


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
        read_pool_pods(desired, applied, cluster)
    return reported_status(desired, applied, now)
