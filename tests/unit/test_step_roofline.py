"""Past its table the step time follows a roofline fitted to the table: continuous at the edge,
monotone, and growing with the tokens each step verifies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specfleet_runtime.cost_profile import PUBLISHED_H100_LLAMA31_8B_EAGLE, StepTimeProfile
from specfleet_runtime.step_roofline import Roofline

P = PUBLISHED_H100_LLAMA31_8B_EAGLE
KS = (0, 1, 3, 5)


def test_the_fit_on_the_published_table() -> None:
    r = P.roofline
    # Compute per verified token: 16 GFLOP a token of Llama-3.1-8B in 0.026 ms is about 610 TFLOPS.
    assert r.ms_per_token == pytest.approx(0.0262, abs=5e-4)
    assert r.ms_per_request == pytest.approx(0.0044, abs=5e-4)
    assert r.ms_per_speculating_request == pytest.approx(0.0180, abs=5e-4)
    assert r.ms_per_draft == pytest.approx((10.33 - 6.52) / 5)
    # The floor is the smallest batch's row, which the roofline passes through.
    for j, k in enumerate(KS):
        assert r.step_ms(1, k) == pytest.approx(P.step_ms[0][j])
    # It reproduces the largest batch's row within 3% (each point).
    for j, k in enumerate(KS):
        assert r.step_ms(256, k) == pytest.approx(P.step_ms[-1][j], rel=0.03)


def test_at_batch_340_speculation_costs_what_its_verified_tokens_do() -> None:
    r = P.roofline
    more = 340 - 256
    k0 = P.step_time_ms(340, 0)
    assert k0 == pytest.approx(14.49 + more * (r.ms_per_request + r.ms_per_token))
    for j, k in ((1, 1), (2, 3)):
        grown = more * (r.ms_per_request + r.ms_per_speculating_request + (1 + k) * r.ms_per_token)
        assert P.step_time_ms(340, k) == pytest.approx(P.step_ms[-1][j] + grown)
    # Against the last segment's slope, which K=1's steep last segment (9.66 -> 27.14 ms) made
    # cost 2.00x K=0 at batch 340 (34.79 / 17.43 ms): the roofline gives 1.96x (33.42 / 17.06 ms),
    # and K=3 3.08x where the slope gave 3.11x (52.53 against 54.25 ms).
    last_segment = {
        k: P.step_ms[-1][j] + more * (P.step_ms[-1][j] - P.step_ms[-2][j]) / (256 - 64)
        for j, k in enumerate(KS)
    }
    assert last_segment[1] / last_segment[0] == pytest.approx(1.996, abs=1e-3)
    assert last_segment[3] / last_segment[0] == pytest.approx(3.113, abs=1e-3)
    assert P.step_time_ms(340, 1) / k0 == pytest.approx(1.959, abs=1e-3)
    assert P.step_time_ms(340, 3) / k0 == pytest.approx(3.079, abs=1e-3)


def test_inside_the_table_nothing_moves() -> None:
    for i, b in enumerate(P.batch_sizes):
        for j, k in enumerate(KS):
            assert P.step_time_ms(b, k) == P.step_ms[i][j]
    assert P.step_time_ms(160, 2) == pytest.approx(((9.66 + 13.50) / 2 + (27.14 + 41.85) / 2) / 2)


@pytest.mark.parametrize("k", [0, 0.5, 1, 2, 3, 4.5, 5])
def test_continuous_at_the_largest_batch(k: float) -> None:
    edge = P.step_time_ms(256, k)
    assert P.step_time_ms(256 + 1e-9, k) == pytest.approx(edge, abs=1e-6)
    assert P.step_time_ms(256 - 1e-9, k) == pytest.approx(edge, abs=1e-6)


@pytest.mark.parametrize("b", [300, 1000])
@pytest.mark.parametrize("k", [0, 0.5, 1, 3])
def test_continuous_in_k_past_the_largest_batch(b: float, k: float) -> None:
    at = P.step_time_ms(b, k)
    assert P.step_time_ms(b, k + 1e-9) == pytest.approx(at, abs=1e-6)
    if k > 0:
        assert P.step_time_ms(b, k - 1e-9) == pytest.approx(at, abs=1e-6)


@pytest.mark.parametrize("b", [1, 10, 64, 200, 256, 300, 1000])
def test_continuous_at_the_largest_k(b: float) -> None:
    edge = P.step_time_ms(b, 5)
    assert P.step_time_ms(b, 5 + 1e-9) == pytest.approx(edge, abs=1e-6)
    assert P.step_time_ms(b, 5 - 1e-9) == pytest.approx(edge, abs=1e-6)


@given(
    batch=st.floats(min_value=0.5, max_value=4096),
    k=st.floats(min_value=0, max_value=12),
    more_batch=st.floats(min_value=0, max_value=1024),
    more_k=st.floats(min_value=0, max_value=4),
)
def test_monotone_in_batch_and_k(batch: float, k: float, more_batch: float, more_k: float) -> None:
    t = P.step_time_ms(batch, k)
    assert P.step_time_ms(batch + more_batch, k) >= t - 1e-9
    assert P.step_time_ms(batch, k + more_k) >= t - 1e-9


@pytest.mark.parametrize(
    ("a", "s", "c"), [(0.004, 0.02, 0.03), (0.0, 0.0, 0.05), (0.01, 0.0, 0.0), (0.002, 0.01, 0.0)]
)
def test_the_fit_recovers_a_true_roofline(a: float, s: float, c: float) -> None:
    floor = {0: 5.0, 1: 5.9, 2: 6.6, 4: 8.1}
    batches = (2, 16, 128, 512)

    def truth(b: int, k: int) -> float:
        return floor[k] + (b - 2) * (a + s * min(k, 1) + c * (1 + k))

    table = tuple(tuple(truth(b, k) for k in floor) for b in batches)
    profile = StepTimeProfile(batch_sizes=batches, speculative_tokens=tuple(floor), step_ms=table)
    r = profile.roofline
    assert r.ms_per_request == pytest.approx(a, abs=1e-9)
    assert r.ms_per_speculating_request == pytest.approx(s, abs=1e-9)
    assert r.ms_per_token == pytest.approx(c, abs=1e-9)
    # Past the table the profile is the true roofline (whose growth it follows from an exact edge).
    for b, k in ((1000, 0), (1000, 2), (2048, 4), (700, 6), (64, 9)):
        expected = truth(b, k) if k <= 4 else truth(b, 4) + (k - 4) * (r.ms_per_draft + (b - 2) * c)
        assert profile.step_time_ms(b, k) == pytest.approx(expected)


def test_tables_that_do_not_grow_with_k_or_batch() -> None:
    # Growth with batch the same at every K: verification is free past the table too.
    flat = StepTimeProfile(batch_sizes=(1, 256), speculative_tokens=(0, 1), step_ms=((5.0, 5.0), (9.0, 9.0)))
    assert flat.roofline.ms_per_token == 0
    assert flat.roofline.ms_per_speculating_request == 0
    assert flat.step_time_ms(1000, 1) == pytest.approx(flat.step_time_ms(1000, 0))
    # One batch size: nothing to fit; constant past it, as the table's only row.
    one = StepTimeProfile(batch_sizes=(8,), speculative_tokens=(0, 2), step_ms=((5.0, 6.0),))
    assert one.step_time_ms(1000, 2) == 6.0
    # Only K=0 measured: K past it costs nothing more (no drafter was measured).
    plain = StepTimeProfile(batch_sizes=(1, 64), speculative_tokens=(0,), step_ms=((5.0,), (7.0,)))
    assert plain.step_time_ms(128, 3) == pytest.approx(plain.step_time_ms(128, 0))
    assert plain.step_time_ms(128, 0) == pytest.approx(7.0 + 64 * 2.0 / 63)
    # A table whose step shrinks with the batch does not make the roofline shrink.
    odd = StepTimeProfile(batch_sizes=(1, 2), speculative_tokens=(0,), step_ms=((5.0,), (4.0,)))
    assert odd.step_time_ms(10, 0) == 4.0


def test_fit_of_a_table_directly() -> None:
    r = Roofline.fit((1, 3), (0, 2), ((2.0, 3.0), (2.2, 3.6)))
    # u = 2 at batch 3: K=0 grows 0.2 = 2 (a + c), K=2 grows 0.6 = 2 (a + s + 3 c).
    assert r.ms_per_request + r.ms_per_token == pytest.approx(0.1)
    assert r.ms_per_request + r.ms_per_speculating_request + 3 * r.ms_per_token == pytest.approx(0.3)
    assert min(r.ms_per_request, r.ms_per_speculating_request, r.ms_per_token) >= 0
