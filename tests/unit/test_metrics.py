"""Observations from PromQL answers: the numbers, and every way data can be missing."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from specfleet.observe.prometheus import (
    FleetAnswers,
    PoolSelector,
    PrometheusQuerier,
    QueryError,
    QueryFn,
    fleet_queries,
    namespace_matcher,
    pool_observation,
    query_fleet,
)
from specfleet.policy.inputs.fleet_answers import CLOCK_SKEW_SECONDS
from specfleet.policy.inputs.observation import PoolObservation
from support.fake_prometheus import FakePrometheus, asked_namespaces
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
    return pool_observation(query_fleet(query, window, [selector.namespace]), selector, window, now, **kw)  # type: ignore[arg-type]


def test_queries_group_by_pool_and_use_the_window():
    queries = fleet_queries(60, ["ns"])
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
    answers = query_fleet(prom, 60, ["ns", "other"])
    assert len(prom.queries) == len(fleet_queries(60, ["ns"]))
    latency = pool_observation(answers, SEL, 60, NOW)
    batch = pool_observation(answers, PoolSelector("ns", "llama", "batch"), 60, NOW)
    qwen = pool_observation(answers, PoolSelector("other", "qwen", "latency"), 60, NOW)
    assert (latency.acceptance_length, latency.per_position) == (
        pytest.approx(2.5),
        pytest.approx((0.7, 0.5)),
    )
    assert (batch.running_per_replica, batch.replicas_reporting) == (50.0, 4)
    assert (qwen.acceptance_length, qwen.running_per_replica) == (pytest.approx(1.5), 3.0)
    # A pool nobody reported: its own problem, the others unaffected.
    assert pool_observation(answers, PoolSelector("ns", "gone", "latency"), 60, NOW).problem == (
        "no engine samples for pool latency in Prometheus"
    )


def test_a_nan_quantile_is_no_data_but_an_infinite_load_is_rejected():
    sample = {"namespace": "ns", "specfleet_io_deployment": "llama", "specfleet_io_pool": "latency"}
    answers = FleetAnswers.from_results(
        {
            "replicas": [{"metric": sample, "value": [0, "2"]}],
            "sample_age": [{"metric": sample, "value": [0, "3"]}],
            "itl_p99": [{"metric": sample, "value": [0, "NaN"]}],
            "running_per_replica": [{"metric": sample, "value": [0, "+Inf"]}],
        }
    )
    # NaN is Prometheus' quantile of no observations: no value, nothing wrong with the answer.
    assert answers.get("itl_p99", SEL.key) is None
    assert answers.rejected == {("running_per_replica", "not_finite"): 1}
    obs = pool_observation(answers, SEL, 60, NOW)
    assert obs.problem == (
        "no running-request count for pool latency in Prometheus "
        "(running_per_replica sample rejected: value inf is not a finite number)"
    )


def test_the_prefix_hit_rate_is_hits_over_lookups_by_pool():
    q = fleet_queries(60, ["ns"])["prefix_hit_rate"]
    by = "namespace, specfleet_io_deployment, specfleet_io_pool"
    sel = 'namespace="ns",specfleet_io_deployment!="",specfleet_io_pool!=""'
    assert q == (
        f"sum by ({by}) (rate(vllm:prefix_cache_hits_total{{{sel}}}[60s])) / "
        f"sum by ({by}) (rate(vllm:prefix_cache_queries_total{{{sel}}}[60s]))"
    )


@pytest.mark.parametrize(
    ("value", "expected", "rejected"),
    [
        ("0.35", 0.35, {}),
        ("0", 0.0, {}),  # lookups that all missed: measured, 0
        ("NaN", None, {}),  # 0 / 0, no lookup in the window: not measured, nothing wrong
        ("1.2", None, {("prefix_hit_rate", "above_one"): 1}),
        ("-0.1", None, {("prefix_hit_rate", "negative"): 1}),
        ("+Inf", None, {("prefix_hit_rate", "not_finite"): 1}),
        (None, None, {}),  # engines that export no prefix-cache counters
    ],
)
def test_the_prefix_hit_rate_reaches_the_observation(
    value: str | None, expected: float | None, rejected: dict[tuple[str, str], int]
) -> None:
    sample = {"namespace": "ns", "specfleet_io_deployment": "llama", "specfleet_io_pool": "latency"}
    results = {
        "replicas": [{"metric": sample, "value": [0, "2"]}],
        "sample_age": [{"metric": sample, "value": [0, "3"]}],
        "running_per_replica": [{"metric": sample, "value": [0, "5"]}],
    }
    if value is not None:
        results["prefix_hit_rate"] = [{"metric": sample, "value": [0, value]}]
    answers = FleetAnswers.from_results(results)
    assert answers.rejected == rejected
    obs = pool_observation(answers, SEL, 60, NOW)
    assert obs.problem is None  # a missing hit rate never keeps a decision from being made
    assert obs.prefix_hit_rate == expected
    assert ("prefixCacheHitRate" in obs.as_text()) == (expected is not None)


def test_the_prefix_hit_rate_comes_through_a_round_of_queries(prom):
    prom.set_pool("latency", prefix_hit_rate=0.6)
    assert observe_pool(prom, SEL, 60, NOW).prefix_hit_rate == 0.6


def test_a_failed_round_holds_every_pool(prom):
    prom.down = True
    answers = query_fleet(prom, 60, ["ns"])
    assert len(prom.queries) == 1  # the first failure ends the round
    for pool in ("latency", "batch"):
        assert "Prometheus query failed" in (
            pool_observation(answers, PoolSelector("ns", "llama", pool), 60, NOW).problem or ""
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


# ---- hostile or broken answers: range-checked, skipped and counted, never fatal to the round --------


def _rejected(query: str, reason: str) -> float:
    """The operator's count of rejected samples so far (a process-wide counter: compare deltas)."""
    value = REGISTRY.get_sample_value(
        "specfleet_prometheus_samples_rejected_total", {"query": query, "reason": reason}
    )
    return value or 0.0


