"""The SpeculativeDeployment's spec: one model, a drafter, two pools, a router and a policy.

Each part lives in its own module (engine, drafter, pools, routing, policy, monitoring, network_policy);
this one joins them and holds the rules that span parts.
"""

from __future__ import annotations

from pydantic import Field

from specfleet.api.base import ApiModel, Rule
from specfleet.api.drafter import DrafterSpec
from specfleet.api.engine import EngineSpec, ModelSpec
from specfleet.api.monitoring import MonitoringSpec
from specfleet.api.network_policy import NetworkPolicySpec
from specfleet.api.policy import PolicySpec
from specfleet.api.pools import Pools
from specfleet.api.routing import RoutingSpec


class SpeculativeDeploymentSpec(ApiModel):
    """Desired state of a speculative-decoding fleet: one model, a drafter, two pools, a router, a policy."""

    rules = (
        Rule(
            cel="self.policy.reentry.canaryReplicas == 0 || "
            "((self.pools.latency.speculation != 'Auto' || self.policy.reentry.canaryReplicas "
            "< (has(self.pools.latency.autoscaling) ? self.pools.latency.autoscaling.maxReplicas "
            ": self.pools.latency.replicas)) && (self.pools.batch.speculation != 'Auto' || "
            "self.policy.reentry.canaryReplicas < (has(self.pools.batch.autoscaling) ? "
            "self.pools.batch.autoscaling.maxReplicas : self.pools.batch.replicas)))",
            message="policy.reentry.canaryReplicas must be less than the replicas (autoscaling.maxReplicas "
            "when autoscaled) of every Auto pool",
            check=lambda s: (
                s.policy.reentry.canary_replicas == 0
                or all(
                    p.speculation != "Auto" or s.policy.reentry.canary_replicas < p.reference_replicas
                    for p in (s.pools.latency, s.pools.batch)
                )
            ),
        ),
        Rule(
            cel="!self.networkPolicy.enabled || "
            "(has(self.networkPolicy.metricsNamespaces) && size(self.networkPolicy.metricsNamespaces) > 0) || "
            "(!self.monitoring.podMonitor && !self.monitoring.scrapeAnnotations)",
            message="networkPolicy.enabled needs networkPolicy.metricsNamespaces (where Prometheus runs) while "
            "monitoring.podMonitor or monitoring.scrapeAnnotations is on: else no scraper reaches the engines",
            check=lambda s: (
                not s.network_policy.enabled
                or bool(s.network_policy.metrics_namespaces)
                or not (s.monitoring.pod_monitor or s.monitoring.scrape_annotations)
            ),
        ),
        Rule(
            cel="!has(self.routing.gateway) || !self.networkPolicy.enabled",
            message="networkPolicy.enabled is not supported with routing.gateway: the policy admits the "
            "router only, and the gateway's proxies and the endpoint pickers must reach the engines",
            check=lambda s: s.routing.gateway is None or not s.network_policy.enabled,
        ),
        Rule(
            cel="!has(self.routing.gateway) || "
            "((!has(self.pools.latency.rollout) || self.pools.latency.rollout.flip != 'Standby') && "
            "(!has(self.pools.batch.rollout) || self.pools.batch.rollout.flip != 'Standby'))",
            message="rollout.flip Standby is not supported with routing.gateway: a Standby pool serves on "
            "two ports (the plain and the speculative engine) and an InferencePool has one target port",
            check=lambda s: (
                s.routing.gateway is None
                or all(p.rollout.flip != "Standby" for p in (s.pools.latency, s.pools.batch))
            ),
        ),
    )

    model: ModelSpec = Field(description="The target model every pool serves; its output is the answer.")
    drafter: DrafterSpec = Field(description="Speculative decoding settings (vLLM --speculative-config).")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM engine settings.")
    pools: Pools = Field(
        default_factory=Pools,
        description="The two pools of engines: latency (interactive traffic) and batch (throughput-bound "
        "traffic), each with its replicas or autoscaling and its speculation mode (On, Off or Auto).",
    )
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec,
        description="How the router sends each request to a pool: tenant and API-key rules, request "
        "shape, auto-segmentation of busy clients, which headers it trusts, and the router's replicas.",
    )
    policy: PolicySpec = Field(
        default_factory=PolicySpec,
        description="How the operator decides speculation and K for Auto pools from Prometheus: mode, "
        "timing, gates against flapping, re-entry canaries and acceptance drift.",
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="How Prometheus finds the engines (PodMonitor or scrape annotations) and the "
        "alerting rules rendered for this resource.",
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec,
        description="An optional NetworkPolicy that makes the router the engines' only front door (plus "
        "the metrics scrapers' namespaces).",
    )
