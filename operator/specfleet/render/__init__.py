"""The pure renderer: a SpeculativeDeployment and each pool's decided mode in, child manifests out.

Deterministic (same input, byte-identical output) and free of I/O; every child carries a render-hash
annotation so the operator can skip writes that would change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from specfleet.api.models import PoolName, SpeculationMode
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import Manifest, RenderOptions, with_render_hash
from specfleet.render.engine import (
    canary_replicas,
    render_pool_deployment,
    render_pool_pdb,
    render_pool_service,
)
from specfleet.render.monitoring import render_pod_monitor
from specfleet.render.router import (
    render_router_deployment,
    render_router_role,
    render_router_role_binding,
    render_router_service,
    render_router_service_account,
    render_routing_config_map,
)

__all__ = ["Manifest", "RenderOptions", "render_children"]

POOLS: tuple[PoolName, ...] = ("latency", "batch")


def render_children(
    sd: SpeculativeDeployment,
    modes: Mapping[PoolName, SpeculationMode],
    options: RenderOptions | None = None,
    ks: Mapping[PoolName, int | None] | None = None,
    canaries: Mapping[PoolName, int | None] | None = None,
) -> list[Manifest]:
    """Every child object of `sd`, in apply order (config and RBAC before the pods that use them).

    `modes`, `ks` and `canaries` are the decided state: each pool's speculation mode and, where the
    policy chose them, the K it drafts (default: the drafter's) and its canary replicas while off
    (default: policy.reentry.canaryReplicas).
    """
    options = options or RenderOptions()
    ks = ks or {}
    canaries = canaries or {}
    children: list[Manifest] = [
        render_routing_config_map(sd),
        render_router_service_account(sd),
        render_router_role(sd),
        render_router_role_binding(sd),
    ]
    for pool in POOLS:
        children += [
            render_pool_service(sd, pool),
            render_pool_pdb(sd, pool),
            render_pool_deployment(sd, pool, modes[pool], k=ks.get(pool), canaries=canaries.get(pool)),
        ]
        if canary_replicas(sd, pool) is not None:
            children.append(
                render_pool_deployment(
                    sd, pool, modes[pool], track="canary", k=ks.get(pool), canaries=canaries.get(pool)
                )
            )
    children += [render_router_service(sd, options), render_router_deployment(sd, options)]
    if sd.spec.monitoring.pod_monitor:
        children.append(render_pod_monitor(sd))
    return [with_render_hash(child) for child in children]
