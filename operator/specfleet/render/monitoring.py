"""Render prometheus-operator objects when the spec asks for them (pure): a PodMonitor for engines
and router, and a PrometheusRule with the resource's recording rules and alerts."""

from __future__ import annotations

from typing import Any

from specfleet.api.constants import (
    LABEL_DEPLOYMENT,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_SPECULATION,
    LABEL_TRACK,
    POOLS,
)
from specfleet.api.pools import LatencySlo
from specfleet.api.reasons import DEGRADED, METRICS_AVAILABLE
from specfleet.api.validation import SpeculativeDeployment
from specfleet.observe.resource_metrics import CONDITION, POOL_READY_REPLICAS, POOL_REPLICAS, POOL_SPECULATING
from specfleet.policy.inputs.slo_attainment import TargetBucket, target_buckets
from specfleet.policy.rules.threshold import threshold_values
from specfleet.render.common import Manifest, RenderOptions, metadata
from specfleet.render.standby import SPECULATIVE_PORT_NAME, standby_pool
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.cost_profile import default_profile
from specfleet_runtime.names import (
    BY_POOL,
    MIN_DRAFTS_IN_WINDOW,
    ROUTER_REQUESTS,
    SERIES_DEPLOYMENT,
    SERIES_POOL,
    SERIES_SPECULATION,
)


def _monitoring_metadata(sd: SpeculativeDeployment, options: RenderOptions) -> dict[str, Any]:
    """Metadata of the PodMonitor and PrometheusRule: the installation's labels, then the resource's."""
    meta = metadata(sd, sd.name, "monitoring")
    meta["labels"].update(dict(options.monitoring_labels))
    meta["labels"].update(sd.spec.monitoring.labels)
    return meta


def _has_standby_pool(sd: SpeculativeDeployment) -> bool:
    return any(standby_pool(sd, pool) for pool in POOLS)


def render_pod_monitor(sd: SpeculativeDeployment, options: RenderOptions) -> Manifest:
    """One PodMonitor scraping /metrics on the `http` port of every pod of this resource, and on the
    `speculative` port of a Standby pool's pods (its second engine: awake or asleep, both are scraped
    and the policy's queries count the awake one)."""
    meta = _monitoring_metadata(sd, options)
    endpoints = [{"port": "http", "path": "/metrics", "interval": "15s"}]
    if _has_standby_pool(sd):
        # Pods without a port of that name (every other pod) get no target from this endpoint.
        endpoints.append({"port": SPECULATIVE_PORT_NAME, "path": "/metrics", "interval": "15s"})
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {LABEL_INSTANCE: sd.name, LABEL_DEPLOYMENT: sd.name}},
            "podMetricsEndpoints": endpoints,
            # The policy's PromQL selects engine series by these (as specfleet_io_deployment, ...).
            "podTargetLabels": [LABEL_DEPLOYMENT, LABEL_POOL, LABEL_SPECULATION, LABEL_TRACK],
        },
    }


# Recording rules: one name for every resource, told apart by their labels.
RECORD_ACCEPTANCE = "specfleet:pool_acceptance_length"
RECORD_REJECTED = "specfleet:pool_rejected_draft_tokens_per_second_per_replica"
RECORD_RUNNING = "specfleet:pool_running_requests_per_replica"


def _seconds(value: int) -> str:
    return f"{value}s"


# The SRE workbook's multiwindow, multi-burn-rate alerts ("Alerting on SLOs", its table for a 30-day
# SLO period): (long window, short window, burn rate). The short window makes an alert stop soon after
# the burn does. A page when 2% of the budget goes in an hour or 5% in 6 hours; a ticket at 10% in 3 days.
FAST_BURN = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
SLOW_BURN = (("3d", "6h", 1.0),)
SLO_WINDOWS = ("5m", "30m", "1h", "6h", "3d")


