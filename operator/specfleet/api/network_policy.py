"""spec.networkPolicy: who may reach the engine pods besides the router in front of them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from specfleet.api.base import ApiModel

# A namespace name: an RFC 1123 label, as `kubernetes.io/metadata.name` holds it.
NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class NetworkPolicySpec(ApiModel):
    """A NetworkPolicy on the engine pods: only this resource's router, and the metrics scrapers' namespaces."""

    enabled: bool = Field(
        default=False,
        description="Render a NetworkPolicy that admits to the engine pods (both pools, stable and canary) "
        "only this resource's router pods and pods of metricsNamespaces, so no client can call an engine's "
        "/v1 directly and skip the router's classification and tenant rules. Off by default: turning it on "
        "cuts off every other caller of the engines. Needs a network plugin that enforces NetworkPolicy.",
    )
    metrics_namespaces: list[NamespaceName] = Field(
        default_factory=list,
        max_length=8,
        description="Namespaces whose pods may reach the engine port, for /metrics (where Prometheus runs; "
        "matched on the kubernetes.io/metadata.name label). A NetworkPolicy cannot tell paths apart: pods "
        "of these namespaces can reach /v1 too. Required while enabled and monitoring.podMonitor or "
        "monitoring.scrapeAnnotations is on, else the policy reads no engine metrics.",
    )
