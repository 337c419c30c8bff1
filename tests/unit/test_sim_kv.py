"""The simulated engine's KV cache against hand-computed cases: vLLM V1's allocation and preemption."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.policy.predict.kv_cache import CapacityModel
from specfleet.sim.accounts import RunResult
from specfleet.sim.engine import EngineConfig, Replica, SimRequest
from specfleet.sim.fleet import SimOptions, Strategy, simulate
from specfleet.sim.workload import Trace, TraceRequest
from specfleet_runtime.cost_profile import default_profile

PROFILE = default_profile()
NEVER = (0.0, 0.0, 0.0)  # drafts never accepted: exactly one token per step, speculating or not


def step(batch: int, k: int = 0) -> float:
    return PROFILE.step_time_s(batch, k)


def replica(config: EngineConfig, prefill_s: float = 0.0) -> Replica:
    return Replica(0, "latency", "stable", "t", config, PROFILE, prefill_s, 1, 0.0, 0.0)


def request(index: int, prompt: int, tokens: int) -> SimRequest:
    return SimRequest(index, 0.0, prompt, tokens, NEVER, "latency", None)


def run(rep: Replica, *reqs: SimRequest) -> list[SimRequest]:
    for req in reqs:
        rep.submit(req, 0.0)
    done: list[SimRequest] = []
    rep.advance_to(1000.0, done)
    return done


def test_the_newest_request_is_preempted_when_a_step_cannot_allocate_and_recomputes_later() -> None:
    # 100 slots of 1 token. Two requests of a 40-token prompt and 30 output tokens join in one step
    # (40 + 40 <= 100) and each gets its first token: 82 tokens held. Decode step j needs 82 + 2j slots:
    # steps 0..9 fit, then 102 > 100, so B (the newest) is preempted with 11 tokens; A alone needs 51 and
    # B's recompute (40 + 11) does not fit beside it. A finishes after 19 more steps at batch 1, then B
    # recomputes 51 tokens in one step (its 12th token) and decodes its last 18.
    rep = replica(EngineConfig(speculative=False, k=0, kv_capacity_tokens=100, block_size=1))
    a, b = request(0, 40, 30), request(1, 40, 30)
    done = run(rep, a, b)
    assert done == [a, b]
    assert rep.preemptions == 1
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert a.finish == pytest.approx(11 * step(2) + 19 * step(1))
    assert b.finish == pytest.approx(11 * step(2) + 38 * step(1))
    assert b.first_token == pytest.approx(step(2))  # its first token came before the preemption
    assert rep.generation_tokens == pytest.approx(60)
    assert rep.prompt_tokens == pytest.approx(40 + 40 + 51)
    assert rep.kv_tokens == pytest.approx(0)
    assert rep.idle


def test_a_speculating_request_also_holds_its_drafts_and_lookahead_slots() -> None:
    # As above, speculating with K=2 and 2 lookahead slots: each running request needs 4 slots more, so
    # decode step j needs 82 + 2j + 8: steps 0..5 fit and B is preempted with 7 tokens.
    config = EngineConfig(speculative=True, k=2, kv_capacity_tokens=100, block_size=1, lookahead_tokens=2)
    rep = replica(config)
    a, b = request(0, 40, 30), request(1, 40, 30)
    done = run(rep, a, b)
    assert done == [a, b]
    assert rep.preemptions == 1
    assert a.finish == pytest.approx(7 * step(2, 2) + 23 * step(1, 2))
    assert rep.prompt_tokens == pytest.approx(40 + 40 + 47)


def test_without_pressure_nothing_is_preempted_and_usage_counts_partly_filled_blocks() -> None:
    rep = replica(EngineConfig(speculative=False, k=0, kv_capacity_tokens=1600, block_size=16))
    req = request(0, 20, 50)
    rep.submit(req, 0.0)
    rep.advance_to(step(1) / 2, [])  # the prefill step ran: 21 tokens held
    # 21 tokens in blocks of 16, each request's last block counted half empty on average (15/32).
    assert rep.kv_usage == pytest.approx((21 / 16 + 15 / 32) / 100)
    assert run(rep) == [req]
    assert rep.preemptions == 0


def test_waiting_requests_join_only_while_their_prompt_fits() -> None:
    # 100 slots: a 60-token prompt runs; a second one waits (60 + 1 + 60 > 100) until the first finishes.
    rep = replica(EngineConfig(speculative=False, k=0, kv_capacity_tokens=100, block_size=1))
    a, b = request(0, 60, 10), request(1, 60, 10)
    done = run(rep, a, b)
    assert done == [a, b]
    assert rep.preemptions == 0
    assert b.first_token == pytest.approx(10 * step(1) + step(1))


def test_the_drafter_prefills_every_prompt_token_too() -> None:
    config = EngineConfig(speculative=True, k=2, lookahead_tokens=2, drafter_prefill_fraction=0.05)
    rep = replica(config, prefill_s=1e-4)
    req = request(0, 1000, 1)
    assert run(rep, req) == [req]
    assert req.finish == pytest.approx(step(1, 2) + 1000 * 1e-4 * 1.05)


def test_under_heavy_pressure_no_request_is_lost_and_no_token_generated_twice() -> None:
    rng = np.random.default_rng(7)
    config = EngineConfig(speculative=True, k=3, kv_capacity_tokens=3000, block_size=16, lookahead_tokens=3)
    rep = replica(config, prefill_s=1e-5)
    reqs = [
        SimRequest(
            i, 0.0, int(rng.integers(10, 400)), int(rng.integers(1, 300)), (0.7, 0.4, 0.2), "latency", None
        )
        for i in range(60)
    ]
    done = run(rep, *reqs)
    assert sorted(r.index for r in done) == list(range(60))
    assert rep.preemptions > 0
    assert rep.generation_tokens == pytest.approx(sum(r.tokens for r in reqs))
    assert rep.kv_tokens == pytest.approx(0, abs=1e-6)


def test_the_simulated_prometheus_answers_the_memory_queries_as_an_engine_exposes_them() -> None:
    from specfleet.sim.prom import Prometheus

    config = EngineConfig(speculative=True, k=3, kv_capacity_tokens=3200, block_size=16, lookahead_tokens=3)
    rep = replica(config)
    prometheus = Prometheus()
    prometheus.track(rep)
    for i in range(40):
        rep.submit(SimRequest(i, 0.0, 100, 200, (0.7, 0.4, 0.2), "latency", None), 0.0)
    done: list[SimRequest] = []
    queued = []
    for tick in range(13):  # every 0.1 s: the whole run takes about a second
        rep.advance_to(tick / 10, done)
        prometheus.scrape(rep, tick / 10)
        queued.append(len(rep.waiting))
    assert rep.preemptions > 0
    answers = prometheus.fleet_answers("ns", "sd", ["latency"], 1.2, 1.2)
    key = ("ns", "sd", "latency")
    assert answers.kv_capacity[key] == {"On": 3200}  # 200 blocks of 16 tokens, as cache_config_info says
    assert answers.values["preemptions"][key] > 0
    assert 0.5 < answers.values["kv_usage"][key] <= 1.0
    assert answers.values["prompt_len"][key] == pytest.approx(100)
    assert answers.values["output_len"][key] == pytest.approx(200)
    # Averaged over the window's samples, as avg_over_time does (the demand's two parts alike).
    assert answers.values["waiting"][key] == pytest.approx(sum(queued[1:]) / len(queued[1:]))  # (0, 1.2]
    assert len(done) < 40  # still under pressure at the end of the window


# -- a draining pod's grace period ---------------------------------------------------------------------

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"


def _flip_under_a_long_queue(grace_seconds: int) -> RunResult:
    """2 latency engines, 1,200 long requests at once, the pool turned off at 30 s: the old engines drain
    from when the new ones are ready (90 s) with most of the queue still waiting."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    doc["spec"]["engine"] = {**doc["spec"].get("engine", {}), "terminationGracePeriodSeconds": grace_seconds}
    sd = parse_resource(doc)
    burst = [TraceRequest(arrival=0.0, prompt_tokens=200, output_tokens=2000) for _ in range(1199)]
    trace = Trace((*burst, TraceRequest(arrival=900.0, prompt_tokens=10, output_tokens=10)))  # runs 900 s
    flip = Strategy("flip", "schedule", schedule=((0.0, "latency", "On", 3), (30.0, "latency", "Off", None)))
    return simulate(sd, trace, flip, SimOptions(startup_seconds=60))


