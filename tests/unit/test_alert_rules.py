"""The PrometheusRule: every rendered rule file passes `promtool check rules`, and each alert fires
(and stays quiet) on input series in `promtool test rules`, with thresholds taken from the resource.

promtool is the real one (Debian's prometheus package, installed by `ensure_prometheus()`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet.render.monitoring import alert_groups
from support.manifests import EXAMPLES, load_yaml, merge
from support.promtool import promtool

RENDERABLE = [p for p in EXAMPLES if "degraded" not in p.stem]
NS, NAME = "inference", "assistant"


@pytest.mark.parametrize("path", RENDERABLE, ids=lambda p: p.stem)
def test_every_rendered_rule_file_passes_promtool_check(path, tmp_path):
    doc = merge(load_yaml(path), {"spec": {"monitoring": {"prometheusRule": True}}})
    sd = parse_resource(doc)
    rules = [c for c in render_children(sd, decided_plan(sd)) if c["kind"] == "PrometheusRule"]
    assert len(rules) == 1
    assert rules[0]["metadata"]["labels"].items() >= sd.spec.monitoring.labels.items()
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(yaml.safe_dump(rules[0]["spec"]))
    result = promtool("check", "rules", rule_file)
    assert result.returncode == 0, result.stdout + result.stderr
    # Every rule rendered is one promtool read: 11, plus the burn-rate rules of an SLO's targets.
    rendered = sum(len(group["rules"]) for group in rules[0]["spec"]["groups"])
    assert rendered == 11 or sd.spec.pools.latency.slo is not None
    assert f"SUCCESS: {rendered} rules found" in result.stdout


def test_no_prometheus_rule_unless_asked():
    sd = parse_resource(load_yaml(RENDERABLE[0]))
    assert "PrometheusRule" not in [c["kind"] for c in render_children(sd, decided_plan(sd))]


# ---- promtool test rules -------------------------------------------------------------------------


def _resource(**spec_patch: Any) -> Any:
    doc = {
        "apiVersion": "specfleet.io/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": merge(
            {
                "model": {"name": "m"},
                "drafter": {"method": "eagle3", "model": "d"},
                "policy": {"windowSeconds": 60},
                "monitoring": {"prometheusRule": True, "alerts": {"forSeconds": 120}},
            },
            spec_patch,
        ),
    }
    return parse_resource(doc)


def _engine(
    metric: str, pool: str, values: str, pod: str = "e0", ns: str = NS, speculation: str = "On"
) -> dict[str, str]:
    labels = (
        f'namespace="{ns}",specfleet_io_deployment="{NAME}",specfleet_io_pool="{pool}",'
        f'specfleet_io_speculation="{speculation}",pod="{pod}"'
    )
    return {"series": f"{metric}{{{labels}}}", "values": values}


def _pool_alert(pool: str) -> dict[str, str]:
    return {"namespace": NS, "specfleet_io_deployment": NAME, "specfleet_io_pool": pool}


def _description(sd: Any, alert: str) -> str:
    for group in alert_groups(sd):
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return str(rule["annotations"]["description"])
    raise AssertionError(f"no alert {alert}")


def _run(sd: Any, tmp_path: Path, series: list[dict[str, str]], checks: list[dict[str, Any]]) -> None:
    """Run one promtool unit test; each check is (eval_time, alert, [(labels, summary)])."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": alert_groups(sd)}))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": c["at"],
                        "alertname": c["alert"],
                        "exp_alerts": [
                            {
                                "exp_labels": {**labels, "alertname": c["alert"], "severity": c["severity"]},
                                "exp_annotations": {
                                    "summary": summary,
                                    "description": _description(sd, c["alert"]),
                                },
                            }
                            for labels, summary in c.get("firing", [])
                        ],
                    }
                    for c in checks
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", tmp_path / "tests.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
RUNNING = "vllm:num_requests_running"


