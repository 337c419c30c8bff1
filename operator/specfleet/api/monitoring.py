"""spec.monitoring: how Prometheus finds the engines and the router, and the alerts it evaluates."""

from __future__ import annotations

from pydantic import Field

from specfleet.api.base import ApiModel


class AlertSpec(ApiModel):
    """Values of the PrometheusRule's alerts that the policy does not already give.

    The acceptance stop value, the flip budget and the load limit come from `policy`; the rate window
    of every alert is `policy.windowSeconds`.
    """

    for_seconds: int = Field(
        default=300, ge=0, le=86400, description="How long a condition must hold before its alert fires."
    )
    acceptance_drop_percent: int = Field(
        default=25,
        ge=1,
        le=99,
        description="Alert when a speculating pool's acceptance length falls this many percent below its "
        "baseline (the median over acceptanceBaselineSeconds).",
    )
    acceptance_baseline_seconds: int = Field(
        default=86400,
        ge=600,
        le=2592000,
        description="Period whose median acceptance length is the pool's baseline (needs that much "
        "Prometheus retention).",
    )
    router_error_percent: int = Field(
        default=5, ge=1, le=100, description="Alert when more than this percent of router answers are 5xx."
    )
    rejected_draft_tokens_per_second_per_replica: int = Field(
        default=1000,
        ge=1,
        le=10000000,
        description="Alert when a speculating pool rejects more drafted tokens per second per replica than "
        "this while its running requests per replica exceed policy.thresholds.stopAboveConcurrencyPerReplica.",
    )


class MonitoringSpec(ApiModel):
    """How Prometheus finds the engines and the router, and which alerts it evaluates."""

    pod_monitor: bool = Field(
        default=False, description="Render a prometheus-operator PodMonitor (needs its CRD in the cluster)."
    )
    scrape_annotations: bool = Field(
        default=True, description="Put prometheus.io/scrape annotations on engine and router pods."
    )
    prometheus_rule: bool = Field(
        default=False,
        description="Render a prometheus-operator PrometheusRule with this resource's alerts (acceptance, "
        "metrics, flip budget, Degraded, engines, router errors, rejected drafts; needs its CRD).",
    )
    alerts: AlertSpec = Field(default_factory=AlertSpec, description="Alert values of the PrometheusRule.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the PodMonitor and PrometheusRule, to match your Prometheus' selectors "
        "(kube-prometheus-stack's selects release: <its Helm release name>). They win over the operator's "
        "chart value monitoring.labels.",
    )
