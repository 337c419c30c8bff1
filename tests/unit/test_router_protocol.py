"""The router's HTTP edges against hostile clients and broken engines (hardening, round two).

Heads it refuses (Host, version, header count, protocol upgrades), what of a client's head never
reaches an engine (trailer fields, hop-by-hop and forwarding headers), streams whose engine freezes
mid-way, the messages it sends back, and what its /readyz says about static engines. Requests go as
raw bytes or through the official openai client; behind the router sits an engine that records the
headers it was sent, or the engine emulator as a process.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from specfleet_runtime.router.classify import sha256_hex
from support.ports import free_port
from support.router_harness import (
    BATCH_KEY,
    COMPLETION,
    FAST,
    GOOD,
    assert_openai_error,
    break_stream_midway,
    engine_process,
    raw_exchange,
    raw_request,
    routing,
    running_router,
    serve_handler,
    wait_http,
)
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


@dataclass
class HeaderEngine:
    """Serves /v1/completions and /health; keeps the header fields of every completion request."""

    url: str = ""
    requests: list[list[tuple[str, str]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response()
        self.requests.append(list(request.headers.items()))
        await request.read()
        return web.json_response(COMPLETION)

    def names(self, index: int = -1) -> set[str]:
        return {name.lower() for name, _ in self.requests[index]}

    def values(self, name: str, index: int = -1) -> list[str]:
        return [value for key, value in self.requests[index] if key.lower() == name]


@asynccontextmanager
async def header_engine() -> AsyncIterator[HeaderEngine]:
    engine = HeaderEngine()
    async with serve_handler(engine.handle, client_max_size=1024**2) as engine.url:
        yield engine


def head_only(request: bytes) -> bytes:
    """`raw_request`'s head without its Content-Length line and final blank line."""
    return request.split(b"Content-Length")[0]


# ---- what of a client's request reaches an engine --------------------------------------------------


async def test_trailer_fields_are_dropped_never_forwarded_nor_classified(tmp_path: Path) -> None:
    config = routing([], [], tenantRules=[{"pool": "batch", "apiKeySha256": [sha256_hex(BATCH_KEY)]}])
    async with header_engine() as engine:
        config["pools"] = {"latency": {"staticUrls": [engine.url]}, "batch": {"staticUrls": [engine.url]}}
        async with running_router(tmp_path, config) as rr:
            trailers = (
                f"Authorization: Bearer {BATCH_KEY}\r\nX-Forwarded-For: 203.0.113.9\r\n"
                "X-Trailer-Probe: yes\r\n"
            )
            chunked = b"%x\r\n%b\r\n0\r\n" % (len(GOOD), GOOD) + trailers.encode() + b"\r\n"
            head = head_only(raw_request("POST", "/v1/completions"))
            resp = await raw_exchange(
                rr.url, head + b"Trailer: Authorization\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
            )
            assert resp is not None
            assert resp.status == 200
            # The batch key in a trailer classifies nothing ...
            assert (resp.headers["x-specfleet-class"], resp.headers["x-specfleet-reason"]) == (
                "latency",
                "default",
            )
            # ... and no trailer field reaches the engine.
            assert not {"authorization", "x-trailer-probe", "trailer"} & engine.names()
            assert engine.values("x-forwarded-for") == ["127.0.0.1"]


async def test_hop_by_hop_and_client_forwarding_headers_stay_at_the_router(tmp_path: Path) -> None:
    async with header_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        extra = (
            "Connection: keep-alive, X-Hop-Secret\r\nX-Hop-Secret: 1\r\nForwarded: for=198.51.100.7\r\n"
            "X-Real-IP: 198.51.100.7\r\nX-Forwarded-Host: admin.internal\r\n"
            "X-Forwarded-For: 198.51.100.7\r\nX-Forwarded-For: 198.51.100.8\r\nX-Kept: yes\r\n"
        )
        request = raw_request("POST", "/v1/completions", GOOD, extra).replace(
            b"Connection: close\r\n", b"", 1
        )
        resp = await raw_exchange(rr.url, request)
        assert resp is not None
        assert resp.status == 200
        names = engine.names()
        assert not {"x-hop-secret", "forwarded", "x-real-ip", "x-forwarded-host"} & names
        assert engine.values("x-kept") == ["yes"]
        # The router vouches only for its own peer.
        assert engine.values("x-forwarded-for") == ["127.0.0.1"]


# ---- heads the router does not serve ----------------------------------------------------------------


async def test_heads_without_one_host_or_of_another_version_are_refused(tmp_path: Path) -> None:
    async with header_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        good = raw_request("POST", "/v1/completions", GOOD)
        refused = {
            "no Host": good.replace(b"Host: router\r\n", b""),
            "two Hosts": good.replace(b"Host: router\r\n", b"Host: router\r\nHost: engine\r\n"),
            "HTTP/2.0": good.replace(b" HTTP/1.1\r\n", b" HTTP/2.0\r\n", 1),
            "HTTP/0.9": good.replace(b" HTTP/1.1\r\n", b" HTTP/0.9\r\n", 1),
        }
        for case, data in refused.items():
            resp = await raw_exchange(rr.url, data)
            assert resp is not None, case
            assert resp.status == 400, case
            assert_openai_error(resp.json(), code="invalid_request")
        assert engine.requests == []
        # HTTP/1.0 does not require Host: served.
        http10 = good.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1).replace(b"Host: router\r\n", b"")
        resp = await raw_exchange(rr.url, http10)
        assert resp is not None
        assert resp.status == 200
        assert len(engine.requests) == 1