@pytest.mark.parametrize(("stop_milli", "fires"), [(1400, True), (1200, False)])
def test_acceptance_below_the_resources_own_stop_value(tmp_path, stop_milli, fires):
    sd = _resource(policy={"thresholds": {"stopBelowAcceptanceLengthMilli": stop_milli}})
    series = [
        # latency: 10 drafts/s, 3 accepted/s -> 1.30 tokens per step.
        _engine(DRAFTS, "latency", "0+600x30"),
        _engine(ACCEPTED, "latency", "0+180x30"),
        # batch: 2.0 per step, healthy.
        _engine(DRAFTS, "batch", "0+600x30"),
        _engine(ACCEPTED, "batch", "0+600x30"),
        # Another deployment's engines with a low acceptance must not fire this resource's alert.
        _engine(DRAFTS, "latency", "0+600x30", ns="other"),
        _engine(ACCEPTED, "latency", "0+60x30", ns="other"),
    ]
    stop = f"{stop_milli / 1000:g}"
    summary = f"latency pool of {NS}/{NAME} accepts 1.30 tokens per step, below its stop value {stop}"
    firing = [(_pool_alert("latency"), summary)] if fires else []
    checks = [
        # Not yet: the condition must hold for forSeconds (120 s).
        {"at": "2m", "alert": "SpecfleetAcceptanceBelowStop", "severity": "warning"},
        {"at": "10m", "alert": "SpecfleetAcceptanceBelowStop", "severity": "warning", "firing": firing},
    ]
    _run(sd, tmp_path, series, checks)


def test_acceptance_ignores_a_nearly_idle_pool(tmp_path):
    sd = _resource()
    # One draft a minute: below the 100-drafts-per-window floor, so no acceptance series at all.
    series = [_engine(DRAFTS, "latency", "0+1x30"), _engine(ACCEPTED, "latency", "0+0x30")]
    _run(
        sd, tmp_path, series, [{"at": "10m", "alert": "SpecfleetAcceptanceBelowStop", "severity": "warning"}]
    )


def test_acceptance_drop_below_the_pools_own_baseline(tmp_path):
    sd = _resource(monitoring={"alerts": {"acceptanceDropPercent": 25, "acceptanceBaselineSeconds": 1200}})
    # 3.0 tokens per step for 20 minutes, then 2.0 (33% below the baseline; still above the stop value).
    series = [
        _engine(DRAFTS, "latency", "0+600x40"),
        _engine(ACCEPTED, "latency", "0+1200x20 24600+600x20"),
    ]
    summary = f"latency pool of {NS}/{NAME} accepts 2.00 tokens per step, more than 25% below its baseline"
    checks = [
        {"at": "19m", "alert": "SpecfleetAcceptanceBelowBaseline", "severity": "warning"},
        {
            "at": "25m",
            "alert": "SpecfleetAcceptanceBelowBaseline",
            "severity": "warning",
            "firing": [(_pool_alert("latency"), summary)],
        },
        # Once the lower acceptance holds for most of the baseline period it is the new baseline.
        {"at": "40m", "alert": "SpecfleetAcceptanceBelowBaseline", "severity": "warning"},
        {"at": "40m", "alert": "SpecfleetAcceptanceBelowStop", "severity": "warning"},
    ]
    _run(sd, tmp_path, series, checks)


def _condition(type_: str, status: str, values: str, name: str = NAME) -> dict[str, str]:
    labels = f'namespace="{NS}",name="{name}",type="{type_}",status="{status}"'
    return {"series": f"specfleet_condition{{{labels}}}", "values": values}


def test_metrics_unavailable_and_degraded_from_the_operators_condition_gauge(tmp_path):
    sd = _resource()
    series = [
        _condition("MetricsAvailable", "False", "0 0 1 1 1 1 1 1 1 1"),
        _condition("MetricsAvailable", "True", "1 1 0 0 0 0 0 0 0 0"),
        _condition("Degraded", "True", "0 0 0 0 0 1 1 1 1 1"),
        _condition("Degraded", "True", "1 1 1 1 1 1 1 1 1 1", name="someone-else"),
    ]
    cond = {"namespace": NS, "name": NAME}
    checks = [
        {"at": "3m", "alert": "SpecfleetPolicyMetricsUnavailable", "severity": "warning"},
        {
            "at": "5m",
            "alert": "SpecfleetPolicyMetricsUnavailable",
            "severity": "warning",
            "firing": [
                (
                    {**cond, "type": "MetricsAvailable", "status": "False", "specfleet_io_deployment": NAME},
                    f"The speculation policy of {NS}/{NAME} has no usable metrics and holds every pool",
                )
            ],
        },
        {"at": "6m", "alert": "SpecfleetDegraded", "severity": "critical"},
        {
            "at": "8m",
            "alert": "SpecfleetDegraded",
            "severity": "critical",
            "firing": [
                (
                    {**cond, "type": "Degraded", "status": "True", "specfleet_io_deployment": NAME},
                    f"{NS}/{NAME} is Degraded",
                )
            ],
        },
    ]
    _run(sd, tmp_path, series, checks)


