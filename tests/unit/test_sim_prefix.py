"""The simulated engines' prefix cache (hand-computed cases), the shared-prefix workload, and the hit
rate the simulated Prometheus answers and the policy reads back."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.sim import prom, traffic
from specfleet.sim.engine import EngineConfig, Replica, SimRequest
from specfleet.sim.fleet import SimOptions, simulate
from specfleet.sim.options import LEAST_OUTSTANDING, PREFIX_AFFINITY
from specfleet.sim.prefix_cache import PrefixCache
from specfleet.sim.workload import (
    Trace,
    TraceRequest,
    WorkloadError,
    parse_trace,
    shared_prefix_conversations,
)
from specfleet_runtime.cost_profile import default_profile
from specfleet_runtime.router.affinity import Ring, prefix_key

PROFILE = default_profile()
NEVER = (0.0, 0.0, 0.0)
PREFILL_S = 0.001  # per prompt token: large enough to see in a first token's time
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "02-two-pools-routing-policy.yaml"


def replica(kv_tokens: int = 400_000, caching: bool = True) -> Replica:
    config = EngineConfig(
        speculative=False, k=0, kv_capacity_tokens=kv_tokens, block_size=16, enable_prefix_caching=caching
    )
    return Replica(0, "latency", "stable", "t", config, PROFILE, PREFILL_S, 1, 0.0, 0.0)


def request(
    index: int, prompt: int, prefix: tuple[tuple[str, int], ...], tokens: int = 1, at: float = 0.0
) -> SimRequest:
    return SimRequest(index, at, prompt, tokens, NEVER, "latency", None, prefix)


def serve(rep: Replica, req: SimRequest) -> SimRequest:
    """Run `req` alone on `rep` from its arrival to its end."""
    rep.advance_to(req.arrival, [])
    rep.submit(req, req.arrival)
    done: list[SimRequest] = []
    rep.advance_to(req.arrival + 100.0, done)
    assert done == [req]
    return req


def test_a_cached_prefix_skips_its_prefill_and_is_counted_as_vllm_counts_it() -> None:
    rep = replica()
    first = serve(rep, request(0, 1000, (("system", 800),)))
    assert first.first_token == pytest.approx(PROFILE.step_time_s(1, 0) + PREFILL_S * 1000)
    # The second prompt's 800 shared tokens (50 blocks of 16) are cached: 200 are prefilled.
    second = serve(rep, request(1, 1000, (("system", 800),), at=100.0))
    assert second.hit == 800
    assert second.first_token - 100.0 == pytest.approx(PROFILE.step_time_s(1, 0) + PREFILL_S * 200)
    assert (rep.prefix_queries, rep.prefix_hits) == (2000.0, 800.0)


def test_the_lookup_takes_the_longest_run_of_leading_segments_up_to_the_last_prompt_token() -> None:
    rep = replica()
    # A conversation's first turn caches the system prompt (800 tokens) and its own 800 (50 blocks each).
    serve(rep, request(0, 1600, (("system", 800), ("conv", 1600))))
    # Its next turn extends the conversation: the 100 cached blocks hit, the rest is new.
    assert serve(rep, request(1, 2400, (("system", 800), ("conv", 2400)), at=100.0)).hit == 1600
    # Another system prompt: the chain breaks at its first segment, nothing after it is looked up.
    assert serve(rep, request(2, 2400, (("other", 800), ("conv", 2400)), at=200.0)).hit == 0
    # A prompt of exactly the cached blocks: its last token is computed (vLLM looks up n - 1 tokens).
    assert serve(rep, request(3, 1600, (("system", 800), ("conv", 1600)), at=300.0)).hit == 1584
    # No prefix: looked up (counted), never a hit.
    assert serve(rep, request(4, 500, (), at=400.0)).hit == 0
    assert rep.prefix_queries == 1600 + 2400 + 2400 + 1600 + 500
    assert rep.prefix_hits == 1600 + 1584


def test_cached_blocks_nobody_holds_are_evicted_least_recently_used_first_when_kv_runs_short() -> None:
    rep = replica(kv_tokens=1600)  # 100 blocks
    serve(rep, request(0, 800, (("a", 800),)))
    serve(rep, request(1, 800, (("b", 800),), at=100.0))
    assert dict(rep.prefix_cache.blocks) == {"a": 50, "b": 50}  # both fit in the 100 free blocks
    # "c" runs (50 blocks and its output): the free blocks no longer hold a and b, a goes first.
    serve(rep, request(2, 800, (("c", 800),), tokens=20, at=200.0))
    assert list(rep.prefix_cache.blocks) == ["b", "c"]
    assert rep.prefix_cache.blocks["b"] < 50
    assert rep.prefix_cache.blocks["c"] == 50
    assert rep.prefix_cache.cached <= rep.kv_blocks
    assert rep.prefix_cache.held == 0  # nothing runs: every cached block is free
    # "a" was evicted: its next request misses and is prefilled in full.
    assert serve(rep, request(3, 800, (("a", 800),), at=300.0)).hit == 0


def test_blocks_a_running_request_holds_stay_cached_and_serve_others() -> None:
    rep = replica(kv_tokens=2000)  # 125 blocks
    serve(rep, request(0, 800, (("b", 800),)))
    rep.submit(request(1, 800, (("a", 800),), tokens=500, at=100.0), 100.0)
    rep.advance_to(101.0, [])
    assert rep.prefix_cache.held == 50
    # With no block free (as before a preemption), only what no running request holds goes.
    rep.prefix_cache.evict(0.0)
    assert dict(rep.prefix_cache.blocks) == {"a": 50}
    # A request of the same prefix that fits beside it finds all 50 blocks (within its 900 - 1).
    rep.submit(request(2, 900, (("a", 800),), at=101.0), 101.0)
    rep.advance_to(102.0, [])
    assert rep.prefix_hits == 800


def test_running_requests_hold_their_shared_prefix_blocks_once() -> None:
    # 400 blocks: a 4096-token system prompt (256 blocks) once and 8 conversations of 96 prompt tokens
    # (6 blocks) and 32 output (2) fit; two whole prompts and outputs (264 blocks each) do not.
    rep = replica(kv_tokens=6400)
    reqs = [request(i, 4096 + 96, (("system", 4096), (f"conv{i}", 4192)), tokens=32) for i in range(8)]
    for req in reqs:
        rep.submit(req, 0.0)
    rep.advance_to(1e-9, [])  # the first step: every request joins it
    assert rep.running == 8
    assert rep.prefix_cache.held == 256 + 8 * 6
    # Each holds its first token, in a block on average half empty ((16 - 1) / 32).
    assert rep.kv_usage == pytest.approx((256 + 8 * 6 + 8 * (1 / 16 + 15 / 32)) / 400)
    done: list[SimRequest] = []
    rep.advance_to(100.0, done)
    assert len(done) == 8
    assert rep.preemptions == 0
    assert {r.first_token for r in reqs} == {reqs[0].first_token}
    assert (rep.prefix_cache.held, rep.kv_tokens) == (0, pytest.approx(0.0))


def test_shared_blocks_are_freed_when_their_last_holder_stops() -> None:
    rep = replica()
    short = request(0, 1000, (("system", 800),), tokens=5)
    long = request(1, 1000, (("system", 800),), tokens=500)
    rep.submit(short, 0.0)
    rep.submit(long, 0.0)
    done: list[SimRequest] = []
    rep.advance_to(2.0, done)  # a prefill of 1.2 s, then 5 vs 500 steps of 6.5 ms
    assert done == [short]
    # The long request still holds the 50 shared blocks: nothing to evict.
    assert (rep.prefix_cache.held, rep.prefix_cache.free_blocks_cached) == (50, 0)
    rep.prefix_cache.evict(0.0)
    assert dict(rep.prefix_cache.blocks) == {"system": 50}
    rep.advance_to(100.0, done)
    assert done == [short, long]
    assert (rep.prefix_cache.held, rep.prefix_cache.free_blocks_cached) == (0, 50)
    assert rep.kv_tokens == pytest.approx(0.0)
    rep.prefix_cache.evict(0.0)
    assert not rep.prefix_cache.blocks


def test_a_longer_turn_holds_only_the_blocks_it_adds_to_a_held_segment() -> None:
    cache = PrefixCache(16)
    first = cache.take((("t", 800), ("t/c", 1600)), 1600)  # 50 + 50 blocks
    assert cache.to_hold((("t", 800), ("t/c", 2400)), 2400) == (150, 50)
    later = cache.take((("t", 800), ("t/c", 2400)), 2400)
    assert (cache.cached, cache.held) == (150, 150)
    # The longer turn stops first: the first still holds its 100, the segment's tail is free.
    cache.release(later)
    assert (cache.cached, cache.held) == (150, 100)
    cache.evict(0.0)
    assert dict(cache.blocks) == {"t": 50, "t/c": 50}
    cache.release(first)
    assert (cache.cached, cache.held, cache.holders) == (100, 0, {})


def test_the_kv_count_stays_the_running_requests_own_tokens_plus_their_prefix_blocks_once() -> None:
    """A shared-prefix workload on one engine short of KV, with preemptions: after every span, the
    engine's count is what the running requests hold, recomputed from scratch."""
    rep = replica(kv_tokens=24_000)
    trace = shared_prefix_conversations(tenants=3, conversations=40, duration=120.0, seed=5)
    reqs = [
        request(i, r.prompt_tokens, r.prefix, r.output_tokens, r.arrival)
        for i, r in enumerate(trace.requests)
    ]
    done: list[SimRequest] = []
    for req in reqs:
        rep.advance_to(req.arrival, done)
        rep.submit(req, req.arrival)
        own = 0.0
        most: dict[str, int] = {}
        for r in rep._order.values():
            g = rep.groups[r.acceptance]
            own += r.prompt + r.generated + g.level - r.entry_level - r.shared
            for key, blocks in r.pinned:
                most[key] = max(most.get(key, 0), blocks)
            assert r.shared == 16 * sum(blocks for _, blocks in r.pinned)
        assert rep.kv_tokens == pytest.approx(own, abs=1e-6)
        assert rep.prefix_cache.held == sum(most.values())
    rep.advance_to(1e6, done)
    assert len(done) == len(reqs)
    assert rep.preemptions > 0
    assert (rep.prefix_cache.held, rep.prefix_cache.holders) == (0, {})
    assert rep.kv_tokens == pytest.approx(0.0, abs=1e-6)


