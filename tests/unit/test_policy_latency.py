"""Each setting's latency (`policy.predict.latency`): TPOT as the batch over the tokens per second, TTFT as
the queue's wait plus the prompt's prefill (the drafter's share included) and a step, and the share of
requests within an SLO read from the measured histograms scaled by the predicted ratio of means."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from specfleet.api.pools import LatencySlo
from specfleet.policy import PoolObservation
from specfleet.policy.predict.latency import Latency, predict_latency, predicted_attainment, scaled_share
from specfleet.policy.predict.throughput import OFF, pool_model
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, default_profile

ACC = tuple(PUBLISHED_ACCEPTANCE[:3])
PROFILE = default_profile()
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _model(prompt: float = 1000.0, output: float = 200.0):
    obs = PoolObservation(
        pool="latency",
        at=NOW,
        acceptance_length=1 + sum(ACC),
        per_position=ACC,
        acceptance_source="pool",
        running_per_replica=4.0,
        replicas_reporting=1,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
    )
    return pool_model(PROFILE, obs, [1, 3], mode="On", current_k=3)


def test_speculation_cuts_tpot_at_a_small_batch_and_costs_it_at_a_large_one():
    model = _model()
    low = {n: predict_latency(model, n, ACC, 200.0, 1000.0, 200.0) for n in (OFF, "K3")}
    assert low["K3"].tpot < 0.75 * low[OFF].tpot
    # TPOT is the batch over the tokens per second at it: the per-request decode rate's inverse.
    running = model.requests_for("K3", ACC, 200.0)
    assert low["K3"].tpot == pytest.approx(
        max(1.0, running) / model.tokens_per_second("K3", ACC, max(1.0, running))
    )
    # Decode-bound (short prompts) at K 3's capacity: its large batch's steps cost more than the
    # tokens they yield, where the engine without the drafter serves the same rate with fewer requests.
    short = _model(prompt=10.0)
    cap_k3 = short.capacity("K3", ACC)
    high = {n: predict_latency(short, n, ACC, 0.99 * cap_k3, 10.0, 200.0) for n in (OFF, "K3")}
    assert high["K3"].tpot > high[OFF].tpot


def test_the_drafter_costs_ttft_at_low_load_and_a_setting_past_its_capacity_never_answers():
    model = _model(prompt=4000.0)
    off = predict_latency(model, OFF, ACC, 50.0, 4000.0, 200.0)
    k3 = predict_latency(model, "K3", ACC, 50.0, 4000.0, 200.0)
    # No queue to speak of: the prompt's prefill with the drafter's share, and a longer first step.
    share = PROFILE.drafter_prefill_fraction
    assert k3.ttft - off.ttft == pytest.approx(
        4000 * PROFILE.prefill_ms_per_token / 1000 * share
        + PROFILE.step_time_s(1, 3)
        - PROFILE.step_time_s(1, 0),
        rel=0.2,
    )
    assert k3.ttft > off.ttft
    beyond = predict_latency(model, "K3", ACC, 1.01 * model.capacity("K3", ACC), 4000.0, 200.0)
    assert math.isinf(beyond.ttft)
    assert math.isinf(beyond.tpot)


def test_a_histogram_scaled_by_the_predicted_ratio_gives_another_settings_share():
    # 100 requests: 50 within 0.1 s, all within 0.2 s.
    histogram = ((0.1, 50.0), (0.2, 100.0), (math.inf, 100.0))
    assert scaled_share(histogram, 0.1, 1.0) == pytest.approx(0.5)
    # Twice as slow: a 0.2 s target is met as often as 0.1 s is now.
    assert scaled_share(histogram, 0.2, 2.0) == pytest.approx(0.5)
    assert scaled_share(histogram, 0.1, math.inf) == 0.0
    assert scaled_share((), 0.1, 1.0) is None


def test_predicted_attainment_multiplies_the_targets_shares_and_knows_when_it_cannot_tell():
    slo = LatencySlo(time_to_first_token_milliseconds=200, time_per_output_token_milliseconds=10)
    ttft = ((0.1, 50.0), (0.2, 100.0), (math.inf, 100.0))
    tpot = ((0.005, 20.0), (0.01, 80.0), (0.02, 100.0), (math.inf, 100.0))
    now = Latency(ttft=0.1, tpot=0.008)
    assert predicted_attainment(slo, ttft, tpot, now, now) == pytest.approx(1.0 * 0.8)
    # A setting with half the TPOT and twice the TTFT.
    other = Latency(ttft=0.2, tpot=0.004)
    assert predicted_attainment(slo, ttft, tpot, now, other) == pytest.approx(0.5 * 1.0)
    # One that cannot serve the arrivals meets nothing; a current one that cannot gives no scale.
    assert predicted_attainment(slo, ttft, tpot, now, Latency(math.inf, math.inf)) == 0.0
    assert predicted_attainment(slo, ttft, tpot, Latency(math.inf, math.inf), other) is None
    assert predicted_attainment(slo, (), tpot, now, other) is None