def test_a_draining_engine_is_killed_when_its_grace_period_runs_out() -> None:
    # Killed at 90 + 10 s: what it had not started goes to the new engines, its running streams fail.
    short = _flip_under_a_long_queue(grace_seconds=10)
    assert short.failed > 0
    assert short.failed <= 2 * 256  # at most what the two old engines were running (max_num_seqs)
    assert short.completed + short.rejected + short.failed == short.submitted == 1200
    # With a grace period longer than the queue takes, nothing is cut off.
    long = _flip_under_a_long_queue(grace_seconds=3600)
    assert long.failed == 0
    assert long.completed == 1200


def test_a_run_counts_each_pools_preemptions_and_mean_kv_usage() -> None:
    # The long queue of the flip above, with engines whose cache holds a few requests: the run reports
    # the preemptions of every engine (the drained ones too) and the mean KV usage of its ready engines.
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    sd = parse_resource(doc)
    burst = [TraceRequest(arrival=float(i) / 10, prompt_tokens=3000, output_tokens=600) for i in range(400)]
    trace = Trace((*burst, TraceRequest(arrival=300.0, prompt_tokens=10, output_tokens=10)))
    small = CapacityModel(gpu_bytes=22 * 2**30)  # about 34k tokens of KV: a dozen such requests
    profile = dataclasses.replace(default_profile(), memory=None)  # the engines size it from `small`
    static = Strategy("alwaysOnK3", "static", mode="On", k=3)
    run = simulate(sd, trace, static, SimOptions(memory=small), profile)
    latency = run.pools["latency"]
    assert latency.preemptions > 0
    assert latency.mean_kv_usage is not None
    assert 0.1 < latency.mean_kv_usage <= 1.0  # the idle tail of the run counts too
    assert run.pools["batch"].preemptions == 0
