"""Shared pieces of rendering: names, labels, owner references and the render-hash annotation."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import yaml

from specfleet import __version__
from specfleet.api.constants import (
    ANNOTATION_RENDER_HASH,
    API_VERSION,
    KIND,
    LABEL_COMPONENT,
    LABEL_DEPLOYMENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_POOL,
)
from specfleet.api.validation import SpeculativeDeployment
from specfleet_runtime.names import ROUTER_PORT

Manifest = dict[str, Any]
MANAGED_BY = "specfleet-operator"


@dataclass(frozen=True)
class RenderOptions:
    """Inputs that come from the operator's installation, not from the resource."""

    router_image: str = f"ghcr.io/specfleet/specfleet:{__version__}"
    router_port: int = ROUTER_PORT
    # Labels on every PodMonitor and PrometheusRule (the chart's monitoring.labels, e.g. kube-prometheus-
    # stack's `release: <its release>`); a resource's own spec.monitoring.labels win over them.
    monitoring_labels: tuple[tuple[str, str], ...] = ()
    # The operator's own namespace (POD_NAMESPACE, set by the chart): a Standby pool's NetworkPolicy
    # admits it, since the operator switches the engines over their HTTP ports during a flip.
    operator_namespace: str | None = None


def pool_name(sd: SpeculativeDeployment, pool: str) -> str:
    """Name of a pool's Deployment, Service and PodDisruptionBudget."""
    return f"{sd.name}-{pool}"


def router_name(sd: SpeculativeDeployment) -> str:
    """Name of the router's Deployment and ServiceAccount."""
    return f"{sd.name}-router"


def engine_network_policy_name(sd: SpeculativeDeployment) -> str:
    """Name of the NetworkPolicy on the engine pods of both pools."""
    return f"{sd.name}-engines"


def routing_config_map_name(sd: SpeculativeDeployment) -> str:
    """Name of the routing ConfigMap the router reads."""
    return f"{sd.name}-routing"


def selector_labels(sd: SpeculativeDeployment, component: str, pool: str | None = None) -> dict[str, str]:
    """Labels that select a component's pods; never includes anything that changes (selectors are immutable)."""
    labels = {LABEL_INSTANCE: sd.name, LABEL_COMPONENT: component, LABEL_DEPLOYMENT: sd.name}
    if pool is not None:
        labels[LABEL_POOL] = pool
    return labels


def common_labels(sd: SpeculativeDeployment, component: str, pool: str | None = None) -> dict[str, str]:
    """Recommended app.kubernetes.io labels plus specfleet's own."""
    return {
        LABEL_NAME: "specfleet",
        LABEL_PART_OF: "specfleet",
        LABEL_MANAGED_BY: MANAGED_BY,
        **selector_labels(sd, component, pool),
    }


def owner_references(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    """Children point at the resource so Kubernetes garbage-collects them; none without a uid (CLI)."""
    if not sd.uid:
        return []
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": sd.name,
            "uid": sd.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def metadata(sd: SpeculativeDeployment, name: str, component: str, pool: str | None = None) -> dict[str, Any]:
    """Object metadata of a child."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": sd.namespace,
        "labels": common_labels(sd, component, pool),
    }
    owners = owner_references(sd)
    if owners:
        meta["ownerReferences"] = owners
    return meta


def hardened_container() -> dict[str, Any]:
    """The securityContext of the containers the operator runs itself (router, endpoint picker): no
    privilege escalation, a read-only root filesystem, not root, no capabilities."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def content_hash(manifest: Manifest) -> str:
    """sha256 of a manifest's canonical JSON, ignoring the hash annotation itself."""
    doc = json.loads(json.dumps(manifest))
    doc.get("metadata", {}).get("annotations", {}).pop(ANNOTATION_RENDER_HASH, None)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_render_hash(manifest: Manifest) -> Manifest:
    """The manifest with its render-hash annotation set."""
    digest = content_hash(manifest)
    manifest.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_RENDER_HASH] = digest
    return manifest


class _ManifestDumper(yaml.SafeDumper):
    """Writes multi-line strings (the routing JSON) as readable literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _str_representer)


def to_yaml(manifests: list[Manifest]) -> str:
    """Manifests as a multi-document YAML stream, keys in render order."""
    return yaml.dump_all(manifests, Dumper=_ManifestDumper, sort_keys=False, width=120)
