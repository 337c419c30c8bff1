"""The cost model reproduces the published numbers and interpolates sensibly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    PUBLISHED_H100_LLAMA31_8B_EAGLE,
    StepTimeProfile,
    best_k,
    default_profile,
    expected_tokens_per_step,
    goodput,
    load_profile,
    speedup,
    validate_acceptance,
)

P = PUBLISHED_H100_LLAMA31_8B_EAGLE
A = PUBLISHED_ACCEPTANCE


def test_default_is_the_published_h100_profile() -> None:
    assert default_profile() is P
    assert P.step_time_ms(1, 0) == 6.52
    assert P.step_time_ms(64, 3) == 13.50
    assert P.step_time_ms(256, 5) == 57.40


def test_expected_tokens_per_step() -> None:
    assert expected_tokens_per_step(A, 0) == 1.0
    assert expected_tokens_per_step(A, 1) == pytest.approx(1.68)
    assert expected_tokens_per_step(A, 3) == pytest.approx(2.27)
    # Positions beyond the vector are never accepted.
    assert expected_tokens_per_step([0.5], 4) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="within"):
        expected_tokens_per_step([1.2], 1)
    with pytest.raises(ValueError, match="K must be"):
        expected_tokens_per_step(A, -1)


def test_goodput_is_tokens_per_second_per_request() -> None:
    assert goodput(P, 1, 0, A) == pytest.approx(1000 / 6.52)
    assert goodput(P, 1, 3, A) == pytest.approx(2.27 * 1000 / 8.84)


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_best_k_at_low_batch_is_3_at_about_1_65x(batch: int) -> None:
    assert best_k(P, batch, A) == 3
    assert speedup(P, batch, 3, A) == pytest.approx(1.65, abs=0.1)
    assert speedup(P, 1, 3, A) == pytest.approx(1.67, abs=0.01)


def test_best_k_at_64_is_1_at_about_1_35x() -> None:
    assert best_k(P, 64, A) == 1
    assert speedup(P, 64, 1, A) == pytest.approx(1.35, abs=0.01)


def test_speculation_loses_at_256() -> None:
    assert best_k(P, 256, A) == 0
    assert speedup(P, 256, 1, A) == pytest.approx(0.90, abs=0.01)
    assert speedup(P, 256, 3, A) == pytest.approx(0.79, abs=0.01)


def test_best_k_with_explicit_candidates_and_ties() -> None:
    assert best_k(P, 64, A, candidates=[0, 3]) == 3
    flat = StepTimeProfile(batch_sizes=(1,), speculative_tokens=(0, 1), step_ms=((10.0, 20.0),))
    # K=1 with certain acceptance doubles tokens and doubles time: a tie goes to the smaller K.
    assert best_k(flat, 1, [1.0]) == 0
    with pytest.raises(ValueError, match="no candidate"):
        best_k(P, 1, A, candidates=[])


def test_interpolation_is_linear_between_table_points() -> None:
    # Batch: halfway between 64 and 256 at K=0.
    assert P.step_time_ms(160, 0) == pytest.approx((7.77 + 14.49) / 2)
    # K: K=2 halfway between K=1 and K=3 at batch 1.
    assert P.step_time_ms(1, 2) == pytest.approx((7.37 + 8.84) / 2)
    # Both at once (bilinear).
    expected = ((7.37 + 8.84) / 2 + (9.66 + 13.50) / 2) / 2
    assert P.step_time_ms(32.5, 2) == pytest.approx(expected)
    assert P.step_time_s(1, 0) == pytest.approx(0.00652)


def test_extrapolation_beyond_the_table() -> None:
    # Beyond the largest batch: the fitted roofline's growth per request, a + s min(K, 1) + c (1 + K).
    r = P.roofline
    assert P.step_time_ms(512, 0) == pytest.approx(14.49 + 256 * (r.ms_per_request + r.ms_per_token))
    per_request_k3 = r.ms_per_request + r.ms_per_speculating_request + 4 * r.ms_per_token
    assert P.step_time_ms(512, 3) == pytest.approx(41.85 + 256 * per_request_k3)
    # Below the smallest batch: clamped.
    assert P.step_time_ms(0.5, 0) == 6.52
    # Beyond the largest K: one more drafter pass each (the smallest batch's mean cost per draft) and
    # the compute of the extra verified tokens.
    per_draft = (10.33 - 6.52) / 5
    assert P.step_time_ms(1, 7) == pytest.approx(10.33 + 2 * per_draft)
    assert P.step_time_ms(256, 7) == pytest.approx(57.40 + 2 * (per_draft + 255 * r.ms_per_token))
    # Never decreasing beyond the table, even if the table's last segment decreases.
    odd = StepTimeProfile(batch_sizes=(1, 2), speculative_tokens=(0,), step_ms=((5.0,), (4.0,)))
    assert odd.step_time_ms(10, 0) == 4.0
    with pytest.raises(ValueError, match="batch size"):
        P.step_time_ms(0, 1)
    with pytest.raises(ValueError, match="K must"):
        P.step_time_ms(1, -1)


@given(
    batch=st.floats(min_value=1, max_value=2048),
    k=st.floats(min_value=0, max_value=8),
    more=st.floats(min_value=0, max_value=100),
)
def test_step_time_grows_with_batch_and_k(batch: float, k: float, more: float) -> None:
    t = P.step_time_ms(batch, k)
    assert t > 0
    assert P.step_time_ms(batch + more, k) >= t - 1e-9
    assert P.step_time_ms(batch, k + more / 10) >= t - 1e-9


def test_profile_round_trips_and_loads_from_yaml_and_json(tmp_path: Path) -> None:
    assert StepTimeProfile.from_dict(P.to_dict()) == P
    yaml_file = tmp_path / "a100.yaml"
    yaml_file.write_text(
        "name: a100-test\n"
        "batchSizes: [1, 32]\n"
        "numSpeculativeTokens: [0, 2]\n"
        "stepTimeMs:\n"
        "  - [10, 12]\n"
        "  - [14, 20]\n"
        "prefillMsPerToken: 0.01\n"
    )
    loaded = load_profile(yaml_file)
    assert loaded.name == "a100-test"
    assert loaded.step_time_ms(32, 2) == 20.0
    assert loaded.prefill_time_ms(100) == pytest.approx(1.0)
    json_file = tmp_path / "h100.json"
    json_file.write_text(json.dumps(P.to_dict()))
    assert load_profile(json_file) == P


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"numSpeculativeTokens": [0], "stepTimeMs": [[1.0]]}, "lacks 'batchSizes'"),
        ({"batchSizes": [1], "numSpeculativeTokens": [0], "stepTimeMs": [["x"]]}, "malformed"),
        ({"batchSizes": [2, 1], "numSpeculativeTokens": [0], "stepTimeMs": [[1.0], [2.0]]}, "increasing"),
        ({"batchSizes": [1], "numSpeculativeTokens": [1, 3], "stepTimeMs": [[1.0, 2.0]]}, "start at 0"),
        ({"batchSizes": [1], "numSpeculativeTokens": [0, 1], "stepTimeMs": [[1.0]]}, "one column per K"),
        ({"batchSizes": [1], "numSpeculativeTokens": [0], "stepTimeMs": [[-1.0]]}, "positive"),
        ({"batchSizes": [], "numSpeculativeTokens": [0], "stepTimeMs": []}, "at least one"),
    ],
)
def test_invalid_profiles_are_refused(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepTimeProfile.from_dict(doc)


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_profile(f)


def test_validate_acceptance() -> None:
    assert validate_acceptance([0.7, 0.4, 0.4, 0.0]) == (0.7, 0.4, 0.4, 0.0)
    assert validate_acceptance([]) == ()
    with pytest.raises(ValueError, match="cannot increase"):
        validate_acceptance([0.4, 0.5])
    with pytest.raises(ValueError, match="within"):
        validate_acceptance([-0.1])


def test_break_even_concurrency_of_the_published_profile():
    from specfleet_runtime.cost_profile import MAX_CONCURRENCY, concurrency_at_speedup

    profile = default_profile()
    published = tuple(PUBLISHED_ACCEPTANCE)
    c = concurrency_at_speedup(profile, 1, published, 1.0)
    assert speedup(profile, c, 1, published) == pytest.approx(1.0, abs=1e-6)
    assert 160 < c < 175  # the measurement: about 169
    assert concurrency_at_speedup(profile, 3, (0.0, 0.0, 0.0), 1.0) == 0.0
    # Even perfect acceptance stops paying once verifying more than doubles the step (K=1 at about 392
    # here: past the table a request costs K=1 more than twice what it costs K=0) ...
    assert 300 < concurrency_at_speedup(profile, 1, (1.0,), 1.0) < 400
    # ... while free verification pays at any load.
    flat = StepTimeProfile(batch_sizes=(1, 256), speculative_tokens=(0, 1), step_ms=((5.0, 5.0), (9.0, 9.0)))
    assert concurrency_at_speedup(flat, 1, (0.5,), 1.0) == MAX_CONCURRENCY


def test_break_even_concurrency_is_where_the_best_k_stops_paying() -> None:
    from specfleet_runtime.cost_profile import break_even_concurrency, speedup

    profile = default_profile()
    published = (0.68, 0.39, 0.2, 0.1, 0.05)
    c = break_even_concurrency(profile, published, [1, 3])
    assert 160 < c < 180  # issue 12 measured about 169 for the published drafter
    assert max(speedup(profile, c, k, published) for k in (1, 3)) == pytest.approx(1.0, abs=1e-6)
    assert max(speedup(profile, c + 1, k, published) for k in (1, 3)) < 1.0
    # The best of several K reaches further than the drafter's K alone.
    assert break_even_concurrency(profile, published, [3]) < c
    with pytest.raises(ValueError, match="no candidate K"):
        break_even_concurrency(profile, published, [])