def _labels(pool: str = "latency", **extra: str) -> dict[str, str]:
    return {"namespace": "ns", "specfleet_io_deployment": "llama", "specfleet_io_pool": pool, **extra}


def test_negative_accepted_tokens_are_rejected_not_a_negative_acceptance_length(prom):
    prom.set_pool("latency", drafts=10.0, accepted=-50.0, draft_tokens=30.0, per_pos=[7.0, 5.0])
    before = _rejected("accepted", "negative")
    obs = observe_pool(prom, SEL, 60, NOW)
    assert _rejected("accepted", "negative") == before + 1
    assert obs.acceptance_length is None
    assert obs.draft_acceptance_rate is None
    assert obs.usable  # acceptance unknown is an ordinary state (memory, canaries); the load is known


@pytest.mark.parametrize("running", [None, float("nan"), float("inf"), -1000.0])
def test_a_running_count_not_measured_is_a_problem_never_zero_load(prom, running):
    prom.set_pool("latency", running=running)
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.running_per_replica is None
    assert (obs.problem or "").startswith("no running-request count for pool latency in Prometheus")


def test_a_future_sample_time_is_rejected():
    now = NOW.timestamp()
    answers = FleetAnswers.from_results(
        {
            "replicas": [{"metric": _labels(), "value": [now, "2"]}],
            "sample_age": [{"metric": _labels(), "value": [now, "3"]}],
            # Within the allowed clock skew: kept.
            "waiting": [{"metric": _labels(), "value": [now + CLOCK_SKEW_SECONDS / 2, "1"]}],
            "running_per_replica": [{"metric": _labels(), "value": [now + 3600, "4"]}],
        },
        now,
    )
    assert answers.rejected == {("running_per_replica", "future"): 1}
    obs = pool_observation(answers, SEL, 60, NOW)
    assert obs.problem == (
        "no running-request count for pool latency in Prometheus "
        "(running_per_replica sample rejected: sample time is 3600s in the future)"
    )


def test_a_newest_sample_in_the_future_is_rejected(prom):
    prom.set_pool("latency", age=-3600.0)
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.problem == (
        "no sample age for pool latency in Prometheus "
        "(sample_age sample rejected: newest sample is 3600s in the future)"
    )


