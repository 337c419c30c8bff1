"""Observations from PromQL answers: the numbers, and every way data can be missing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from specfleet.metrics.prometheus import PoolSelector, observe_pool, pool_queries
from support.fake_prometheus import FakePrometheus

NOW = datetime(2026, 11, 29, tzinfo=UTC)
SEL = PoolSelector("ns", "llama", "latency")


@pytest.fixture
def prom():
    return FakePrometheus("ns", "llama", 60)


def test_queries_select_the_pool_and_use_the_window():
    queries = pool_queries(SEL, 60)
    assert 'specfleet_io_pool="latency"' in queries["drafts"]
    assert "[60s]" in queries["drafts"]
    assert queries["accepted_per_pos"].startswith("sum by (position)")
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in queries["accepted_per_pos"]


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
