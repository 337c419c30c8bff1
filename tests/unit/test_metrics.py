"""Observations from PromQL answers: the numbers, and every way data can be missing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from specfleet.metrics.prometheus import (
    FleetAnswers,
    PoolSelector,
    PrometheusQuerier,
    QueryError,
    QueryFn,
    fleet_queries,
    observe,
    query_fleet,
)
from specfleet.policy.observations import PoolObservation
from support.fake_prometheus import FakePrometheus
from support.prometheus_faults import FaultyPrometheus

NOW = datetime(2026, 11, 29, tzinfo=UTC)
SEL = PoolSelector("ns", "llama", "latency")


@pytest.fixture
def prom():
    return FakePrometheus("ns", "llama", 60)


def observe_pool(
    query: QueryFn, selector: PoolSelector, window: int, now: datetime, **kw: object
) -> PoolObservation:
    """One round of fleet queries, then one pool's observation (what the scheduler does per target)."""
    return observe(query_fleet(query, window), selector, window, now, **kw)  # type: ignore[arg-type]


def test_queries_group_by_pool_and_use_the_window():
    queries = fleet_queries(60)
    by = "namespace, specfleet_io_deployment, specfleet_io_pool"
    assert queries["drafts"].startswith(f"sum by ({by}) (rate(")
    assert "[60s]" in queries["drafts"]
    assert queries["accepted_per_pos"].startswith(f"sum by ({by}, position)")
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in queries["accepted_per_pos"]
    assert f"sum by ({by}, le)" in queries["itl_p99"]
    # Every query is grouped: no pool's series is ever summed with another's.
    assert all(by in q for q in queries.values())


def test_one_round_of_queries_serves_every_pool_of_every_deployment(prom):
    prom.set_pool("latency", drafts=10.0, accepted=15.0, per_pos=[7.0, 5.0], running=12.0)
    prom.set_pool("batch", running=50.0, replicas=4)
    prom.set_pool("latency", namespace="other", deployment="qwen", drafts=10.0, accepted=5.0, running=3.0)
    answers = query_fleet(prom, 60)
    assert len(prom.queries) == len(fleet_queries(60))
    latency = observe(answers, SEL, 60, NOW)
    batch = observe(answers, PoolSelector("ns", "llama", "batch"), 60, NOW)
    qwen = observe(answers, PoolSelector("other", "qwen", "latency"), 60, NOW)
    assert (latency.acceptance_length, latency.per_position) == (
        pytest.approx(2.5),
        pytest.approx((0.7, 0.5)),
    )
    assert (batch.running_per_replica, batch.replicas_reporting) == (50.0, 4)
    assert (qwen.acceptance_length, qwen.running_per_replica) == (pytest.approx(1.5), 3.0)
    # A pool nobody reported: its own problem, the others unaffected.
    assert observe(answers, PoolSelector("ns", "gone", "latency"), 60, NOW).problem == (
        "no engine samples for pool latency in Prometheus"
    )


def test_answers_skip_values_that_are_not_numbers():
    sample = {"namespace": "ns", "specfleet_io_deployment": "llama", "specfleet_io_pool": "latency"}
    answers = FleetAnswers.from_results(
        {
            "replicas": [{"metric": sample, "value": [0, "2"]}],
            "sample_age": [{"metric": sample, "value": [0, "3"]}],
            "itl_p99": [{"metric": sample, "value": [0, "NaN"]}],
            "running_per_replica": [{"metric": sample, "value": [0, "+Inf"]}],
        }
    )
    obs = observe(answers, SEL, 60, NOW)
    assert obs.usable
    assert (obs.itl_p99_seconds, obs.running_per_replica) == (None, None)


def test_a_failed_round_holds_every_pool(prom):
    prom.down = True
    answers = query_fleet(prom, 60)
    assert len(prom.queries) == 1  # the first failure ends the round
    for pool in ("latency", "batch"):
        assert "Prometheus query failed" in (
            observe(answers, PoolSelector("ns", "llama", pool), 60, NOW).problem or ""
        )


def test_acceptance_numbers(prom):
    prom.set_pool(
        "latency", drafts=10.0, accepted=15.0, draft_tokens=30.0, per_pos=[7.0, 5.0, 3.0], running=12.0
    )
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.usable
    assert obs.acceptance_length == pytest.approx(2.5)
    assert obs.draft_acceptance_rate == pytest.approx(0.5)
    assert obs.per_position == pytest.approx((0.7, 0.5, 0.3))
    assert obs.running_per_replica == 12.0
    assert obs.acceptance_source == "pool"


def test_no_drafts_means_unknown_acceptance_not_zero(prom):
    prom.set_pool("latency", drafts=0.0, accepted=0.0)
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.usable
    assert obs.acceptance_length is None
    assert obs.per_position == ()


def test_canary_source_when_pool_is_off(prom):
    prom.set_pool("latency", drafts=2.0, accepted=4.0, per_pos=[1.0, 0.6])
    assert observe_pool(prom, SEL, 60, NOW, pool_mode="Off").acceptance_source == "canary"


def test_prometheus_down_is_a_problem(prom):
    prom.down = True
    obs = observe_pool(prom, SEL, 60, NOW)
    assert not obs.usable
    assert "Prometheus query failed" in (obs.problem or "")


def test_no_samples_is_a_problem(prom):
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.problem == "no engine samples for pool latency in Prometheus"


def test_stale_samples_are_a_problem(prom):
    prom.set_pool("latency", age=600.0)
    obs = observe_pool(prom, SEL, 60, NOW)
    assert "stale metrics" in (obs.problem or "")
    assert obs.acceptance_length is None


def test_partial_samples_are_a_problem(prom):
    prom.set_pool("latency", replicas=1, running=40.0)
    obs = observe_pool(prom, SEL, 60, NOW, expected_replicas=3)
    assert obs.problem == "partial metrics for pool latency: 1 of 3 ready engines have samples"
    assert obs.running_per_replica is None
    assert observe_pool(prom, SEL, 60, NOW, expected_replicas=1).usable


def test_too_few_drafts_leave_acceptance_unknown(prom):
    # 1 draft/s over 60 s is 60 drafts: too few to judge a drafter by.
    prom.set_pool("latency", drafts=1.0, accepted=0.2, per_pos=[0.1, 0.1, 0.0])
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.usable
    assert obs.acceptance_length is None
    assert obs.drafts_in_window == 60


def test_a_slow_prometheus_is_reported_as_slow_and_a_closed_port_as_unreachable():
    slow = FaultyPrometheus("http://127.0.0.1:9", slow_seconds=3).start()
    slow.mode = "slow"
    try:
        with pytest.raises(QueryError) as late:
            PrometheusQuerier(slow.url, 1)("up")
    finally:
        slow.stop()
    assert str(late.value) == f"{slow.url} did not answer in time"
    with pytest.raises(QueryError) as refused:
        PrometheusQuerier("http://127.0.0.1:9", 1)("up")
    assert str(refused.value) == "cannot connect to http://127.0.0.1:9"
