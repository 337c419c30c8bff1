"""What specfleet renders for prometheus-operator, applied with strict field validation against
prometheus-operator's real CRDs (generated from its Go API module with controller-gen, installed in
the real apiserver): each example's PodMonitor and PrometheusRule, and the chart's ServiceMonitor."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_testbed import ensure_prometheus_operator_crds
from support.manifests import EXAMPLES, apply_crds, chart_template, load_yaml, merge
from support.strict_apply import stored_as_rendered, strict_dry_run

pytestmark = pytest.mark.cluster
KINDS = ("podmonitors", "prometheusrules", "servicemonitors")
RENDERABLE = [p for p in EXAMPLES if "degraded" not in p.stem]


@pytest.fixture(scope="module")
def monitoring_crds(cluster) -> Iterator[object]:
    crd_dir = ensure_prometheus_operator_crds()
    names = [f"{kind}.monitoring.coreos.com" for kind in KINDS]
    apply_crds(cluster, *(crd_dir / f"monitoring.coreos.com_{kind}.yaml" for kind in KINDS))
    yield cluster
    # Other cluster tests run without prometheus-operator.
    cluster.kubectl("delete", "crd", *names, "--wait=false", check=False)


@pytest.mark.parametrize("path", RENDERABLE, ids=lambda p: p.stem)
def test_rendered_pod_monitor_and_prometheus_rule_pass_strict_validation(monitoring_crds, namespace, path):
    doc = merge(load_yaml(path), {"spec": {"monitoring": {"podMonitor": True, "prometheusRule": True}}})
    sd = parse_resource(doc)
    rendered = [
        c for c in render_children(sd, decided_plan(sd)) if c["kind"] in ("PodMonitor", "PrometheusRule")
    ]
    assert sorted(c["kind"] for c in rendered) == ["PodMonitor", "PrometheusRule"]
    for manifest in rendered:
        result = strict_dry_run(monitoring_crds, namespace, manifest)
        assert result.returncode == 0, f"{manifest['kind']}: {result.stderr}"
        # Nothing pruned: every rendered field is stored as written (the server may add defaults).
        assert stored_as_rendered(json.loads(result.stdout)["spec"], manifest["spec"]), manifest["kind"]


def test_a_wrong_field_is_refused(monitoring_crds, namespace):
    # The check above can fail: strict validation refuses a field the schema does not have.
    sd = parse_resource(merge(load_yaml(RENDERABLE[0]), {"spec": {"monitoring": {"prometheusRule": True}}}))
    rule = next(c for c in render_children(sd, decided_plan(sd)) if c["kind"] == "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["expression"] = "up"
    result = strict_dry_run(monitoring_crds, namespace, rule)
    assert result.returncode != 0
    assert ".rules[0].expression: field not declared in schema" in result.stderr


def test_chart_service_monitor_passes_strict_validation(monitoring_crds, namespace):
    rendered = chart_template(
        monitoring_crds,
        "-n",
        namespace,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--show-only",
        "templates/servicemonitor.yaml",
    )
    monitor = yaml.safe_load(rendered)
    assert monitor["kind"] == "ServiceMonitor"
    result = strict_dry_run(monitoring_crds, namespace, monitor)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spec"]["endpoints"][0]["honorLabels"] is True
