"""The router benchmark's own load generator (`benchmarks/router_bench.py`, `_ClosedLoop`) counts
what it claims: answered 200s as done, anything else (a 404, a dropped connection) as an error, and it
keeps its concurrency when a server drops connections. Its max req/s column rests on these counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import ModuleType

from aiohttp import web

from support.benchmarks import load_benchmark
from support.ports import free_port


def load_bench() -> ModuleType:
    return load_benchmark("router_bench")


@asynccontextmanager
async def server(drop_every: int = 0) -> AsyncIterator[tuple[str, list[int]]]:
    """An aiohttp server on 127.0.0.1: 200 on /v1/completions (closing the connection without an answer
    every `drop_every`-th request when set), 404 elsewhere; yields its base URL and the request count."""
    seen = [0]

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        seen[0] += 1
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
