"""Forwarding one classified request to an engine and relaying its answer.

Retries happen only while nothing has reached the client: on a refused connection, a dropped
connection (on another engine while one is left), or a stalled engine (no byte for `stall_seconds` and then no answer to a health probe
either, watched by `stall`; a busy engine still answers the probe, a frozen or wedged one does not). A stalled or refusing
engine is ejected. Once the status line is sent, a broken engine ends the response with an SSE error
event (streams) or a dropped connection (anything else), and the request is counted as an error.

An answer that started and then gives no byte for `stream_stall_timeout` is ended the same way (a
small answer not yet relayed gets a clean 504 instead), and its engine is suspected as for a stall
before its first byte: probed, and ejected if the probe fails too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from specfleet_runtime.names import PoolName
from specfleet_runtime.router.affinity import PrefixKeys
from specfleet_runtime.router.backends import Backends
from specfleet_runtime.router.classify import Classification
from specfleet_runtime.router.errors import error_response, sse_error_event
from specfleet_runtime.router.message import Headers, Request
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.reply import Reply
from specfleet_runtime.router.stall import StallWatch, StallWatches
from specfleet_runtime.router.upstream import (
    Client,
    ConnectFailed,
    ConnectTimedOut,
    Disconnected,
    ReadTimedOut,
    Response,
    UpstreamError,
)

log = logging.getLogger(__name__)

# Response headers telling the client (and tests) where a request went and why.
SERVED_POOL_HEADER = "x-specfleet-served-pool"
CLASS_HEADER = "x-specfleet-class"
REASON_HEADER = "x-specfleet-reason"
# RFC 9110 hop-by-hop headers, plus those recomputed for each leg.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)
# What a client says about the path in front of the router: unverifiable, so never passed on (the
# router sets X-Forwarded-For itself, to its peer).
CLIENT_FORWARDING = frozenset(
    {"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "x-real-ip"}
)
NOT_FORWARDED = HOP_BY_HOP | CLIENT_FORWARDING
# Connection options that are not header names of their own.
_CONNECTION_TOKENS = frozenset({"close", "keep-alive", ""})
RESPONSE_HEADERS_SET_BY_SERVER = frozenset({"server", "date"})
DROPPED_RESPONSE_HEADERS = HOP_BY_HOP | RESPONSE_HEADERS_SET_BY_SERVER
# Largest answer of known length that is read whole before it is sent (see Proxy._relay).
WHOLE_BODY_LIMIT = 1024 * 1024
# Largest engine error body (not JSON) read to quote in the router's own OpenAI-format error.
ENGINE_ERROR_QUOTE = 4096
# Status recorded for a request whose client went away before the answer was complete (nginx's 499).
CLIENT_CLOSED = 499
# How long a request dropped by engines that went away (a kill, a drain ending mid-request) waits, in
# all, for its pool's endpoints to change (a new engine ready) when no endpoint is left.
ENDPOINT_WAIT_SECONDS = 10.0
HEALTH_PATH = "/health"
OWN_HEADERS = frozenset({SERVED_POOL_HEADER, CLASS_HEADER, REASON_HEADER})
_NOT_COPIED = DROPPED_RESPONSE_HEADERS | OWN_HEADERS


@dataclass(frozen=True)
class ProxySettings:
    connect_timeout: float
    read_timeout: float
    max_attempts: int
    stall_seconds: float
    probe_timeout: float
    stream_stall_timeout: float = 0.0  # 0: only read_timeout bounds a silence once an answer started

    @property
    def mid_answer_timeout(self) -> float:
        """The longest silence from an engine once its answer started."""
        if self.stream_stall_timeout > 0:
            return min(self.stream_stall_timeout, self.read_timeout)
        return self.read_timeout


@dataclass(frozen=True, slots=True)
class RequestResult:
    """How a request ended, as its metrics record it: the status the client got, the pool that served
    it, and the error label ("none" where it did not fail)."""

    status: int
    pool: PoolName
    error: str = "none"

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(self, status: int, pool: PoolName, error: str = "none") -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "error", error)


@dataclass(frozen=True, slots=True)
class _EngineRequest:
    """One request as every attempt sends and records it, whichever endpoint the attempt goes to."""

    request: Request
    # The canonical path (and query) sent to the engine, never the client's spelling.
    target: str
    body: bytes
    # The client's header fields an engine gets (`forward_headers`).
    headers: list[tuple[str, str]]
    classification: Classification
    # The request's arrival, to time its first byte; None where that time is not observed.
    started: float | None

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(
        self,
        request: Request,
        target: str,
        body: bytes,
        headers: list[tuple[str, str]],
        classification: Classification,
        started: float | None,
    ) -> None:
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "classification", classification)
        object.__setattr__(self, "started", started)


class _Stalled(Exception):
    """The engine gave no byte for stall_seconds and failed its health probe."""


def forward_headers(headers: Headers, remote: str | None) -> list[tuple[str, str]]:
    """The client's header fields an engine gets: no hop-by-hop field (those named in the client's
    `Connection` too, RFC 9110 7.6.1), no forwarding claim; X-Forwarded-For is the router's peer."""
    dropped = NOT_FORWARDED
    if "connection" in headers:
        named = {
            option.strip().lower() for value in headers.getall("connection") for option in value.split(",")
        }
        if not named <= _CONNECTION_TOKENS:
            dropped = dropped | named
    out = [(name, value) for lower, name, value in headers.fields if lower not in dropped]
    if remote:
        out.append(("X-Forwarded-For", remote))
    return out


