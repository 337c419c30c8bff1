"""SLO attainment of simulated runs (`specfleet.sim.slo`): the share of requests meeting both targets, per
window and over a run, and the per-level oracle that runs each window's best static setting."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from specfleet.api.pools import LatencySlo
from specfleet.api.validation import parse_resource
from specfleet.sim.fleet import SimOptions, Strategy, simulate
from specfleet.sim.slo import (
    START_PAYING,
    Targets,
    attainment,
    declared_setting,
    met_scores,
    oracle_attainment,
    start_paying_bound,
    window_counts,
)
from specfleet.sim.workload import Trace, TraceRequest
from specfleet_runtime.cost_profile import default_profile

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"


def _run(windows: list[list[tuple[float, float | None]]]) -> SimpleNamespace:
    """A run's per-window latencies of the latency pool (all `window_counts` reads)."""
    return SimpleNamespace(bin_latency={"latency": windows})


def test_a_request_meets_the_slo_when_both_targets_hold_and_unset_targets_hold_always():
    both = Targets.of(LatencySlo(time_to_first_token_milliseconds=500, time_per_output_token_milliseconds=20))
    assert (both.ttft_s, both.tpot_s) == (0.5, 0.02)
    assert both.met(0.5, 0.02)
    assert not both.met(0.51, 0.01)
    assert not both.met(0.1, 0.021)
    # One output token: no TPOT, judged by its TTFT.
    assert both.met(0.1, None)
    ttft_only = Targets.of(LatencySlo(time_to_first_token_milliseconds=500))
    assert ttft_only.met(0.2, 9.0)
    assert ttft_only.text() == "TTFT 500 ms"


def test_attainment_counts_requests_in_the_window_they_finished_in():
    targets = Targets(0.5, 0.02)
    run = _run([[(0.1, 0.01), (0.9, 0.01)], [], [(0.1, 0.03), (0.2, None), (0.3, 0.02)]])
    met, done = window_counts(run, "latency", targets)
    assert list(met) == [1, 0, 2]
    assert list(done) == [2, 0, 3]
    assert attainment(run, "latency", targets) == pytest.approx(3 / 5)
    assert attainment(_run([[]]), "latency", targets) is None


def test_the_oracle_runs_each_windows_best_setting_and_counts_its_requests():
    targets = Targets(0.5, None)
    fast, slow = (0.1, None), (0.9, None)
    # "a" meets the target early and misses late; "b" the other way round. Without smoothing the
    # oracle takes a's early windows and b's late ones: every request met.
    runs = {
        "a": _run([[fast, fast], [fast], [slow], [slow, slow]]),
        "b": _run([[slow, slow], [slow], [fast], [fast, fast]]),
    }
    oracle = oracle_attainment(runs, ["a", "b"], "latency", targets, smooth=0)
    assert oracle.choice == ("a", "a", "b", "b")
    assert oracle.attainment == 1.0
    assert attainment(runs["a"], "latency", targets) == 0.5
    # Judged over neighbours, a window is given the setting best around it.
    smoothed = oracle_attainment(runs, ["a", "b"], "latency", targets, smooth=1)
    assert (smoothed.choice[0], smoothed.choice[-1]) == ("a", "b")


def test_a_simulated_pool_past_its_capacity_misses_a_ttft_target_it_meets_at_low_load():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    doc["spec"]["policy"] = {**doc["spec"].get("policy", {}), "reentry": {"canaryReplicas": 0}}
    sd = parse_resource(doc)
    # 2 requests/s for a minute, then 60/s of 2,000-token prompts: the prefill alone passes capacity.
    calm = [TraceRequest(arrival=i / 2, prompt_tokens=2000, output_tokens=50) for i in range(120)]
    busy = [TraceRequest(arrival=60 + i / 60, prompt_tokens=2000, output_tokens=50) for i in range(3600)]
    run = simulate(
        sd, Trace((*calm, *busy)), Strategy("off", "static", "Off"), SimOptions(seed=0), default_profile()
    )
    targets = Targets(0.5, None)
    met, done = window_counts(run, "latency", targets)
    assert met[0] == done[0] > 0
    assert attainment(run, "latency", targets) < 0.5


def test_the_simulated_engines_export_vllms_latency_histograms_and_status_reads_attainment_from_them():
    # The same resource with an SLO on its latency pool: the simulated Prometheus answers the fleet's
    # TTFT and TPOT bucket queries from each engine's histograms, and the policy's evaluation writes the
    # pool's attainment into status as the operator does from real engines.
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    doc["spec"]["pools"]["latency"]["slo"] = {
        "timeToFirstTokenMilliseconds": 500,
        "timePerOutputTokenMilliseconds": 50,
        "percentile": 90,
    }
    doc["spec"]["policy"] = {**doc["spec"].get("policy", {}), "reentry": {"canaryReplicas": 0}}
    sd = parse_resource(doc)
    calm = [TraceRequest(arrival=i / 4, prompt_tokens=500, output_tokens=100) for i in range(2400)]
    run = simulate(
        sd, Trace(tuple(calm)), Strategy("policy", "policy"), SimOptions(seed=0), default_profile()
    )
    status = run.status.pools.latency
    # A calm pool of an 8B: every request well within both targets, by the histograms and by the run.
    assert status.slo_attainment_percent is not None
    assert float(status.slo_attainment_percent) == pytest.approx(100.0, abs=1.0)
    assert attainment(run, "latency", Targets(0.5, 0.05)) == pytest.approx(1.0, abs=0.01)


def test_the_start_paying_bound_scores_met_requests_per_window_and_its_neighbours():
    targets = Targets(0.5, None)
    fast, slow = (0.1, None), (0.9, None)
    run = _run([[fast, slow], [], [fast, fast], [], [], []])
    scores = met_scores({"a": run}, "latency", targets, smooth=1)["a"]
    assert list(scores[:4]) == [1, 3, 2, 2]
    # No request finished in the window nor its neighbours: no score (as the throughput bound's NaN).
    assert scores[5] != scores[5]


def test_the_start_paying_bound_starts_in_the_declared_setting_and_changes_nothing_before_the_first_evaluation():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    sd = parse_resource(doc)
    # Off meets a TTFT target (89 ms) the drafter's share of a long prefill misses (87 ms off, 92 ms at
    # K 3): the bound leaves the declared setting for off, but only after the policy's first evaluation.
    trace = Trace(
        tuple(TraceRequest(arrival=i / 4, prompt_tokens=2000, output_tokens=20) for i in range(1200))
    )
    options, profile = SimOptions(seed=0), default_profile()
    statics = {
        name: simulate(sd, trace, Strategy(name, "static", mode, k), options, profile)
        for name, mode, k in (("alwaysOff", "Off", None), ("alwaysOnK3", "On", 3))
    }
    declared = declared_setting(sd)
    assert declared == f"alwaysOnK{sd.spec.drafter.num_speculative_tokens}"
    bound = start_paying_bound(sd, trace, statics, options, profile, "latency", Targets(0.089, None))
    assert bound.strategy.name == START_PAYING
    changes = [(at, mode, k) for at, pool, mode, k in bound.strategy.schedule if pool == "latency"]
    assert changes[0] == (0.0, "On", sd.spec.drafter.num_speculative_tokens)
    assert [mode for _, mode, _ in changes[1:]] == ["Off"]
    assert changes[1][0] >= sd.spec.policy.evaluation_interval_seconds
