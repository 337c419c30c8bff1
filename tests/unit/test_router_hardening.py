"""The router against hostile input: path spellings, malformed HTTP, slow and greedy clients, stalls.

Requests are sent as raw bytes where an HTTP client would normalize or refuse them. Behind the router
sits a recording engine (every path it is asked for is kept) or the engine emulator as a process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from support.router_harness import (
    FAST,
    GOOD,
    LEAST_OUTSTANDING,
    MODEL,
    RunningRouter,
    assert_openai_error,
    break_stream_midway,
    engine_process,
    raw_exchange,
    raw_request,
    recording_engine,
    routing,
    running_router,
    wait_http,
)
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

# ---- the allow-list ------------------------------------------------------------------------------

# (method, raw request target, body): none of these may reach anything but the canonical inference
# paths of an engine, whatever the spelling.
OUTSIDE_V1 = [
    ("GET", "/v1/../metrics"),
    ("POST", "/v1/../admin/reset"),
    ("POST", "/v1/%2e%2e/admin/reset"),
    ("POST", "/v1/%2E%2E/admin/reset"),
    ("POST", "/v1/..%2fadmin/reset"),
    ("POST", "/v1%2f..%2f..%2fadmin/reset"),
    ("POST", "/v1/completions/../../admin/reset"),
    ("POST", "//admin/reset"),
    ("POST", "/v1/%252e%252e/admin/reset"),  # double-encoded: decoded once only
    ("POST", "/admin/reset"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/completions%00"),
    ("POST", "/v1/tokenize"),
    ("GET", "/v1/../health"),
    ("POST", "http://engine/admin/reset"),  # absolute-form
]


async def test_only_allow_listed_paths_reach_an_engine(tmp_path: Path) -> None:
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        for method, target in OUTSIDE_V1:
            resp = await raw_exchange(rr.url, raw_request(method, target, GOOD if method == "POST" else b""))
            assert resp is not None, target
            assert resp.headers["content-type"].startswith(("application/json", "text/plain; version")), (
                target
            )
            if target == "/v1/../metrics":
                # The router's own metrics (the normalized path), never the engine's.
                assert resp.status == 200
                assert b"specfleet_router_" in resp.body
                assert b"engine_secret" not in resp.body
                continue
            assert resp.status == 404, target
            assert_openai_error(resp.json(), code="not_found")
        assert engine.admin_calls == 0
        assert engine.seen == []

        # Other spellings of the inference paths: body checks and shape routing still apply ...
        for target in ("/v1/./completions", "/v1//completions", "/v1/%2e/completions", "/v1%2fcompletions"):
            bad = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "5"}).encode()
            resp = await raw_exchange(rr.url, raw_request("POST", target, bad))
            assert resp is not None
            assert resp.status == 400, target
            assert_openai_error(resp.json(), param="max_tokens")
            wrong_model = json.dumps({"model": "other", "prompt": "x"}).encode()
            resp = await raw_exchange(rr.url, raw_request("POST", target, wrong_model))
            assert resp is not None
            assert resp.status == 404, target
        assert engine.seen == []
        # ... and a good request goes out under the canonical spelling only.
        for target in ("/v1/./completions", "/v1//completions/", "/v1/%63ompletions", "/x/../v1/completions"):
            resp = await raw_exchange(rr.url, raw_request("POST", target, GOOD))
            assert resp is not None
            assert resp.status == 200, target
            assert resp.headers["x-specfleet-served-pool"] == "latency"
        assert engine.seen == ["/v1/completions"] * 4
        # A wrong method on an allow-listed path: the router's 405.
        resp = await raw_exchange(rr.url, raw_request("DELETE", "/v1/chat/completions"))
        assert resp is not None
        assert resp.status == 405
        assert resp.headers["allow"] == "POST"
        assert_openai_error(resp.json(), code="method_not_allowed")


async def test_engine_errors_that_are_not_openai_format_are_rewritten(tmp_path: Path) -> None:
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], [])) as rr,
        aiohttp.ClientSession() as http,
    ):
        for fail, code in (("405", "method_not_allowed"), ("404", "not_found")):
            async with http.post(f"{rr.url}/v1/completions?fail={fail}", data=GOOD) as resp:
                assert resp.status == int(fail)
                assert resp.content_type == "application/json"
                body = await resp.json()
                assert_openai_error(body, code=code)
                assert fail in body["error"]["message"]
        # The engine's own OpenAI-format errors pass unchanged (tests in test_router_e2e.py).


# ---- malformed HTTP ------------------------------------------------------------------------------

MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n",
    b"GET /" + b"a" * 40_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
]


async def test_malformed_http_gets_openai_errors_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="specfleet_runtime")
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        for _ in range(3):
            for data in MALFORMED:
                resp = await raw_exchange(rr.url, data)
                assert resp is not None, data[:40]
                assert resp.status == 400, data[:40]
                assert resp.headers["content-type"].startswith("application/json")
                assert_openai_error(resp.json(), code="invalid_request")
        assert rr.counter("specfleet_router_protocol_errors_total", reason="parse_error") == 3 * len(
            MALFORMED
        )
        # A normal request on a fresh connection still works.
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD))
        assert resp is not None
        assert resp.status == 200
    assert engine.seen == ["/v1/completions"]
    problems = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(("aiohttp", "specfleet"))
    ]
    # One rate-limited line for 27 malformed requests, and no traceback anywhere.
    assert [r.levelname for r in problems] == ["WARNING"]
    assert all(r.exc_info is None for r in caplog.records)


async def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    """Requests sent back to back on one connection: one at a time, answers in order, then the close."""
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        host, port = rr.url.removeprefix("http://").rsplit(":", 1)
        keep = raw_request("POST", "/v1/completions?wait=1", GOOD).replace(b"Connection: close\r\n", b"")
        last = raw_request("GET", "/v1/models")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(keep + keep.replace(b"?wait=1", b"") + last)
        await wait_until(lambda: len(engine.seen) == 1)
        await asyncio.sleep(0.1)
        assert engine.seen == ["/v1/completions?wait=1"]  # the second waits for the first's answer
        engine.gate.set()
        data = await asyncio.wait_for(reader.read(), 10)  # until the close asked for by the last
        writer.close()
        assert data.count(b"HTTP/1.1 200 OK") == 3
        assert data.rindex(b"x-specfleet-served-pool") < data.index(b'"object": "list"')
    assert engine.seen == ["/v1/completions?wait=1", "/v1/completions"]


async def test_a_client_leaving_a_reused_connection_frees_its_request(tmp_path: Path) -> None:
    """One task serves every request of a connection: after answers on a keep-alive connection, the
    client closing it in the middle of a later (endless) stream still cancels that request at once."""
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        server = rr.router.server
        assert server is not None
        host, port = rr.url.removeprefix("http://").rsplit(":", 1)
        keep = raw_request("POST", "/v1/completions", GOOD).replace(b"Connection: close\r\n", b"")
        reader, writer = await asyncio.open_connection(host, int(port))
        for answered in range(1, 4):
            writer.write(keep)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await asyncio.wait_for(reader.readexactly(length), 10)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert len(engine.seen) == answered
        connection = next(iter(server.connections))
        serving = connection.task
        assert serving is not None
        assert not serving.done()  # waiting for the next request, not ended by the answers
        writer.write(keep.replace(b"/v1/completions", b"/v1/completions?endless=1"))
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert rr.router.in_flight == 1
        writer.close()
        await asyncio.wait_for(engine.endless_ended.wait(), 10)
        await wait_until(lambda: server.open_count == 0 and rr.router.in_flight == 0)
        assert serving.done()
        labels = {"class": "latency", "pool": "latency"}
        assert rr.counter("specfleet_router_requests_total", **labels, code="200", error="none") == 3
        assert rr.counter("specfleet_router_requests_total", **labels, code="499", error="client_closed") == 1
        # The server serves new connections as before.
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD))
        assert resp is not None
        assert resp.status == 200


async def test_chunked_request_bodies_are_read(tmp_path: Path) -> None:
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        half = len(GOOD) // 2
        chunked = b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in (GOOD[:half], GOOD[half:]))
        head = raw_request("POST", "/v1/completions").split(b"Content-Length")[0]
        resp = await raw_exchange(
            rr.url, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n"
        )
        assert resp is not None
        assert resp.status == 200
        assert resp.headers["x-specfleet-served-pool"] == "latency"
    assert engine.seen == ["/v1/completions"]


# ---- bounded resources ---------------------------------------------------------------------------


async def test_bytes_in_flight_are_capped(tmp_path: Path) -> None:
    settings = replace(FAST, max_body_bytes=64 * 1024, max_bytes_in_flight=100 * 1024)
    body = json.dumps({"model": MODEL, "prompt": "x" * 60_000, "max_tokens": 2}).encode()
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
        aiohttp.ClientSession() as http,
    ):
        held = asyncio.create_task(http.post(f"{rr.url}/v1/completions?wait=1", data=body))
        await wait_until(lambda: rr.router.budget.used > 0, what="the held request admitted")
        async with http.post(f"{rr.url}/v1/completions", data=body) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            assert_openai_error(await resp.json(), code="overloaded")
        # A small request still fits beside the held one.
        async with http.post(f"{rr.url}/v1/completions", data=GOOD) as resp:
            assert resp.status == 200
        engine.gate.set()
        async with await held as resp:
            assert resp.status == 200
        assert rr.router.budget.used == 0
        async with http.post(f"{rr.url}/v1/completions", data=body) as resp:
            assert resp.status == 200


async def test_short_and_slow_bodies_time_out(tmp_path: Path) -> None:
    settings = replace(FAST, body_timeout=0.5)
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
    ):
        # A body shorter than its Content-Length, the connection left open: 408, then closed.
        short = raw_request("POST", "/v1/completions", GOOD)[:-5]
        resp = await raw_exchange(rr.url, short)
        assert resp is not None
        assert resp.status == 408
        assert resp.headers["connection"].lower() == "close"
        assert_openai_error(resp.json(), code="request_timeout")
        assert rr.router.budget.used == 0
    assert engine.seen == []


async def read_until_closed(url: str, trickle: bytes, every: float) -> bytes:
    """Send `trickle` a byte at a time, `every` seconds apart, until the server closes; returns what came."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for byte in trickle:
            if reader.at_eof():
                # Closed while the last read timed out: what is left is what came.
                return await reader.read()
            writer.write(bytes([byte]))
            try:
                await writer.drain()
                return await asyncio.wait_for(reader.read(), timeout=every)
            except TimeoutError:
                continue
            except ConnectionError:
                return b""
        raise AssertionError("the router kept a trickling connection open")
    finally:
        writer.close()


