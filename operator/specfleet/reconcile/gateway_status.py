"""The GatewayAccepted condition (pure): what the Gateways say of the HTTPRoute and the InferencePools
(each parent's Accepted and ResolvedRefs), and which routing rules a route cannot express."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specfleet.api import reasons
from specfleet.api.conditions import ConditionStatus, set_condition
from specfleet.api.status import Condition
from specfleet.api.validation import SpeculativeDeployment
from specfleet.reconcile.children import describe
from specfleet.render import Manifest
from specfleet.render.gateway import unexpressed_rules

# The children whose parents report on them, and the conditions each parent must hold True.
REPORTED_KINDS = ("HTTPRoute", "InferencePool")
PARENT_CONDITIONS = ("Accepted", "ResolvedRefs")


def _parent_name(parent: Mapping[str, Any]) -> str:
    ref = parent.get("parentRef") or {}
    namespace = ref.get("namespace")
    return f"{namespace}/{ref.get('name')}" if namespace else str(ref.get("name"))


def parent_reports(live: Manifest | None) -> tuple[list[str], list[str], list[str]]:
    """(accepted, pending, failing) descriptions of one child's parents: failing with the parent's
    own reason and message; pending while a condition is missing or older than the object."""
    if live is None:
        return [], ["not created yet"], []
    generation = (live.get("metadata") or {}).get("generation")
    parents = (live.get("status") or {}).get("parents") or []
    if not parents:
        return [], ["no Gateway has reported on it yet"], []
    accepted: list[str] = []
    pending: list[str] = []
    failing: list[str] = []
    for parent in parents:
        found = {c.get("type"): c for c in parent.get("conditions") or []}
        name = _parent_name(parent)
        bad = [found[t] for t in PARENT_CONDITIONS if t in found and found[t].get("status") != "True"]
        stale = [
            t
            for t in PARENT_CONDITIONS
            if t not in found
            or (generation is not None and found[t].get("observedGeneration", generation) < generation)
        ]
        if bad:
            failing += [
                f"{name}: {c.get('type')}={c.get('status')} ({c.get('reason', '')}: {c.get('message', '')})"
                for c in bad
            ]
        elif stale:
            pending.append(f"{name} has not reported {' and '.join(stale)} on the current generation")
        else:
            accepted.append(name)
    return accepted, pending, failing


def gateway_condition(
    conditions: list[Condition],
    sd: SpeculativeDeployment,
    children: list[Manifest],
    live: Mapping[str, Manifest | None],
    generation: int,
    now: datetime,
) -> list[Condition]:
    """GatewayAccepted from the parents' reports (absent outside gateway mode). False when a parent
    refuses a child, Unknown while any has not reported, True when every one accepted every child."""
    if sd.spec.routing.gateway is None:
        return [c for c in conditions if c.type != reasons.GATEWAY_ACCEPTED]
    failing: list[str] = []
    pending: list[str] = []
    accepted: set[str] = set()
    for child in (c for c in children if c["kind"] in REPORTED_KINDS):
        ok, waiting, bad = parent_reports(live.get(describe(child)))
        accepted.update(ok)
        pending += [f"{describe(child)}: {w}" for w in waiting]
        failing += [f"{describe(child)}: {b}" for b in bad]
    status: ConditionStatus
    if failing:
        status, reason = "False", reasons.ROUTES_NOT_ACCEPTED
        message = reasons.with_link("; ".join(failing), reason)
    elif pending:
        status, reason = "Unknown", reasons.ROUTES_PENDING
        message = reasons.with_link("; ".join(pending), reason)
    else:
        status, reason = "True", reasons.ROUTES_ACCEPTED
        message = f"accepted by {', '.join(sorted(accepted))}"
    lost = unexpressed_rules(sd)
    if lost:
        message += "; not expressed by the route, so not applied: " + "; ".join(lost)
    return set_condition(
        conditions,
        type_=reasons.GATEWAY_ACCEPTED,
        status=status,
        reason=reason,
        message=message,
        generation=generation,
        now=now,
    )
