"""The prefix-routing benchmark's pure parts (`benchmarks/prefix_routing.py`): the simulator's workload
rule turned into chat turns whose shared prefixes are identical text and whose token counts are the
trace's, the tables and the targets it prints, and the simulator's prefix counters it reads. The
processes (emulators, routers) are not started here."""

from __future__ import annotations

import pytest

from specfleet.sim.options import LEAST_OUTSTANDING, PREFIX_AFFINITY
from specfleet_runtime.emulator.text import Prompt
from support.benchmarks import load_benchmark

pr = load_benchmark("prefix_routing")


def test_the_workload_fits_the_rate_asked_for_and_is_seeded() -> None:
    trace = pr.workload(4.0, 20.0, 5.0)
    assert trace == pr.workload(4.0, 20.0, 5.0)
    measured = sum(1 for r in trace.requests if r.arrival >= 5.0)
    assert measured == pytest.approx(80, rel=0.1)


def test_turns_repeat_the_conversation_so_far_word_for_word_and_count_the_traces_tokens() -> None:
    trace = pr.workload(4.0, 20.0, 5.0)
    live = pr.live_requests(trace)
    assert len(live) == len(trace.requests)
    turns: dict[str, list[object]] = {}
    for row, req in zip(trace.requests, live, strict=True):
        _, (conversation, prompt) = row.prefix
        assert req.conversation == conversation
        assert req.max_tokens == row.output_tokens
        # The rule's prompt tokens, plus the chat template's few per message.
        counted = Prompt.from_chat(req.messages).num_tokens
        assert prompt <= counted <= prompt + 6 * len(req.messages) + 6
        seen = turns.setdefault(conversation, [])
        if seen:
            earlier = seen[-1]
            assert isinstance(earlier, pr.LiveRequest)
            # The previous turn's messages, then its answer and a new user message.
            assert req.messages[: len(earlier.messages)] == earlier.messages
            assert [r for r, _ in req.messages[len(earlier.messages) :]] == ["assistant", "user"]
            assert len(req.messages[-2][1].split()) == earlier.max_tokens
        seen.append(req)
    # Every conversation of a tenant starts with the same system prompt text.
    systems: dict[str, set[str]] = {}
    for row, req in zip(trace.requests, live, strict=True):
        systems.setdefault(row.prefix[0][0], set()).add(req.messages[0][1])
    assert all(len(texts) == 1 for texts in systems.values())
    assert len(systems) > 1


def test_a_phase_salt_changes_the_first_block_and_nothing_else() -> None:
    req = pr.live_requests(pr.workload(2.0, 10.0, 2.0))[0]
    a, b = req.body("run0x0"), req.body("run1x0")
    assert a != b
    assert a.replace(b"run0x0", b"run1x0") == b
    assert b'"stream":true' in a
    assert b'"ignore_eos":true' in a


def phase(router: str, rate: float, ttft: list[float], tokens: float, hit: float, cpu: float) -> object:
    return pr.Phase(
        router, rate, offered=rate, ttft=ttft, tokens_per_s=tokens, hit_rate=hit, imbalance=1.2, cpu_ms=cpu
    )


def test_the_table_puts_each_router_beside_least_outstanding_and_the_targets_say_met_or_not() -> None:
    lo, pa, ca, ch, rr = (name for name, _, _ in pr.ROUTERS)
    phases = [
        phase(lo, 2, [0.4] * 10, 100, 0.4, 5.0),
        phase(pa, 2, [0.1] * 10, 110, 0.8, 5.2),
        phase(ca, 2, [0.2] * 10, 105, 0.7, 3.0),
        phase(lo, 4, [0.4] * 10, 200, 0.4, 5.0),
        phase(pa, 4, [0.1] * 9 + [2.0], 190, 0.8, 5.2),
        phase(ca, 4, [0.2] * 10, 205, 0.7, 3.0),
        pr.Phase(ch, 2, skipped="pip install vllm-router failed"),
    ]
    table = pr.render_table(phases).splitlines()
    assert table[0].startswith("| rate req/s (offered) | router | TTFT p50 ms | p50 / LO |")
    assert (
        "| 2 (2.0) | specfleet PrefixAffinity | 100 | 0.25x | 100 | 0.25x | 110 | 1.10x | 0.80 |" in table[3]
    )
    assert any(
        "| 2 | vllm-router consistent_hash | not run: pip install vllm-router failed |" in t for t in table
    )
    assert rr not in "\n".join(table)
    met = {target.split(" (")[0].split(" at ")[0]: ok for target, ok, _ in pr.targets(phases)}
    assert met == {
        "TTFT p50 <= 0.5x least-outstanding's": True,
        "tokens/s >= least-outstanding's": False,  # 190 < 200 at 4 req/s
        "hit rate >= vllm-router cache_aware's": True,
        "TTFT p99 <= vllm-router cache_aware's": False,  # 2000 ms > 200 ms at 4 req/s
        "max/mean outstanding <= 1.5": True,
        "router CPU per request": True,  # 5.2 <= 1.1 x 5.0
    }
    assert "| not met |" in pr.render_targets(pr.targets(phases))


def test_the_imbalance_ignores_near_idle_samples() -> None:
    assert pr.imbalance([[1, 0, 0, 0], [2, 2, 2, 2], [4, 2, 1, 1]]) == pytest.approx((1.0 + 2.0) / 2)
    assert pr.imbalance([[0, 0, 0, 1]]) is None


def test_the_simulator_reads_a_hit_rate_after_the_warm_up_for_both_routings() -> None:
    trace = pr.workload(2.0, 10.0, 4.0)
    rows = [pr.simulate_routing(trace, 2.0, r, 4.0, 4.0) for r in (LEAST_OUTSTANDING, PREFIX_AFFINITY)]
    for row in rows:
        assert row.hit_rate is not None
        assert 0.0 < row.hit_rate < 1.0
        assert row.tokens_per_request_second > 0
    text = pr.render_sim_table(rows)
    assert text.splitlines()[2].startswith("| 2 | leastOutstanding |")