def test_malformed_samples_are_skipped_and_counted_and_the_round_goes_on(prom):
    prom.set_pool("latency", drafts=10.0, accepted=15.0, per_pos=[7.0, 5.0], running=12.0)
    prom.set_pool("batch", running=50.0)
    prom.extra = {
        "accepted_per_pos": [{"metric": _labels(position="x"), "value": [0, "3"]}],
        "running_per_replica": [{"metric": _labels("batch")}, "not a sample"],
        "waiting": [{"metric": _labels(), "value": [0]}, {"metric": _labels(), "value": [0, "lots"]}],
    }
    before = {
        key: _rejected(*key)
        for key in [
            ("accepted_per_pos", "bad_position"),
            ("running_per_replica", "malformed"),
            ("waiting", "malformed"),
        ]
    }
    answers = query_fleet(prom, 60, ["ns"])
    assert answers.error is None
    assert answers.rejected == {
        ("accepted_per_pos", "bad_position"): 1,
        ("running_per_replica", "malformed"): 2,
        ("waiting", "malformed"): 2,
    }
    after = {key: _rejected(*key) for key in before}
    assert after == {
        ("accepted_per_pos", "bad_position"): before[("accepted_per_pos", "bad_position")] + 1,
        ("running_per_replica", "malformed"): before[("running_per_replica", "malformed")] + 2,
        ("waiting", "malformed"): before[("waiting", "malformed")] + 2,
    }
    latency = pool_observation(answers, SEL, 60, NOW)
    batch = pool_observation(answers, PoolSelector("ns", "llama", "batch"), 60, NOW)
    assert latency.usable
    assert batch.usable
    assert latency.per_position == pytest.approx((0.7, 0.5))
    assert (batch.running_per_replica, latency.waiting) == (50.0, 0.0)  # the good samples stand


def test_positions_must_count_from_zero_without_a_gap(prom):
    prom.set_pool("latency", drafts=10.0, accepted=15.0, running=12.0)
    prom.extra = {
        "accepted_per_pos": [
            {"metric": _labels(position=str(i)), "value": [0, str(p)]}
            for i, p in ((0, 7.0), (1, 5.0), (3, 1.0))
        ]
    }
    answers = query_fleet(prom, 60, ["ns"])
    assert answers.rejected == {("accepted_per_pos", "position_gap"): 1}
    assert pool_observation(answers, SEL, 60, NOW).per_position == pytest.approx((0.7, 0.5))


def test_acceptance_above_one_is_rejected_beyond_extrapolation_noise(prom):
    # 10.5 accepted at position 0 per 10 drafts is within a rate's extrapolation noise: clamped to 1.
    prom.set_pool("latency", drafts=10.0, accepted=15.0, draft_tokens=30.0, per_pos=[10.5, 5.0], running=12.0)
    obs = observe_pool(prom, SEL, 60, NOW)
    assert obs.per_position == pytest.approx((1.0, 0.5))
    # 30 accepted per 10 drafts at position 1, and more accepted than drafted tokens: contradictions.
    prom.set_pool("latency", drafts=10.0, accepted=90.0, draft_tokens=30.0, per_pos=[7.0, 30.0], running=12.0)
    answers = query_fleet(prom, 60, ["ns"])
    assert answers.rejected == {
        ("accepted_per_pos", "accepted_exceeds_drafted"): 1,
        ("accepted", "accepted_exceeds_drafted"): 1,
    }
    obs = pool_observation(answers, SEL, 60, NOW)
    assert (obs.acceptance_length, obs.per_position) == (None, ())


def test_two_samples_for_one_series_leave_its_value_unknown(prom):
    prom.set_pool("latency", running=12.0)
    prom.extra = {"running_per_replica": [{"metric": _labels(), "value": [0, "0"]}]}
    answers = query_fleet(prom, 60, ["ns"])
    assert answers.rejected == {("running_per_replica", "duplicate"): 1}
    assert pool_observation(answers, SEL, 60, NOW).running_per_replica is None


def test_queries_select_only_the_namespaces_asked_about():
    one = fleet_queries(60, ["team-a"])
    assert all('{namespace="team-a",specfleet_io_deployment!=""' in q for q in one.values())
    several = fleet_queries(60, ["team-b", "team-a", "team-b"])
    assert all('namespace=~"team-a|team-b",' in q for q in several.values())
    with pytest.raises(ValueError, match="no namespace"):
        fleet_queries(60, [])


