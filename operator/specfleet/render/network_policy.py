"""Render the NetworkPolicy that makes the router the engines' front door (pure).

Engine pods of both pools (stable and canary, speculating or not: the selector holds no label that a
flip or a canary changes) admit traffic on the engine port only from the peers `engine_ingress_peers`
lists: this resource's router pods, and the pods of the namespaces named in
`spec.networkPolicy.metricsNamespaces` (the scrapers of /metrics, served on the same port). Another
front door, such as the gateway of a Gateway API inference endpoint picker, would be one more peer here.
"""

from __future__ import annotations

from typing import Any

from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import Manifest, engine_network_policy_name, metadata, selector_labels
from specfleet.render.engine import ENGINE_COMPONENT
from specfleet.render.router import ROUTER_COMPONENT
from specfleet.render.standby import standby_pool
from specfleet_runtime.names import ENGINE_PORT, POOLS, STANDBY_SPECULATIVE_PORT

# The label the apiserver sets on every namespace to its own name (Kubernetes 1.22 and later).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def engine_ingress_peers(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    """Who may reach the engines: the router (a podSelector alone means this namespace), then each
    metrics namespace."""
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": selector_labels(sd, ROUTER_COMPONENT)}}]
    peers += [
        {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}
        for namespace in sd.spec.network_policy.metrics_namespaces
    ]
    return peers


def render_engine_network_policy(
    sd: SpeculativeDeployment, operator_namespace: str | None = None
) -> Manifest:
    """Ingress to every engine pod of this resource from `engine_ingress_peers` only, on the engine port
    (and, with a Standby pool, its speculative engine port and from the operator's namespace: the
    operator drains and switches the engines of a Standby flip over their HTTP ports)."""
    ports = [{"protocol": "TCP", "port": ENGINE_PORT}]
    peers = engine_ingress_peers(sd)
    if any(standby_pool(sd, pool) for pool in POOLS):
        ports.append({"protocol": "TCP", "port": STANDBY_SPECULATIVE_PORT})
        if operator_namespace:
            peers.append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}}})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(sd, engine_network_policy_name(sd), ENGINE_COMPONENT),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(sd, ENGINE_COMPONENT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": peers,
                    "ports": ports,
                }
            ],
        },
    }
