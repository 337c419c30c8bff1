"""The router benchmark's own load generator (`benchmarks/router_bench.py`, `_ClosedLoop`) counts
what it claims: answered 200s as done, anything else (a 404, a dropped connection) as an error, and it
keeps its concurrency when a server drops connections. Its max req/s column rests on these counts. With
--prompts N every phase cycles over N prompts of distinct leading text and equal length."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType

from aiohttp import web

from support.benchmarks import load_benchmark
from support.ports import free_port


def load_bench() -> ModuleType:
    return load_benchmark("router_bench")


@asynccontextmanager
async def server(
    drop_every: int = 0, prompts: Counter[str] | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """An aiohttp server on 127.0.0.1: 200 on /v1/completions (closing the connection without an answer
    every `drop_every`-th request when set), 404 elsewhere; yields its base URL and the request count, and
    counts the requests of each prompt into `prompts` when given."""
    seen = [0]

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen[0] += 1
        if prompts is not None:
            prompts[body["prompt"]] += 1
        if drop_every and seen[0] % drop_every == 0:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError
        return web.json_response({"choices": []})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_the_closed_loop_counts_answered_requests_and_stops_at_its_cap() -> None:
    bench = load_bench()
    async with server() as (base, seen):
        got = await bench._ClosedLoop(f"{base}/v1/completions", 4, 30.0, 200).run()
    assert got["errors"] == 0
    # Stops at the cap, at most one request in flight per connection beyond it.
    assert 200 <= got["done"] <= 204
    assert got["done"] == seen[0]
    assert got["seconds"] < 30.0


async def test_the_closed_loop_counts_other_statuses_as_errors() -> None:
    bench = load_bench()
    async with server() as (base, _):
        got = await bench._ClosedLoop(f"{base}/v1/nothing", 2, 30.0, 50).run()
    assert got["done"] == 0
    assert 50 <= got["errors"] <= 52


async def test_dropped_connections_are_errors_and_the_loop_keeps_going() -> None:
    bench = load_bench()
    async with server(drop_every=10) as (base, seen):
        got = await bench._ClosedLoop(f"{base}/v1/completions", 3, 30.0, 300).run()
    assert got["errors"] > 0
    assert got["done"] + got["errors"] >= 300
    # Every request the server saw is either an answer or a dropped connection.
    assert got["done"] + got["errors"] == seen[0]


def test_one_prompt_is_the_load_of_before_and_more_prompts_differ_in_their_leading_text() -> None:
    bench = load_bench()
    assert bench.prompt_texts(1) == ["hello"]
    texts = bench.prompt_texts(64)
    assert texts[0] == "hello"
    assert len({text[:2] for text in texts}) > 1  # not one leading text
    assert len(set(texts)) == 64
    # Equal length: a request's bytes do not change with the number of prompts.
    bodies = bench.Bodies(64)
    assert {len(body) for body in bodies.plain} == {len(bench.Bodies(1).plain[0])}
    assert {len(body) for body in bodies.streamed} == {len(bench.Bodies(1).streamed[0])}
    assert bodies.body(64) == bodies.body(0) == bench.request_body("hello")
    assert b'"stream": true' in bodies.body(3, stream=True)


async def test_the_closed_loop_cycles_over_its_prompts() -> None:
    bench = load_bench()
    prompts: Counter[str] = Counter()
    async with server(prompts=prompts) as (base, _):
        got = await bench._ClosedLoop(f"{base}/v1/completions", 4, 30.0, 200, prompts=8).run()
    assert got["errors"] == 0
    assert set(prompts) == set(bench.prompt_texts(8))
    # In turn: each prompt 200 / 8 times, give or take the requests in flight past the cap.
    assert max(prompts.values()) - min(prompts.values()) <= 4


async def test_every_aiohttp_phase_cycles_over_its_prompts() -> None:
    bench = load_bench()
    bodies = bench.Bodies(4)
    prompts: Counter[str] = Counter()
    async with server(prompts=prompts) as (base, _):
        url = f"{base}/v1/completions"
        latencies, errors = await bench.interleaved_latencies([url], 8, 30.0, bodies)
        assert errors == [0]
        assert len(latencies[0]) == 8
        assert prompts == Counter(dict.fromkeys(bench.prompt_texts(4), 5 + 2))  # 20 warm-up, 8 timed
        prompts.clear()
        await bench.cpu_per_request(url, os.getpid(), 40, 4, bodies)
        assert set(prompts) == set(bench.prompt_texts(4))
        prompts.clear()
        got, failed = await bench.paced_latencies(url, 200.0, 0.2, bodies)
        assert failed == 0
        assert len(got) == 40
        assert prompts == Counter(dict.fromkeys(bench.prompt_texts(4), 10))


def test_paired_ratio_is_per_round_median_and_range() -> None:
    """The per-round ratio columns (req/s, CPU per request) pair each round with vllm-router's same round:
    a round where both moved together (a busy machine) does not move the ratio."""
    bench = load_bench()
    ours, theirs = [10.0, 20.0, 12.0], [10.0, 16.0, 8.0]
    assert bench.paired_ratio(ours, theirs) == "1.25 (1.00-1.50)"
    assert bench.paired_ratio(ours, None) == "-"
    assert bench.paired_ratio(theirs, theirs) == "-"
    assert bench.paired_ratio(ours, [0.0, 0.0, 0.0]) == "-"
