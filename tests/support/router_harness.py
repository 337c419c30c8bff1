"""The router under test: started in the test's event loop over emulated engines, or as processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.router.app import Router, RouterSettings
from specfleet_runtime.router.serving import serve_router
from specfleet_runtime.router.sources import ConfigFileSource
from support.ports import free_port
from support.waiting import wait_until

MODEL = "tiny"
BATCH_KEY = "sk-batch-team"
FAST = RouterSettings(connect_timeout=2.0, read_timeout=30.0, drain_seconds=2.0, housekeeping_seconds=0.05)


# Least outstanding in both pools, for the tests of which engine a retry or an ejection leaves a
# request on: prefix affinity, the default, sends their identical prompts to one engine on purpose.
LEAST_OUTSTANDING = {"latency": {"strategy": "LeastOutstanding"}, "batch": {"strategy": "LeastOutstanding"}}


def routing(latency: list[str], batch: list[str], **extra: Any) -> dict[str, Any]:
    """A routing.json document with static pools; a pool without URLs is left out (that is invalid)."""
    pools = {name: {"staticUrls": urls} for name, urls in (("latency", latency), ("batch", batch)) if urls}
    doc: dict[str, Any] = {"servedModelName": MODEL, "pools": pools}
    doc.update(extra)
    return doc


@dataclass
class RunningRouter:
    url: str
    router: Router
    config_path: Path
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    def client(self, **kw: Any) -> openai.AsyncOpenAI:
        """An OpenAI client on the router, closed with it; no client-side retries, so errors show."""
        kw.setdefault("api_key", "sk-anything")
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", max_retries=0, timeout=30, **kw)
        self.clients.append(client)
        return client

    def write_config(self, doc: dict[str, Any] | str) -> None:
        text = doc if isinstance(doc, str) else json.dumps(doc)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.config_path)  # atomic, like a ConfigMap volume update

    def counter(self, name: str, **labels: str) -> float:
        value = self.router.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


@asynccontextmanager
async def running_router(
    tmp_path: Path,
    config: dict[str, Any],
    settings: RouterSettings = FAST,
    slice_watch_factory: Any = None,
) -> AsyncIterator[RunningRouter]:
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(config))
    router = Router(settings, ConfigFileSource(path, poll_seconds=0.05), slice_watch_factory)
    async with serve_router(router, "127.0.0.1", 0) as runner:
        port = runner.addresses[0][1]
        await wait_until(lambda: router.config is not None, what="the routing config loaded")
        running = RunningRouter(f"http://127.0.0.1:{port}", router, path)
        try:
            yield running
        finally:
            for client in running.clients:
                await client.close()


def emulator_config(time_scale: float = 0.1) -> EmulatorConfig:
    return EmulatorConfig(served_model_name=MODEL, model="m", time_scale=time_scale)


def assert_openai_error(body: Any, code: str | None = None, param: str | None = None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param


@contextmanager
def engine_process(time_scale: float) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The emulator as a process (so it can be SIGKILLed); yields its URL and process."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "specfleet_runtime.emulator", "--model", "m", "--served-model-name", MODEL,
        "--port", str(port), "--host", "127.0.0.1", "--time-scale", str(time_scale),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


async def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not come up")
            await asyncio.sleep(0.05)


async def break_stream_midway(
    client: openai.AsyncOpenAI,
    after: int,
    breaking: Callable[[], object],
    match: str,
    timeout: float | None = None,
) -> int:
    """Chunks read of a long stream whose engine `breaking` cuts after `after`, ending in error `match`."""
    stream = await client.completions.create(
        model=MODEL, prompt="x", max_tokens=5000, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0

    async def consume() -> None:
        nonlocal received
        async for _ in stream:
            received += 1
            if received == after:
                breaking()

    with pytest.raises(openai.APIError, match=match):
        await asyncio.wait_for(consume(), timeout)
    return received


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_exchange(url: str, data: bytes, timeout: float = 10.0) -> RawResponse | None:
    """Send `data` as is on a fresh connection (paths unnormalized, headers unchecked); read the answer.

    Returns None when the server closed the connection without answering.
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
        return RawResponse(status, headers, body)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    finally:
        writer.close()


def raw_request(method: str, target: str, body: bytes = b"", extra: str = "") -> bytes:
    """An HTTP/1.1 request with the request target exactly as given."""
    head = f"{method} {target} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n{extra}"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": MODEL,
    "choices": [{"index": 0, "text": " ok", "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
GOOD = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}).encode()


@dataclass
class RecordingEngine:
    """An engine that serves /v1/completions, a /metrics and an admin endpoint, and records every path."""

    url: str = ""
    seen: list[str] = field(default_factory=list)
    admin_calls: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when an `?endless=1` stream ends (its client, the router, went away).
    endless_ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.raw_path)
        await request.read()
        if request.path.startswith("/admin"):
            self.admin_calls += 1
            return web.json_response({"changed": True})
        if request.path == "/metrics":
            return web.Response(text="engine_secret_metric 1\n")
        if request.path == "/health":
            return web.Response()
        if request.path not in ("/v1/completions", "/v1/chat/completions"):
            return web.json_response({"detail": "Not Found"}, status=404)  # FastAPI's shape
        fail = request.query.get("fail")
        if fail == "405":
            return web.Response(status=405, text="Method Not Allowed")
        if fail == "404":
            return web.json_response({"detail": "Not Found"}, status=404)
        if request.query.get("wait"):
            await self.gate.wait()
        if request.query.get("endless"):
            return await self._endless(request)
        if request.query.get("bytes"):
            return web.Response(body=b"x" * int(request.query["bytes"]), content_type="application/json")
        return web.json_response(COMPLETION)

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        """An SSE stream of 64 KiB events that ends only when its reader goes away."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b"data: " + b"x" * 65536 + b"\n\n"
        try:
            while True:
                await response.write(event)
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.CancelledError):
            self.endless_ended.set()
            raise


@asynccontextmanager
async def serve_handler(
    handler: Callable[[web.Request], Any], client_max_size: int = 64 * 1024 * 1024
) -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1 answering every path with `handler`; yields its URL."""
    app = web.Application(client_max_size=client_max_size)
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def recording_engine() -> AsyncIterator[RecordingEngine]:
    engine = RecordingEngine()
    async with serve_handler(engine.handle) as engine.url:
        try:
            yield engine
        finally:
            engine.gate.set()
