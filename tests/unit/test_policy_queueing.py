"""Whether a setting can serve what arrives (`policy.predict.queueing`): a speculating setting whose most
tokens per second is below the arrivals (served + the queue's growth) is never kept nor turned to where
the engine without the drafter serves more; below its capacity, the closed-loop prediction decides."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy import PoolObservation, PoolState, decide
from specfleet.policy.predict.queueing import (
    Arrivals,
    arrivals,
    batching_in_system,
    in_system,
    overloaded,
    waiting,
)
from specfleet.policy.predict.throughput import OFF, pool_model
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, MemoryProfile, default_profile

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
ACC = PUBLISHED_ACCEPTANCE
# A 70B-class target on one GPU: the drafter's cache holds 3 requests of 1k-token prompts, off's 11.
BIG = replace(
    default_profile(), memory=MemoryProfile(kv_cache_tokens=12900, kv_cache_tokens_with_drafter=4300)
)
POLICY = PolicySpec.model_validate({})


def obs(running: float, generated: float, waiting: float = 0.0) -> PoolObservation:
    return PoolObservation(
        pool="latency",
        at=NOW,
        acceptance_length=1 + sum(ACC[:3]),
        per_position=tuple(ACC[:3]),
        acceptance_source="pool",
        running_per_replica=running,
        waiting=waiting,
        replicas_reporting=3,
        mean_prompt_tokens=1000.0,
        mean_output_tokens=200.0,
        generation_tokens_per_second=generated,
    )


MODEL = pool_model(BIG, obs(2.0, 300.0), [1, 2, 3], mode="On", current_k=3)


def test_capacity_is_the_throughput_at_the_largest_batch_each_setting_runs():
    assert (MODEL.settings[OFF].fits, MODEL.settings["K3"].fits) == (11.0, 3.0)
    assert MODEL.capacity("K3", ACC) == MODEL.tokens_per_second("K3", ACC, 3.0)
    assert MODEL.capacity(OFF, ACC) == MODEL.tokens_per_second(OFF, ACC, 11.0)
    assert MODEL.capacity(OFF, ACC) > MODEL.capacity("K3", ACC)


def test_arrivals_are_what_is_served_plus_a_growing_queue_never_minus_a_draining_one():
    queue = obs(3.0, 300.0, waiting=6.0)
    assert arrivals(queue, 0.05) == Arrivals(100.0, 0.05 * 200.0)
    assert arrivals(queue, -0.5) == Arrivals(100.0, 0.0)
    # Without a queue the demand's growth is more requests running, served: not counted.
    assert arrivals(obs(2.0, 300.0), 0.05) == Arrivals(100.0, 0.0)
    assert arrivals(replace(obs(2.0, 300.0), generation_tokens_per_second=None), 0.1) is None


def test_a_setting_below_the_arrivals_is_overloaded_where_off_serves_more():
    cap = MODEL.capacity("K3", ACC)
    assert overloaded(MODEL, "K3", ACC, Arrivals(cap * 0.8, 0.0), 0.05) is None
    why = overloaded(MODEL, "K3", ACC, Arrivals(cap * 0.9, cap * 0.2), 0.05)
    assert why is not None
    assert "queue would grow" in why
    # Up to its capacity it serves the arrivals; off must serve more by the margin to relieve it.
    assert overloaded(MODEL, "K3", ACC, Arrivals(cap * 0.99, 0.0), 0.05) is None
    off = MODEL.capacity(OFF, ACC)
    assert overloaded(MODEL, "K3", ACC, Arrivals(cap * 1.1, 0.0), off / cap - 1) is None
    assert overloaded(MODEL, OFF, ACC, Arrivals(1e9, 0.0), 0.05) is None


def _decide(mode: str, ob: PoolObservation, recent: tuple[tuple[datetime, float], ...] = ()):
    state = PoolState(mode=mode, last_transition=NOW - timedelta(days=1), recent_load=recent, k=3)
    return decide(POLICY, 3, {"latency": state}, {"latency": ob}, NOW, BIG)[0]


def test_a_speculating_pool_that_cannot_serve_the_arrivals_turns_off():
    cap = MODEL.capacity("K3", ACC)
    # 2.5 running per replica: at that demand the drafter is still faster per request (closed loop) ...
    calm = _decide("On", obs(2.5, 3 * cap * 0.5))
    assert calm.target == "On"
    # ... but the engines already serve all they can and the queue grows: the arrivals do not fit.
    # (A queue of one request per replica growing slowly: the demand's projection stays within noise.)
    rising = tuple((NOW - timedelta(seconds=s), 4.0 - s / 240) for s in range(120, 0, -15))
    d = _decide("On", obs(3.0, 3 * cap, waiting=3.0), rising)
    assert (d.target, d.reason) == ("Off", r.GOODPUT_OVERLOADED)
    assert "arrivingTokensPerSecond" in d.observations
    # The same throughput with no queue (a large batch yielding little more than a medium one): the
    # closed-loop prediction decides.
    assert _decide("On", obs(3.0, 3 * cap), rising).target == "On"


def test_an_off_pool_does_not_turn_on_into_a_load_the_drafter_cannot_serve():
    cap = MODEL.capacity("K3", ACC)
    # Off serves 1.5x what the drafter could at 2 running per replica: it stays off, saying why.
    d = _decide("Off", obs(2.0, 3 * cap * 1.5))
    assert (d.target, d.reason) == ("Off", r.GOODPUT_OVERLOADED)
    assert d.message.startswith("stays off")
    # Serving half of it, the same pool turns on.
    assert _decide("Off", obs(2.0, 3 * cap * 0.5)).target == "On"


def test_requests_for_is_the_batch_that_serves_a_rate_and_none_beyond_capacity():
    rate = MODEL.tokens_per_second("K3", ACC, 2.0)
    assert math.isclose(MODEL.requests_for("K3", ACC, rate), 2.0, rel_tol=1e-6)
    assert MODEL.requests_for("K3", ACC, 0.0) == 0.0
    assert MODEL.requests_for("K3", ACC, MODEL.capacity("K3", ACC) * 1.01) == math.inf
    # Off runs up to 11 here: the rate K3 cannot serve, it can.
    assert MODEL.requests_for(OFF, ACC, MODEL.capacity("K3", ACC) * 1.01) < 11


def test_waiting_is_erlang_c():
    # M/M/1: utilisation^2 / (1 - utilisation); M/M/2 at 0.5: 1/3 (textbook values).
    assert math.isclose(waiting(1, 0.5), 0.5)
    assert math.isclose(waiting(2, 0.5), 1 / 3)
    assert waiting(4, 1.0) == math.inf
    assert waiting(4, 0.0) == 0.0
    # More slots at the same utilisation: less waiting; more utilisation: more.
    assert waiting(14, 0.85) < waiting(3, 0.85) < waiting(3, 0.95)


# Memory binds at a larger batch (an 8B-class step on a 70B-class cache over two GPUs): the drafter's
# cache holds 14 requests of 1k-token prompts, off's 29.
TWO = replace(
    default_profile(), memory=MemoryProfile(kv_cache_tokens=25800, kv_cache_tokens_with_drafter=12500)
)


def test_a_queue_a_speculating_pool_serves_with_fewer_requests_is_not_a_reason_to_turn_off():
    model = pool_model(TWO, obs(14.0, 300.0), [1, 2, 3], mode="On", current_k=3)
    assert (model.settings[OFF].fits, model.settings["K3"].fits) == (29.0, 14.0)
    rate = 0.85 * model.capacity("K3", ACC)
    assert in_system(model, "K3", ACC, rate) < in_system(model, OFF, ACC, rate) / 1.05

    def decided(ob: PoolObservation):
        state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), recent_load=(), k=3)
        return decide(POLICY, 3, {"latency": state}, {"latency": ob}, NOW, TWO)[0]

    # 14 running and 20 waiting per replica: at a demand of 34 off would run 29 at once and win (a
    # closed loop); the rate arriving is 0.85 of what the drafter serves, with fewer in the engines.
    queued = obs(14.0, 3 * rate, waiting=60.0)
    d = decided(queued)
    assert (d.target, d.reason) == ("On", r.GOODPUT_WITHIN_MARGIN)
    assert d.message.startswith("stays on"), d.message
    # Without the rate measured the closed-loop prediction alone decides: off, memory-bound.
    unknown = decided(replace(queued, generation_tokens_per_second=None))
    assert (unknown.target, unknown.reason) == ("Off", r.GOODPUT_MEMORY_BOUND)
    # At the drafter's capacity the queue is its own: off.
    assert decided(obs(14.0, 3 * model.capacity("K3", ACC), waiting=60.0)).target == "Off"


def test_a_rising_demand_turns_a_pool_off_before_its_engines_overflow():
    cap = MODEL.capacity("K3", ACC)
    # 1.5 requests per replica (the drafter's cache holds 3) rising by 1.5 a window, no queue yet:
    # on the trend, more than the drafter runs arrive before a rollout to off could finish.
    rising = tuple((NOW - timedelta(seconds=s), 1.5 - s / 80) for s in range(120, 0, -15))
    serving = obs(1.5, 3 * cap * 0.6)
    d = _decide("On", serving, rising)
    # The drafter's KV cache is the limit (3 < maxNumSeqs): said as memory-bound, with its numbers.
    assert (d.target, d.reason) == ("Off", r.GOODPUT_MEMORY_BOUND)
    assert d.message.startswith("memory-bound ahead"), d.message
    assert "by the time a rollout" in d.message, d.message
    assert d.observations["memoryBound"] == "true"
    # Level, the same load stays on: the drafter serves it, fewer requests at a time.
    level = tuple((NOW - timedelta(seconds=s), 1.5) for s in range(120, 0, -15))
    assert _decide("On", serving, level).target == "On"
    # Rising where the engine without the drafter could not serve more (8 requests at most, a cache
    # that holds them either way): nothing to gain by leaving, the pool stays on.
    roomy = replace(
        default_profile(), memory=MemoryProfile(kv_cache_tokens=400000, kv_cache_tokens_with_drafter=390000)
    )
    small = pool_model(roomy, serving, [1, 2, 3], mode="On", current_k=3, max_num_seqs=8)
    assert small.capacity(OFF, ACC) < small.capacity("K3", ACC)
    state = PoolState(
        mode="On", last_transition=NOW - timedelta(days=1), recent_load=rising, k=3, max_num_seqs=8
    )
    fast = obs(1.5, 3 * small.capacity("K3", ACC) * 0.6)
    assert decide(POLICY, 3, {"latency": state}, {"latency": fast}, NOW, roomy)[0].target == "On"


def _served(values: list[float]) -> tuple[tuple[datetime, float], ...]:
    """Served tokens per second per replica at the evaluations before NOW, 15 s apart, oldest first."""
    return tuple((NOW - timedelta(seconds=15 * (len(values) - i)), v) for i, v in enumerate(values))


def test_the_served_tokens_rising_toward_the_drafters_capacity_turn_a_pool_off_before_it_queues():
    cap = MODEL.capacity("K3", ACC)
    # 1.5 requests per replica, level (the drafter's cache holds 3): the demand shows nothing yet.
    level = tuple((NOW - timedelta(seconds=s), 1.5) for s in range(120, 0, -15))
    now_served = 0.55 * cap

    def decided(served: tuple[tuple[datetime, float], ...], flip: str = "Restart"):
        state = PoolState(
            mode="On",
            last_transition=NOW - timedelta(days=1),
            recent_load=level,
            recent_tokens_per_second=served,
            k=3,
            flip=flip,
        )
        return decide(POLICY, 3, {"latency": state}, {"latency": obs(1.5, 3 * now_served)}, NOW, BIG)[0]

    # The tokens served rose from 0.25 to 0.55 of the drafter's capacity over the last window: by the
    # time a flip decided at the next evaluation would serve, the arrivals would near the capacity,
    # where the drafter's engines hold more requests (a queue) than the engines without it.
    rising = _served([cap * (0.25 + 0.3 * i / 8) for i in range(8)])
    d = decided(rising)
    assert (d.target, d.reason) == ("Off", r.GOODPUT_MEMORY_BOUND), d.message
    assert "served tokens' trend" in d.message, d.message
    assert float(d.observations["projectedTokensPerSecond"]) > now_served
    # Level at the same rate, the drafter serves it with fewer requests in its engines: it stays on.
    assert decided(_served([now_served] * 8)).target == "On"
    # A Standby pool flips at once: overloaded, the engines serve at their capacity, so the flip's
    # dip (one replica out for seconds) is priced against the capacities' ratio, not the closed-loop
    # gain at today's demand.
    standby = decided(rising, flip="Standby")
    assert (standby.target, standby.reason) == ("Off", r.GOODPUT_MEMORY_BOUND), standby.message


def test_an_off_pool_does_not_turn_on_where_the_drafter_would_hold_more_requests_than_it_does():
    cap = MODEL.capacity("K3", ACC)
    # 0.9 of what the drafter's engines serve at the 3 requests they hold: below their capacity (the
    # saturation guard lets it pass), but random arrivals queue at that utilisation, more than at the
    # engine without the drafter's (11 slots, well below its capacity).
    near = obs(1.5, 3 * cap * 0.9)
    assert in_system(MODEL, "K3", ACC, cap * 0.9) > in_system(MODEL, OFF, ACC, cap * 0.9)
    d = _decide("Off", near)
    assert (d.target, d.reason) == ("Off", r.GOODPUT_MEMORY_BOUND), d.message
    assert d.message.startswith("stays off"), d.message
    # At a third of the capacity the drafter serves the arrivals with fewer requests: it turns on.
    assert in_system(MODEL, "K3", ACC, cap / 3) < in_system(MODEL, OFF, ACC, cap / 3)
    assert _decide("Off", obs(1.5, cap)).target == "On"
    # Falling, the arrivals are taken where they will be when the flip serves: a windowed rate trails.
    falling = tuple((NOW - timedelta(seconds=15 * (8 - i)), cap * (1.6 - 0.1 * i)) for i in range(8))
    state = PoolState(
        mode="Off",
        last_transition=NOW - timedelta(days=1),
        recent_load=tuple((t, 1.5) for t, _ in falling),
        recent_tokens_per_second=falling,
        k=3,
    )
    assert decide(POLICY, 3, {"latency": state}, {"latency": near}, NOW, BIG)[0].target == "On"


# Long prompts on an 8B engine: the KV cache holds 18 requests of 24k tokens, 17 with the drafter.
LONG = replace(
    default_profile(),
    memory=MemoryProfile(kv_cache_tokens=18 * 24200, kv_cache_tokens_with_drafter=17 * 24200),
)
WEAK = (0.3, 0.1, 0.03)


def long_obs(running: float, generated: float, waiting: float, per_position=WEAK) -> PoolObservation:
    return replace(
        obs(running, generated, waiting),
        per_position=per_position,
        acceptance_length=1 + sum(per_position),
        mean_prompt_tokens=24000.0,
    )


def test_the_batching_chain_is_an_m_m_1_queue_where_the_pace_does_not_depend_on_the_batch():
    # A setting that serves at its capacity from one request on: requests in an M/M/1 queue,
    # utilisation / (1 - utilisation).
    model = pool_model(LONG, long_obs(10.0, 600.0, 0.0), [1], mode="On", current_k=1)
    flat = replace(model, max_num_seqs=1)
    cap = flat.capacity(OFF, WEAK)
    for u in (0.2, 0.5, 0.9):
        assert math.isclose(batching_in_system(flat, OFF, WEAK, u * cap), u / (1 - u), rel_tol=1e-6)
    assert batching_in_system(flat, OFF, WEAK, cap) == math.inf
    assert batching_in_system(flat, OFF, WEAK, 0.0) == 0.0


def test_near_capacity_random_arrivals_wait_longer_for_a_weak_drafter_than_its_throughput_says():
    model = pool_model(LONG, long_obs(10.0, 600.0, 0.0), [1], mode="On", current_k=1)
    assert (model.settings[OFF].fits, model.settings["K1"].fits) == (18.0, 17.0)
    cap = model.capacity(OFF, WEAK)
    # At a dozen running (a closed loop) the weak drafter loses ~2%: inside the 5% margin ...
    closed = model.tokens_per_second("K1", WEAK, 12.0) / model.tokens_per_second(OFF, WEAK, 12.0)
    assert 0.95 < closed < 1.0
    # ... but requests that arrive at random at 0.85 of the capacity spend 10% longer in its engines.
    rate = 0.85 * cap
    assert batching_in_system(model, "K1", WEAK, rate) > 1.05 * batching_in_system(model, OFF, WEAK, rate)
    # At a light load it is the faster one (its small batches are where it gains).
    assert batching_in_system(model, "K1", WEAK, 0.15 * cap) < batching_in_system(
        model, OFF, WEAK, 0.15 * cap
    )


def test_a_queueing_weak_drafter_turns_off_where_random_arrivals_would_wait_longer_with_it():
    model = pool_model(LONG, long_obs(10.0, 600.0, 0.0), [1], mode="On", current_k=1)
    cap = model.capacity("K1", WEAK)

    def decided(ob: PoolObservation, k: int = 1):
        state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), recent_load=(), k=k)
        return decide(POLICY, k, {"latency": state}, {"latency": ob}, NOW, LONG)[0]

    # The engines queue (1.2 waiting per replica) at 0.85 of the drafter's capacity: off.
    d = decided(long_obs(12.0, 3 * 0.85 * cap, 3.6))
    assert (d.target, d.reason) == ("Off", r.GOODPUT_MEMORY_BOUND), d.message
    assert "arrive and the engines queue" in d.message, d.message
    # No queue: no sign the arrivals are random (a closed loop holds its demand); throughput decides.
    assert decided(long_obs(12.0, 3 * 0.85 * cap, 0.0)).target == "On"
    # Light load with a queue (a crowd waiting for prefill): the drafter is faster there; stays on.
    assert decided(long_obs(12.0, 3 * 0.3 * cap, 3.6)).target == "On"
    # Within the margin of its capacity the capacities decide (the overload guard, with its margin):
    # the arrivals measured there cannot tell two settings a percent apart.
    assert decided(long_obs(12.0, 3 * 0.99 * cap, 3.6)).reason != r.GOODPUT_MEMORY_BOUND
    # A drafter that gains (published acceptance): the same queue keeps it on.
    published = tuple(ACC[:3])
    assert decided(long_obs(12.0, 3 * 0.85 * cap, 3.6, published), k=3).target == "On"


def test_a_drafter_that_takes_no_request_from_the_batch_is_not_turned_off_by_the_queueing_chain():
    # Longer prompts: the drafter's share of the KV cache no longer costs a request (17 fit either
    # way), so near capacity the chain would compare two capacities about a percent apart (the
    # drafter's prefill share), a difference the arrivals measured cannot tell; the published drafter
    # there serves the busy stretch faster than the engine without it (long-context-8b, seed 1).
    even = replace(
        default_profile(),
        memory=MemoryProfile(
            kv_cache_tokens=int(17.9 * 24200), kv_cache_tokens_with_drafter=int(17.3 * 24200)
        ),
    )
    published = tuple(ACC[:3])
    model = pool_model(even, long_obs(12.0, 600.0, 3.6, published), [3], mode="On", current_k=3)
    assert model.settings[OFF].fits == model.settings["K3"].fits == 17.0
    cap = model.capacity("K3", published)
    state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), recent_load=(), k=3)
    for share in (0.85, 0.95):
        ob = long_obs(12.0, 3 * share * cap, 3.6, published)
        d = decide(POLICY, 3, {"latency": state}, {"latency": ob}, NOW, even)[0]
        assert "arrive and the engines queue" not in d.message, (share, d.message)


def test_served_tokens_rising_toward_where_random_arrivals_wait_longer_turn_a_weak_drafter_off_before_a_queue():
    # No queue yet (a flip decided at the first queue serves a rollout later, into the queue built
    # meanwhile), but what is served rises: the chain is asked at the arrivals projected to when a
    # flip would serve, as the overload guard projects them.
    model = pool_model(LONG, long_obs(6.0, 600.0, 0.0), [1], mode="On", current_k=1)
    cap = model.capacity("K1", WEAK)

    def decided(served: tuple[tuple[datetime, float], ...]):
        state = PoolState(
            mode="On",
            last_transition=NOW - timedelta(days=1),
            recent_load=(),
            recent_tokens_per_second=served,
            k=1,
        )
        ob = long_obs(6.0, 3 * served[-1][1], 0.0)
        return decide(POLICY, 1, {"latency": state}, {"latency": ob}, NOW, LONG)[0]

    # From 0.45 to 0.6 of the capacity over the last 105 s: about 0.85 by when a flip would serve.
    rising = _served([cap * (0.45 + 0.15 * i / 7) for i in range(8)])
    d = decided(rising)
    assert (d.target, d.reason) == ("Off", r.GOODPUT_MEMORY_BOUND), d.message
    assert "arrive" in d.message, d.message
    # Level at the same rate (0.6 of the capacity, no queue): nothing says the arrivals are random.
    assert decided(_served([rising[-1][1]] * 8)).target == "On"
    # Rising at a light load: the drafter serves small batches faster; it stays on.
    assert decided(_served([cap * (0.05 + 0.1 * i / 7) for i in range(8)])).target == "On"