def slo_error_ratio_record(target: str, window: str) -> str:
    """The recording rule with a pool's share of requests missing one SLO target over one window."""
    return f"specfleet:pool_{target}_slo_errors:ratio_rate{window}"


def _slo_error_ratios(pool_engines: str, tb: TargetBucket) -> list[dict[str, Any]]:
    """Recording rules: the share of a pool's requests above one target's bucket, over each window."""

    def rate_sum(series: str, window: str) -> str:
        return f"sum by ({BY_POOL}) (rate({series}[{window}]))"

    rules = []
    for window in SLO_WINDOWS:
        within = rate_sum(f"{tb.histogram}_bucket{{{pool_engines},{vm.bucket_matcher(tb.le)}}}", window)
        total = rate_sum(f"{tb.histogram}_count{{{pool_engines}}}", window)
        # No request in the window: 0 / 0, NaN, which no alert compares above its threshold.
        rules.append({"record": slo_error_ratio_record(tb.target, window), "expr": f"1 - {within} / {total}"})
    return rules


def _burning(
    pool_engines: str, tb: TargetBucket, budget: float, pairs: tuple[tuple[str, str, float], ...]
) -> str:
    """Burn rate above its threshold over both windows of any pair (error ratio > rate x budget)."""
    return " or ".join(
        f"({slo_error_ratio_record(tb.target, long)}{{{pool_engines}}} > {rate * budget:.6g}"
        f" and {slo_error_ratio_record(tb.target, short)}{{{pool_engines}}} > {rate * budget:.6g})"
        for long, short, rate in pairs
    )


def _slo_rules(sd: SpeculativeDeployment, pool: str, slo: LatencySlo) -> tuple[list[Any], list[Any]]:
    """A pool's SLO error ratios (recording rules) and burn-rate alerts, for each target the SLO sets.

    Error ratio: the share of the window's requests above the target's bucket (`target_buckets`).
    Burn rate: that ratio over the error budget, 1 - percentile / 100.
    """
    ns, name = sd.namespace, sd.name
    pool_engines = f'namespace="{ns}",{SERIES_DEPLOYMENT}="{name}",{SERIES_POOL}="{pool}"'
    budget = 1 - slo.percentile / 100
    recording: list[Any] = []
    alerts: list[Any] = []
    for tb in target_buckets(slo):
        recording += _slo_error_ratios(pool_engines, tb)
        target, bucket = tb.target.upper(), f"{vm.bucket_label(tb.le)} s"
        missed = f"{{{{ $value | humanizePercentage }}}} of requests above {bucket} (budget {budget:.0%})"
        counted = (
            f"A request counts as missing the {tb.milliseconds} ms target when it is above the {bucket} "
            "bucket, the largest of vLLM's bucket bounds at or under the target: conservative, requests "
            "between the two count as missing it too."
        )
        alerts += [
            _alert(
                f"Specfleet{target.title()}SloFastBurn",
                _burning(pool_engines, tb, budget, FAST_BURN),
                # The short window already requires the burn to be current: no extra hold.
                "0s",
                "critical",
                f"{pool} pool of {ns}/{name} is spending its {target} error budget fast: {missed}",
                "The share of requests missing the target is more than 14.4 times the error budget "
                "(1 - percentile/100) over both the last hour and 5 minutes, or 6 times over both 6 hours "
                f"and 30 minutes: at that rate a 30-day budget lasts 2 or 5 days. {counted}",
            ),
            _alert(
                f"Specfleet{target.title()}SloSlowBurn",
                _burning(pool_engines, tb, budget, SLOW_BURN),
                "0s",
                "warning",
                f"{pool} pool of {ns}/{name} is spending its {target} error budget: {missed} over 3 days",
                "The share of requests missing the target is above the error budget (1 - percentile/100) "
                "over both the last 3 days and 6 hours: if it goes on, the objective fails over a 30-day "
                f"period. {counted}",
            ),
        ]
    return recording, alerts