def test_the_namespace_matcher_escapes_regex_and_string_metacharacters():
    # Kubernetes names allow none of these; the matcher must stay exact whatever it is given.
    names = ["a.b", "c|d", 'e"f', "g\\h", "x"]
    matcher = namespace_matcher(names)
    assert matcher == r'namespace=~"a\\.b|c\\|d|e\"f|g\\\\h|x"'
    pattern = json.loads(matcher.removeprefix("namespace=~"))
    for name in names:
        assert re.fullmatch(pattern, name)
    for other in ("aXb", "c", "d", "a.b|x", ""):
        assert not re.fullmatch(pattern, other)
    # The fake Prometheus reads the same namespaces back out of the query.
    assert sorted(asked_namespaces(fleet_queries(60, names)["drafts"])) == sorted(names)


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


def test_the_latency_histograms_are_asked_per_bucket_by_pool():
    queries = fleet_queries(60, ["ns"])
    by = "namespace, specfleet_io_deployment, specfleet_io_pool"
    sel = 'namespace="ns",specfleet_io_deployment!="",specfleet_io_pool!=""'
    assert queries["ttft_buckets"] == (
        f"sum by ({by}, le) (rate(vllm:time_to_first_token_seconds_bucket{{{sel}}}[60s]))"
    )
    assert queries["tpot_buckets"] == (
        f"sum by ({by}, le) (rate(vllm:request_time_per_output_token_seconds_bucket{{{sel}}}[60s]))"
    )
    # Counter rates need no filter of sleeping engines: a Standby round asks the same.
    standby = fleet_queries(60, ["ns"], standby=True)
    assert (standby["ttft_buckets"], standby["tpot_buckets"]) == (
        queries["ttft_buckets"],
        queries["tpot_buckets"],
    )


def test_the_latency_histograms_reach_the_observation_sorted_by_bound(prom):
    prom.set_pool(
        "latency",
        ttft_buckets={"+Inf": 10.0, "0.5": 6.0, "0.1": 2.0},
        tpot_buckets={"0.05": 8.0, "+Inf": 10.0},
    )
    prom.set_pool("batch")
    answers = query_fleet(prom, 60, ["ns"])
    assert answers.rejected == {}
    obs = pool_observation(answers, SEL, 60, NOW)
    assert obs.ttft_histogram == ((0.1, 2.0), (0.5, 6.0), (math.inf, 10.0))
    assert obs.tpot_histogram == ((0.05, 8.0), (math.inf, 10.0))
    # Engines that export no such histogram: not measured, and nothing else is affected.
    batch = pool_observation(answers, PoolSelector("ns", "llama", "batch"), 60, NOW)
    assert (batch.usable, batch.ttft_histogram, batch.tpot_histogram) == (True, (), ())


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"metric": _labels(le="soon"), "value": [0, "1"]}, "bad_bucket"),
        ({"metric": _labels(le="NaN"), "value": [0, "1"]}, "bad_bucket"),
        ({"metric": _labels(), "value": [0, "1"]}, "bad_bucket"),  # no le at all
        ({"metric": _labels(le="0.25"), "value": [0, "-1"]}, "negative"),
        ({"metric": _labels(le="0.5"), "value": [0, "7"]}, "duplicate"),
    ],
)
def test_a_histogram_with_a_bucket_rejected_is_not_measured_at_all(prom, extra, reason):
    # One bucket fewer would move requests between buckets: the pool's whole histogram goes.
    prom.set_pool("latency", ttft_buckets={"0.1": 2.0, "0.5": 6.0, "+Inf": 10.0})
    prom.set_pool("batch", ttft_buckets={"0.1": 1.0, "+Inf": 2.0})
    prom.extra = {"ttft_buckets": [extra]}
    answers = query_fleet(prom, 60, ["ns"])
    assert answers.rejected == {("ttft_buckets", reason): 1}
    assert answers.histogram("ttft_buckets", SEL.key) == ()
    assert answers.histogram("ttft_buckets", ("ns", "llama", "batch")) == ((0.1, 1.0), (math.inf, 2.0))
