"""Per-request latency in the simulator's results: each finished request's time to first token and
time per output token (TPOT: the mean time between its tokens after the first), per pool and per
window, and the requests a run ends with still in the system (issue 47, item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.sim.accounts import request_latency, window_latency
from specfleet.sim.compare import compare
from specfleet.sim.engine import EngineConfig, Replica, SimRequest
from specfleet.sim.fleet import SimOptions, Strategy, simulate
from specfleet.sim.workload import Trace, TraceRequest
from specfleet_runtime.cost_profile import default_profile

PROFILE = default_profile()
NEVER = (0.0, 0.0, 0.0)  # drafts never accepted: one token per step
EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"


def test_a_lone_requests_ttft_is_its_first_step_and_its_tpot_the_step_time() -> None:
    # Alone on an idle engine without prefill cost: the first token after one step at batch 1, each
    # of the other 29 a step later.
    rep = Replica(
        0, "latency", "stable", "t", EngineConfig(speculative=False, k=0), PROFILE, 0.0, 1, 0.0, 0.0
    )
    req = SimRequest(0, 2.0, 40, 30, NEVER, "latency", None)
    rep.submit(req, 2.0)
    done: list[SimRequest] = []
    rep.advance_to(1000.0, done)
    assert done == [req]
    ttft, tpot = request_latency(req)
    assert ttft == pytest.approx(PROFILE.step_time_s(1, 0))
    assert tpot == pytest.approx(PROFILE.step_time_s(1, 0))
    # One output token has a first token and no time between tokens.
    one = SimRequest(1, 0.0, 40, 1, NEVER, "latency", None)
    one.first_token, one.finish = 0.5, 0.5
    assert request_latency(one) == (0.5, None)


def _sd():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    return parse_resource(doc)


def test_every_result_has_ttft_and_tpot_percentiles_per_pool_and_per_window() -> None:
    # Light load, then a crowd of long requests at the last arrival: the run goes on until they finish
    # (none is left unfinished), and their latencies count in the pool's, not in a window's.
    calm = [TraceRequest(arrival=float(i), prompt_tokens=200, output_tokens=50) for i in range(50)]
    crowd = [TraceRequest(arrival=58.0, prompt_tokens=200, output_tokens=4000) for _ in range(20)]
    trace = Trace((*calm, *crowd))
    static = Strategy("alwaysOnK3", "static", mode="On", k=3)
    run = simulate(_sd(), trace, static, SimOptions(bin_seconds=10.0))
    latency = run.pools["latency"]
    assert (latency.requests, latency.unfinished) == (70, 0)
    assert len(latency.ttft) == len(latency.tpot) == 70
    assert all(t > 0 for t in latency.tpot)
    assert sum(len(done) for done in run.bin_latency["latency"]) == 50  # the crowd ends after the run
    windows = window_latency(run, "latency", 90)
    assert len(windows) == len(run.timeline)
    assert any(ttft is not None and tpot is not None for ttft, tpot in windows)
    # Speculating with drafts that are accepted, tokens come in bunches: a shorter TPOT than off.
    off = simulate(_sd(), Trace(tuple(calm)), Strategy("alwaysOff", "static", mode="Off"), SimOptions())
    on = simulate(_sd(), Trace(tuple(calm)), static, SimOptions())
    median = sorted(on.pools["latency"].tpot)[len(on.pools["latency"].tpot) // 2]
    assert median < sorted(off.pools["latency"].tpot)[len(off.pools["latency"].tpot) // 2]


def test_the_comparison_reports_latency_percentiles_and_unfinished_requests() -> None:
    trace = Trace(
        tuple(TraceRequest(arrival=float(i) / 2, prompt_tokens=200, output_tokens=80) for i in range(60))
    )
    comp = compare(_sd(), trace, SimOptions(), PROFILE, only=("policy",))
    doc = comp.strategy_json("policy")
    pool = doc["pools"]["latency"]
    for key in ("ttftP50Seconds", "ttftP90Seconds", "tpotP50Seconds", "tpotP90Seconds", "tpotP99Seconds"):
        assert (pool[key] or 0) > 0, key
    assert pool["tpotP50Seconds"] <= pool["tpotP90Seconds"] <= pool["tpotP99Seconds"]
    assert pool["unfinished"] == 0
    window = doc["timeline"][-1]["latency"]
    assert {"tpotP90Seconds", "ttftP90Seconds"} <= set(window)