def test_without_prefix_caching_nothing_is_cached_or_counted() -> None:
    rep = replica(caching=False)
    serve(rep, request(0, 1000, (("system", 800),)))
    req = serve(rep, request(1, 1000, (("system", 800),), at=100.0))
    assert req.hit == 0
    assert not rep.prefix_cache.blocks
    assert (rep.prefix_queries, rep.prefix_hits) == (0.0, 0.0)


# ---- the workload --------------------------------------------------------------------------------


def test_shared_prefix_conversations_follow_their_rule() -> None:
    trace = shared_prefix_conversations(tenants=5, conversations=40, duration=600.0, seed=3)
    assert trace == shared_prefix_conversations(tenants=5, conversations=40, duration=600.0, seed=3)
    assert trace != shared_prefix_conversations(tenants=5, conversations=40, duration=600.0, seed=4)
    arrivals = [r.arrival for r in trace.requests]
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] < 600.0
    systems: dict[str, int] = {}
    turns: dict[str, list[TraceRequest]] = {}
    for r in trace.requests:
        (tenant, system), (conv, end) = r.prefix
        assert systems.setdefault(tenant, system) == system  # one system prompt per tenant
        assert 1024 <= system <= 4096
        assert end == r.prompt_tokens
        turns.setdefault(conv, []).append(r)
    assert len(systems) <= 5
    assert len(turns) <= 40
    for conv in turns.values():
        # Each turn's prompt starts with the last one's prompt and answer, and a new message.
        for before, after in itertools.pairwise(conv):
            assert after.prompt_tokens >= before.prompt_tokens + before.output_tokens + 32
            assert after.arrival > before.arrival


