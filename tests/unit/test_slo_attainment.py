"""A pool's SLO attainment from cumulative latency histograms: the share within a target, by hand."""

from __future__ import annotations

import math

import pytest

from specfleet.api.pools import LatencySlo
from specfleet.policy.inputs.slo_attainment import (
    TargetBucket,
    measure_attainment,
    share_within,
    target_buckets,
)
from specfleet_runtime import vllm_metrics as vm

INF = math.inf
# 10 requests/s: 2 at or under 0.1 s, 6 at or under 0.5 s, 9 at or under 1 s, 1 slower.
TTFT = ((0.1, 2.0), (0.5, 6.0), (1.0, 9.0), (INF, 10.0))


def test_a_target_on_a_bucket_boundary_is_that_bucket_s_count():
    assert share_within(TTFT, 0.5) == pytest.approx(0.6)
    assert share_within(TTFT, 1.0) == pytest.approx(0.9)


def test_a_target_inside_a_bucket_is_interpolated_linearly():
    # 0.3 s is halfway from 0.1 to 0.5: 2 + (6 - 2) / 2 = 4 of 10.
    assert share_within(TTFT, 0.3) == pytest.approx(0.4)
    # 0.75 s is halfway from 0.5 to 1.0: 6 + 3 / 2 = 7.5 of 10.
    assert share_within(TTFT, 0.75) == pytest.approx(0.75)


def test_a_target_below_the_first_bucket_interpolates_from_zero():
    # 0.05 s is half of the first bucket (0, 0.1]: 1 of 10.
    assert share_within(TTFT, 0.05) == pytest.approx(0.1)


def test_a_target_past_the_last_finite_bucket_counts_only_what_is_under_it():
    # The +Inf bucket has no upper bound: the one request past 1 s may or may not meet 5 s.
    assert share_within(TTFT, 5.0) == pytest.approx(0.9)


def test_an_empty_window_is_not_measured_not_a_met_objective():
    assert share_within(((0.1, 0.0), (INF, 0.0)), 0.5) is None
    assert share_within((), 0.5) is None


def test_a_histogram_without_its_inf_bucket_is_not_measured():
    assert share_within(((0.1, 2.0), (1.0, 3.0)), 0.5) is None


def test_a_lower_bucket_above_a_higher_one_is_held_to_it():
    # Rates extrapolated per bucket can cross: the higher bucket is taken as at least the lower one.
    assert share_within(((0.1, 5.0), (0.5, 4.0), (INF, 10.0)), 0.5) == pytest.approx(0.5)


def test_attainment_is_the_smaller_share_of_the_targets_set():
    tpot = ((0.025, 1.0), (0.05, 8.0), (INF, 10.0))
    slo = LatencySlo(time_to_first_token_milliseconds=500, time_per_output_token_milliseconds=50)
    measured = measure_attainment(slo, TTFT, tpot)
    assert measured.ttft == pytest.approx(0.6)
    assert measured.tpot == pytest.approx(0.8)
    assert measured.attainment == pytest.approx(0.6)


def test_a_single_target_is_the_attainment_and_the_other_is_not_reported():
    measured = measure_attainment(LatencySlo(time_to_first_token_milliseconds=300), TTFT, ())
    assert measured.ttft == pytest.approx(0.4)
    assert measured.tpot is None
    assert measured.attainment == pytest.approx(0.4)


def test_a_target_not_measured_leaves_the_attainment_unknown():
    slo = LatencySlo(time_to_first_token_milliseconds=500, time_per_output_token_milliseconds=50)
    measured = measure_attainment(slo, TTFT, ())
    assert measured.ttft == pytest.approx(0.6)
    assert measured.tpot is None
    assert measured.attainment is None


def test_alerts_count_a_target_at_the_largest_bucket_at_or_under_it():
    # On a bound: that bucket (50 ms is exactly 0.05 s). Between bounds: the one under it.
    assert target_buckets(
        LatencySlo(time_to_first_token_milliseconds=800, time_per_output_token_milliseconds=50)
    ) == [
        TargetBucket("ttft", vm.TIME_TO_FIRST_TOKEN, 800, 0.75),
        TargetBucket("tpot", vm.TIME_PER_OUTPUT_TOKEN, 50, 0.05),
    ]
    assert [t.le for t in target_buckets(LatencySlo(time_per_output_token_milliseconds=74))] == [0.05]
    assert [t.le for t in target_buckets(LatencySlo(time_to_first_token_milliseconds=600000))] == [160.0]


def test_a_target_under_the_first_bucket_has_no_alert_bucket():
    # TPOT's first bound is 10 ms: a 5 ms target cannot be counted at any bucket (status interpolates it).
    assert target_buckets(LatencySlo(time_per_output_token_milliseconds=5)) == []
    assert [t.target for t in target_buckets(LatencySlo(time_to_first_token_milliseconds=1))] == ["ttft"]
