"""The Grafana dashboard: generated file up to date, the panels the docs promise, and every panel's
PromQL accepted by a real Prometheus (Debian's 2.42 on an empty TSDB: a parse or type error fails)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from specfleet.observe.dashboard import dashboard, dashboard_json
from specfleet_sandbox.prometheus import PrometheusProcess
from support.manifests import ROOT

COMMITTED = ROOT / "charts" / "specfleet" / "dashboards" / "specfleet.json"
# What Grafana substitutes before a query reaches Prometheus ("All" selected for the variables).
GRAFANA_VARIABLES = {"$namespace": ".*", "$deployment": ".*", "$__rate_interval": "1m"}


def as_sent(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
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
        "Inter-token latency p50 / p99",
        "Router requests by class and pool",
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
