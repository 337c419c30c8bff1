"""The policy's one prediction (`policy.predict.throughput`): continuous in load, priced like the engines
(batch, decode, prefill, memory, preemptions), and equal to the decode-only speedup where the other
terms vanish."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.policy import PolicySpec
from specfleet.policy import PoolObservation, PoolState, decide
from specfleet.policy.predict.throughput import OFF, SCHEDULE, PoolModel, pool_model, setting_name
from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    MemoryProfile,
    StepTimeProfile,
    default_profile,
    speedup,
)

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
ACC = PUBLISHED_ACCEPTANCE
KS = [1, 2, 3]
PUBLISHED = default_profile()
# A 70B-class target on one GPU: 12.9k tokens of KV cache without the drafter, 4.3k with it.
BIG = replace(PUBLISHED, memory=MemoryProfile(kv_cache_tokens=12900, kv_cache_tokens_with_drafter=4300))


def obs(prompt: float | None, output: float | None, **more: object) -> PoolObservation:
    return PoolObservation(
        pool="latency",
        at=NOW,
        running_per_replica=2.0,
        waiting=0.0,
        replicas_reporting=2,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        generation_tokens_per_second=1000.0,
        **more,  # type: ignore[arg-type]
    )


def model(profile: StepTimeProfile, ob: PoolObservation, mode: str = "On", **kw: object) -> PoolModel:
    return pool_model(profile, ob, KS, mode=mode, current_k=3, **kw)  # type: ignore[arg-type]


CASES = {
    # Memory-bound: 1k-token prompts on a 70B-class engine (the drafter's cache holds 3, off's 11).
    "70b-one-gpu": model(BIG, obs(1000.0, 200.0)),
    # Long context on the published 8B profile: 24k-token prompts, 300 generated.
    "8b-long-context": model(PUBLISHED, obs(24000.0, 300.0)),
    # Preempting now: its measured rate is charged where each setting's batch overflows.
    "70b-preempting": model(BIG, obs(1000.0, 200.0, preemptions_per_second=3.0)),
    # Short requests, no memory section: decode and prefill only, up to max_num_seqs.
    "8b-no-memory": model(PUBLISHED, obs(200.0, 300.0), max_num_seqs=64),
    # The in-engine schedule (K 3 up to 8 running, 1 up to 48, 0 beyond).
    "schedule": model(BIG, obs(1000.0, 200.0), schedule=((1, 8, 3), (9, 48, 1), (49, 65536, 0))),
}


def capacity(m: PoolModel) -> float:
    return min(m.max_num_seqs, max(s.fits for s in m.settings.values()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_setting_moves_smoothly_with_demand(name: str) -> None:
    # Demand from 1 to twice what the engines can run, each load 1% above the last: no step in any
    # setting's predicted gain larger than 3% between neighbouring loads (a model switched at a
    # threshold jumps by tens of percent where its branches meet).
    m = CASES[name]
    top = 2 * capacity(m)
    demands = [1.0]
    while demands[-1] < top:
        demands.append(demands[-1] * 1.01)
    for setting in m.settings:
        gains = [m.gain(setting, ACC, d) for d in demands]
        jumps = [abs(b - a) / a for a, b in itertools.pairwise(gains)]
        worst = max(range(len(jumps)), key=lambda i: jumps[i])
        assert jumps[worst] <= 0.03, (setting, demands[worst], gains[worst], gains[worst + 1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_gain_at_no_demand_is_its_limit_as_the_demand_falls(name: str) -> None:
    # Both settings serve nothing at no demand; what the next request to arrive sees is the gain at a
    # batch of one (below it the step is one request's), not 1.0: a projected fall to zero must not
    # price the pool's next minutes as idle.
    m = CASES[name]
    for setting in m.settings:
        assert m.gain(setting, ACC, 0.0) == pytest.approx(m.gain(setting, ACC, 1e-3))
        assert m.gain(setting, ACC, 0.0) == pytest.approx(m.gain(setting, ACC, 1.0))
    assert m.gain("K3", ACC, 0.0) != pytest.approx(1.0)


def test_where_nothing_binds_the_gain_is_the_cost_profiles_speedup() -> None:
    m = CASES["8b-no-memory"]
    for d in (1.0, 7.5, 40.0):
        for k in KS:
            expected = speedup(PUBLISHED, d, k, list(ACC), 200.0 / 300.0)
            assert m.gain(setting_name(k), ACC, d) == pytest.approx(expected)


def test_the_batch_never_exceeds_max_num_seqs() -> None:
    m = CASES["8b-no-memory"]
    assert m.batch(OFF, 500.0) == 64.0
    assert m.gain("K3", ACC, 500.0) == pytest.approx(m.gain("K3", ACC, 64.0))


def test_prefix_cache_hits_take_the_prefill_out() -> None:
    # Every prompt token served from the cache: only decode is left, the decode-only speedup.
    m = replace(CASES["8b-no-memory"], prefill_hit_share=1.0)
    assert m.gain("K3", ACC, 16.0) == pytest.approx(speedup(PUBLISHED, 16.0, 3, list(ACC)))
    # The longer the prompts per generated token, the closer speculation's gain to 1.
    short = model(PUBLISHED, obs(100.0, 300.0)).gain("K3", ACC, 16.0)
    long = model(PUBLISHED, obs(8000.0, 300.0)).gain("K3", ACC, 16.0)
    assert short > long > 1


def test_the_measured_hit_rate_prices_the_prefill_net_of_the_prefix_cache() -> None:
    # 4k-token prompts per 300 generated at 128 running per replica: with every prompt token prefilled
    # speculation loses; the more of them the prefix cache serves, the more it gains, past break-even.
    def gain(h: float | None) -> float:
        return model(PUBLISHED, obs(4000.0, 300.0, prefix_hit_rate=h)).gain("K3", ACC, 128.0)

    gains = [gain(h) for h in (0.0, 0.25, 0.5, 0.75, 0.9)]
    assert gains == sorted(gains)
    assert gains[0] < 1 < gains[-1]
    # Not measured (no lookup in the window) is no hit: every prompt token prefilled.
    assert gain(None) == gain(0.0)
    assert model(PUBLISHED, obs(4000.0, 300.0, prefix_hit_rate=0.5)).prefill_hit_share == 0.5
    # The engine without the drafter serves more too: its prefill is cheaper by the same share.
    off = [
        model(PUBLISHED, obs(4000.0, 300.0, prefix_hit_rate=h)).tokens_per_second(OFF, ACC, 128.0)
        for h in (0.0, 0.5)
    ]
    assert off[1] > off[0]


def test_memory_bound_settings_compare_by_the_batch_each_holds() -> None:
    m = CASES["70b-one-gpu"]
    assert (m.settings[OFF].fits, m.settings["K3"].fits) == (11.0, 3.0)
    # Demand 3: both hold it, compute decides; demand 11: off runs 11, the drafter 3.
    assert m.gain("K3", ACC, 3.0) > 1
    assert m.gain("K3", ACC, 11.0) < 0.6
    assert m.bound(11.0)
    assert not m.bound(3.0)


def test_the_schedule_drafts_by_batch_and_pays_k0_inside_the_engine() -> None:
    m = CASES["schedule"]
    assert m.tokens_per_second(SCHEDULE, ACC, 3.0) == pytest.approx(m.tokens_per_second("K3", ACC, 3.0))


def test_the_projected_load_never_exceeds_what_an_engine_runs() -> None:
    # Load rising fast towards the engines' limit: the projection stops at max_num_seqs.
    policy = PolicySpec.model_validate({})
    recent = tuple((NOW - timedelta(seconds=s), 250.0 - s) for s in range(150, 0, -15))
    state = PoolState(
        mode="On", last_transition=NOW - timedelta(days=1), recent_load=recent, max_num_seqs=256
    )
    ob = replace(obs(200.0, 300.0), running_per_replica=250.0, waiting=0.0)
    d = decide(policy, 3, {"latency": state}, {"latency": ob}, NOW, PUBLISHED)[0]
    assert float(d.observations["expectedRunningPerReplica"]) <= 256
