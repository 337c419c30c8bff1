"""The router end to end: the official `openai` client -> router -> engine emulators on 127.0.0.1.

Most tests run router and emulators in the test's event loop; the tests that kill an engine or
SIGTERM the router run them as subprocesses (`python -m ...`), exactly as they run in pods.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator
from specfleet_runtime.router.classify import sha256_hex
from specfleet_runtime.router.sources import SlicePublish
from support.ports import free_port, refused
from support.router_harness import (
    BATCH_KEY,
    FAST,
    LEAST_OUTSTANDING,
    MODEL,
    assert_openai_error,
    break_stream_midway,
    emulator_config,
    engine_process,
    routing,
    running_router,
    wait_http,
)
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


@asynccontextmanager
async def two_emulators(time_scale: float = 0.1) -> AsyncIterator[tuple[RunningEmulator, RunningEmulator]]:
    async with (
        serve_emulator(emulator_config(time_scale)) as latency,
        serve_emulator(emulator_config(time_scale)) as batch,
    ):
        yield latency, batch


def tokens(emulator: RunningEmulator) -> int:
    return emulator.engine.stats.generation_tokens


# ---- the basics ----------------------------------------------------------------------------------


async def test_completions_and_chat_streaming_and_not(tmp_path: Path) -> None:
    async with two_emulators() as (lat, bat), running_router(tmp_path, routing([lat.url], [bat.url])) as rr:
        client = rr.client()
        raw = await client.completions.with_raw_response.create(model=MODEL, prompt="hello", max_tokens=8)
        completion = raw.parse()
        assert completion.choices[0].text
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 8
        assert raw.headers["x-specfleet-served-pool"] == "latency"
        assert raw.headers["x-specfleet-reason"] == "default"

        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert chat.choices[0].message.content

        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=20,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert len("".join(pieces).split()) == 20

        text_stream = await client.completions.create(model=MODEL, prompt="x", max_tokens=6, stream=True)
        finish = [c.choices[0].finish_reason async for c in text_stream]
        assert finish[-1] == "length"

        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        assert (await client.models.retrieve(MODEL)).id == MODEL
        assert tokens(lat) > 0
        assert tokens(bat) == 0

        async with aiohttp.ClientSession() as http:
            async with http.get(f"{rr.url}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{rr.url}/readyz") as resp:
                assert resp.status == 200
            async with http.get(f"{rr.url}/metrics") as resp:
                text = await resp.text()
        for name in (
            'specfleet_router_requests_total{class="latency",code="200",error="none",pool="latency"}',
            "specfleet_router_request_duration_seconds_bucket",
            "specfleet_router_time_to_first_byte_seconds_bucket",
            "specfleet_router_in_flight_requests",
            'specfleet_router_classifications_total{class="latency",reason="default"}',
            'specfleet_router_endpoints{pool="batch"} 1.0',
        ):
            assert name in text


async def test_streaming_is_passed_through_without_buffering(tmp_path: Path) -> None:
    # Real-time pacing (~6.5 ms a token): 150 tokens take about a second.
    async with (
        serve_emulator(emulator_config(time_scale=1.0)) as emu,
        running_router(tmp_path, routing([emu.url], [])) as rr,
    ):
        started = time.monotonic()
        stream = await rr.client().completions.create(
            model=MODEL, prompt="x", max_tokens=150, stream=True, extra_body={"ignore_eos": True}
        )
        arrivals = [time.monotonic() - started async for _ in stream]
        assert arrivals[-1] > 0.7
        # The first token reaches the client long before the stream ends.
        assert arrivals[1] < arrivals[-1] / 4


# ---- classification by each rule ----------------------------------------------------------------


async def test_classification_rules_end_to_end(tmp_path: Path) -> None:
    async with two_emulators() as (lat, bat):
        config = routing(
            [lat.url],
            [bat.url],
            tenantRules=[
                {"pool": "batch", "tenants": ["etl"]},
                {"pool": "batch", "apiKeySha256": [sha256_hex(BATCH_KEY)]},
            ],
            shape={"batchIfMaxTokensAtLeast": 64, "batchIfNAtLeast": 3},
            tenantHeaderTrust="Trusted",  # as if a gateway in front set the tenant header
        )
        async with running_router(tmp_path, config) as rr:
            client = rr.client()

            async def served(client: openai.AsyncOpenAI, **kw: Any) -> tuple[str, str]:
                kw.setdefault("max_tokens", 4)
                raw = await client.completions.with_raw_response.create(model=MODEL, prompt="p", **kw)
                return raw.headers["x-specfleet-served-pool"], raw.headers["x-specfleet-reason"]

            assert await served(client) == ("latency", "default")
            assert await served(client, extra_headers={"x-specfleet-pool": "batch"}) == (
                "batch",
                "pool_header",
            )
            # A client's own header does not beat a tenant or API-key rule (poolHeaderTrust default).
            escape = {"x-specfleet-pool": "latency", "x-specfleet-tenant": "etl"}
            assert await served(client, extra_headers=escape) == ("batch", "tenant")
            key_escape = {"x-specfleet-pool": "latency"}
            assert await served(rr.client(api_key=BATCH_KEY), extra_headers=key_escape) == (
                "batch",
                "api_key",
            )
            # Where the resource says every client is trusted, it does.
            rr.write_config({**config, "poolHeaderTrust": "Always"})
            await wait_until(
                lambda: rr.router.config is not None and rr.router.config.pool_header_trust == "Always"
            )
            assert await served(client, extra_headers=escape) == ("latency", "pool_header")
            rr.write_config(config)
            await wait_until(
                lambda: (
                    rr.router.config is not None and rr.router.config.pool_header_trust == "AfterTenantRules"
                )
            )
            assert await served(client, extra_headers={"x-specfleet-tenant": "etl"}) == ("batch", "tenant")
            assert await served(rr.client(api_key=BATCH_KEY)) == ("batch", "api_key")
            assert await served(client, max_tokens=64) == ("batch", "shape_max_tokens")
            assert await served(client, n=3) == ("batch", "shape_n")
            before = tokens(bat)
            assert await served(client, max_tokens=63) == ("latency", "default")
            assert tokens(bat) == before
            assert (
                rr.counter(
                    "specfleet_router_classifications_total", **{"class": "batch", "reason": "api_key"}
                )
                == 2
            )


async def test_auto_segmentation_under_concurrent_load(tmp_path: Path) -> None:
    async with two_emulators(time_scale=1.0) as (lat, bat):
        segmentation = {"enabled": True, "inFlightThreshold": 3, "calmSeconds": 1}
        # The client header is trusted here, as if a gateway in front set it.
        config = routing([lat.url], [bat.url], autoSegmentation=segmentation, clientHeaderTrust="Trusted")
        async with running_router(tmp_path, config) as rr:
            client = rr.client()

            async def one(client_id: str, max_tokens: int) -> tuple[str, str]:
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "go"}],
                    max_tokens=max_tokens,
                    stream=True,
                    extra_body={"ignore_eos": True},
                    extra_headers={"x-specfleet-client": client_id},
                )
                stream = raw.parse()
                async for _ in stream:
                    pass
                return raw.headers["x-specfleet-served-pool"], raw.headers["x-specfleet-reason"]

            bulk = [asyncio.create_task(one("bulk", 100)) for _ in range(8)]
            await wait_until(lambda: rr.router.tracker.in_flight("client:bulk") == 8)
            # An interactive client at the same time is not affected.
            assert await one("chat", 5) == ("latency", "default")
            results = await asyncio.gather(*bulk)
            assert sorted(results) == [("batch", "auto_segmentation")] * 5 + [("latency", "default")] * 3
            assert (
                rr.counter("specfleet_router_reclassifications_total", from_pool="latency", to_pool="batch")
                == 5
            )
            assert rr.counter("specfleet_router_segment_transitions_total", direction="to_batch") == 1
            # Below the threshold for calmSeconds: the client is interactive again.
            await wait_until(lambda: rr.router.tracker.segmented_count() == 0, timeout=5)
            assert await one("bulk", 5) == ("latency", "default")
            assert rr.counter("specfleet_router_segment_transitions_total", direction="from_batch") == 1


# ---- malformed and refused requests ----------------------------------------------------------------


async def test_bad_requests_get_openai_errors(tmp_path: Path) -> None:
    settings = replace(FAST, max_body_bytes=4096)
    async with (
        serve_emulator(emulator_config()) as emu,
        running_router(tmp_path, routing([emu.url], []), settings) as rr,
    ):
        url = f"{rr.url}/v1/completions"
        cases: list[tuple[bytes, int, str | None]] = [
            (b"{not json", 400, None),
            (b"", 400, None),
            (b"[1, 2]", 400, None),
            (b"\xff\xfe\x00garbage", 400, None),
            (b"[" * 2000 + b"]" * 2000, 400, None),  # nesting past the recursion limit
            (json.dumps({"model": MODEL, "prompt": "x", "stream": "yes"}).encode(), 400, "stream"),
            (json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "9"}).encode(), 400, "max_tokens"),
            (json.dumps({"model": MODEL, "prompt": "x", "n": True}).encode(), 400, "n"),
            (json.dumps({"model": 7, "prompt": "x"}).encode(), 400, "model"),
            (json.dumps({"model": "gpt-9", "prompt": "x"}).encode(), 404, "model"),
            (json.dumps({"model": MODEL, "prompt": "x" * 5000}).encode(), 413, None),
        ]
        async with aiohttp.ClientSession() as http:
            for body, status, param in cases:
                async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    assert resp.status == status, body[:40]
                    assert_openai_error(await resp.json(), param=param)

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b" " * 1000  # chunked upload, no Content-Length: counted while read

            async with http.post(url, data=chunks()) as resp:
                assert resp.status == 413
                assert_openai_error(await resp.json(), code="request_too_large")
            async with http.post(
                url, json={"model": MODEL, "prompt": "x"}, headers={"x-specfleet-pool": "gpu"}
            ) as resp:
                assert resp.status == 400
                assert_openai_error(await resp.json(), param="x-specfleet-pool")
            async with http.get(url) as resp:
                assert resp.status == 405
                assert_openai_error(await resp.json(), code="method_not_allowed")
            async with http.get(f"{rr.url}/nowhere") as resp:
                assert resp.status == 404
                assert_openai_error(await resp.json(), code="not_found")
            # The engine's own validation errors pass through unchanged.
            async with http.post(url, json={"model": MODEL, "prompt": "x", "max_tokens": 0}) as resp:
                assert resp.status == 400
                assert_openai_error(await resp.json())
            # Other /v1 paths are not served: the router's own 404, nothing reaches an engine.
            async with http.post(f"{rr.url}/v1/embeddings", json={"model": MODEL, "input": "x"}) as resp:
                assert resp.status == 404
                assert "x-specfleet-served-pool" not in resp.headers
                assert_openai_error(await resp.json(), code="not_found")
            async with http.get(f"{rr.url}/healthz") as resp:
                assert resp.status == 200

        client = rr.client()
        with pytest.raises(openai.NotFoundError) as not_found:
            await client.completions.create(model="gpt-9", prompt="x")
        assert not_found.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-9")
        with pytest.raises(openai.APIStatusError) as too_big:
            await client.completions.create(model=MODEL, prompt="y" * 5000)
        assert too_big.value.status_code == 413
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model=MODEL, prompt="x", extra_body={"stream": "yes"})
        assert (
            rr.counter(
                "specfleet_router_requests_total",
                **{"class": "none", "pool": "none", "code": "400", "error": "refused"},
            )
            >= 9
        )


async def test_concurrency_cap_answers_429(tmp_path: Path) -> None:
    settings = replace(FAST, max_in_flight=1)
    async with (
        serve_emulator(emulator_config(time_scale=1.0)) as emu,
        running_router(tmp_path, routing([emu.url], []), settings) as rr,
    ):
        client = rr.client()
        stream = await client.completions.create(
            model=MODEL, prompt="x", max_tokens=100, stream=True, extra_body={"ignore_eos": True}
        )
        with pytest.raises(openai.RateLimitError):
            await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        async for _ in stream:
            pass
        assert (await client.completions.create(model=MODEL, prompt="x", max_tokens=2)).choices


# ---- no endpoints: fallback and 503 ----------------------------------------------------------------


class EmptyService:
    """A watch source whose Service never has a ready endpoint (pods not ready yet)."""

    def __call__(self, namespace: str, service: str, publish: SlicePublish) -> Any:
        publish([])
        return self

    def stop(self) -> None:
        pass


async def test_pool_without_endpoints_falls_back_or_is_rejected(tmp_path: Path) -> None:
    async with serve_emulator(emulator_config()) as emu:
        config = routing([emu.url], [])
        config["pools"]["batch"] = {"service": "tiny-batch", "port": 8000}
        async with running_router(tmp_path, config, slice_watch_factory=EmptyService()) as rr:
            client = rr.client()
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt="x", max_tokens=2, extra_headers={"x-specfleet-pool": "batch"}
            )
            assert raw.headers["x-specfleet-served-pool"] == "latency"
            assert raw.headers["x-specfleet-class"] == "batch"
            assert rr.counter("specfleet_router_fallbacks_total", from_pool="batch", to_pool="latency") == 1

            rr.write_config({**config, "fallback": "reject"})
            await wait_until(lambda: rr.router.config is not None and rr.router.config.fallback == "reject")
            with pytest.raises(openai.APIStatusError) as refused:
                await client.completions.create(
                    model=MODEL, prompt="x", max_tokens=2, extra_headers={"x-specfleet-pool": "batch"}
                )
            assert refused.value.status_code == 503
            assert refused.value.code == "no_endpoints"
            # The latency pool still serves.
            assert (await client.completions.create(model=MODEL, prompt="x", max_tokens=2)).choices

            # No endpoint anywhere: not ready, and 503 for everyone.
            rr.write_config({**config, "pools": {"latency": config["pools"]["batch"]}})
            await wait_until(lambda: not any(rr.router.pool_endpoints.values()))
            async with aiohttp.ClientSession() as http, http.get(f"{rr.url}/readyz") as resp:
                assert resp.status == 503
            with pytest.raises(openai.InternalServerError):
                await client.completions.create(model=MODEL, prompt="x", max_tokens=2)


# ---- config reload -------------------------------------------------------------------------------


async def test_config_file_reload_keeps_last_good(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with two_emulators() as (lat, bat):
        config = routing([lat.url], [bat.url])
        async with running_router(tmp_path, config) as rr:
            client = rr.client()

            def rejected() -> float:
                return rr.counter("specfleet_router_config_reloads_total", result="rejected")

            async def pool() -> str:
                raw = await client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2)
                return raw.headers["x-specfleet-served-pool"]

            assert await pool() == "latency"
            rr.write_config({**config, "defaultPool": "batch"})
            await wait_until(
                lambda: rr.router.config is not None and rr.router.config.default_pool == "batch"
            )
            assert await pool() == "batch"

            rr.write_config("{ this is not json")
            await wait_until(lambda: rejected() == 1)
            rr.write_config({**config, "pools": {"gpu": {"staticUrls": ["http://x"]}}})
            await wait_until(lambda: rejected() == 2)
            rr.config_path.write_bytes(b"\xff\xfe not utf-8")
            await wait_until(lambda: rejected() == 3)
            assert await pool() == "batch"
            assert "keeping the last good one" in caplog.text
            rr.config_path.unlink()
            await wait_until(
                lambda: "cannot read routing config" in caplog.text, what="the missing file read"
            )
            assert await pool() == "batch"


# ---- engines that die ------------------------------------------------------------------------------


async def test_killed_engine_is_retried_and_a_cut_stream_errors(tmp_path: Path) -> None:
    with engine_process(time_scale=1.0) as (url_a, proc_a), engine_process(time_scale=1.0) as (url_b, proc_b):
        await asyncio.gather(wait_http(f"{url_a}/health"), wait_http(f"{url_b}/health"))
        dead = f"http://127.0.0.1:{free_port()}"
        config = routing([url_a, url_b, dead], [], endpointSelection=LEAST_OUTSTANDING)
        async with running_router(tmp_path, config) as rr:
            client = rr.client()
            for _ in range(6):
                assert (await client.completions.create(model=MODEL, prompt="x", max_tokens=2)).choices
            assert rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="connect") >= 1

            proc_a.kill()
            proc_a.wait(10)
            # Every request succeeds: refused connections are retried on another endpoint.
            results = await asyncio.gather(
                *(client.completions.create(model=MODEL, prompt="x", max_tokens=2) for _ in range(10))
            )
            assert all(r.choices for r in results)
            assert rr.counter("specfleet_router_retries_total", pool="latency") >= 2

            # A stream cut after it started ends with an error at the client, not a hang.
            received = await break_stream_midway(client, 5, proc_b.kill, "interrupted", timeout=15)
            assert 5 <= received < 5000
            assert (
                rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="mid_stream") == 1
            )
            # Nothing is left: a clear 502, not a hang.
            with pytest.raises(openai.APIStatusError) as gone:
                await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
            assert gone.value.status_code == 502


@asynccontextmanager
async def dropping_engine() -> AsyncIterator[tuple[str, list[int]]]:
    """An engine that went away: it takes each connection and closes it without an answer (as the
    router's pooled connections to a killed engine do). Yields its URL and the count of connections."""
    accepted = [0]

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted
    finally:
        server.close()


async def test_an_engine_that_drops_every_connection_is_left_for_another(tmp_path: Path) -> None:
    """A request an engine dropped goes to another engine next, even to a busier one: the drop may be a
    stale keep-alive connection, or an engine that went away with every connection it had."""
    async with (
        serve_emulator(emulator_config(time_scale=1.0)) as busy,
        dropping_engine() as (gone, accepted),
        running_router(tmp_path, routing([busy.url], [], endpointSelection=LEAST_OUTSTANDING)) as rr,
    ):
        client = rr.client()
        # Two long streams make the live engine the busier one: the least-loaded pick is the other.
        streams = [
            await client.completions.create(
                model=MODEL, prompt="x", max_tokens=400, stream=True, extra_body={"ignore_eos": True}
            )
            for _ in range(2)
        ]
        rr.write_config(routing([gone, busy.url], [], endpointSelection=LEAST_OUTSTANDING))
        await wait_until(lambda: gone in rr.router.pool_endpoints.get("latency", ()))
        answer = await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        for stream in streams:
            await stream.close()
    assert answer.choices
    assert accepted[0] == 1
    assert rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="disconnect") == 1


