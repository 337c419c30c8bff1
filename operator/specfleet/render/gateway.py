"""Render gateway mode (pure): per pool an InferencePool, its InferenceObjective and, unless the user
names one, the endpoint picker (Deployment, Service, ServiceAccount, Role, RoleBinding); and one HTTPRoute
carrying the resource's routing rules to the Gateways of `spec.routing.gateway`.

The InferencePool selects its pool's engines on labels no speculation flip or canary changes, so surge
and canary pods join it when Ready and drained pods leave it, as they do the pool's Service.
"""

from __future__ import annotations

from typing import Any, Final

from specfleet.api.constants import POOLS, PoolName
from specfleet.api.gateway import GatewaySpec, PickerService
from specfleet.api.routing import EndpointSelection
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import Manifest, hardened_container, metadata, pool_name, selector_labels
from specfleet.render.engine import ENGINE_COMPONENT
from specfleet_runtime.names import ENGINE_PORT

INFERENCE_GROUP: Final = "inference.networking.k8s.io"
INFERENCE_POOL_API: Final = f"{INFERENCE_GROUP}/v1"
# InferenceObjective is still alpha, in the x-k8s.io group, in the pinned Inference Extension release.
OBJECTIVE_GROUP: Final = "inference.networking.x-k8s.io"
OBJECTIVE_API: Final = f"{OBJECTIVE_GROUP}/v1alpha2"
GATEWAY_GROUP: Final = "gateway.networking.k8s.io"
HTTP_ROUTE_API: Final = f"{GATEWAY_GROUP}/v1"
# The header a request names its InferenceObjective by (the endpoint picker reads it); the route sets
# it, replacing whatever the client sent, so a client cannot raise its own priority.
OBJECTIVE_HEADER: Final = "x-gateway-inference-objective"
# Priority per pool's objective: higher is served first under saturation, negative is sheddable.
OBJECTIVE_PRIORITY: Final[dict[PoolName, int]] = {"latency": 1, "batch": -1}
PICKER_COMPONENT: Final = "endpoint-picker"
ROUTE_COMPONENT: Final = "route"
# The endpoint picker's ports (its own defaults): ext_proc gRPC, gRPC health, metrics.
PICKER_GRPC_PORT: Final = 9002
PICKER_HEALTH_PORT: Final = 9003
PICKER_METRICS_PORT: Final = 9090
# The Gateway API's limit on the header matches of one HTTPRoute rule.
MAX_MATCHES_PER_RULE: Final = 64


def gateway_of(sd: SpeculativeDeployment) -> GatewaySpec:
    gateway = sd.spec.routing.gateway
    assert gateway is not None, "gateway mode only"
    return gateway


def inference_pool_name(sd: SpeculativeDeployment, pool: PoolName) -> str:
    """Name of a pool's InferencePool and InferenceObjective (the pool's Service has the same name)."""
    return pool_name(sd, pool)


def picker_name(sd: SpeculativeDeployment, pool: PoolName) -> str:
    """Name of the Deployment, Service, ServiceAccount and RBAC of a pool's endpoint picker."""
    return f"{sd.name}-{pool}-epp"


def picker_component(pool: PoolName) -> str:
    """The component label of a pool's picker: it tells the two pickers apart without the pool label,
    which would count its Deployment and pods as the pool's engines."""
    return f"{PICKER_COMPONENT}-{pool}"


def existing_picker(sd: SpeculativeDeployment, pool: PoolName) -> PickerService | None:
    """The user's own picker for `pool`, or None when the operator runs one."""
    existing: PickerService | None = getattr(gateway_of(sd).endpoint_picker.services, pool)
    return existing


def render_inference_pool(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """The pool's engines as an InferencePool: selected like the pool's Service (no speculation or track
    label), on the engine port, with the pool's endpoint picker."""
    existing = existing_picker(sd, pool)
    picker, port = (existing.name, existing.port) if existing else (picker_name(sd, pool), PICKER_GRPC_PORT)
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": metadata(sd, inference_pool_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            "selector": {"matchLabels": selector_labels(sd, ENGINE_COMPONENT, pool)},
            "targetPorts": [{"number": ENGINE_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker,
                "port": {"number": port},
                "failureMode": gateway_of(sd).endpoint_picker.failure_mode,
            },
        },
    }


