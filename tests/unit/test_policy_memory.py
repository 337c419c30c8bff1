"""The policy sees memory: the memory queries and their parsing, `policy.predict.kv_cache` against hand-computed
cases, and Goodput decisions where memory, not compute, is the bound."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.observe.prometheus import fleet_queries, query_fleet
from specfleet.policy import MeasuredAcceptance, PoolObservation, PoolState, decide
from specfleet.policy.inputs.fleet_answers import (
    ABOVE_ONE,
    BAD_CACHE_CONFIG,
    FleetAnswers,
    PoolSelector,
    pool_observation,
)
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.predict.kv_cache import recompute_seconds_per_token
from specfleet.policy.predict.throughput import OFF, memory_view
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.cost_profile import MemoryProfile, StepTimeProfile, default_profile
from support.fake_prometheus import FakePrometheus

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
# Who should scrape the pools (named only when Prometheus does not scrape a pool's Ready pods).
SCRAPE = ScrapeSetup("default", "llama", pod_monitor=False, scrape_annotations=True)
LONG_AGO = NOW - timedelta(days=1)
GOODPUT = PolicySpec.model_validate({})

# A profile whose numbers are easy by hand: step time is linear in batch,
# step(b, 0) = 10 + 0.1 (b - 1) ms, step(b, 1) = 12 + 0.14 (b - 1), step(b, 3) = 16 + 0.24 (b - 1).
HAND = StepTimeProfile(
    batch_sizes=(1, 101),
    speculative_tokens=(0, 1, 3),
    step_ms=((10.0, 12.0, 16.0), (20.0, 26.0, 40.0)),
    memory=MemoryProfile(kv_cache_tokens=16000, kv_cache_tokens_with_drafter=4800),
)
ACC = (0.5, 0.25, 0.125)


def mobs(
    *,
    running: float = 4.0,
    waiting: float | None = 16.0,
    prompt: float | None = 1000.0,
    output: float | None = 200.0,
    pool: str = "latency",
    **more: object,
) -> PoolObservation:
    """Two replicas; by default 4 running + 16 / 2 waiting = 12 requests per replica of 1000 + 200 / 2
    = 1100 KV tokens each."""
    return PoolObservation(
        pool=pool,
        at=NOW,
        acceptance_length=2.27,
        per_position=(0.68, 0.39, 0.2),
        acceptance_source="pool",
        running_per_replica=running,
        waiting=waiting,
        replicas_reporting=2,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        generation_tokens_per_second=1000.0,
        **more,  # type: ignore[arg-type]
    )


# ---- memory_view against hand-computed numbers ----------------------------------------------------


def test_each_setting_holds_what_its_blocks_allow():
    # Footprint 1100 tokens: ceil(1100 / 16) = 69 blocks off, ceil(1101 / 16) = ceil(1103 / 16) = 69 at
    # K 1 and 3. Off: 16000 // 16 = 1000 blocks hold 14 requests; on: 4800 // 16 = 300 blocks hold 4.
    v = memory_view(HAND, mobs(), [1, 3], mode="On", current_k=3)
    assert v is not None
    assert v.demand == 12.0
    assert v.footprint_tokens == 1100.0
    assert {n: (s.fits, v.batch(n)) for n, s in v.settings.items()} == {
        "off": (14, 12.0),
        "K1": (4, 4.0),
        "K3": (4, 4.0),
    }
    assert v.bound()  # 12 do not fit with the drafter (4) while they do without (14)
    assert v.current == "K3"


def test_lookahead_slots_cost_a_block_where_they_cross_one():
    # 1004 + 200 / 2 = 1104 tokens fill 69 blocks exactly; K 1 or K 3 lookahead needs a 70th. With
    # 5584 tokens (349 blocks) of cache in both settings: 349 // 69 = 5 requests off, 349 // 70 = 4 on.
    cap = 349 * 16
    ob = mobs(prompt=1004.0, kv_capacity_tokens_off=cap, kv_capacity_tokens_on=cap)
    v = memory_view(HAND, ob, [1, 3], mode="Off", current_k=3)
    assert v is not None
    assert [v.settings[n].fits for n in ("off", "K1", "K3")] == [5, 4, 4]
    assert v.bound()


def test_throughput_is_batch_times_tokens_per_step_over_step_time():
    v = memory_view(HAND, mobs(preemptions_per_second=0.0), [1, 3], mode="On", current_k=3)
    assert v is not None
    # off: 12 requests / step(12, 0) = 11.1 ms -> 1081.08 tokens/s
    assert v.tokens_per_second(OFF, ACC) == pytest.approx(12 / 0.0111)
    # K 1: 4 x 1.5 tokens / step(4, 1) = 12.42 ms -> 483.09; K 3: 4 x 1.875 / 16.72 ms -> 448.56
    assert v.tokens_per_second("K1", ACC) == pytest.approx(6 / 0.01242)
    assert v.tokens_per_second("K3", ACC) == pytest.approx(7.5 / 0.01672)
    assert v.gain("K1", ACC) == pytest.approx((6 / 0.01242) / (12 / 0.0111))
    assert v.gain("K3", ACC) == pytest.approx((7.5 / 0.01672) / (12 / 0.0111))


def test_preemptions_cost_the_recompute_of_prompt_and_half_the_output_where_memory_bounds():
    # 2 preemptions/s over 1000 generated tokens/s: 0.002 per token. A recompute prefills 1100 tokens
    # at the profile's marginal 0.1 ms per token (its K 0 slope): 0.11 s.
    assert recompute_seconds_per_token(HAND) == pytest.approx(1e-4)
    v = memory_view(HAND, mobs(preemptions_per_second=2.0), [1, 3], mode="On", current_k=3)
    assert v is not None
    assert v.preemptions_per_token == pytest.approx(0.002)
    assert v.recompute_seconds == pytest.approx(0.11)
    t = 6 / 0.01242
    assert v.tokens_per_second("K1", ACC) == pytest.approx(t / (1 + 0.002 * 0.11 * t))
    # Off holds the whole demand: it does not preempt, so it is not charged.
    assert v.tokens_per_second(OFF, ACC) == pytest.approx(12 / 0.0111)
    # With a prefill cost in the profile, that is the recompute's price.
    priced = replace(HAND, prefill_ms_per_token=0.05)
    assert recompute_seconds_per_token(priced) == pytest.approx(5e-5)


def test_a_demand_that_fits_is_not_memory_bound():
    v = memory_view(HAND, mobs(running=3.0, waiting=0.0), [1, 3], mode="On", current_k=3)
    assert v is not None
    assert not v.bound()
    assert {v.batch(n) for n in v.settings} == {3.0}


def test_max_num_seqs_bounds_the_batch_before_memory_does():
    v = memory_view(HAND, mobs(), [1, 3], mode="On", current_k=3, max_num_seqs=4)
    assert v is not None
    assert not v.bound()
    assert v.batch(OFF) == 4.0


def test_capacity_measured_per_setting_else_the_profile_else_unknown():
    v = memory_view(HAND, mobs(kv_capacity_tokens_off=20000), [1], mode="On", current_k=1)
    assert v is not None
    assert (v.settings[OFF].kv_cache_tokens, v.settings[OFF].kv_cache_source) == (20000, "measured")
    assert (v.settings["K1"].kv_cache_tokens, v.settings["K1"].kv_cache_source) == (4800, "profile")
    bare = replace(HAND, memory=None)
    assert memory_view(bare, mobs(kv_capacity_tokens_off=20000), [1], mode="On", current_k=1) is None
    both = mobs(kv_capacity_tokens_off=20000, kv_capacity_tokens_on=6000)
    v = memory_view(bare, both, [1], mode="On", current_k=1)
    assert v is not None
    assert v.settings["K1"].kv_cache_tokens == 6000


def test_without_demand_or_request_size_there_is_no_memory_reasoning():
    assert memory_view(HAND, mobs(waiting=None), [1], mode="On", current_k=1) is None
    assert memory_view(HAND, mobs(prompt=None), [1], mode="On", current_k=1) is None
    assert memory_view(HAND, mobs(output=None), [1], mode="On", current_k=1) is None


def test_request_size_from_kv_usage_where_lengths_are_missing():
    # 90% of 4800 tokens over 4 running requests = 1080 tokens each, less K 3 lookahead: 1077.
    v = memory_view(HAND, mobs(prompt=None, kv_usage=0.9), [1, 3], mode="On", current_k=3)
    assert v is not None
    assert v.footprint_tokens == pytest.approx(1077.0)


def test_the_schedule_reserves_its_largest_k_and_drafts_by_batch():
    schedule = ((1, 3, 3), (4, 65536, 1))
    v = memory_view(HAND, mobs(), [1, 3], mode="On", current_k=3, schedule=schedule)
    assert v is not None
    assert v.current == "schedule"
    assert v.settings["schedule"].lookahead == 3
    # At a batch of 4 the schedule drafts K 1: the same throughput as K 1.
    assert v.tokens_per_second("schedule", ACC) == pytest.approx(v.tokens_per_second("K1", ACC))


# ---- decisions ------------------------------------------------------------------------------------

# A 70B-class target on one GPU (issue 27): 12.9k tokens of KV cache without the drafter, 4.3k with it
# (806 and 268 blocks of 16, as vLLM reports them), on the published step-time table.
BIG = replace(
    default_profile(), memory=MemoryProfile(kv_cache_tokens=12896, kv_cache_tokens_with_drafter=4288)
)


def big_obs(running: float, per_replica: float, **more: object) -> PoolObservation:
    """Two replicas of `per_replica` requests each (running + waiting) of ~1k-token prompts."""
    return mobs(running=running, waiting=2 * (per_replica - running), prompt=1000.0, output=200.0, **more)


def st(mode: str = "On", last: datetime = LONG_AGO, k: int | None = None) -> PoolState:
    memory = MeasuredAcceptance(2.27, (0.68, 0.39, 0.2), NOW - timedelta(minutes=1))
    return PoolState(mode=mode, last_transition=last, last_acceptance=memory, k=k)


def one(state: PoolState, ob: PoolObservation, profile: StepTimeProfile = BIG, now: datetime = NOW):
    return decide(GOODPUT, 3, {ob.pool: state}, {ob.pool: ob}, now, profile)[0]


def test_a_memory_bound_70b_pool_turns_off_for_goodput_memory_bound():
    d = one(st("On"), big_obs(2.4, 24.0))
    assert (d.flip, d.target, d.reason) == (True, "Off", r.GOODPUT_MEMORY_BOUND)
    n = d.observations
    assert n["memoryBound"] == "true"
    assert n["demandPerReplica"] == "24"
    assert n["kvCacheTokens"] == "off=12896(profile),on=4288(profile)"
    # 806 blocks // 69 = 11 requests without the drafter, 268 // 69 = 3 with it.
    assert n["memoryBatch"] == "off=11,K1=3,K3=3"
    assert "memoryTokensPerSecond" in n
    assert "memory-bound" in d.message


def test_without_memory_the_same_pool_stays_on():
    # What the policy did before it saw memory (and does without the metrics): 2.4 running per
    # replica is far below break-even, so speculation stays on.
    d = one(st("On"), replace(big_obs(2.4, 24.0), waiting=None))
    assert (d.flip, d.target) == (False, "On")
    assert d.reason != r.GOODPUT_MEMORY_BOUND
    assert "memoryBound" not in d.observations


@pytest.mark.parametrize(
    "strip",
    [
        {"kv_capacity_tokens_off": None, "kv_capacity_tokens_on": None},
        {"mean_prompt_tokens": None, "mean_output_tokens": None},
    ],
)
@pytest.mark.parametrize(
    ("mode", "running", "per_replica"), [("On", 2.4, 24.0), ("Off", 11.0, 24.0), ("On", 3.0, 30.0)]
)
def test_memory_terms_vanish_where_capacity_or_request_size_is_unknown(strip, mode, running, per_replica):
    # One model: without a capacity (no profile section, none measured) or a request size, no batch is
    # bound by memory, and the decision is the one a cache too large to bind gives.
    ob = replace(big_obs(running, per_replica), **strip)
    unknown = one(st(mode), ob, profile=replace(BIG, memory=None))
    vast = replace(BIG, memory=MemoryProfile(kv_cache_tokens=10**9, kv_cache_tokens_with_drafter=10**9))
    unbound = one(st(mode), ob, profile=vast)
    assert unknown.reason != r.GOODPUT_MEMORY_BOUND
    assert (unknown.target, unknown.reason, unknown.message) == (
        unbound.target,
        unbound.reason,
        unbound.message,
    )


def test_without_a_waiting_count_the_running_requests_are_the_demand():
    # 11 running per replica measured off; with the drafter the cache holds 3 of them: the running count
    # alone shows memory bounds the speculating engine.
    d = one(st("Off"), replace(big_obs(11.0, 11.0), waiting=None))
    assert (d.flip, d.target, d.reason) == (False, "Off", r.GOODPUT_MEMORY_BOUND)
    assert d.observations["demandPerReplica"] == "11"


def test_engines_running_more_than_the_model_fits_calibrate_the_request_size():
    # The profile says the drafter's cache holds 3 requests of 1,100 tokens, yet 30 run with it: what is
    # measured wins (the footprint falls to what 30 fit in), and the pool is not memory-bound.
    d = one(st("On"), big_obs(30.0, 30.0))
    assert d.reason != r.GOODPUT_MEMORY_BOUND
    assert d.target == "On"


def test_an_off_pool_stays_off_while_memory_bound_and_turns_on_once_demand_fits_after_the_gates():
    flipped = NOW - timedelta(seconds=GOODPUT.min_dwell_seconds // 2)
    # Memory-bound: the per-request speed at 11 running alone would turn it on.
    d = one(st("Off", last=LONG_AGO), big_obs(11.0, 24.0))
    assert (d.flip, d.target, d.reason) == (False, "Off", r.GOODPUT_MEMORY_BOUND)
    # The demand falls to 3 per replica (fits the 3 the speculating cache holds), served at the 400
    # tokens/s per replica the engines without the drafter yield there (419 at most): back on, once the
    # dwell since the last flip has passed.
    fits = replace(big_obs(3.0, 3.0), generation_tokens_per_second=800.0)
    d = one(st("Off", last=flipped), fits)
    assert (d.flip, d.target, d.reason) == (False, "Off", r.MIN_DWELL)
    assert "GoodputAboveBreakEven" in d.message
    later = flipped + timedelta(seconds=max(GOODPUT.min_dwell_seconds, GOODPUT.cooldown_seconds) + 1)
    d = one(st("Off", last=flipped), replace(fits, at=later), now=later)
    assert (d.flip, d.target, d.reason) == (True, "On", r.GOODPUT_ABOVE_BREAK_EVEN)


def test_the_prediction_has_no_jump_where_memory_starts_to_bound():
    # At 3 requests per replica all fit (per-request speed at 3 running); at 3.01 the speculating
    # cache holds 3 of them (throughput at the batch each holds): the two predictions agree within
    # 1%, so the margins keep their meaning and a pool at the boundary does not flap.
    fits = one(st("On"), big_obs(3.0, 3.0))
    bound = one(st("On"), big_obs(3.0, 3.01))
    assert "memoryBound" not in fits.observations
    assert bound.observations["memoryBound"] == "true"
    a, b = float(fits.observations["bestKSpeedup"]), float(bound.observations["bestKSpeedup"])
    assert b == pytest.approx(a, rel=0.01)
    assert not fits.flip
    assert not bound.flip


def test_a_measured_capacity_beats_the_profile_and_a_missing_one_falls_back_to_it():
    # Measured: the engines with the drafter hold 64k tokens, so 24 requests fit: not memory-bound.
    d = one(st("On"), big_obs(2.4, 24.0, kv_capacity_tokens_on=64000))
    assert (d.flip, d.target) == (False, "On")
    assert "memoryBound" not in d.observations
    # Only the Off setting measured (the pool never ran engines with the drafter... or not now):
    # the On capacity comes from the profile.
    d = one(st("On"), big_obs(2.4, 24.0, kv_capacity_tokens_off=12900))
    assert d.reason == r.GOODPUT_MEMORY_BOUND
    assert d.observations["kvCacheTokens"] == "off=12900(measured),on=4288(profile)"


def test_memory_numbers_reach_the_event():
    from specfleet.api.status import SpeculativeDeploymentStatus
    from specfleet.policy.decision.record import record

    ob = big_obs(2.4, 24.0)
    d = one(st("On"), ob)
    rec = record(SpeculativeDeploymentStatus(), [d], {"latency": ob}, 1, NOW, SCRAPE, window_seconds=60)
    assert any("demandPerReplica=24" in message for _, _, message in rec.events)
    entry = rec.status.history[-1]
    assert entry.reason == r.GOODPUT_MEMORY_BOUND
    assert entry.observations["memoryBatch"] == "off=11,K1=3,K3=3"


# ---- queries and answers --------------------------------------------------------------------------


def test_fleet_queries_ask_for_memory():
    q = fleet_queries(60, ["ns"])
    assert q["kv_usage"].startswith(
        "avg by (namespace, specfleet_io_deployment, specfleet_io_pool) (avg_over_time("
    )
    assert vm.KV_CACHE_USAGE in q["kv_usage"]
    assert "[60s]" in q["kv_usage"]
    assert q["preemptions"].startswith("sum by (")
    assert f"rate({vm.NUM_PREEMPTIONS}" in q["preemptions"]
    assert q["kv_capacity"].startswith(
        "max by (namespace, specfleet_io_deployment, specfleet_io_pool, specfleet_io_speculation, "
        "num_gpu_blocks, block_size) (vllm:cache_config_info{"
    )
    for name, metric in (
        ("prompt_len", vm.REQUEST_PROMPT_TOKENS),
        ("output_len", vm.REQUEST_GENERATION_TOKENS),
    ):
        assert f"rate({metric}_sum{{" in q[name]
        assert f"rate({metric}_count{{" in q[name]


KEY = ("ns", "sd", "latency")
LABELS = dict(zip(("namespace", "specfleet_io_deployment", "specfleet_io_pool"), KEY, strict=True))


def sample(value: float | str, **labels: str) -> dict[str, object]:
    return {"metric": {**LABELS, **labels}, "value": [0, str(value)]}


BASE = {
    "replicas": [sample(2)],
    "sample_age": [sample(5)],
    "running_per_replica": [sample(4)],
    "waiting": [sample(10)],
}


def cache(setting: str, blocks: str, size: str = "16") -> dict[str, object]:
    return sample(1, specfleet_io_speculation=setting, num_gpu_blocks=blocks, block_size=size)


def test_memory_answers_reach_the_observation():
    answers = FleetAnswers.from_results(
        {
            **BASE,
            "kv_usage": [sample(0.85)],
            "preemptions": [sample(0.5)],
            "kv_capacity": [cache("On", "268"), cache("Off", "806"), cache("Off", "800")],
            "prompt_len": [sample(1000)],
            "output_len": [sample(200)],
        }
    )
    o = pool_observation(answers, PoolSelector(*KEY), 60, NOW)
    assert o.problem is None
    assert (o.kv_usage, o.preemptions_per_second) == (0.85, 0.5)
    # Two Off configs: the smaller bounds what the pool holds.
    assert (o.kv_capacity_tokens_on, o.kv_capacity_tokens_off) == (268 * 16, 800 * 16)
    assert (o.mean_prompt_tokens, o.mean_output_tokens) == (1000.0, 200.0)
    assert not answers.rejected


def test_missing_memory_answers_are_none_never_zero():
    o = pool_observation(FleetAnswers.from_results(BASE), PoolSelector(*KEY), 60, NOW)
    assert o.problem is None
    assert (o.kv_usage, o.preemptions_per_second, o.kv_capacity_tokens_on, o.kv_capacity_tokens_off) == (
        None,
        None,
        None,
        None,
    )
    assert (o.mean_prompt_tokens, o.mean_output_tokens) == (None, None)


def test_memory_answers_are_range_checked():
    answers = FleetAnswers.from_results(
        {
            **BASE,
            "kv_usage": [sample(1.7)],
            "preemptions": [sample(-1)],
            "kv_capacity": [
                cache("Maybe", "268"),
                cache("On", "0"),
                cache("Off", "x"),
                cache("On", "10", "-16"),
            ],
            # 0 / 0 (no request finished in the window) is no data, not a rejected sample.
            "prompt_len": [sample("NaN")],
            "output_len": [sample("+Inf")],
        }
    )
    o = pool_observation(answers, PoolSelector(*KEY), 60, NOW)
    assert o.problem is None
    assert (o.kv_usage, o.preemptions_per_second, o.kv_capacity_tokens_on, o.kv_capacity_tokens_off) == (
        None,
        None,
        None,
        None,
    )
    assert (o.mean_prompt_tokens, o.mean_output_tokens) == (None, None)
    assert answers.rejected == {
        ("kv_usage", ABOVE_ONE): 1,
        ("preemptions", "negative"): 1,
        ("kv_capacity", BAD_CACHE_CONFIG): 4,
        ("output_len", "not_finite"): 1,
    }
    assert "kv_capacity sample rejected" in answers.why_missing("kv_capacity", KEY)


def test_a_round_through_prometheus_carries_capacities():
    prom = FakePrometheus("ns", "sd", 60)
    prom.set_pool("latency", kv_capacity={"On": (268, 16), "Off": (806, 16)}, kv_usage=0.5, prompt_len=900.0)
    o = pool_observation(query_fleet(prom, 60, ["ns"]), PoolSelector("ns", "sd", "latency"), 60, NOW)
    assert (o.kv_capacity_tokens_on, o.kv_capacity_tokens_off, o.kv_usage) == (4288, 12896, 0.5)
    assert o.mean_prompt_tokens == 900.0
    assert o.mean_output_tokens is None
    assert math.isclose(o.waiting or 0, 0.0)


def test_a_memory_bound_pool_lowers_k_where_fewer_lookahead_slots_hold_more_requests():
    # Requests of 1002 + 200 / 2 = 1102 tokens: 1103 at K 1 fill 69 blocks, 1105 at K 3 need 70. With
    # 276 blocks (4416 tokens) with the drafter: 4 requests at K 1, 3 at K 3; 281 blocks without: 4.
    ob = mobs(
        running=3.0,
        waiting=42.0,
        prompt=1002.0,
        output=200.0,
        kv_capacity_tokens_on=276 * 16,
        kv_capacity_tokens_off=281 * 16,
    )
    d = one(st("On"), ob)
    assert d.observations["memoryBatch"] == "off=4,K1=4,K3=3"
    assert (d.flip, d.reason, d.current_k, d.target_k) == (False, r.GOODPUT_RETUNE, 3, 1)


def test_measured_capacities_are_shown_whole():
    text = mobs(kv_capacity_tokens_off=12896, kv_capacity_tokens_on=4288, kv_usage=0.5).as_text()
    assert (text["kvCacheTokensOff"], text["kvCacheTokensOn"], text["kvCacheUsage"]) == (
        "12896",
        "4288",
        "0.5",
    )
    assert "kvCacheTokensOff" not in mobs().as_text()