def test_a_trace_carries_prefixes_in_its_prefix_column() -> None:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens,prefix\n", "0,3000,10,t1:2000;t1/c7:3000\n", "1,50,5,\n"]
    trace = parse_trace(rows)
    assert trace.requests[0].prefix == (("t1", 2000), ("t1/c7", 3000))
    assert trace.requests[1].prefix == ()
    for bad in ("t1", "t1:", "t1:0", "t1:2000;t1/c7:1000"):
        with pytest.raises(WorkloadError, match="row 2"):
            parse_trace(["TIMESTAMP,ContextTokens,GeneratedTokens,prefix\n", f"0,3000,10,{bad}\n"])


# ---- the fleet: Prometheus' answer, read back by the policy ---------------------------------------


def test_shared_prefixes_produce_a_hit_rate_the_policy_reads_back() -> None:
    sd = parse_resource(yaml.safe_load(EXAMPLE.read_text()))
    trace = shared_prefix_conversations(tenants=8, conversations=120, duration=600.0)
    result = simulate(sd, trace, options=SimOptions(startup_seconds=60))
    assert result.completed == len(trace.requests)
    rates = [row["latency"].get("prefixCacheHitRate") for row in result.timeline if row["t"] > 300]
    # Most prompt tokens are a tenant's system prompt or the conversation so far.
    assert rates
    assert all(r is not None and 0.5 < r < 1.0 for r in rates)
    # Without shared prefixes every lookup misses: a rate of 0, measured (not unknown).
    plain = Trace(tuple(TraceRequest(r.arrival, r.prompt_tokens, r.output_tokens) for r in trace.requests))
    result = simulate(sd, plain, options=SimOptions(startup_seconds=60))
    assert {row["latency"].get("prefixCacheHitRate") for row in result.timeline if row["t"] > 300} == {0.0}