async def test_a_request_whose_engines_all_went_away_waits_for_a_new_one(tmp_path: Path) -> None:
    """Mid-flip, the only engine drops a request and is gone (it closes the connection, then refuses):
    with no endpoint left the request waits for the pool's endpoints to change and is served by the new
    engine, not failed with a 502."""
    accepted = [0]
    server: asyncio.Server | None = None

    async def drop_then_go(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        await reader.readuntil(b"\r\n\r\n")
        assert server is not None
        server.close()  # from now on connections are refused
        writer.close()

    server = await asyncio.start_server(drop_then_go, "127.0.0.1", 0)
    gone = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with (
        serve_emulator(emulator_config()) as new,
        running_router(tmp_path, routing([gone], [])) as rr,
    ):
        client = rr.client()
        request = asyncio.ensure_future(client.completions.create(model=MODEL, prompt="x", max_tokens=2))
        await wait_until(lambda: accepted[0] == 1)
        await asyncio.sleep(0.5)  # the request has nowhere left to go
        assert not request.done()
        rr.write_config(routing([new.url], []))  # the new engine is ready
        answer = await asyncio.wait_for(request, timeout=10)
    assert answer.choices
    assert rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="disconnect") == 1


async def test_non_streaming_answer_cut_is_an_error_not_a_short_success(tmp_path: Path) -> None:
    # The emulator sends a JSON answer in one piece; this backend dies 12 bytes into its answer.
    async def truncated(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if request.query.get("length") == "known":
            response.content_length = 1000
        await response.prepare(request)
        await response.write(b'{"id": "x", ')
        assert request.transport is not None
        request.transport.abort()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", truncated)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        backend = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with running_router(tmp_path, routing([backend], [])) as rr:
            client = rr.client()
            # Known length: the router reads the answer whole before sending, so it can still say 502.
            with pytest.raises(openai.InternalServerError) as bad_gateway:
                await client.completions.create(
                    model=MODEL, prompt="x", max_tokens=2, extra_query={"length": "known"}
                )
            assert bad_gateway.value.status_code == 502
            assert bad_gateway.value.code == "upstream_interrupted"
            # Unknown length (chunked): relayed as it comes, so the router drops the client connection.
            with pytest.raises(openai.APIConnectionError):
                await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
            assert (
                rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="mid_stream") == 2
            )
            async with aiohttp.ClientSession() as http, http.get(f"{rr.url}/healthz") as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()