def test_the_choice_cost_runs_both_strategies_on_the_same_bodies_and_the_cpu_target_cites_it() -> None:
    requests = pr.live_requests(pr.workload(4.0, 5.0, 2.0))[:40]
    least, affinity = pr.choice_cost(requests, repeats=1)
    assert least > 0
    assert affinity > 0
    lo, pa = pr.ROUTERS[0][0], pr.ROUTERS[1][0]
    phases = [phase(lo, 2, [0.4] * 10, 100, 0.4, 5.0), phase(pa, 2, [0.1] * 10, 110, 0.8, 6.0)]
    phases[0].syscalls, phases[1].syscalls = 200.0, 260.0
    (cpu,) = [row for row in pr.targets(phases, (80.0, 104.0)) if row[0].startswith("router CPU")]
    assert cpu[1] is False  # 6.0 > 1.1 x 5.0
    assert cpu[2] == (
        "6.00 vs 5.00 ms (1.20x); system calls 260 vs 200 per request; the choice itself 104 vs 80 µs per request"
    )


def test_the_choices_table_has_a_row_per_counted_phase_and_a_zero_for_a_choice_not_made() -> None:
    uniform = pr.Phase("specfleet PrefixAffinity", 14.0, choices={"conversation": 250.0, "placed": 23.0})
    hot = pr.Phase("specfleet PrefixAffinity", 14.0, hot=True, choices={"spilled": 24.0})
    rows = pr.render_choices([hot, uniform]).splitlines()[2:]
    assert rows == [
        "| 14 | uniform | 250 | 0 | 23 | 0 | 0 |",
        "| 14 | one hot tenant | 0 | 0 | 0 | 24 | 0 |",
    ]


def test_the_ttft_floor_prefills_only_what_no_earlier_request_sent() -> None:
    from specfleet.sim.workload import Trace, TraceRequest

    def req(at: float, tenant: str, system: int, conversation: str, prompt: int, output: int) -> TraceRequest:
        return TraceRequest(arrival=at, prompt_tokens=prompt, output_tokens=output,
                            prefix=((tenant, system), (conversation, prompt)))  # fmt: skip

    trace = Trace((
        req(0.5, "t1", 1000, "t1/c1", 1100, 50),  # in the warm-up: not measured, but t1 is sent
        req(2.0, "t1", 1000, "t1/c2", 1200, 50),  # t1's system prompt was sent: 200 new tokens
        req(3.0, "t2", 3000, "t2/c1", 3100, 50),  # a new tenant: all 3100 cold
        req(4.0, "t1", 1000, "t1/c1", 1300, 50),  # c1's next turn repeats 1100 + 50: 150 new
    ))  # fmt: skip
    floor = pr.ttft_floor(trace, warmup=1.0, seconds=10.0, time_scale=2.0)
    step = pr.default_profile().step_ms[0][0]
    per_token = pr.default_profile().prefill_ms_per_token
    assert floor == pytest.approx([(n * per_token + step) * 2 / 1000 for n in (200, 3100, 150)])
    kinds = pr.request_floors(trace, 2.0)
    assert [kind for kind, _ in kinds] == ["new tenant", "new conversation", "new tenant", "turn"]
    # The benchmark's log line names each slow request's kind and floor.
    measured = pr.Phase("r", 1.0, by_request={1: 0.5, 2: 0.9, 3: 0.2})
    assert pr.slowest(measured, kinds, count=2) == (
        f"900 ms (new tenant, floor {kinds[2][1] * 1000:.0f}), 500 ms (new conversation, floor {kinds[1][1] * 1000:.0f})"
    )


def test_the_p99_target_at_a_rate_with_more_traces_compares_them_pooled() -> None:
    lo, pa, ca = (name for name, _, _ in pr.ROUTERS[:3])
    phases = [
        phase(lo, 4, [0.4] * 100, 200, 0.4, 5.0),
        # The main trace: PrefixAffinity's two slowest requests are slower than cache_aware's ...
        phase(pa, 4, [0.1] * 98 + [0.9, 0.9], 210, 0.8, 5.2),
        phase(ca, 4, [0.1] * 98 + [0.8, 0.8], 205, 0.7, 3.0),
    ]
    # ... but over two more traces it is the other way round.
    for k in (1, 2):
        for router, slow in ((pa, 0.5), (ca, 0.7)):
            extra = phase(router, 4, [0.1] * 98 + [slow, slow], 200, 0.8, 5.0)
            extra.trace = k
            phases.append(extra)
    floors = {(4.0, k): [0.05] * 99 + [0.4] for k in (0, 1, 2)}
    (p99,) = [row for row in pr.targets(phases, None, floors) if row[0].startswith("TTFT p99")]
    assert p99[1] is True
    assert p99[2] == "4: 500 vs 700 ms pooled over 3 traces, floor 50 (main trace 900 vs 800)"
    # Only the main trace's phases go into the main table; the p99 table has one column per trace.
    table = pr.render_p99(phases, floors, 4.0).splitlines()
    assert (
        table[0]
        == "| TTFT p99 ms at 4 req/s | trace 1 (seed 29) | trace 2 (seed 30) | trace 3 (seed 31) | pooled |"
    )
    assert table[2] == f"| {pa} | 900 | 500 | 500 | 500 |"
    assert table[4] == "| floor (no queue, every cache in place) | 50 | 50 | 50 | 50 |"
    assert pr.render_p99(phases, {(4.0, 0): [0.1]}, 4.0) == ""
