"""Pure reads of rendered children against their live objects: what differs, who owns the replicas,
whether a pool's Deployments have settled and how many ready engines it needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from specfleet.api.constants import ANNOTATION_RENDER_HASH, FIELD_MANAGER, LABEL_POOL, LABEL_TRACK, PoolName
from specfleet.api.pools import PoolSpec
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render import Manifest


def describe(manifest: Manifest) -> str:
    """The child's "Kind/name", the key live objects go by."""
    return f"{manifest['kind']}/{manifest['metadata']['name']}"


def track(child: Manifest) -> str:
    """The Deployment's track label: stable, or canary (re-entry)."""
    return str((child["metadata"].get("labels") or {}).get(LABEL_TRACK, "stable"))


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


def pool_deployments(
    children: list[Manifest], live: Mapping[str, Manifest | None], pool: PoolName
) -> list[tuple[Manifest, Manifest | None]]:
    return [
        (child, live.get(describe(child)))
        for child in children
        if child["kind"] == "Deployment" and child["metadata"]["labels"].get(LABEL_POOL) == pool
    ]


def needed_replicas(
    sd: SpeculativeDeployment, pool: PoolName, children: list[Manifest], live: Mapping[str, Manifest | None]
) -> int:
    """Ready engines the pool needs to be Ready: its fixed `replicas`, or for an autoscaled pool what
    its Deployments ask for now (the autoscaler's count plus canaries), at least `minReplicas`."""
    spec: PoolSpec = getattr(sd.spec.pools, pool)
    if spec.autoscaling is None:
        return spec.replicas
    asked = sum(wanted_replicas(d, lv) or 0 for d, lv in pool_deployments(children, live, pool))
    return max(asked, spec.autoscaling.min_replicas)
