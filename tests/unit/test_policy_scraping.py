"""MetricsAvailable tells "Prometheus does not scrape these Ready pods" (PrometheusNotScraping, after a
few evaluations) from "Prometheus is down" and from one empty window (MetricsUnavailable), and says
what to check: the series the queries select, the PodMonitor and its labels, or the scrape annotations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specfleet.api import reason_docs, reasons
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment, parse_resource
from specfleet.controller.control import Controller
from specfleet.policy.decision.evaluation import Evaluation, evaluate_policy
from specfleet.policy.inputs.fleet_answers import FleetAnswers, PoolSelector, pool_observation
from specfleet.policy.inputs.observation import PoolObservation
from specfleet.policy.inputs.scraping import NOT_SCRAPING_EVALUATIONS, unscraped_evaluations
from specfleet.render import RenderOptions
from specfleet_runtime.cost_profile import default_profile
from specfleet_runtime.names import POOL_LABELS
from support.fake_cluster import FakeCluster
from support.fake_prometheus import FakePrometheus
from support.manifests import ROOT, load_yaml, merge

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEY = ("default", "llama", "latency")
SELECTOR = PoolSelector(*KEY)
SERIES = '{namespace="default",specfleet_io_deployment="llama",specfleet_io_pool="latency"}'
EMPTY = FleetAnswers()  # Prometheus answered every query with an empty vector
DOWN = FleetAnswers(error="ConnectionError: connection refused")
SCRAPED = FleetAnswers(
    values={"replicas": {KEY: 2.0}, "sample_age": {KEY: 3.0}, "running_per_replica": {KEY: 4.0}}
)


def _doc(monitoring: dict[str, Any] | None = None) -> dict[str, Any]:
    return merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {
            "metadata": {"uid": "u1", "generation": 1},
            "spec": {
                "pools": {"latency": {"replicas": 2}, "batch": {"replicas": 1, "speculation": "Off"}},
                "policy": {"evaluationIntervalSeconds": 5, "windowSeconds": 30},
                "monitoring": monitoring or {},
            },
        },
    )


def _ready(ready: int = 2) -> SpeculativeDeploymentStatus:
    return SpeculativeDeploymentStatus.model_validate(
        {"pools": {"latency": {"speculation": "On", "replicas": 2, "readyReplicas": ready, "settled": True}}}
    )


def _run(
    sd: SpeculativeDeployment,
    rounds: list[FleetAnswers],
    status: SpeculativeDeploymentStatus | None = None,
    monitoring_labels: tuple[tuple[str, str], ...] = (),
) -> list[Evaluation]:
    """Evaluate once per round, each on the status the last one returned (as the operator does)."""
    status = status or _ready()
    out = []
    for i, answers in enumerate(rounds):
        now = T0 + timedelta(seconds=5 * i)
        evaluation = evaluate_policy(sd, status, answers, default_profile(), None, now, monitoring_labels)
        status = evaluation.status
        out.append(evaluation)
    return out


def _metrics(evaluation: Evaluation) -> tuple[str, str, str]:
    (c,) = [c for c in evaluation.status.conditions if c.type == reasons.METRICS_AVAILABLE]
    return c.status, c.reason, c.message


def _count(evaluation: Evaluation) -> int | None:
    return evaluation.status.pools.latency.unscraped_evaluations


# --- one observation ---------------------------------------------------------------------------


def test_an_empty_answer_counts_the_ready_pods_without_series():
    obs = pool_observation(EMPTY, SELECTOR, 30, T0, expected_replicas=2, ready_replicas=2)
    assert (obs.ready_without_series, obs.usable) == (2, False)
    assert obs.problem == "no engine samples for pool latency in Prometheus although 2 pods are Ready"
    one = pool_observation(EMPTY, SELECTOR, 30, T0, ready_replicas=1)
    assert one.problem == "no engine samples for pool latency in Prometheus although 1 pod is Ready"


@pytest.mark.parametrize(
    ("answers", "ready", "without"),
    [
        (DOWN, 2, None),  # not known: Prometheus did not answer
        (EMPTY, 0, 0),  # no pod Ready: no series is expected
        (SCRAPED, 2, 0),  # scraped
        # A sample that was there but rejected was scraped: a different problem.
        (
            FleetAnswers.from_results(
                {"replicas": [{"metric": dict(zip(POOL_LABELS, KEY, strict=True)), "value": [0, "-1"]}]}
            ),
            2,
            0,
        ),
        (FleetAnswers(rejected_for={("replicas", KEY): "negative value -1"}), 2, 0),
    ],
)
def test_only_an_answer_without_series_while_pods_are_ready_counts(answers, ready, without):
    assert pool_observation(answers, SELECTOR, 30, T0, ready_replicas=ready).ready_without_series == without


@pytest.mark.parametrize(
    ("previous", "without", "count"),
    [
        (None, 2, 1),
        (1, 2, 2),
        (NOT_SCRAPING_EVALUATIONS, 2, NOT_SCRAPING_EVALUATIONS),  # capped: no status write per evaluation
        (-4, 1, 1),  # a damaged status counts afresh
        (2, None, 2),  # Prometheus did not answer: neither for nor against
        (2, 0, None),  # series seen (or no pod Ready): the count starts again
    ],
)
def test_the_count_of_evaluations_without_series(previous, without, count):
    obs = PoolObservation(pool="latency", at=T0, problem="x", ready_without_series=without)
    assert unscraped_evaluations(previous, obs) == count


def test_a_pool_not_observed_is_not_counted():
    assert unscraped_evaluations(2, None) is None


# --- the condition over evaluations ------------------------------------------------------------


def test_ready_pods_without_series_for_a_few_evaluations_say_prometheus_is_not_scraping():
    sd = parse_resource(_doc())
    evaluations = _run(sd, [EMPTY] * (NOT_SCRAPING_EVALUATIONS + 1))
    before, at, after = evaluations[-3], evaluations[-2], evaluations[-1]
    assert _metrics(before)[:2] == ("False", reasons.METRICS_UNAVAILABLE)
    assert [_count(e) for e in evaluations] == [1, 2, 3, 3]
    status, reason, message = _metrics(at)
    assert (status, reason) == ("False", reasons.PROMETHEUS_NOT_SCRAPING)
    assert f"no series {SERIES} for {NOT_SCRAPING_EVALUATIONS} evaluations in a row" in message
    assert "latency: Prometheus is not scraping this pool's pods: 2 pods are Ready" in message
    assert "specfleet.io/deployment=llama, specfleet.io/pool=latency" in message
    # Default spec.monitoring: scrape annotations, no PodMonitor.
    assert "annotated prometheus.io/scrape=true" in message
    assert "labelmap of __meta_kubernetes_pod_label_(.+)" in message
    assert "PodMonitor default/" not in message
    assert message.endswith("troubleshooting/#prometheusnotscraping)")
    # One Warning when the reason appears (after MetricsUnavailable's own), none while it lasts.
    assert [e[:2] for e in at.events] == [("Warning", reasons.EVENT_PROMETHEUS_NOT_SCRAPING)]
    assert at.events[0][2] == message
    assert _metrics(after) == _metrics(at)
    assert after.events == []
    assert [d.reason for d in after.decisions] == [reasons.METRICS_UNAVAILABLE]  # every pool holds


def test_the_podmonitor_and_the_labels_prometheus_would_select_it_by_are_named():
    doc = _doc({"podMonitor": True, "labels": {"release": "kps", "team": "ml"}})
    evaluations = _run(
        parse_resource(doc),
        [EMPTY] * NOT_SCRAPING_EVALUATIONS,
        monitoring_labels=(("release", "chart-default"), ("tier", "gpu")),
    )
    _, reason, message = _metrics(evaluations[-1])
    assert reason == reasons.PROMETHEUS_NOT_SCRAPING
    # The installation's labels, then the resource's, which win (as the renderer sets them).
    assert "selects PodMonitor default/llama" in message
    assert "PodMonitor's labels (release=kps,team=ml,tier=gpu;" in message
    assert "release=<its Helm release name>" in message
    assert "podMonitorNamespaceSelector must include namespace default" in message


def test_a_spec_that_renders_nothing_to_scrape_says_so():
    doc = _doc({"podMonitor": False, "scrapeAnnotations": False})
    _, reason, message = _metrics(_run(parse_resource(doc), [EMPTY] * NOT_SCRAPING_EVALUATIONS)[-1])
    assert reason == reasons.PROMETHEUS_NOT_SCRAPING
    assert "spec.monitoring sets neither podMonitor nor scrapeAnnotations" in message


def test_one_empty_window_after_a_rollout_is_not_reported_as_not_scraping():
    sd = parse_resource(_doc())
    rounds = [EMPTY] * (NOT_SCRAPING_EVALUATIONS - 1) + [SCRAPED] + [EMPTY] * (NOT_SCRAPING_EVALUATIONS - 1)
    evaluations = _run(sd, rounds)
    assert reasons.PROMETHEUS_NOT_SCRAPING not in {_metrics(e)[1] for e in evaluations}
    assert _metrics(evaluations[NOT_SCRAPING_EVALUATIONS - 1])[:2] == ("True", reasons.METRICS_OK)
    assert _count(evaluations[NOT_SCRAPING_EVALUATIONS - 1]) is None


def test_pods_that_are_not_ready_are_not_expected_to_have_series():
    sd = parse_resource(_doc())
    evaluations = _run(sd, [EMPTY] * (NOT_SCRAPING_EVALUATIONS + 1), status=_ready(0))
    assert {_metrics(e)[1] for e in evaluations} == {reasons.METRICS_UNAVAILABLE}
    assert {_count(e) for e in evaluations} == {None}


def test_prometheus_down_is_reported_as_such_and_does_not_reset_the_count():
    sd = parse_resource(_doc())
    evaluations = _run(sd, [EMPTY, EMPTY, DOWN, EMPTY])
    assert [_count(e) for e in evaluations] == [1, 2, 2, 3]
    _, reason, message = _metrics(evaluations[2])
    assert reason == reasons.METRICS_UNAVAILABLE
    assert "Prometheus query failed: ConnectionError" in message
    assert _metrics(evaluations[3])[1] == reasons.PROMETHEUS_NOT_SCRAPING
    # Down again once it said so: the query error is what is wrong now.
    later = _run(sd, [DOWN], status=evaluations[3].status)[0]
    assert _metrics(later)[1] == reasons.METRICS_UNAVAILABLE
    assert _count(later) == NOT_SCRAPING_EVALUATIONS


def test_series_again_clear_the_condition_and_the_count():
    sd = parse_resource(_doc())
    evaluations = _run(sd, [EMPTY] * NOT_SCRAPING_EVALUATIONS + [SCRAPED])
    assert _metrics(evaluations[-1])[:2] == ("True", reasons.METRICS_OK)
    assert "unscrapedEvaluations" not in evaluations[-1].status.to_wire()["pools"]["latency"]


def test_the_troubleshooting_entry_says_how_many_evaluations():
    assert NOT_SCRAPING_EVALUATIONS == 3
    assert (
        "for three evaluations in a row" in reason_docs.REASON_DOCS[reasons.PROMETHEUS_NOT_SCRAPING].meaning
    )


# --- the operator ------------------------------------------------------------------------------


def test_the_operator_counts_through_status_and_names_the_charts_podmonitor_labels():
    cluster = FakeCluster()
    key = ("SpeculativeDeployment", "default", "llama")
    cluster.objects[key] = _doc({"podMonitor": True})
    prom = FakePrometheus("default", "llama", 30)  # no pool has series
    clock = [T0]
    options = RenderOptions(monitoring_labels=(("release", "kps"),))
    controller = Controller(cluster, options, lambda url, timeout: prom, clock=lambda: clock[0])
    controller.reconcile_object("default", "llama")
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    events = []
    for _ in range(NOT_SCRAPING_EVALUATIONS):
        clock[0] += timedelta(seconds=5)
        events += [e.reason for e in controller.evaluate_policy("default", "llama").events]
    status = cluster.objects[key]["status"]
    assert status["pools"]["latency"]["unscrapedEvaluations"] == NOT_SCRAPING_EVALUATIONS
    (condition,) = [c for c in status["conditions"] if c["type"] == reasons.METRICS_AVAILABLE]
    assert condition["reason"] == reasons.PROMETHEUS_NOT_SCRAPING
    assert "PodMonitor's labels (release=kps;" in condition["message"]
    assert events == [reasons.EVENT_METRICS_UNAVAILABLE, reasons.EVENT_PROMETHEUS_NOT_SCRAPING]
    # A restarted operator goes on from status: series again clear it.
    prom.set_pool("latency")
    restarted = Controller(cluster, options, lambda url, timeout: prom, clock=lambda: clock[0])
    clock[0] += timedelta(seconds=5)
    restarted.evaluate_policy("default", "llama")
    status = cluster.objects[key]["status"]
    assert "unscrapedEvaluations" not in status["pools"]["latency"]
    (condition,) = [c for c in status["conditions"] if c["type"] == reasons.METRICS_AVAILABLE]
    assert condition["reason"] == reasons.METRICS_OK