async def test_idle_and_slow_header_connections_are_closed(tmp_path: Path) -> None:
    settings = replace(FAST, idle_timeout=0.5)
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
    ):
        host, port = rr.url.removeprefix("http://").rsplit(":", 1)
        # Idle: connected, nothing sent.
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(reader.read(), timeout=30) == b""
        writer.close()
        # Slow headers: a byte every 0.1 s, for longer than any timeout, never completes.
        slow = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        assert await read_until_closed(rr.url, slow, every=0.1) == b""
        # Idle after an answer (keep-alive) closes too, and a request in time is served.
        reader, writer = await asyncio.open_connection(host, int(port))
        head = raw_request("POST", "/v1/completions", GOOD).replace(b"Connection: close\r\n", b"")
        writer.write(head)
        answer = await asyncio.wait_for(reader.read(), timeout=30)  # returns at EOF: the idle close
        assert answer.startswith(b"HTTP/1.1 200")
        writer.close()
    assert engine.seen == ["/v1/completions"]


async def test_connection_cap(tmp_path: Path) -> None:
    settings = replace(FAST, max_connections=3, idle_timeout=60)
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
    ):
        host, port = rr.url.removeprefix("http://").rsplit(":", 1)
        held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        await wait_until(lambda: rr.counter("specfleet_router_open_connections") >= 3)
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD))
        assert resp is not None
        assert resp.status == 503
        assert_openai_error(resp.json(), code="too_many_connections")
        assert rr.counter("specfleet_router_protocol_errors_total", reason="too_many_connections") == 1
        for _, writer in held:
            writer.close()
        await wait_until(lambda: rr.counter("specfleet_router_open_connections") == 0)
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD))
        assert resp is not None
        assert resp.status == 200
    assert engine.seen == ["/v1/completions"]


