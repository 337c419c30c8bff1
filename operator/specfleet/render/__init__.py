"""The pure renderer: a SpeculativeDeployment and each pool's decided mode in, child manifests out.

Deterministic (same input, byte-identical output) and free of I/O; every child carries a render-hash
annotation so the operator can skip writes that would change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specfleet.api.constants import LABEL_INSTANCE, LABEL_MANAGED_BY, POOLS, PoolName
from specfleet.api.drafter import DynamicScheduleRange
from specfleet.api.fields import SpeculationMode
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.autoscaling import render_pool_autoscaler
from specfleet.render.common import MANAGED_BY, Manifest, RenderOptions, with_render_hash
from specfleet.render.engine import (
    canary_replicas,
    render_pool_deployment,
    render_pool_pdb,
    render_pool_service,
    render_pool_speculative_service,
)
from specfleet.render.gateway import render_gateway_children
from specfleet.render.monitoring import render_pod_monitor, render_prometheus_rule
from specfleet.render.network_policy import render_engine_network_policy
from specfleet.render.router import (
    render_router_deployment,
    render_router_pdb,
    render_router_role,
    render_router_role_binding,
    render_router_service,
    render_router_service_account,
    render_routing_config_map,
)
from specfleet.render.standby import standby_pool

__all__ = [
    "GATEWAY_KINDS",
    "MANAGED_KINDS",
    "POOLS",
    "Manifest",
    "PoolPlan",
    "RenderOptions",
    "owner_labels",
    "plan_of",
    "render_children",
]

# Every (apiVersion, kind) render_children can produce: what the operator may prune when the render no
# longer produces an object it made (and the only kinds its RBAC may delete).
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    # Drafter retrain Jobs (render.retrain): created by the policy when drift lasts, not on every render.
    ("batch/v1", "Job"),
)
# The kinds only gateway mode renders: pruned only by a resource in (or leaving) gateway mode, since a
# cluster without their CRDs, or an operator installed without gateway RBAC, cannot list them.
GATEWAY_KINDS: tuple[tuple[str, str], ...] = (
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
)


def owner_labels(sd: SpeculativeDeployment) -> dict[str, str]:
    """Labels every child of `sd` carries: selects what the operator made for this resource."""
    return {LABEL_INSTANCE: sd.name, LABEL_MANAGED_BY: MANAGED_BY}


@dataclass(frozen=True)
class PoolPlan:
    """The decided state of one pool: its speculation mode and, where the policy chose them, the K it
    drafts (None: the drafter's) and its canary replicas while off (None: policy.reentry's).
    Decided by reconcile (spec or the policy's status), drawn here."""

    mode: SpeculationMode
    k: int | None = None
    canaries: int | None = None
    # The Goodput policy's Dynamic SD schedule for the pool while it speculates (None: none chosen).
    schedule: tuple[DynamicScheduleRange, ...] | None = None
    # Each pod runs both engines, one asleep (rollout.flip Standby, unless its engines could not sleep).
    standby: bool = False


def plan_of(
    modes: Mapping[PoolName, SpeculationMode],
    ks: Mapping[PoolName, int | None] | None = None,
    sd: SpeculativeDeployment | None = None,
) -> dict[PoolName, PoolPlan]:
    """A plan from plain modes (and Ks): for tests and tools that pick the modes themselves (with `sd`,
    its Standby pools are planned Standby)."""
    return {
        pool: PoolPlan(modes[pool], (ks or {}).get(pool), standby=sd is not None and standby_pool(sd, pool))
        for pool in POOLS
    }


def render_children(
    sd: SpeculativeDeployment,
    plan: Mapping[PoolName, PoolPlan],
    options: RenderOptions | None = None,
) -> list[Manifest]:
    """Every child object of `sd`, in apply order (config and RBAC before the pods that use them)."""
    options = options or RenderOptions()
    gateway = sd.spec.routing.gateway is not None
    children: list[Manifest] = []
    if not gateway:  # in gateway mode the Gateway and the endpoint pickers replace the router
        children += [
            render_routing_config_map(sd),
            render_router_service_account(sd),
            render_router_role(sd),
            render_router_role_binding(sd),
        ]
    # Before the engine pods, so none of them is ever reachable around the router.
    if sd.spec.network_policy.enabled:
        children.append(render_engine_network_policy(sd, options.operator_namespace))
    for pool in POOLS:
        children.append(render_pool_service(sd, pool, standby=plan[pool].standby))
        if standby_pool(sd, pool):
            children.append(render_pool_speculative_service(sd, pool))
        children += [
            render_pool_pdb(sd, pool),
            render_pool_deployment(
                sd,
                pool,
                plan[pool].mode,
                k=plan[pool].k,
                canaries=plan[pool].canaries,
                options=options,
                schedule=plan[pool].schedule,
                standby=plan[pool].standby,
            ),
        ]
        if canary_replicas(sd, pool) is not None:
            children.append(
                render_pool_deployment(
                    sd,
                    pool,
                    plan[pool].mode,
                    track="canary",
                    k=plan[pool].k,
                    canaries=plan[pool].canaries,
                    options=options,
                )
            )
        autoscaler = render_pool_autoscaler(sd, pool)
        if autoscaler is not None:
            children.append(autoscaler)
    if gateway:
        children += render_gateway_children(sd)
    else:
        children += [render_router_service(sd, options), render_router_deployment(sd, options)]
        router_pdb = render_router_pdb(sd)
        if router_pdb is not None:
            children.append(router_pdb)
    if sd.spec.monitoring.pod_monitor:
        children.append(render_pod_monitor(sd, options))
    if sd.spec.monitoring.prometheus_rule:
        children.append(render_prometheus_rule(sd, options))
    return [with_render_hash(child) for child in children]
