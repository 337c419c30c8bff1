"""The Grafana dashboard: generated file up to date, the panels the docs promise, and every panel's
PromQL accepted by a real Prometheus (Debian's 2.42 on an empty TSDB: a parse or type error fails)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from specfleet.observe.dashboard import dashboard, dashboard_json
from specfleet_sandbox.prometheus import PrometheusProcess
from support.manifests import ROOT
from support.promtool import assert_rule_tests_pass

COMMITTED = ROOT / "charts" / "specfleet" / "dashboards" / "specfleet.json"
# What Grafana substitutes before a query reaches Prometheus ("All" selected for the variables).
GRAFANA_VARIABLES = {"$namespace": ".*", "$deployment": ".*", "$__rate_interval": "1m"}


def as_sent(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    # `$1` is label_replace's capture group, which Grafana leaves alone (no variable has that name).
    assert not re.search(r"\$(?!1\b)", expr), f"unsubstituted variable in {expr}"
    return expr


def test_committed_dashboard_is_generated():
    assert COMMITTED.read_text() == dashboard_json(), "run `make dashboard` and commit the result"


def test_panels_cover_the_fleet():
    titles = [p["title"] for p in dashboard()["panels"]]
    assert titles == [
        "Acceptance length per pool",
        "Acceptance per draft position",
        "Drafted vs accepted tokens/s",
        "Speculation mode and K per pool",
        "Flips and decisions by reason",
        "Running and waiting requests per replica",
        "KV-cache usage",
        "Time to first token p50 / p99",
        "Share of requests within the SLO's TTFT / TPOT targets",
        "Inter-token latency p50 / p99",
        "Router requests by class and pool",
        "Each change: predicted vs realized speedup",
        "Acceptance the policy last measured",
    ]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard()["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[PrometheusProcess]:
    config = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"}, "scrape_configs": []}
    process = PrometheusProcess(tmp_path_factory.mktemp("prometheus"), config).start()
    try:
        yield process
    finally:
        process.stop()


def _query_error(prometheus: PrometheusProcess, expr: str) -> str | None:
    url = f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            doc = json.load(response)
    except urllib.error.HTTPError as err:
        doc = json.load(err)
    return None if doc.get("status") == "success" else f"{doc.get('errorType')}: {doc.get('error')}"


TARGETS = [(p["title"], t["refId"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]]


@pytest.mark.parametrize(("title", "ref", "expr"), TARGETS, ids=[f"{t}-{r}" for t, r, _ in TARGETS])
def test_every_panel_query_is_valid_promql(prometheus, title, ref, expr):
    assert _query_error(prometheus, as_sent(expr)) is None


def test_a_broken_query_is_caught(prometheus):
    # The check above can fail: Prometheus rejects a bad expression with a parse error.
    error = _query_error(prometheus, "sum by (pool (rate(x[1m]))")
    assert error is not None
    assert error.startswith("bad_data")


def test_variable_queries_name_labels_the_panels_select_on():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "deployment"):
        assert re.fullmatch(
            r"label_values\(.+, (namespace|specfleet_io_deployment)\)", variables[name]["definition"]
        )


def test_the_slo_panel_counts_each_pool_at_its_targets_bucket(tmp_path: Path):
    # promtool evaluates the panel's queries on engine buckets and the operator's gauge naming each
    # target's bucket: TTFT counted at 1 s (vLLM writes "1.0", the gauge the stored "1"), TPOT at 0.2 s.
    # Shares of 1/2 and 1/4, exact in floating point.
    (panel,) = [p for p in dashboard()["panels"] if "SLO" in p["title"]]
    ttft, tpot = "vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds"

    def engine(series: str, pool: str, le: str = "") -> str:
        bound = f',le="{le}"' if le else ""
        return f'{series}{{namespace="ns",specfleet_io_deployment="chat",specfleet_io_pool="{pool}"{bound}}}'

    # Requests a minute at or under each bound, and in all (`_count`).
    series = [
        (engine(f"{ttft}_bucket", "latency", "0.75"), 30),
        (engine(f"{ttft}_bucket", "latency", "1.0"), 50),
        (engine(f"{ttft}_count", "latency"), 100),
        (engine(f"{tpot}_bucket", "latency", "0.2"), 25),
        (engine(f"{tpot}_count", "latency"), 100),
        # The batch pool has no SLO, so no gauge: no series for it.
        (engine(f"{ttft}_bucket", "batch", "1.0"), 10),
        (engine(f"{ttft}_count", "batch"), 100),
    ]
    gauge = 'specfleet_pool_slo_target_bucket{namespace="ns",name="chat",pool="latency"'
    input_series = [{"series": s, "values": f"0+{n}x10"} for s, n in series] + [
        {"series": f'{gauge},target="ttft",le="1"}}', "values": "1x10"},
        {"series": f'{gauge},target="tpot",le="0.2"}}', "values": "1x10"},
    ]
    labels = '{namespace="ns",specfleet_io_deployment="chat",specfleet_io_pool="latency"}'
    tests = [
        {"expr": as_sent(t["expr"]), "eval_time": "5m", "exp_samples": [{"labels": labels, "value": share}]}
        for t, share in zip(panel["targets"], (0.5, 0.25), strict=True)
    ]
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": tests}],
    }
    assert_rule_tests_pass(tmp_path, doc)