async def test_header_count_is_bounded(tmp_path: Path) -> None:
    async with header_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        # raw_request sends four fields of its own (Host, Connection, Content-Type, Content-Length).
        at_limit = "".join(f"X-Field-{i}: {i}\r\n" for i in range(96))
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD, at_limit))
        assert resp is not None
        assert resp.status == 200
        past = "".join(f"X-Field-{i}: {i}\r\n" for i in range(97))
        resp = await raw_exchange(rr.url, raw_request("POST", "/v1/completions", GOOD, past))
        assert resp is not None
        assert resp.status == 431
        assert_openai_error(resp.json(), code="request_header_fields_too_large")
        assert "100" in resp.json()["error"]["message"]
        # Trailer fields count too: past the limit the request is refused, never forwarded.
        many = "".join(f"X-Trailer-{i}: {i}\r\n" for i in range(200)).encode()
        chunked = b"%x\r\n%b\r\n0\r\n" % (len(GOOD), GOOD) + many + b"\r\n"
        head = head_only(raw_request("POST", "/v1/completions"))
        resp = await raw_exchange(rr.url, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        assert resp is not None
        assert resp.status == 400
        assert_openai_error(resp.json(), code="invalid_request")
    assert len(engine.requests) == 1


async def test_protocol_upgrades_get_a_clear_refusal(tmp_path: Path) -> None:
    async with header_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        for upgrade in ("websocket", "h2c"):
            extra = f"Upgrade: {upgrade}\r\n"
            request = raw_request("POST", "/v1/completions", GOOD, extra).replace(
                b"Connection: close", b"Connection: Upgrade"
            )
            resp = await raw_exchange(rr.url, request)
            assert resp is not None
            assert resp.status == 400
            assert_openai_error(resp.json(), code="upgrade_not_supported")
            message = resp.json()["error"]["message"]
            assert "upgrade" in message.lower()
            assert "JSON" not in message
    assert engine.requests == []


# ---- what the router says back ----------------------------------------------------------------------


async def test_a_long_model_name_is_not_echoed_in_full(tmp_path: Path) -> None:
    async with header_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        name = "m" * 100_000
        body = json.dumps({"model": name, "prompt": "x", "max_tokens": 2}).encode()
        for request in (
            raw_request("POST", "/v1/completions", body),
            raw_request("GET", f"/v1/models/{name[:10_000]}"),
        ):
            resp = await raw_exchange(rr.url, request)
            assert resp is not None
            assert resp.status == 404
            assert_openai_error(resp.json(), code="model_not_found")
            message = resp.json()["error"]["message"]
            assert len(message) < 200
            assert "m" * 100 + "…" in message
    assert engine.requests == []


# ---- streams that stall mid-way ---------------------------------------------------------------------


async def test_a_stream_whose_engine_freezes_mid_way_ends_with_an_error_event(tmp_path: Path) -> None:
    # (read_timeout past the test's own timeout: only the stall timeout can end the stream in time; the
    # stall timeout well above a loaded machine's gap between two tokens, so only the freeze trips it)
    settings = replace(
        FAST, stream_stall_timeout=2.0, read_timeout=300.0, probe_timeout=0.3, eject_seconds=60
    )
    with engine_process(time_scale=1.0) as (url, proc):
        await wait_http(f"{url}/health")
        async with running_router(tmp_path, routing([url], []), settings) as rr:
            client = rr.client()
            try:
                await break_stream_midway(client, 3, lambda: proc.send_signal(signal.SIGSTOP), "stalled")
                # Suspected as for a stall before the first byte: its health probe failed, it is ejected.
                await wait_until(lambda: url in rr.router.backends.ejected_until)
                assert rr.counter("specfleet_router_upstream_errors_total", pool="latency", kind="stall") == 1
                labels = {"class": "latency", "pool": "latency", "code": "200"}
                assert rr.counter("specfleet_router_requests_total", **labels, error="mid_stream") == 1
            finally:
                proc.send_signal(signal.SIGCONT)


# ---- readiness ----------------------------------------------------------------------------------------


async def test_readyz_needs_a_static_engine_that_answers(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    async with (
        header_engine() as engine,
        running_router(tmp_path, routing([nobody], [])) as rr,
        aiohttp.ClientSession() as http,
    ):

        async def readyz() -> tuple[int, dict[str, object]]:
            async with http.get(f"{rr.url}/readyz") as resp:
                return resp.status, await resp.json()

        status, body = await readyz()
        assert status == 503
        assert "health" in str(body["reason"])
        rr.write_config(routing([nobody, engine.url], []))
        await wait_until(lambda: len(rr.router.pool_endpoints["latency"]) == 2)
        # New static endpoints are checked at the next /readyz: one answers, so the router is ready.
        status, body = await readyz()
        assert (status, body["reason"]) == (200, "ok")