# ---- graceful shutdown of the real process -------------------------------------------------------


async def test_sigterm_finishes_the_in_flight_stream(tmp_path: Path) -> None:
    async with serve_emulator(emulator_config(time_scale=1.0)) as emu:
        config_path = tmp_path / "routing.json"
        config_path.write_text(json.dumps(routing([emu.url], [])))
        port = free_port()
        log_path = tmp_path / "router.log"
        cmd = [
            sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config_path),
            "--host", "127.0.0.1", "--port", str(port), "--drain-seconds", "20",
            "--shutdown-delay-seconds", "0",
        ]  # fmt: skip
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ})
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_http(f"{url}/readyz")
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            stream = await client.completions.create(
                model=MODEL, prompt="x", max_tokens=200, stream=True, extra_body={"ignore_eos": True}
            )
            chunks = []
            async for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 3:
                    proc.send_signal(signal.SIGTERM)
                    # The listening socket is closed while the stream goes on.
                    await wait_until(lambda: refused(port), what="the listening socket closed")
            assert chunks[-1].choices[0].finish_reason == "length"
            assert sum(len(c.choices[0].text.split()) for c in chunks if c.choices) == 200
            assert await asyncio.to_thread(proc.wait, 15) == 0
            await client.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        log = log_path.read_text()
        assert "draining" in log
        assert "router stopped" in log