def render_inference_objective(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """The pool's priority for its picker's flow control: latency first, batch sheddable."""
    return {
        "apiVersion": OBJECTIVE_API,
        "kind": "InferenceObjective",
        "metadata": metadata(sd, inference_pool_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            "priority": OBJECTIVE_PRIORITY[pool],
            "poolRef": {"group": INFERENCE_GROUP, "name": inference_pool_name(sd, pool)},
        },
    }


def render_picker_service_account(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(sd, picker_name(sd, pool), picker_component(pool)),
    }


def render_picker_role(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """Read-only, namespace-scoped: the pods it picks from and its own InferencePool (watched with a
    name field selector, so the rule names it); objectives and model rewrites, which the picker watches
    whenever their CRDs exist (it fails to start without them)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(sd, picker_name(sd, pool), picker_component(pool)),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": [INFERENCE_GROUP],
                "resources": ["inferencepools"],
                "resourceNames": [inference_pool_name(sd, pool)],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": [OBJECTIVE_GROUP],
                "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }


def render_picker_role_binding(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    name = picker_name(sd, pool)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(sd, name, picker_component(pool)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": sd.namespace}],
    }


def picker_args(sd: SpeculativeDeployment, pool: PoolName) -> list[str]:
    """The picker's flags: its pool, JSON logs, no tracing exporter, and metrics without the
    TokenReview check (which would need cluster-wide RBAC); then the user's."""
    return [
        "--pool-name",
        inference_pool_name(sd, pool),
        "--pool-namespace",
        sd.namespace,
        "--zap-encoder",
        "json",
        "--tracing=false",
        "--metrics-endpoint-auth=false",
        *gateway_of(sd).endpoint_picker.args,
    ]


def render_picker_deployment(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """One picker pod per pool, hardened as the router is. One replica with Recreate, as upstream
    recommends: its prefix-cache state is per process, and more replicas need leader election."""
    name = picker_name(sd, pool)
    component = picker_component(pool)
    meta = metadata(sd, name, component)
    health = {"grpc": {"port": PICKER_HEALTH_PORT, "service": "inference-extension"}}
    container: dict[str, Any] = {
        "name": "epp",
        "image": gateway_of(sd).endpoint_picker.image,
        "args": picker_args(sd, pool),
        "ports": [
            {"name": "grpc", "containerPort": PICKER_GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": PICKER_HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": PICKER_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "readinessProbe": {**health, "periodSeconds": 2},
        "livenessProbe": {**health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": hardened_container(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(sd, component)},
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": dict(meta["labels"])},
                "spec": {
                    "serviceAccountName": name,
                    "containers": [container],
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def render_picker_service(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """The Service the InferencePool's endpointPickerRef names."""
    component = picker_component(pool)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(sd, picker_name(sd, pool), component),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(sd, component),
            "ports": [
                {"name": "grpc-ext-proc", "port": PICKER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {
                    "name": "http-metrics",
                    "port": PICKER_METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def route_targets(sd: SpeculativeDeployment) -> list[tuple[str, PoolName, list[tuple[str, str]]]]:
    """The routing rules a route can express, in the router's order of precedence: (what, pool,
    [(header, value)...]) where any one header match sends a request to the pool.

    The router reads the pool header before the tenant rules (poolHeaderTrust Always) or after them
    (AfterTenantRules), and never when Ignored; a tenant listed in several rules goes where the first
    one says. Each match holds one header, so the Gateway API's precedence (most header matches, then
    rule order) is the list order here.
    """
    routing = sd.spec.routing
    pool_header: list[tuple[str, PoolName, list[tuple[str, str]]]] = []
    if routing.pool_header_trust != "Ignored":
        pool_header = [("pool-header", p, [(routing.pool_header, p)]) for p in POOLS]
    tenants: list[tuple[str, PoolName, list[tuple[str, str]]]] = []
    if routing.tenant_header_trust == "Trusted":
        first: dict[str, PoolName] = {}
        for rule in routing.tenant_rules:
            for tenant in rule.tenants:
                first.setdefault(tenant, rule.pool)
        for pool in POOLS:
            values = [(routing.tenant_header, t) for t, p in first.items() if p == pool]
            if values:
                tenants.append(("tenants", pool, values))
    return pool_header + tenants if routing.pool_header_trust == "Always" else tenants + pool_header


def _backend(sd: SpeculativeDeployment, pool: PoolName) -> dict[str, Any]:
    """A rule's action: name the pool's objective, send to the pool's InferencePool."""
    objective = {"set": [{"name": OBJECTIVE_HEADER, "value": inference_pool_name(sd, pool)}]}
    return {
        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": objective}],
        "backendRefs": [
            {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": inference_pool_name(sd, pool)}
        ],
    }


def http_route_rules(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    """The HTTPRoute's rules: `route_targets` (split at the per-rule match limit), then everything
    else to the default pool."""
    rules: list[dict[str, Any]] = []
    for what, pool, headers in route_targets(sd):
        for start in range(0, len(headers), MAX_MATCHES_PER_RULE):
            chunk = headers[start : start + MAX_MATCHES_PER_RULE]
            suffix = f"-{start // MAX_MATCHES_PER_RULE + 1}" if start else ""
            rules.append(
                {
                    "name": f"{what}-{pool}{suffix}",
                    "matches": [{"headers": [{"type": "Exact", "name": h, "value": v}]} for h, v in chunk],
                    **_backend(sd, pool),
                }
            )
    default = sd.spec.routing.default_pool
    rules.append({"name": f"default-{default}", **_backend(sd, default)})
    return rules


def render_http_route(sd: SpeculativeDeployment) -> Manifest:
    """One HTTPRoute, named after the resource, attached to the Gateways of spec.routing.gateway."""
    parents = []
    for ref in gateway_of(sd).parent_refs:
        parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": ref.name}
        if ref.namespace is not None:
            parent["namespace"] = ref.namespace
        if ref.section_name is not None:
            parent["sectionName"] = ref.section_name
        parents.append(parent)
    return {
        "apiVersion": HTTP_ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": metadata(sd, sd.name, ROUTE_COMPONENT),
        "spec": {"parentRefs": parents, "rules": http_route_rules(sd)},
    }


def unexpressed_rules(sd: SpeculativeDeployment) -> list[str]:
    """The routing settings of `sd` that an HTTPRoute cannot carry (they need the router), in words."""
    routing = sd.spec.routing
    lost: list[str] = []
    shape = [
        name
        for name, on in (
            ("batchIfMaxTokensAtLeast", routing.shape.batch_if_max_tokens_at_least is not None),
            ("batchIfNAtLeast", routing.shape.batch_if_n_at_least is not None),
            ("batchIfNotStreaming", routing.shape.batch_if_not_streaming),
        )
        if on
    ]
    if shape:
        lost.append(f"shape rules ({', '.join(shape)}: a route does not read the request body)")
    if routing.auto_segmentation.enabled:
        lost.append("auto-segmentation (a route keeps no per-client count)")
    if any(rule.api_key_sha256 for rule in routing.tenant_rules):
        lost.append("apiKeySha256 tenant rules (a route matches header values, not their hashes)")
    if routing.fallback == "OtherPool":
        lost.append("fallback OtherPool (a pool without ready engines is not backed by the other)")
    # The pickers' own scorers (queue, KV cache, prefix cache) stand in for the default, PrefixAffinity
    # with its default bound; what a resource asks beyond it is theirs to decide.
    if any(getattr(routing.endpoint_selection, p) != EndpointSelection() for p in POOLS):
        lost.append("endpointSelection (each pool's endpoint picker chooses the engine)")
    return lost


def render_gateway_children(sd: SpeculativeDeployment) -> list[Manifest]:
    """Every gateway-mode child, pickers' RBAC before their pods, InferencePools before the route."""
    children: list[Manifest] = []
    for pool in POOLS:
        if existing_picker(sd, pool) is None:
            children += [
                render_picker_service_account(sd, pool),
                render_picker_role(sd, pool),
                render_picker_role_binding(sd, pool),
                render_picker_service(sd, pool),
                render_picker_deployment(sd, pool),
            ]
    for pool in POOLS:
        children += [render_inference_pool(sd, pool), render_inference_objective(sd, pool)]
    children.append(render_http_route(sd))
    return children
