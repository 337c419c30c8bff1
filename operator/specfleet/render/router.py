"""Render the router: routing ConfigMap, Deployment, Service, and the RBAC it needs (pure)."""

from __future__ import annotations

from typing import Any, Final, Literal

from specfleet.api.constants import POOLS
from specfleet.api.routing import RoutingFallback
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import (
    Manifest,
    RenderOptions,
    hardened_container,
    metadata,
    pool_name,
    router_name,
    routing_config_map_name,
    selector_labels,
)
from specfleet.render.standby import speculative_service_name, standby_pool
from specfleet_runtime.names import ENGINE_PORT, STANDBY_SPECULATIVE_PORT
from specfleet_runtime.routing_config import ROUTING_CONFIG_KEY, RoutingConfig

ROUTER_COMPONENT = "router"
# The router's routing.json keeps its own spelling of the fallback, so a router of the previous
# version still reads the ConfigMap during an upgrade.
ROUTER_FALLBACK: Final[dict[RoutingFallback, Literal["otherPool", "reject"]]] = {
    "OtherPool": "otherPool",
    "Reject": "reject",
}
ROUTER_SERVICE_PORT = 80


def routing_config(sd: SpeculativeDeployment) -> RoutingConfig:
    """The data-plane routing contract for this resource: `spec.routing` as the router reads it.

    The API's routing fields are the contract's own (a unit test holds them equal), so they pass as they are.
    """
    routing = sd.spec.routing.model_dump(exclude={"router", "gateway"})
    pools: dict[str, dict[str, Any]] = {p: {"service": pool_name(sd, p), "port": ENGINE_PORT} for p in POOLS}
    for pool in POOLS:
        if standby_pool(sd, pool):
            # A Standby pool's pods serve from either engine: the union of both Services' endpoints.
            service = {"service": speculative_service_name(sd, pool), "port": STANDBY_SPECULATIVE_PORT}
            pools[pool]["extra_services"] = [service]
    routing["fallback"] = ROUTER_FALLBACK[sd.spec.routing.fallback]
    return RoutingConfig.from_dict({**routing, "served_model_name": sd.served_model_name, "pools": pools})


def render_routing_config_map(sd: SpeculativeDeployment) -> Manifest:
    """The ConfigMap the router watches; edits reload without a restart."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(sd, routing_config_map_name(sd), ROUTER_COMPONENT),
        "data": {ROUTING_CONFIG_KEY: routing_config(sd).to_json()},
    }


def render_router_service_account(sd: SpeculativeDeployment) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(sd, router_name(sd), ROUTER_COMPONENT),
    }


def render_router_role(sd: SpeculativeDeployment) -> Manifest:
    """Read-only, namespace-scoped: the router needs its own ConfigMap and the pools' EndpointSlices.

    The ConfigMap rule names that one ConfigMap (list/watch pass with resourceNames because the router
    lists with `fieldSelector=metadata.name=<name>`); EndpointSlices are found by label, so that rule
    cannot be narrowed by name.
    """
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(sd, router_name(sd), ROUTER_COMPONENT),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [routing_config_map_name(sd)],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }


def render_router_role_binding(sd: SpeculativeDeployment) -> Manifest:
    name = router_name(sd)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(sd, name, ROUTER_COMPONENT),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": sd.namespace}],
    }


def render_router_deployment(sd: SpeculativeDeployment, options: RenderOptions) -> Manifest:
    """The router pods: the operator's image, run with the router command."""
    spec = sd.spec
    name = router_name(sd)
    meta = metadata(sd, name, ROUTER_COMPONENT)
    annotations: dict[str, str] = {}
    if spec.monitoring.scrape_annotations:
        annotations = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(options.router_port),
            "prometheus.io/path": "/metrics",
        }
    template_meta: dict[str, Any] = {"labels": dict(meta["labels"])}
    if annotations:
        template_meta["annotations"] = annotations
    container: dict[str, Any] = {
        "name": "router",
        "image": spec.routing.router.image or options.router_image,
        "command": ["specfleet-router"],
        "args": [
            "--configmap",
            f"{sd.namespace}/{routing_config_map_name(sd)}",
            "--port",
            str(options.router_port),
        ],
        "ports": [{"name": "http", "containerPort": options.router_port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": hardened_container(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": spec.routing.router.replicas,
            "selector": {"matchLabels": selector_labels(sd, ROUTER_COMPONENT)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": template_meta,
                "spec": {
                    "serviceAccountName": name,
                    "containers": [container],
                    # Long enough to finish in-flight streams after SIGTERM.
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def render_router_service(sd: SpeculativeDeployment, options: RenderOptions) -> Manifest:
    """The client-facing Service: named after the resource itself."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(sd, sd.name, ROUTER_COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(sd, ROUTER_COMPONENT),
            "ports": [{"name": "http", "port": ROUTER_SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_router_pdb(sd: SpeculativeDeployment) -> Manifest | None:
    """A node drain takes at most one router pod at a time; None for a single router (a budget of one
    pod would block every drain, and a budget that allows zero protects nothing)."""
    if sd.spec.routing.router.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(sd, router_name(sd), ROUTER_COMPONENT),
        "spec": {
            # maxUnavailable, not minAvailable: it holds at any replica count without a re-render.
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(sd, ROUTER_COMPONENT)},
        },
    }