def test_the_simulated_prometheus_answers_hits_over_queries_and_nothing_without_lookups() -> None:
    def series(hits: float, queries: float) -> prom.Series:
        s = prom.Series(pool="latency")
        for i in range(9):
            s.samples.append(
                prom.Sample(
                    t=15.0 * i,
                    drafts=0.0,
                    draft_tokens=0.0,
                    accepted=0.0,
                    accepted_pos=(),
                    generation_tokens=100.0 * i,
                    running=4.0,
                    waiting=0.0,
                    prefix_queries=queries * i,
                    prefix_hits=hits * i,
                )
            )
        return s

    now = datetime(2026, 1, 1, tzinfo=UTC)
    answers = prom.answers([series(300.0, 1000.0), series(100.0, 1000.0)], 120.0, 120.0)
    # Summed over the pool's engines before the ratio: (300 + 100) / (1000 + 1000).
    assert prom.observation("latency", answers, 120, now).prefix_hit_rate == pytest.approx(0.2)
    idle = prom.answers([series(0.0, 0.0)], 120.0, 120.0)
    assert idle["prefix_hit_rate"] == []
    assert prom.observation("latency", idle, 120, now).prefix_hit_rate is None


def test_prefix_affinity_routing_raises_the_hit_rate_over_least_outstanding() -> None:
    sd = parse_resource(yaml.safe_load(EXAMPLE.read_text()))
    trace = shared_prefix_conversations(tenants=8, conversations=120, duration=600.0)

    def hit_rate(routing: str) -> float:
        result = simulate(sd, trace, options=SimOptions(startup_seconds=60, routing=routing))
        assert result.completed == len(trace.requests)
        rates = [row["latency"].get("prefixCacheHitRate") for row in result.timeline if row["t"] > 300]
        return sum(rates) / len(rates)

    # Each conversation's later turns find their history on the engine that served the earlier ones.
    assert hit_rate(PREFIX_AFFINITY) > hit_rate(LEAST_OUTSTANDING) + 0.05


def test_the_simulators_prefix_routing_is_the_routers_choice() -> None:
    """`traffic.PrefixRouting` runs the router's own `affinity.choose`: a tenant's first turn is placed
    (nothing placed yet: on the ring's owner of its system prompt, the router's Ring over the same
    names), a returning turn goes back to the engine that served its conversation and a new one of the
    tenant to where its system prompt is, past the ring's limit, up to their own (the slack)."""
    engines = [Replica(i, "latency", "stable", "t", replica().config, PROFILE, PREFILL_S, 1, 0.0, 0.0)
               for i in range(4)]  # fmt: skip
    routing = traffic.PrefixRouting()
    names = tuple(sorted(str(r.serial) for r in engines))
    owner = Ring(names).owner(prefix_key("tenant-a") or 0)
    first = routing.pick(engines, [("tenant-a", 1000), ("conv-1", 1200)], engines[0], 125)
    assert str(first.serial) == owner
    # The conversation's engine is now loaded past the ring's limit (ceil(1.25 * 4 / 4) = 2 with 3
    # outstanding there), within the conversation's and the system prompt's (ceil(4 / 4) + 8 = 9): the
    # next turn stays, and a new conversation of the tenant goes there too.
    for i in range(3):
        first.submit(request(i, 100, ()), 0.0)
    assert first.outstanding == 3
    again = routing.pick(engines, [("tenant-a", 1000), ("conv-1", 1600)], engines[1], 125)
    assert again is first
    assert routing.pick(engines, [("tenant-a", 1000), ("conv-2", 1100)], engines[1], 125) is first
    # At the system prompt's limit (ceil(12 / 4) + 8 = 11 with 11 outstanding) a new conversation of the
    # tenant spills along the ring.
    for i in range(3, 11):
        first.submit(request(i, 100, ()), 0.0)
    assert routing.pick(engines, [("tenant-a", 1000), ("conv-3", 1100)], engines[1], 125) is not first


def test_a_hot_tenant_takes_its_share_of_the_conversations() -> None:
    def share(hot: float) -> float:
        trace = shared_prefix_conversations(tenants=24, conversations=400, duration=600.0, hot_share=hot)
        firsts = {r.prefix[1][0]: r.prefix[0][0] for r in trace.requests}  # conversation -> tenant
        return sum(t == "t0" for t in firsts.values()) / len(firsts)

    assert share(0.0) < 0.1  # uniform: about 1/24
    assert 0.45 < share(0.5) < 0.60  # half, plus t0's uniform share of the rest