def alert_groups(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    """The rule groups of one resource: what a Prometheus rule file holds under `groups`.

    Thresholds come from the resource itself: the policy's acceptance stop value, load limit and
    flip budget, and `monitoring.alerts` for the rest.
    """
    spec = sd.spec
    alerts = spec.monitoring.alerts
    # Threshold values as the policy uses them: the spec's, or derived from the cost profile's break-even.
    thresholds = threshold_values(
        spec.policy, spec.drafter.num_speculative_tokens, default_profile(spec.drafter.method)
    )
    window = _seconds(spec.policy.window_seconds)
    hold = _seconds(alerts.for_seconds)
    ns, name = sd.namespace, sd.name
    engines = f'namespace="{ns}",{SERIES_DEPLOYMENT}="{name}",{SERIES_SPECULATION}="On"'
    router = f'namespace="{ns}",{SERIES_DEPLOYMENT}="{name}"'
    resource = f'namespace="{ns}",name="{name}"'
    ids = {SERIES_DEPLOYMENT: name}

    def by_pool(metric: str, selector: str = engines) -> str:
        return f"sum by ({BY_POOL}) (rate({metric}{{{selector}}}[{window}]))"

    # Per-replica means over awake engines only where a Standby pod's second engine sleeps (see
    # fleet_queries); other resources keep the plain expressions.
    running = f"{vm.REQUESTS_RUNNING}{{{engines}}}"
    running = vm.awake_only(running, engines) if _has_standby_pool(sd) else f"({running})"

    drafts = by_pool(vm.SPEC_DRAFTS)
    recording = [
        {
            "record": RECORD_ACCEPTANCE,
            "expr": f"(1 + {by_pool(vm.SPEC_ACCEPTED_TOKENS)} / {drafts})"
            f" and {drafts} * {spec.policy.window_seconds} >= {MIN_DRAFTS_IN_WINDOW}",
        },
        {
            "record": RECORD_RUNNING,
            "expr": f"avg by ({BY_POOL}) {running}",
        },
        {
            "record": RECORD_REJECTED,
            "expr": f"({by_pool(vm.SPEC_DRAFT_TOKENS)} - {by_pool(vm.SPEC_ACCEPTED_TOKENS)})"
            f" / count by ({BY_POOL}) {running}",
        },
    ]
    own = f'namespace="{ns}",{SERIES_DEPLOYMENT}="{name}"'
    stop = f"{thresholds.stop_acceptance:.3g}"
    drop = alerts.acceptance_drop_percent
    budget = spec.policy.max_flips_per_hour
    near_budget = max(1, budget - 1)
    rules: list[dict[str, Any]] = [
        _alert(
            "SpecfleetAcceptanceBelowStop",
            f"{RECORD_ACCEPTANCE}{{{own}}} < {stop}",
            hold,
            "warning",
            f'{{{{ $labels.{SERIES_POOL} }}}} pool of {ns}/{name} accepts {{{{ $value | printf "%.2f" }}}} '
            f"tokens per step, below its stop value {stop}",
            "A speculating pool's mean acceptance length stayed below policy.thresholds."
            "stopBelowAcceptanceLengthMilli: the drafter no longer fits the traffic or the target.",
        ),
        _alert(
            "SpecfleetAcceptanceBelowBaseline",
            f"{RECORD_ACCEPTANCE}{{{own}}} < {1 - drop / 100:g} * quantile_over_time(0.5, "
            f"{RECORD_ACCEPTANCE}{{{own}}}[{_seconds(alerts.acceptance_baseline_seconds)}])",
            hold,
            "warning",
            f'{{{{ $labels.{SERIES_POOL} }}}} pool of {ns}/{name} accepts {{{{ $value | printf "%.2f" }}}} '
            f"tokens per step, more than {drop}% below its baseline",
            "Acceptance drifted below the pool's own median: traffic or the target changed; the drafter "
            "may need retraining.",
        ),
        _alert(
            "SpecfleetPolicyMetricsUnavailable",
            f'{CONDITION}{{{resource},type="{METRICS_AVAILABLE}",status="False"}} == 1',
            hold,
            "warning",
            f"The speculation policy of {ns}/{name} has no usable metrics and holds every pool",
            "MetricsAvailable is False: Prometheus is unreachable, or engine samples are missing or stale.",
        ),
        _alert(
            "SpecfleetFlipBudgetNearlySpent",
            f"changes({POOL_SPECULATING}{{{resource}}}[1h]) >= {near_budget}",
            "0s",
            "info",
            f"{{{{ $labels.pool }}}} pool of {ns}/{name} flipped {{{{ $value }}}} times in the last hour "
            f"(budget {budget})",
            "The pool is close to policy.maxFlipsPerHour; once spent, the policy holds the pool's mode.",
        ),
        _alert(
            "SpecfleetDegraded",
            f'{CONDITION}{{{resource},type="{DEGRADED}",status="True"}} == 1',
            hold,
            "critical",
            f"{ns}/{name} is Degraded",
            "The operator cannot realise the spec: see the Degraded condition's message and Events.",
        ),
        _alert(
            "SpecfleetEnginesNotReady",
            f"{POOL_READY_REPLICAS}{{{resource}}} < {POOL_REPLICAS}{{{resource}}}",
            hold,
            "warning",
            f"{{{{ $labels.pool }}}} pool of {ns}/{name} has fewer ready engines than replicas",
            "Engine pods are not ready (scheduling, image pull, model load or crashes).",
        ),
        _alert(
            "SpecfleetRouterErrors",
            f'sum by (namespace, {SERIES_DEPLOYMENT}) (rate({ROUTER_REQUESTS}{{{router},code=~"5.."}}'
            f"[{window}])) / sum by (namespace, {SERIES_DEPLOYMENT}) "
            f"(rate({ROUTER_REQUESTS}{{{router}}}[{window}])) * 100 > {alerts.router_error_percent}",
            hold,
            "critical",
            f'The router of {ns}/{name} answers {{{{ $value | printf "%.1f" }}}}% of requests with 5xx',
            "More than monitoring.alerts.routerErrorPercent of router answers are server errors.",
        ),
        _alert(
            "SpecfleetRejectedDraftTokensHigh",
            f"{RECORD_REJECTED}{{{own}}} > {alerts.rejected_draft_tokens_per_second_per_replica}"
            f" and on ({BY_POOL}) {RECORD_RUNNING}{{{own}}} > {thresholds.stop_concurrency:g}",
            hold,
            "warning",
            f"{{{{ $labels.{SERIES_POOL} }}}} pool of {ns}/{name} rejects "
            f'{{{{ $value | printf "%.0f" }}}} drafted tokens/s per replica under high load',
            "The pool speculates above policy.thresholds.stopAboveConcurrencyPerReplica running requests "
            "per replica: verification of rejected drafts costs compute the batch needs.",
        ),
    ]
    for pool in POOLS:
        slo = getattr(spec.pools, pool).slo
        if slo is not None:
            slo_recording, slo_alerts = _slo_rules(sd, pool, slo)
            recording += slo_recording
            rules += slo_alerts
    for rule in rules:
        rule["labels"].update(ids)
    return [
        {"name": f"specfleet.{ns}.{name}.recording", "rules": recording},
        {"name": f"specfleet.{ns}.{name}.alerts", "rules": rules},
    ]


def _alert(name: str, expr: str, hold: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": hold,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


def render_prometheus_rule(sd: SpeculativeDeployment, options: RenderOptions) -> Manifest:
    """One PrometheusRule with this resource's recording rules and alerts (labels as the PodMonitor's)."""
    meta = _monitoring_metadata(sd, options)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta,
        "spec": {"groups": alert_groups(sd)},
    }