async def test_sigterm_fails_readiness_first_and_serves_new_connections_for_the_delay(
    tmp_path: Path,
) -> None:
    """Kubernetes takes a terminating router out of its Service a moment after the SIGTERM: until the
    delay ends /readyz fails while new connections are still served, each answer closing its own."""
    async with serve_emulator(emulator_config(time_scale=1.0)) as emu:
        config_path = tmp_path / "routing.json"
        config_path.write_text(json.dumps(routing([emu.url], [])))
        port = free_port()
        log_path = tmp_path / "router.log"
        cmd = [
            sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config_path),
            "--host", "127.0.0.1", "--port", str(port), "--shutdown-delay-seconds", "30",
        ]  # fmt: skip
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ})
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_http(f"{url}/readyz")
            proc.send_signal(signal.SIGTERM)
            body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
            async with aiohttp.ClientSession() as http:
                status = 200
                while status == 200:  # until the signal is handled (bounded by the test's timeout)
                    async with http.get(f"{url}/readyz") as resp:
                        status, readiness = resp.status, await resp.json()
                    await asyncio.sleep(0.02)
                assert (status, readiness["reason"]) == (503, "draining")
                # A new connection is still served, and told not to come back.
                async with http.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert resp.headers["Connection"] == "close"
                    assert (await resp.json())["choices"]
            assert proc.poll() is None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert "not ready; serving for 30s" in log_path.read_text()
