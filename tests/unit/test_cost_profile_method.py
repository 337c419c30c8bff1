"""The default step-time table per vLLM speculative method: EAGLE-3's is EAGLE-1's plus the EAGLE-3
drafter's measured extra step per K, and everything that falls back to the default with a spec at hand
(the controller, the monitoring rules, the simulator) picks it by the spec's drafter method."""

from __future__ import annotations

from typing import Any

import pytest

from specfleet.api.validation import SpeculativeDeployment, parse_resource
from specfleet.controller.control import Controller
from specfleet.policy.rules.threshold import threshold_values
from specfleet.render import RenderOptions
from specfleet.render.monitoring import alert_groups
from specfleet.sim.fleet import SimOptions, Strategy, simulate
from specfleet.sim.workload import ClosedLoop
from specfleet_runtime.cost_profile import (
    EAGLE3_DRAFTER_EXTRA_STEP_MS,
    PUBLISHED_ACCEPTANCE,
    PUBLISHED_H100_LLAMA31_8B_EAGLE,
    PUBLISHED_H100_LLAMA31_8B_EAGLE3,
    VLLM_20780_EAGLE1_AL,
    VLLM_20780_EAGLE1_TPOT_MS,
    VLLM_20780_EAGLE3_AL,
    VLLM_20780_EAGLE3_TPOT_MS,
    StepTimeProfile,
    default_profile,
    speedup,
    with_drafter_extra,
)
from support.fake_cluster import FakeCluster
from support.manifests import two_pool_example

E1 = PUBLISHED_H100_LLAMA31_8B_EAGLE
E3 = PUBLISHED_H100_LLAMA31_8B_EAGLE3


def test_eagle3_gets_the_eagle3_table_and_every_other_method_the_unchanged_one() -> None:
    assert default_profile("eagle3") is E3
    for method in (None, "eagle", "draft_model", "ngram", "mtp", "medusa", "suffix"):
        assert default_profile(method) is E1
    assert default_profile() is E1
    assert E1.step_ms[0] == (6.52, 7.37, 8.84, 10.33)  # the published table, untouched


def test_the_eagle3_table_is_the_eagle1_table_plus_the_per_k_term_at_every_batch() -> None:
    assert E3.batch_sizes == E1.batch_sizes
    assert E3.speculative_tokens == E1.speculative_tokens
    assert E3.prefill_ms_per_token == E1.prefill_ms_per_token
    assert E3.drafter_prefill_fraction == E1.drafter_prefill_fraction
    assert E3.memory == E1.memory
    for row1, row3 in zip(E1.step_ms, E3.step_ms, strict=True):
        for k, t1, t3 in zip(E1.speculative_tokens, row1, row3, strict=True):
            assert t3 - t1 == pytest.approx(EAGLE3_DRAFTER_EXTRA_STEP_MS[k], abs=0.0006)


def test_the_per_k_term_is_the_published_step_difference_at_batch_1() -> None:
    for k in (2, 3, 4, 5, 6, 7):
        step3 = VLLM_20780_EAGLE3_TPOT_MS[k] * VLLM_20780_EAGLE3_AL[k]
        step1 = VLLM_20780_EAGLE1_TPOT_MS[k] * VLLM_20780_EAGLE1_AL[k]
        assert EAGLE3_DRAFTER_EXTRA_STEP_MS[k] == pytest.approx(step3 - step1)
    assert EAGLE3_DRAFTER_EXTRA_STEP_MS[0] == 0.0  # no drafter runs
    assert EAGLE3_DRAFTER_EXTRA_STEP_MS[1] == pytest.approx(EAGLE3_DRAFTER_EXTRA_STEP_MS[2] / 2)  # assumed
    assert EAGLE3_DRAFTER_EXTRA_STEP_MS[3] == pytest.approx(1.587, abs=0.001)
    assert EAGLE3_DRAFTER_EXTRA_STEP_MS[5] == pytest.approx(2.266, abs=0.001)


def test_the_eagle3_table_stays_monotone_and_speculation_pays_less_on_it() -> None:
    for row in E3.step_ms:
        assert list(row) == sorted(row)
    for j in range(len(E3.speculative_tokens)):
        column = [row[j] for row in E3.step_ms]
        assert column == sorted(column)
    for batch in (1, 16, 64, 256):
        for k in (1, 3, 5):
            assert speedup(E3, batch, k, PUBLISHED_ACCEPTANCE) < speedup(E1, batch, k, PUBLISHED_ACCEPTANCE)


def test_a_table_without_a_term_for_one_of_its_k_is_refused() -> None:
    with pytest.raises(ValueError, match="no drafter extra for K"):
        with_drafter_extra(E1, {0: 0.0, 1: 0.5}, "partial")


def _resource(method: str, policy: dict[str, Any] | None = None) -> SpeculativeDeployment:
    doc = two_pool_example(policy or {"mode": "Goodput"})
    doc["spec"]["drafter"]["method"] = method
    return parse_resource(doc)


def test_the_controller_decides_on_the_default_of_the_spec_drafter_method() -> None:
    controller = Controller(FakeCluster(), RenderOptions(), lambda url, timeout: None)
    assert controller._cost_profile(_resource("eagle3")) == (E3, None)
    assert controller._cost_profile(_resource("eagle")) == (E1, None)


def test_a_profile_given_to_the_controller_wins_over_the_per_method_default() -> None:
    own = StepTimeProfile(batch_sizes=(1,), speculative_tokens=(0, 1), step_ms=((5.0, 6.0),), name="own")
    controller = Controller(FakeCluster(), RenderOptions(), lambda url, timeout: None, profile=own)
    assert controller._cost_profile(_resource("eagle3")) == (own, None)


def _derived_stop_concurrency(sd: SpeculativeDeployment) -> str:
    for group in alert_groups(sd):
        for rule in group["rules"]:
            expr = str(rule.get("expr", ""))
            if rule.get("alert") and " > " in expr and "running" in expr.lower():
                return expr
    raise AssertionError("no concurrency alert")


def test_the_monitoring_rules_derive_their_thresholds_from_the_method_default() -> None:
    policy = {"mode": "Threshold"}  # no thresholds given: derived from the profile's break-even
    e3, e1 = _resource("eagle3", policy), _resource("eagle", policy)
    k = e3.spec.drafter.num_speculative_tokens
    stop3 = threshold_values(e3.spec.policy, k, E3).stop_concurrency
    stop1 = threshold_values(e1.spec.policy, k, E1).stop_concurrency
    assert stop3 < stop1  # EAGLE-3's longer step stops paying at a lower load
    assert f"> {stop3:g}" in _derived_stop_concurrency(e3)
    assert f"> {stop1:g}" in _derived_stop_concurrency(e1)


def test_the_simulator_runs_an_eagle3_spec_on_the_eagle3_table_unless_given_one() -> None:
    sd = _resource("eagle3")
    workload = ClosedLoop(((0.0, 1), (30.0, 1)), ((76, 207),), name="one")
    options = SimOptions(seed=0, acceptance=PUBLISHED_ACCEPTANCE)
    on = Strategy("on", "static", "On", 3)

    def tpot(profile: StepTimeProfile | None) -> float:
        res = simulate(sd, workload, on, options, profile)
        return sum(res.pools["latency"].tpot) / len(res.pools["latency"].tpot)

    assert tpot(None) == pytest.approx(tpot(E3))
    assert tpot(None) > tpot(E1)