@pytest.mark.parametrize(("budget", "fires"), [(4, True), (5, False)])
def test_flip_budget_nearly_spent_follows_the_resources_budget(tmp_path, budget, fires):
    sd = _resource(policy={"maxFlipsPerHour": budget})
    labels = f'namespace="{NS}",name="{NAME}",pool="batch"'
    # Three flips (On -> Off -> On -> Off) within the hour.
    series = [{"series": f"specfleet_pool_speculating{{{labels}}}", "values": "1 1 0 0 0 1 1 0 0 0"}]
    summary = f"batch pool of {NS}/{NAME} flipped 3 times in the last hour (budget {budget})"
    firing = [({"namespace": NS, "name": NAME, "pool": "batch", "specfleet_io_deployment": NAME}, summary)]
    checks = [
        {
            "at": "9m",
            "alert": "SpecfleetFlipBudgetNearlySpent",
            "severity": "info",
            "firing": firing if fires else [],
        }
    ]
    _run(sd, tmp_path, series, checks)


def test_engines_not_ready(tmp_path):
    sd = _resource()
    res = f'namespace="{NS}",name="{NAME}"'
    series = [
        {"series": f'specfleet_pool_replicas{{{res},pool="latency"}}', "values": "2x10"},
        {"series": f'specfleet_pool_ready_replicas{{{res},pool="latency"}}', "values": "2 2 1 1 1 1 1 1 1 1"},
        {"series": f'specfleet_pool_replicas{{{res},pool="batch"}}', "values": "1x10"},
        {"series": f'specfleet_pool_ready_replicas{{{res},pool="batch"}}', "values": "1x10"},
    ]
    summary = f"latency pool of {NS}/{NAME} has fewer ready engines than replicas"
    checks = [
        {
            "at": "6m",
            "alert": "SpecfleetEnginesNotReady",
            "severity": "warning",
            "firing": [
                ({"namespace": NS, "name": NAME, "pool": "latency", "specfleet_io_deployment": NAME}, summary)
            ],
        }
    ]
    _run(sd, tmp_path, series, checks)


def test_router_5xx_rate(tmp_path):
    sd = _resource(monitoring={"alerts": {"routerErrorPercent": 5}})
    base = f'namespace="{NS}",specfleet_io_deployment="{NAME}",pod="router-0",class="latency",pool="latency"'
    series = [
        {"series": f'specfleet_router_requests_total{{{base},code="200"}}', "values": "0+900x20"},
        {"series": f'specfleet_router_requests_total{{{base},code="503"}}', "values": "0+0x5 0+100x14"},
    ]
    summary = f"The router of {NS}/{NAME} answers 10.0% of requests with 5xx"
    checks = [
        {"at": "5m", "alert": "SpecfleetRouterErrors", "severity": "critical"},
        {
            "at": "12m",
            "alert": "SpecfleetRouterErrors",
            "severity": "critical",
            "firing": [({"namespace": NS, "specfleet_io_deployment": NAME}, summary)],
        },
    ]
    _run(sd, tmp_path, series, checks)


@pytest.mark.parametrize(("running", "fires"), [(60, True), (20, False)])
def test_rejected_draft_tokens_high_only_under_high_load(tmp_path, running, fires):
    sd = _resource(
        policy={"thresholds": {"stopAboveConcurrencyPerReplica": 48, "resumeBelowConcurrencyPerReplica": 32}},
        monitoring={"alerts": {"rejectedDraftTokensPerSecondPerReplica": 20}},
    )
    # Two replicas: 20 drafts/s x K=3 = 60 draft tokens/s, 10 accepted/s -> 50 rejected/s, 25 per replica.
    series = []
    for pod in ("e0", "e1"):
        series += [
            _engine(DRAFT_TOKENS, "batch", "0+1800x20", pod=pod),
            _engine(ACCEPTED, "batch", "0+300x20", pod=pod),
            _engine(RUNNING, "batch", f"{running}x20", pod=pod),
        ]
    summary = f"batch pool of {NS}/{NAME} rejects 25 drafted tokens/s per replica under high load"
    firing = [(_pool_alert("batch"), summary)] if fires else []
    checks = [
        {"at": "10m", "alert": "SpecfleetRejectedDraftTokensHigh", "severity": "warning", "firing": firing}
    ]
    _run(sd, tmp_path, series, checks)


# ---- SLO burn-rate alerts ------------------------------------------------------------------------

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"