class Proxy:
    """The engine leg: pooled engine connections (`upstream.Client`), attempts, relaying, and their cost.

    Health probes go through an aiohttp session: they are rare and off the hot path.
    """

    def __init__(
        self,
        settings: ProxySettings,
        backends: Backends,
        metrics: RouterMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.metrics = metrics
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._client: Client | None = None
        self._probe_timeout = aiohttp.ClientTimeout(total=settings.probe_timeout)
        self.watches = StallWatches(settings.stall_seconds, self.probe)
        self._suspicions: set[asyncio.Task[None]] = set()

    def open(self) -> None:
        # No connection limit: the engines queue, the router must not add a second hidden queue.
        # Bytes pass through untouched (no decompression), so Content-Encoding/Length stay true; no
        # cookies are kept.
        self._client = Client(self.settings.connect_timeout, self.settings.read_timeout)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            skip_auto_headers=("User-Agent",),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        for task in list(self._suspicions):
            task.cancel()
        self.watches.close()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("router used outside its lifespan")
        return self._client

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("router used outside its lifespan")
        return self._session

    async def probe(self, url: str) -> bool:
        """Whether the engine answers its health endpoint within probe_timeout."""
        try:
            async with self.session.get(url + HEALTH_PATH, timeout=self._probe_timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def forward(
        self,
        request: Request,
        target: str,
        body: bytes,
        classification: Classification,
        pools: list[PoolName],
        started: float | None,
        prefix: PrefixKeys | None = None,
    ) -> tuple[Reply | None, RequestResult]:
        """Send to an endpoint until one answers; retries happen only before any byte is relayed.

        Endpoints of `pools[0]` first; the next pool only once every endpoint of the first failed.
        `target` is the canonical path (and query) sent to the engine, never the client's spelling.
        `started` (the request's arrival) times its first byte; None for a request that is not
        inference (tokenizer routes), whose time is not observed. `prefix`: the request's prefix keys,
        for pools that pick endpoints by prefix affinity.
        """
        sent = _EngineRequest(
            request, target, body, forward_headers(request.headers, request.remote), classification, started
        )
        tried: set[str] = set()
        dropped: set[str] = set()
        backends = self.backends
        pool = pools[0]
        waited_until = asyncio.get_running_loop().time() + ENDPOINT_WAIT_SECONDS
        for _ in range(self.settings.max_attempts):
            choice = self._pick(pools, tried, dropped, prefix)
            # No endpoint left after engines dropped this request (they went away, as a killed one or
            # a drain that ended mid-request during a flip's rollout): wait, bounded, for the pool's
            # endpoints to change, a new engine to be ready, rather than fail the request.
            while choice is None and dropped:
                remaining = waited_until - asyncio.get_running_loop().time()
                if not await backends.endpoints_change(remaining):
                    break
                choice = self._pick(pools, tried, dropped, prefix)
            if choice is None:
                break
            pool, url = choice
            answer: tuple[Reply, RequestResult] | None = None
            backends.acquire(url)
            try:
                return await self._attempt(sent, pool, url)
            except (_Stalled, UpstreamError) as err:
                answer = self._attempt_failed(err, pool, url, tried, dropped)
            finally:
                backends.release(url)
            if answer is not None:
                return answer
        message = f"no endpoint of pool {pool} accepted the request ({len(tried)} failed)"
        return error_response(502, message, "upstream_unavailable"), RequestResult(
            502, pool, "upstream_unavailable"
        )

    def _attempt_failed(
        self, err: _Stalled | UpstreamError, pool: PoolName, url: str, tried: set[str], dropped: set[str]
    ) -> tuple[Reply, RequestResult] | None:
        """What an attempt that failed before any byte reached the client leads to: None to try again
        (with `url` in `tried`, never again for this request, or in `dropped`), else the client's answer.

        A stall or a failed connection ejects the engine; a dropped connection is retried, elsewhere
        while another endpoint is left; no byte within read_timeout, or any other failure, ends the
        request.
        """
        if isinstance(err, _Stalled):
            ejected = "stall"
        elif isinstance(err, ConnectTimedOut):
            ejected = "connect_timeout"
        elif isinstance(err, ConnectFailed):
            ejected = "connect"
        elif isinstance(err, Disconnected):
            # Often a pooled keep-alive connection the engine closed, or an engine that went away.
            dropped.add(url)
            self.metrics.upstream_errors.labels(pool, "disconnect").inc()
            self.metrics.retries.labels(pool).inc()
            log.warning("pool %s: %s dropped the connection before answering; retrying", pool, url)
            return None
        elif isinstance(err, ReadTimedOut):
            self.metrics.upstream_errors.labels(pool, "timeout").inc()
            log.warning("pool %s: %s sent nothing for %gs", pool, url, self.settings.read_timeout)
            # The client learns nothing of the engine's address.
            message = f"the engine did not answer within {self.settings.read_timeout:g}s"
            return error_response(504, message, "upstream_timeout"), RequestResult(
                504, pool, "upstream_timeout"
            )
        else:
            self.metrics.upstream_errors.labels(pool, "other").inc()
            log.warning("pool %s: request to %s failed: %r", pool, url, err)
            response = error_response(502, f"engine request failed: {err}", "upstream_error")
            return response, RequestResult(502, pool, "upstream_error")
        tried.add(url)
        self.backends.eject(pool, url, ejected)
        return None

    def _pick(
        self, pools: list[PoolName], tried: set[str], dropped: set[str], prefix: PrefixKeys | None
    ) -> tuple[PoolName, str] | None:
        """The first of `pools` with an endpoint not `tried`, and that endpoint: one that has not
        dropped this request while the pool has one, else one that did."""
        for candidate in pools:
            url = self.backends.pick(candidate, tried | dropped, prefix)
            if url is None:
                url = self.backends.pick(candidate, tried, prefix)
            if url is not None:
                return candidate, url
        return None

    async def _attempt(
        self, sent: _EngineRequest, pool: PoolName, base: str
    ) -> tuple[Reply | None, RequestResult]:
        """One engine: wait for its first bytes under a stall watch, then relay (no retry after that)."""
        request = sent.request
        # The task serving this request is its connection's (the server's); asked there, not of asyncio.
        task = request.connection.task
        watch = StallWatch(self.watches, base, task)
        first: bytes | None = None
        upstream: Response | None = None
        try:
            upstream = await self.client.request(request.method, base, sent.target, sent.headers, sent.body)
            length = upstream.content_length
            is_sse = upstream.content_type == "text/event-stream"
            if upstream.status >= 400:
                return await self._engine_error(upstream, sent.classification, pool)
            if not is_sse and length is not None and length <= WHOLE_BODY_LIMIT:
                # A small answer of known length (a non-streaming completion) is read whole and sent in
                # one write: the client cannot use half a JSON document anyway, it saves a send, and an
                # engine failure while reading it can still be answered cleanly (`_whole_failed`).
                upstream.read_timeout = self.settings.mid_answer_timeout
                try:
                    whole = await upstream.read_all()
                except UpstreamError as err:
                    return await self._whole_failed(err, pool, base, watch)
                watch.stop()
                return self._whole_reply(sent, pool, upstream, whole)
            if is_sse:
                # Wait for the first event before answering the client, so an engine that stalls
                # before its first token can still be replaced.
                first = await upstream.read_chunk()
        except asyncio.CancelledError:
            if upstream is not None:
                upstream.close()
            if watch.stalled:
                if task is not None:
                    task.uncancel()
                raise _Stalled() from None
            raise
        except BaseException:
            if upstream is not None:
                upstream.close()
            raise
        finally:
            watch.stop()
        try:
            return await self._relay(sent, pool, base, upstream, first)
        finally:
            upstream.close()

    def _whole_reply(
        self, sent: _EngineRequest, pool: PoolName, upstream: Response, whole: bytes
    ) -> tuple[Reply, RequestResult]:
        """The client's reply for a small answer read whole (its engine connection goes back to the pool)."""
        if sent.started is not None:
            self.metrics.histogram(self.metrics.time_to_first_byte, sent.classification.pool, pool).observe(
                self.clock() - sent.started
            )
        response = Reply(
            upstream.status,
            whole,
            self._response_headers(upstream, sent.classification, pool),
            upstream.reason,
            content_type=None,
        )
        upstream.release()
        return response, RequestResult(upstream.status, pool)

    async def _whole_failed(
        self, err: UpstreamError, pool: PoolName, base: str, watch: StallWatch
    ) -> tuple[Reply, RequestResult]:
        """A small answer that broke while it was read, before any of it reached the client.

        Silence (no byte for mid_answer_timeout): a frozen engine is replaced as if it had stalled
        before its first byte (`_Stalled`, which the attempt's caller retries); a live one with a stuck
        answer gets a clean 504. Any other failure: a 502.
        """
        if isinstance(err, ReadTimedOut):
            watch.stop()
            if not await self.probe(base):
                raise _Stalled() from None
            log.warning("pool %s: %s's answer stalled after its head; 504", pool, base)
            self.metrics.upstream_errors.labels(pool, "mid_stream").inc()
            return error_response(504, self._stalled_message(), "upstream_timeout"), RequestResult(
                504, pool, "mid_stream"
            )
        self.metrics.upstream_errors.labels(pool, "mid_stream").inc()
        log.warning("pool %s: engine answer broke before it was complete: %r", pool, err)
        message = "the engine's answer was interrupted"
        return error_response(502, message, "upstream_interrupted"), RequestResult(502, pool, "mid_stream")

    async def _engine_error(
        self, upstream: Response, classification: Classification, pool: PoolName
    ) -> tuple[Reply, RequestResult]:
        """An engine error: passed on if it is OpenAI-format already, else said in OpenAI's format."""
        status = upstream.status
        try:
            text = (await upstream.read_all(ENGINE_ERROR_QUOTE))[:ENGINE_ERROR_QUOTE]
        except UpstreamError:
            text = b""
        upstream.close()
        error = "none" if status < 500 else "upstream_error"
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            headers = self._response_headers(upstream, classification, pool)
            reply = Reply(status, text, headers, upstream.reason, content_type=None)
            return reply, RequestResult(status, pool, error)
        # A 404/405 page, FastAPI's {"detail": ...}, a proxy's text: quote its start.
        quoted = text.decode("utf-8", "replace").strip()[:200] or (upstream.reason or "")
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "upstream_error")
        return error_response(status, f"engine answered {status}: {quoted}", code), RequestResult(
            status, pool, error
        )

    def _response_headers(
        self, upstream: Response, classification: Classification, pool: PoolName
    ) -> list[tuple[str, str]]:
        headers = [(name, value) for name, value in upstream.headers if name.lower() not in _NOT_COPIED]
        headers.append((SERVED_POOL_HEADER, pool))
        headers.append((CLASS_HEADER, classification.pool))
        headers.append((REASON_HEADER, classification.label))
        return headers

    def _stalled_message(self) -> str:
        return f"the engine's answer stalled: no byte for {self.settings.mid_answer_timeout:g}s"

    def _suspect(self, pool: PoolName, url: str) -> None:
        """An engine went silent mid-answer: probe it as for a stall before its first byte; eject it if
        the probe fails too (nothing is retried: its answer had started). In a task of its own: the
        client, told already, may hang up and cancel its request."""
        task = self.watches.loop.create_task(self._probe_or_eject(pool, url))
        self._suspicions.add(task)
        task.add_done_callback(self._suspicions.discard)

    async def _probe_or_eject(self, pool: PoolName, url: str) -> None:
        if not await self.probe(url):
            self.backends.eject(pool, url, "stall", retried=False)

    async def _relay(
        self, sent: _EngineRequest, pool: PoolName, base: str, upstream: Response, first: bytes | None
    ) -> tuple[None, RequestResult]:
        """Copy the engine's answer to the client as it arrives, unbuffered."""
        request = sent.request
        is_sse = first is not None
        status = upstream.status
        try:
            await request.start(
                status,
                upstream.reason,
                self._response_headers(upstream, sent.classification, pool),
                upstream.content_length,
            )
        except ConnectionError:
            return None, RequestResult(CLIENT_CLOSED, pool, "client_closed")
        chunk = first
        observed = False
        upstream.read_timeout = self.settings.mid_answer_timeout
        while True:
            if chunk is None:
                try:
                    chunk = await upstream.read_chunk()
                except UpstreamError as err:
                    await self._cut_mid_stream(request, pool, base, is_sse, err)
                    return None, RequestResult(status, pool, "mid_stream")
            if not chunk:
                break
            if not observed and sent.started is not None:
                observed = True
                self.metrics.histogram(
                    self.metrics.time_to_first_byte, sent.classification.pool, pool
                ).observe(self.clock() - sent.started)
            try:
                await request.write(chunk)
            except ConnectionError:
                # The client left; closing the engine leg (caller) aborts the request there.
                log.debug("client %s went away mid-response", request.remote)
                return None, RequestResult(CLIENT_CLOSED, pool, "client_closed")
            chunk = None
        try:
            await request.end()
        except ConnectionError:
            return None, RequestResult(CLIENT_CLOSED, pool, "client_closed")
        return None, RequestResult(status, pool)

    async def _cut_mid_stream(
        self, request: Request, pool: PoolName, base: str, is_sse: bool, err: UpstreamError
    ) -> None:
        """End an answer whose engine broke, or went silent (`ReadTimedOut`), once the answer started.

        A silent engine is suspected as for a stall before its first byte (`_suspect`).
        """
        silent = isinstance(err, ReadTimedOut)
        if silent:
            self._suspect(pool, base)
        self.metrics.upstream_errors.labels(pool, "mid_stream").inc()
        log.warning("pool %s: engine stream broke after the response started: %r", pool, err)
        if is_sse:
            # The status line is gone already; an SSE error event is how the client learns of it.
            event = (
                sse_error_event(self._stalled_message(), "upstream_stalled")
                if silent
                else sse_error_event("the engine stream was interrupted", "upstream_interrupted")
            )
            with contextlib.suppress(ConnectionError):
                await request.write(event)
                await request.end()
            return
        # Anything else: drop the connection, so the client sees a short body rather than a bad one.
        request.abort()