async def never_reading_client(url: str, data: bytes) -> socket.socket:
    """A connection that sends `data` and then never reads (a tiny receive window, so it fills soon)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, data)
    return sock


async def test_a_client_that_never_reads_is_dropped(tmp_path: Path) -> None:
    settings = replace(FAST, write_timeout=0.5)
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
    ):
        server = rr.router.server
        assert server is not None
        # An endless stream: without the write timeout the router would wait on this client forever,
        # holding the engine's stream open.
        stream = await never_reading_client(rr.url, raw_request("POST", "/v1/completions?endless=1", GOOD))
        # A large answer of known length (more than the kernel's socket buffers hold).
        whole = await never_reading_client(
            rr.url, raw_request("POST", f"/v1/completions?bytes={16 * 1024 * 1024}", GOOD)
        )
        try:
            # Both are dropped for the write timeout (not waited for as open at the same moment: on a
            # loaded machine the first can already be dropped before the second is accepted).
            await wait_until(
                lambda: rr.counter("specfleet_router_protocol_errors_total", reason="write_timeout") == 2
            )
            await asyncio.wait_for(engine.endless_ended.wait(), 10)
            await wait_until(lambda: server.open_count == 0)
            assert rr.router.in_flight == 0
            assert rr.router.budget.used == 0
            assert rr.counter("specfleet_router_protocol_errors_total", reason="write_timeout") == 2
            labels = {"class": "latency", "pool": "latency"}
            assert (
                rr.counter("specfleet_router_requests_total", **labels, code="499", error="client_closed")
                == 2
            )
        finally:
            stream.close()
            whole.close()
        # Readers are served as before.
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD))
        assert resp is not None
        assert resp.status == 200


async def test_a_frozen_engine_is_ejected_and_its_requests_retried(tmp_path: Path) -> None:
    settings = replace(FAST, stall_seconds=0.3, probe_timeout=0.3, eject_seconds=60)
    with (
        engine_process(time_scale=0.01) as (url_a, proc_a),
        engine_process(time_scale=0.01) as (url_b, _),
    ):
        await asyncio.gather(wait_http(f"{url_a}/health"), wait_http(f"{url_b}/health"))
        config = routing([url_a, url_b], [], endpointSelection=LEAST_OUTSTANDING)
        async with running_router(tmp_path, config, settings) as rr:
            client = rr.client()
            for _ in range(2):  # both engines hold a pooled connection now
                assert (await client.completions.create(model=MODEL, prompt="x", max_tokens=2)).choices
            proc_a.send_signal(signal.SIGSTOP)
            try:
                for stream in (False, True, False, True):
                    if stream:
                        chunks = [
                            c
                            async for c in await client.completions.create(
                                model=MODEL, prompt="x", max_tokens=3, stream=True
                            )
                        ]
                        assert chunks
                    else:
                        assert (
                            await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
                        ).choices
                assert rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="stall") == 1
                assert url_a in rr.router.backends.ejected_until
                assert (
                    rr.counter(
                        "specfleet_router_requests_total",
                        **{"class": "latency", "pool": "latency", "code": "200", "error": "none"},
                    )
                    == 6
                )
            finally:
                proc_a.send_signal(signal.SIGCONT)


async def test_mid_stream_failure_is_counted_as_an_error(tmp_path: Path) -> None:
    with engine_process(time_scale=1.0) as (url, proc):
        await wait_http(f"{url}/health")
        async with running_router(tmp_path, routing([url], [])) as rr:
            client = rr.client()
            await break_stream_midway(client, 3, proc.kill, "interrupted")
            labels = {"class": "latency", "pool": "latency", "code": "200"}
            assert rr.counter("specfleet_router_requests_total", **labels, error="mid_stream") == 1
            assert rr.counter("specfleet_router_requests_total", **labels, error="none") == 0


# ---- hostile bodies, round two: budgets count arrived bytes, bodies are scanned, not built -------------


async def open_body(
    url: str, declared: int, first: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that declares a `declared`-byte body, sends `first` of it and then nothing."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = raw_request("POST", "/v1/completions").split(b"Content-Length")[0]
    writer.write(head + b"Content-Length: %d\r\n\r\n" % declared + first)
    await writer.drain()
    return reader, writer


async def test_a_declared_length_reserves_nothing(tmp_path: Path) -> None:
    """Eight clients that declare the largest body and send one byte lock nobody out."""
    settings = replace(FAST, max_body_bytes=64 * 1024, max_bytes_in_flight=100 * 1024)
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
        aiohttp.ClientSession() as http,
    ):
        held = [(await open_body(rr.url, 64 * 1024, b"{"))[1] for _ in range(8)]
        await wait_until(lambda: rr.router.budget.used == 8)
        async with http.post(f"{rr.url}/v1/completions", data=GOOD) as resp:
            assert resp.status == 200
        for writer in held:
            writer.close()
        await wait_until(lambda: rr.router.budget.used == 0)


async def test_a_stalled_body_is_shed_to_make_room_for_one_that_arrives(tmp_path: Path) -> None:
    settings = replace(FAST, max_body_bytes=64 * 1024, max_bytes_in_flight=100 * 1024)
    body = json.dumps({"model": MODEL, "prompt": "x" * 60_000, "max_tokens": 2}).encode()
    now = [1000.0]
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
        aiohttp.ClientSession() as http,
    ):
        rr.router.budget.clock = lambda: now[0]
        reader, writer = await open_body(rr.url, len(body), body[:-1])
        await wait_until(lambda: rr.router.budget.used == len(body) - 1)
        # Not yet stalled: the newcomer is the one refused.
        async with http.post(f"{rr.url}/v1/completions", data=body) as resp:
            assert resp.status == 503
        now[0] += 1.5  # the first body has sent nothing for longer than the stall allowance
        async with http.post(f"{rr.url}/v1/completions", data=body) as resp:
            assert resp.status == 200
        answer = await asyncio.wait_for(reader.read(), timeout=10)
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"stalled" in answer
        writer.close()
        await wait_until(lambda: rr.router.budget.used == 0)
    assert engine.seen == ["/v1/completions"]


HOSTILE_BODIES = [
    (b'{"model": "%s", "prompt": "x", "temperature": NaN}', "not finite"),
    (b'{"model": "%s", "prompt": "x", "temperature": -Infinity}', "not finite"),
    (b'{"model": "%s", "prompt": "x", "top_p": 1e400}', "not finite"),
    (b'{"model": "%s", "prompt": "\\ud800x"}', "lone surrogate"),
    (b'{"model": "%s", "prompt": "x", "stop": ["\\udc00"]}', "lone surrogate"),
    (b'{"model": "%s", "prompt": "x", "a": ' + b"[" * 70 + b"]" * 70 + b"}", "deeper than"),
]


@pytest.mark.parametrize("pad", [0, 100_000], ids=["parsed", "scanned"])
async def test_bodies_an_engine_should_never_see_are_refused(tmp_path: Path, pad: int) -> None:
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        for template, why in HOSTILE_BODIES:
            body = template.replace(b"%s", MODEL.encode())
            # Padding past the whole-parse size sends the same body through the scanner.
            body = body[:-1] + b', "pad": "' + b"p" * pad + b'"}' if pad else body
            resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", body))
            assert resp is not None
            assert resp.status == 400, (template, resp.body)
            assert_openai_error(resp.json(), code="invalid_request")
            assert why in resp.json()["error"]["message"], resp.json()
        # Many empty objects: refused past the value count, never built.
        flood = b'{"model": "%s", "prompt": "x", "x": [' % MODEL.encode() + b"{}," * 600_000 + b"{}]}"
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", flood))
        assert resp is not None
        assert resp.status == 400
        assert "more than 500000 JSON values" in resp.json()["error"]["message"]
        # A long model name is not echoed in full.
        resp = await raw_exchange(
            rr.url, raw_request("POST", "/v1/completions", json.dumps({"model": "m" * 100_000}).encode())
        )
        assert resp is not None
        assert resp.status == 404
        assert len(resp.body) < 1000
    assert engine.seen == []


def classified(rr: RunningRouter, pool: str) -> float:
    """Requests the router classified into `pool`, whatever the rule."""
    return sum(
        sample.value
        for metric in rr.router.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "specfleet_router_classifications_total" and sample.labels["class"] == pool
    )


async def test_shape_rules_see_chat_without_max_tokens_and_prompt_lists(tmp_path: Path) -> None:
    config = routing(
        ["http://127.0.0.1:1"], [], shape={"batchIfMaxTokensAtLeast": 1024, "batchIfNAtLeast": 16}
    )
    async with recording_engine() as engine:
        config["pools"] = {"latency": {"staticUrls": [engine.url]}, "batch": {"staticUrls": [engine.url]}}
        async with running_router(tmp_path, config) as rr, aiohttp.ClientSession() as http:
            cases = [
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "batch"),
                ("/v1/chat/completions", {"messages": [], "max_tokens": 10}, "latency"),
                ("/v1/completions", {"prompt": "x"}, "latency"),  # vLLM's completions default: 16
                ("/v1/completions", {"prompt": ["a"] * 32, "n": 3, "max_tokens": 5}, "batch"),
                ("/v1/completions", {"prompt": list(range(64)), "n": 3, "max_tokens": 5}, "latency"),
                ("/v1/completions", {"prompt": [[1, 2]] * 8, "n": 2, "max_tokens": 5}, "batch"),
            ]
            for path, doc, pool in cases:
                # (the recording engine has no chat route; the class is what the router counted)
                before = classified(rr, pool)
                async with http.post(f"{rr.url}{path}", json={"model": MODEL, **doc}) as resp:
                    await resp.read()
                after = classified(rr, pool)
                assert after - before == 1, (doc, pool)


async def test_a_trusted_identity_header_sent_twice_is_refused(tmp_path: Path) -> None:
    """A gateway that appends its tenant after the client's would let the client's value win."""
    config = routing([], [], tenantHeaderTrust="Trusted")
    async with recording_engine() as engine:
        config["pools"] = {"latency": {"staticUrls": [engine.url]}}
        async with running_router(tmp_path, config) as rr:
            twice = "x-specfleet-tenant: etl\r\nx-specfleet-tenant: gateway-says\r\n"
            resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD, twice))
            assert resp is not None
            assert resp.status == 400
            assert_openai_error(resp.json(), code="invalid_request", param="x-specfleet-tenant")
            once = "x-specfleet-tenant: etl\r\n"
            resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD, once))
            assert resp is not None
            assert resp.status == 200
    assert engine.seen == ["/v1/completions"]