def _histogram(name: str, pool: str, per_minute: dict[str, int], minutes: int = 80) -> list[dict[str, str]]:
    """Cumulative bucket counters (and `_count`, the +Inf bucket) growing by `per_minute` requests a minute."""
    labels = f'namespace="{NS}",specfleet_io_deployment="{NAME}",specfleet_io_pool="{pool}",pod="e0"'
    series = [
        {"series": f'{name}_bucket{{{labels},le="{le}"}}', "values": f"0+{n}x{minutes}"}
        for le, n in per_minute.items()
    ]
    return [*series, {"series": f"{name}_count{{{labels}}}", "values": f"0+{per_minute['+Inf']}x{minutes}"}]


@pytest.mark.parametrize(
    ("missed", "fast", "slow"),
    [(80, True, True), (10, False, True), (2, False, False)],
    ids=["missed-often-pages", "missed-a-little-tickets", "met"],
)
def test_ttft_burn_rate_alerts_follow_the_share_of_requests_over_the_target(tmp_path, missed, fast, slow):
    # 95%: a budget of 5%; the page needs 14.4 x 5% = 72% missing (1 h and 5 min), the ticket 5% (3 d, 6 h).
    slo = {"timeToFirstTokenMilliseconds": 1000, "percentile": 95}
    sd = _resource(pools={"latency": {"slo": slo}, "batch": {"slo": slo}})
    series = [
        # 100 requests a minute, `missed` of them over 1 s (vLLM writes the bound as "1.0").
        *_histogram(TTFT, "latency", {"0.75": 50 - missed // 2, "1.0": 100 - missed, "+Inf": 100}),
        # The batch pool's SLO sees no request: no attainment, no alert.
        *_histogram(TTFT, "batch", {"1.0": 0, "+Inf": 0}),
    ]
    pool, ratio = _pool_alert("latency"), f"{missed}%"
    fast_summary = (
        f"latency pool of {NS}/{NAME} is spending its TTFT error budget fast: {ratio} of requests above "
        "1.0 s (budget 5%)"
    )
    slow_summary = (
        f"latency pool of {NS}/{NAME} is spending its TTFT error budget: {ratio} of requests above 1.0 s "
        "(budget 5%) over 3 days"
    )
    checks = [
        {
            "at": "10m",
            "alert": "SpecfleetTtftSloFastBurn",
            "severity": "critical",
            "firing": [(pool, fast_summary)] if fast else [],
        },
        {
            "at": "70m",
            "alert": "SpecfleetTtftSloSlowBurn",
            "severity": "warning",
            "firing": [(pool, slow_summary)] if slow else [],
        },
    ]
    _run(sd, tmp_path, series, checks)


def test_tpot_counts_a_target_between_buckets_at_the_bucket_under_it(tmp_path):
    # A 60 ms target sits between the 50 and 75 ms buckets: the alert counts at 50 ms, so requests of
    # 50-75 ms count as missing it (conservative). Half the requests there, 99%: the page fires.
    sd = _resource(pools={"latency": {"slo": {"timePerOutputTokenMilliseconds": 60, "percentile": 99}}})
    assert "above the 0.05 s bucket" in _description(sd, "SpecfleetTpotSloFastBurn")
    series = _histogram(TPOT, "latency", {"0.05": 50, "0.075": 100, "+Inf": 100})
    summary = (
        f"latency pool of {NS}/{NAME} is spending its TPOT error budget fast: 50% of requests above "
        "0.05 s (budget 1%)"
    )
    checks = [
        {"at": "3m", "alert": "SpecfleetTtftSloFastBurn", "severity": "critical"},  # no TTFT target
        {
            "at": "10m",
            "alert": "SpecfleetTpotSloFastBurn",
            "severity": "critical",
            "firing": [(_pool_alert("latency"), summary)],
        },
    ]
    _run(sd, tmp_path, series, checks)


@pytest.mark.parametrize("le", ["1.0", "1"], ids=["prometheus-2", "prometheus-3"])
def test_an_integral_bucket_is_found_as_either_prometheus_stores_it(tmp_path, le):
    # vLLM writes le="1.0"; Prometheus 3 stores it as "1". Every request over 1 s: the page fires.
    sd = _resource(pools={"latency": {"slo": {"timeToFirstTokenMilliseconds": 1000}}})
    series = _histogram(TTFT, "latency", {le: 0, "+Inf": 100})
    summary = (
        f"latency pool of {NS}/{NAME} is spending its TTFT error budget fast: 100% of requests above "
        "1.0 s (budget 5%)"
    )
    firing = [(_pool_alert("latency"), summary)]
    _run(
        sd,
        tmp_path,
        series,
        [{"at": "10m", "alert": "SpecfleetTtftSloFastBurn", "severity": "critical", "firing": firing}],
    )
