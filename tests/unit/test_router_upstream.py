"""The router's engine-leg HTTP client against engines that answer in every way HTTP/1.1 allows.

Behind the router sits a raw asyncio server that writes exactly the bytes a case asks for: chunked
and EOF-delimited answers, a keep-alive connection the engine closes while it is idle, an answer
that is not HTTP, one cut short. Each case goes through the whole router.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from support.router_harness import COMPLETION, FAST, GOOD, assert_openai_error, routing, running_router
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

BODY = json.dumps(COMPLETION).encode()


def chunked(body: bytes, pieces: int = 3) -> bytes:
    size = -(-len(body) // pieces)
    out = b""
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


# The case name (the request's query) -> the raw answer, and whether the engine closes afterwards.
ANSWERS: dict[str, tuple[bytes, bool]] = {
    "length": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
        False,
    ),
    "chunked": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(BODY),
        False,
    ),
    "eof": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + BODY, True),
    "sse": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(b"data: {}\n\ndata: [DONE]\n\n", 2),
        False,
    ),
    "garbage": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", True),
    "silent": (b"", False),
    # Answers that start and then stall (the engine still answers its health probe).
    "stall-length": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        + BODY[:10],
        False,
    ),
    "stall-chunked": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(BODY).partition(b"\r\n0\r\n")[0][:40],
        False,
    ),
    "stall-sse": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(b"data: {}\n\n", 1).removesuffix(b"0\r\n\r\n"),
        False,
    ),
    "health": (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
    "short": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
        + BODY[:10],
        True,
    ),
}


class RawEngine:
    """Answers each request with ANSWERS[query]; counts connections; can close idle ones."""

    def __init__(self) -> None:
        self.url = ""
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                path, _, query = head.split(b" ", 2)[1].partition(b"?")
                case = "health" if path == b"/health" else query.decode()
                answer, close = ANSWERS[case]
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close_idle_connections(self) -> None:
        """Close them and return once each close is done (the FIN sent, not just asked for)."""
        writers, self.writers = self.writers, []
        for writer in writers:
            writer.close()
        for writer in writers:
            with suppress(ConnectionError):
                await writer.wait_closed()


@asynccontextmanager
async def raw_engine() -> AsyncIterator[RawEngine]:
    engine = RawEngine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield engine
    finally:
        server.close()
        await engine.close_idle_connections()


async def post(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes, str]:
    async with http.post(url, data=GOOD, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.read(), resp.content_type


async def test_every_answer_framing_is_relayed_and_keep_alive_is_reused(tmp_path: Path) -> None:
    async with (
        raw_engine() as engine,
        running_router(tmp_path, routing([engine.url], [])) as rr,
        aiohttp.ClientSession() as http,
    ):
        for case in ("length", "chunked", "length", "eof", "chunked"):
            status, body, _ = await post(http, f"{rr.url}/v1/completions?{case}")
            assert status == 200, case
            assert json.loads(body) == COMPLETION, case
        # One connection for length/chunked/length, a new one after the engine closed ("eof").
        assert engine.connections == 2
        status, body, content_type = await post(http, f"{rr.url}/v1/completions?sse")
        assert (status, content_type) == (200, "text/event-stream")
        assert body == b"data: {}\n\ndata: [DONE]\n\n"

        # The engine closes the pooled idle connection: the next request is not failed by it.
        await engine.close_idle_connections()
        status, body, _ = await post(http, f"{rr.url}/v1/completions?length")
        assert status == 200
        assert json.loads(body) == COMPLETION


async def test_answers_that_are_not_http_or_cut_short_are_clean_errors(tmp_path: Path) -> None:
    async with (
        raw_engine() as engine,
        running_router(tmp_path, routing([engine.url], [])) as rr,
        aiohttp.ClientSession() as http,
    ):
        status, body, _ = await post(http, f"{rr.url}/v1/completions?garbage")
        assert status == 502
        assert_openai_error(json.loads(body), code="upstream_error")
        status, body, _ = await post(http, f"{rr.url}/v1/completions?short")
        assert status == 502
        assert_openai_error(json.loads(body), code="upstream_interrupted")
        labels = {"class": "latency", "pool": "latency", "code": "502"}
        assert rr.counter("specfleet_router_requests_total", **labels, error="upstream_error") == 1
        assert rr.counter("specfleet_router_requests_total", **labels, error="mid_stream") == 1
        # And the engine is still used for what it answers well.
        status, _, _ = await post(http, f"{rr.url}/v1/completions?length")
        assert status == 200


async def test_a_silent_engine_times_out_on_a_pooled_connection_too(tmp_path: Path) -> None:
    # The engine leg's read timer is lazy (one handle per connection, re-armed when it fires): a wait
    # on a pooled connection whose earlier waits left that handle behind must still time out on time.
    settings = replace(FAST, read_timeout=0.3, stall_seconds=60.0)
    async with (
        raw_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
        aiohttp.ClientSession() as http,
    ):
        for pause in (0.0, 0.5):  # the previous handle still pending, then one that fired with no wait
            await asyncio.sleep(pause)
            status, _, _ = await post(http, f"{rr.url}/v1/completions?length")
            assert status == 200
            started = time.monotonic()
            status, body, _ = await post(http, f"{rr.url}/v1/completions?silent")
            elapsed = time.monotonic() - started
            assert status == 504
            assert_openai_error(json.loads(body), code="upstream_timeout")
            assert engine.url.removeprefix("http://") not in body.decode()  # no engine address
            assert 0.25 <= elapsed < 5.0
        assert engine.connections >= 2  # a timed-out connection is not pooled again
        status, _, _ = await post(http, f"{rr.url}/v1/completions?length")
        assert status == 200


async def test_answers_that_stall_mid_body_are_bounded(tmp_path: Path) -> None:
    # The engine answers its health probe (alive, one answer stuck): each answer is ended, none ejected.
    # (read_timeout past the test's own timeout: only the stall timeout can end these answers in time)
    settings = replace(FAST, stream_stall_timeout=0.3, read_timeout=300.0, stall_seconds=60.0)
    async with (
        raw_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
        aiohttp.ClientSession() as http,
    ):
        # A small answer of known length is read whole first: nothing reached the client, a clean 504.
        status, body, _ = await post(http, f"{rr.url}/v1/completions?stall-length")
        assert status == 504
        assert_openai_error(json.loads(body), code="upstream_timeout")
        assert "stalled" in json.loads(body)["error"]["message"]
        # A stream ends with an OpenAI-format error event after what it had relayed.
        status, body, content_type = await post(http, f"{rr.url}/v1/completions?stall-sse")
        assert (status, content_type) == (200, "text/event-stream")
        first, _, event = body.partition(b"\n\n")
        assert first == b"data: {}"
        error = json.loads(event.removeprefix(b"data: "))
        assert_openai_error(error, code="upstream_stalled")
        # An answer of unknown length is cut: the client sees a short body rather than a wrong one.
        with pytest.raises(aiohttp.ClientPayloadError):
            await post(http, f"{rr.url}/v1/completions?stall-chunked")
        labels = {"class": "latency", "pool": "latency"}
        await wait_until(
            lambda: (
                rr.counter("specfleet_router_requests_total", **labels, code="200", error="mid_stream") == 2
            )
        )
        assert rr.router.backends.ejected_until == {}
        status, _, _ = await post(http, f"{rr.url}/v1/completions?length")
        assert status == 200


async def test_requests_leave_no_reference_cycles(tmp_path: Path) -> None:
    """Everything a request creates is freed by reference counting: cycles would leave it to the
    garbage collector, whose passes over them the router would pay for under load. (A parser per
    engine answer, holding its answer as callbacks, was a cycle per request.)"""
    async with raw_engine() as engine, running_router(tmp_path, routing([engine.url], []), FAST) as rr:
        host, port = rr.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        request = (
            b"POST /v1/completions?length HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(GOOD) + GOOD
        )

        async def exchange(count: int) -> None:
            for _ in range(count):
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200 OK")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await asyncio.wait_for(reader.readexactly(length), 10)

        await exchange(20)  # pooled engine connections, caches, metric children: made once
        gc.collect()
        gc.disable()
        try:
            await exchange(200)
            unreachable = gc.collect()
        finally:
            gc.enable()
        writer.close()
    # The client, engine and event loop of this test make some garbage of their own; the router's
    # cycle per request alone was about 2,000 objects per 200 requests.
    assert unreachable < 200, f"{unreachable} objects in reference cycles after 200 requests"
