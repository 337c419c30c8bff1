"""The router's aiohttp application: OpenAI-compatible reverse proxy over the latency and batch pools.

Request path: read the body (size-limited) -> parse and check it -> `extract_facts` -> tracker verdict
-> `classify` -> `resolve_pool` (fallback) -> `choose_endpoint` (least outstanding) -> forward, retrying
on another endpoint only while nothing has reached the client -> relay the response chunk by chunk.
Everything long-lived (HTTP client session, config source, EndpointSlice watches) starts and stops in
the app's lifespan (`cleanup_ctx`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specfleet_runtime.router.classify import (
    Classification,
    ClientLoadTracker,
    InvalidRequest,
    Reason,
    classify,
    extract_facts,
)
from specfleet_runtime.router.endpoints import (
    AddressMap,
    choose_endpoint,
    endpoints_from_slices,
    other_pool,
    resolve_pool,
)
from specfleet_runtime.router.errors import error_response, sse_error_event
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.sources import ConfigSource, EndpointWatch, SliceWatchFactory
from specfleet_runtime.routing_config import POOLS, PoolName, RoutingConfig

log = logging.getLogger(__name__)

# Paths whose JSON body the router reads to check the model and classify by shape.
INFERENCE_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
# Response headers telling the client (and tests) where a request went and why.
SERVED_POOL_HEADER = "x-specfleet-served-pool"
CLASS_HEADER = "x-specfleet-class"
REASON_HEADER = "x-specfleet-reason"
# RFC 9110 hop-by-hop headers, plus those aiohttp recomputes for each leg.
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
RESPONSE_HEADERS_SET_BY_SERVER = frozenset({"server", "date"})
# Request key set once the response's status line went out: no error response is possible after it.
RESPONSE_STARTED = web.RequestKey("specfleet_response_started", bool)
# Largest answer of known length that is read whole before it is sent (see Router._relay).
WHOLE_BODY_LIMIT = 1024 * 1024
# Status recorded for a request whose client went away before the answer was complete (nginx's 499).
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class RouterSettings:
    """Process-level knobs (command-line flags); routing itself lives in `RoutingConfig`."""

    namespace: str = "default"
    connect_timeout: float = 5.0
    # Between two reads from an engine (also the wait for the first byte of a non-streaming answer).
    read_timeout: float = 600.0
    max_body_bytes: int = 32 * 1024 * 1024
    # 0 means no cap; above the cap the router answers 429.
    max_in_flight: int = 0
    max_attempts: int = 3
    # How long an endpoint that refused a connection is skipped while others are available.
    eject_seconds: float = 5.0
    drain_seconds: float = 30.0
    housekeeping_seconds: float = 1.0
    # Rewrites EndpointSlice addresses (a test bed's fake pod IPs to loopback twins); empty in clusters.
    endpoint_address_map: AddressMap = ()


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refusing (BodyTooLarge) past `limit` bytes without reading further."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge()
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or InvalidRequest (400) for anything else."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as err:
        # ValueError covers JSONDecodeError and bad UTF-8; RecursionError very deep nesting.
        raise InvalidRequest(f"request body is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object")
    return doc


def forward_headers(headers: Mapping[str, str], remote: str | None) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in HOP_BY_HOP:
            out.add(name, value)
    if remote:
        previous = headers.get("x-forwarded-for")
        out["X-Forwarded-For"] = f"{previous}, {remote}" if previous else remote
    return out


class Router:
    """Routing state (config, endpoints, load) and the request handlers."""

    def __init__(
        self,
        settings: RouterSettings,
        config_source: ConfigSource | None,
        slice_watch_factory: SliceWatchFactory | None = None,
        metrics: RouterMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.config_source = config_source
        self.slice_watch_factory = slice_watch_factory
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.clock = clock
        self.config: RoutingConfig | None = None
        self._config_text: str | None = None
        # Watches keyed by (pool, namespace, service, port), and what each last reported.
        self._watches: dict[tuple[str, str, str, int], EndpointWatch] = {}
        self._discovered: dict[tuple[str, str, str, int], tuple[str, ...]] = {}
        self.pool_endpoints: dict[str, tuple[str, ...]] = dict.fromkeys(POOLS, ())
        self.outstanding: dict[str, int] = {}
        self._ejected_until: dict[str, float] = {}
        self.tracker = ClientLoadTracker()
        self.in_flight = 0
        self.draining = False
        self._turn = 0
        self._created = int(time.time())
        self._session: aiohttp.ClientSession | None = None

    # ---- configuration and endpoints -------------------------------------------------------------

    def apply_config_text(self, text: str | None, origin: str) -> bool:
        """Validate and apply a config document; a bad one is logged and the last good one kept."""
        if text is None:
            log.warning("%s holds no routing config; keeping the last good one", origin)
            return False
        if text == self._config_text:
            return True
        try:
            config = RoutingConfig.from_json(text)
        except ValueError as err:
            self.metrics.config_reloads.labels("rejected").inc()
            kept = "keeping the last good one" if self.config else "no config loaded yet"
            log.error("rejected routing config from %s: %s; %s", origin, err, kept)
            return False
        self.config = config
        self._config_text = text
        self.metrics.config_reloads.labels("applied").inc()
        log.info(
            "applied routing config from %s (model %s, pools %s, fallback %s)",
            origin,
            config.served_model_name,
            ",".join(sorted(config.pools)),
            config.fallback,
        )
        self._reconcile_watches()
        self._recompute_endpoints()
        return True

    def _reconcile_watches(self) -> None:
        config = self.config
        wanted: set[tuple[str, str, str, int]] = set()
        if config is not None:
            for pool, backend in config.pools.items():
                if backend.service:
                    namespace, _, service = backend.service.rpartition("/")
                    wanted.add((pool, namespace or self.settings.namespace, service, backend.port))
        for key in set(self._watches) - wanted:
            self._watches.pop(key).stop()
            self._discovered.pop(key, None)
        for key in sorted(wanted - set(self._watches)):
            pool, namespace, service, _ = key
            if self.slice_watch_factory is None:
                log.error(
                    "pool %s names service %s/%s but the router has no Kubernetes access; "
                    "using its static URLs only",
                    pool,
                    namespace,
                    service,
                )
                continue
            try:
                self._watches[key] = self.slice_watch_factory(namespace, service, self._slice_publisher(key))
            except Exception:
                log.exception("cannot watch EndpointSlices of %s/%s for pool %s", namespace, service, pool)
            else:
                log.info("watching EndpointSlices of %s/%s for pool %s", namespace, service, pool)

    def _slice_publisher(self, key: tuple[str, str, str, int]) -> Callable[[list[dict[str, Any]]], None]:
        loop = asyncio.get_running_loop()

        def publish(slices: list[dict[str, Any]]) -> None:
            # Called from the watch thread: hop onto the loop, the only place state changes.
            loop.call_soon_threadsafe(self.apply_slices, key, slices)

        return publish

    def apply_slices(self, key: tuple[str, str, str, int], slices: list[dict[str, Any]]) -> None:
        if key not in self._watches:
            return  # a late report from a watch the last config change stopped
        urls = endpoints_from_slices(slices, key[3], self.settings.endpoint_address_map)
        if self._discovered.get(key) != urls:
            log.info("pool %s: %d ready endpoint(s) from %s/%s", key[0], len(urls), key[1], key[2])
        self._discovered[key] = urls
        self._recompute_endpoints()

    def _recompute_endpoints(self) -> None:
        config = self.config
        for pool in POOLS:
            urls: set[str] = set()
            backend = config.pools.get(pool) if config else None
            if backend is not None:
                urls.update(u.rstrip("/") for u in backend.static_urls)
                for key, found in self._discovered.items():
                    if key[0] == pool:
                        urls.update(found)
            self.pool_endpoints[pool] = tuple(sorted(urls))
            self.metrics.endpoints.labels(pool).set(len(urls))

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.config is None:
            return False, "no routing config loaded"
        if not any(self.pool_endpoints.values()):
            return False, "no pool has a ready endpoint"
        return True, "ok"

    # ---- lifespan ---------------------------------------------------------------------------------

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """Start the client session, config source and housekeeping; stop them all on exit."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.settings.connect_timeout, sock_read=self.settings.read_timeout
        )
        # No pool limit: the engines queue, the router must not add a second hidden queue.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        # auto_decompress off: bytes pass through untouched, so Content-Encoding/Length stay true.
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        tasks = [asyncio.create_task(self._housekeeping(), name="router-housekeeping")]
        if self.config_source is not None:
            tasks.append(
                asyncio.create_task(
                    self.config_source.run(self.apply_config_text),
                    name=f"config {self.config_source.description}",
                )
            )
        for task in tasks:
            task.add_done_callback(_log_task_end)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for watch in self._watches.values():
                watch.stop()
            self._watches.clear()
            await self._session.close()
            self._session = None

    async def on_shutdown(self, app: web.Application) -> None:
        # Runs when the listening socket is closed, before in-flight requests are awaited.
        self.draining = True
        log.info("draining: %d request(s) in flight", self.in_flight)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.settings.housekeeping_seconds)
            now = self.clock()
            if self.config is not None:
                for _ in self.tracker.expire(now, self.config.auto_segmentation):
                    self.metrics.segment_transitions.labels("from_batch").inc()
            self.metrics.segmented_clients.set(self.tracker.segmented_count())
            for url in [u for u, until in self._ejected_until.items() if until <= now]:
                del self._ejected_until[url]

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("router used outside its app's lifespan")
        return self._session

    # ---- small handlers ---------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        ok, reason = self.ready()
        body = {
            "status": "ready" if ok else "not ready",
            "reason": reason,
            "endpoints": {pool: len(urls) for pool, urls in self.pool_endpoints.items()},
        }
        return web.json_response(body, status=200 if ok else 503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        self.metrics.segmented_clients.set(self.tracker.segmented_count())
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    def _model_card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "specfleet",
            "root": name,
            "parent": None,
        }

    async def models(self, request: web.Request) -> web.Response:
        if self.config is None:
            return error_response(503, "the router has no routing config yet", "not_ready")
        return web.json_response(
            {"object": "list", "data": [self._model_card(self.config.served_model_name)]}
        )

    async def model(self, request: web.Request) -> web.Response:
        if self.config is None:
            return error_response(503, "the router has no routing config yet", "not_ready")
        name = request.match_info["model"]
        if name != self.config.served_model_name:
            return error_response(404, f"The model `{name}` does not exist.", "model_not_found", "model")
        return web.json_response(self._model_card(name))

    # ---- the proxy --------------------------------------------------------------------------------

    def _refuse(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        classification: Classification | None = None,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        klass = classification.pool if classification else "none"
        self.metrics.requests.labels(klass, "none", str(status)).inc()
        return error_response(status, message, code, param, headers)

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        """Entry point for every proxied /v1/* request."""
        received = self.clock()
        inference = request.path in INFERENCE_PATHS
        if inference and request.method != "POST":
            # The catch-all /v1 route would otherwise proxy a GET of an inference path.
            return self._refuse(
                405,
                f"{request.method} is not allowed on {request.path}",
                "method_not_allowed",
                headers={"Allow": "POST"},
            )
        config = self.config
        if config is None:
            return self._refuse(503, "the router has no routing config yet", "not_ready")
        try:
            body = await read_body(request, self.settings.max_body_bytes)
        except BodyTooLarge:
            return self._refuse(
                413, f"request body exceeds {self.settings.max_body_bytes} bytes", "request_too_large"
            )
        try:
            doc = parse_json_object(body) if inference else None
            if doc is not None:
                model = doc.get("model")
                if model is not None and not isinstance(model, str):
                    raise InvalidRequest("'model' must be a string", "model")
                if model is not None and model != config.served_model_name:
                    return self._refuse(
                        404, f"The model `{model}` does not exist.", "model_not_found", "model"
                    )
            facts = extract_facts(config, request.headers, doc, request.remote)
        except InvalidRequest as err:
            return self._refuse(400, err.message, "invalid_request", err.param)
        if self.settings.max_in_flight and self.in_flight >= self.settings.max_in_flight:
            return self._refuse(
                429,
                "too many requests in flight at the router",
                "too_many_requests",
                headers={"Retry-After": "1"},
            )

        verdict = self.tracker.begin(facts.client_id, self.clock(), config.auto_segmentation)
        try:
            if verdict.transition is not None:
                self.metrics.segment_transitions.labels(verdict.transition).inc()
                log.info(
                    "client %s %s (in flight: %d)",
                    facts.client_id,
                    "segmented as batch" if verdict.transition == "to_batch" else "back to normal",
                    self.tracker.in_flight(facts.client_id),
                )
            classification = classify(config, facts, verdict.segmented)
            self.metrics.classifications.labels(classification.pool, classification.reason.value).inc()
            if (
                classification.reason == Reason.AUTO_SEGMENTATION
                and classification.pool != config.default_pool
            ):
                self.metrics.reclassifications.labels(config.default_pool, classification.pool).inc()
            pool = self._resolve(classification.pool, config)
            if pool is None:
                return self._refuse(
                    503,
                    f"no ready endpoint for pool {classification.pool}",
                    "no_endpoints",
                    classification=classification,
                )
            pools = [pool]
            if config.fallback == "otherPool":
                # Refused connections may still move the request on, as long as nothing was sent.
                pools.append(other_pool(pool))
            return await self._forward(request, body, classification, pools, received)
        finally:
            self.tracker.end(facts.client_id, self.clock(), config.auto_segmentation)

    def _healthy(self, pool: PoolName) -> tuple[str, ...]:
        now = self.clock()
        return tuple(u for u in self.pool_endpoints[pool] if self._ejected_until.get(u, 0.0) <= now)

    def _resolve(self, wanted: PoolName, config: RoutingConfig) -> PoolName | None:
        """Prefer a pool whose endpoints are not ejected; if none has one, any pool with endpoints."""
        healthy = {pool: self._healthy(pool) for pool in POOLS}
        return resolve_pool(wanted, healthy, config.fallback) or resolve_pool(
            wanted, self.pool_endpoints, config.fallback
        )

    async def _forward(
        self,
        request: web.Request,
        body: bytes,
        classification: Classification,
        pools: list[PoolName],
        started: float,
    ) -> web.StreamResponse:
        gauge_labels = (classification.pool, pools[0])
        # What is recorded if the client goes away and the handler is cancelled.
        status, served_by = CLIENT_CLOSED, pools[0]
        self.in_flight += 1
        self.metrics.in_flight.labels(*gauge_labels).inc()
        try:
            response, status, served_by = await self._attempt(request, body, classification, pools, started)
            return response
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.labels(*gauge_labels).dec()
            labels = (classification.pool, served_by)
            if served_by != classification.pool:
                self.metrics.fallbacks.labels(*labels).inc()
            self.metrics.requests.labels(*labels, str(status)).inc()
            self.metrics.duration.labels(*labels).observe(self.clock() - started)

    async def _attempt(
        self,
        request: web.Request,
        body: bytes,
        classification: Classification,
        pools: list[PoolName],
        started: float,
    ) -> tuple[web.StreamResponse, int, PoolName]:
        """Send to an endpoint until one answers; retries happen only before any byte is relayed.

        Endpoints of `pools[0]` first; the next pool only once every endpoint of the first has refused
        a connection. Returns the response, the status to record and the pool that served it.
        """
        headers = forward_headers(request.headers, request.remote)
        data = body if body or request.method not in ("GET", "HEAD") else None
        tried: set[str] = set()
        pool = pools[0]
        for _ in range(self.settings.max_attempts):
            url = None
            for candidate in pools:
                url = self._pick(candidate, tried)
                if url is not None:
                    pool = candidate
                    break
            if url is None:
                break
            self.outstanding[url] = self.outstanding.get(url, 0) + 1
            try:
                try:
                    upstream = await self.session.request(
                        request.method,
                        url + request.path_qs,
                        data=data,
                        headers=headers,
                        allow_redirects=False,
                    )
                except aiohttp.ConnectionTimeoutError:
                    self._connect_failed(pool, url, tried, "connect_timeout")
                    continue
                except aiohttp.ClientConnectorError:
                    self._connect_failed(pool, url, tried, "connect")
                    continue
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    # Often a pooled keep-alive connection the engine closed: try again, same URL allowed.
                    self.metrics.upstream_errors.labels(pool, "disconnect").inc()
                    self.metrics.retries.labels(pool).inc()
                    log.warning("pool %s: %s dropped the connection before answering; retrying", pool, url)
                    continue
                except TimeoutError:
                    self.metrics.upstream_errors.labels(pool, "timeout").inc()
                    return self._upstream_error(
                        504,
                        f"engine {url} did not answer within {self.settings.read_timeout:g}s",
                        "upstream_timeout",
                        pool,
                    )
                except aiohttp.ClientError as err:
                    self.metrics.upstream_errors.labels(pool, "other").inc()
                    log.warning("pool %s: request to %s failed: %r", pool, url, err)
                    return self._upstream_error(502, f"engine request failed: {err}", "upstream_error", pool)
                async with upstream:
                    response, status = await self._relay(request, upstream, classification, pool, started)
                    return response, status, pool
            finally:
                self.outstanding[url] -= 1
                if not self.outstanding[url]:
                    del self.outstanding[url]
        return self._upstream_error(
            502,
            f"no endpoint of pool {pool} accepted the request ({len(tried)} refused a connection)",
            "upstream_unavailable",
            pool,
        )

    def _upstream_error(
        self, status: int, message: str, code: str, pool: PoolName
    ) -> tuple[web.StreamResponse, int, PoolName]:
        return error_response(status, message, code), status, pool

    def _pick(self, pool: PoolName, tried: set[str]) -> str | None:
        endpoints = self.pool_endpoints.get(pool, ())
        now = self.clock()
        ejected = {u for u in endpoints if self._ejected_until.get(u, 0.0) > now}
        self._turn += 1
        url = choose_endpoint(endpoints, self.outstanding, tried | ejected, self._turn)
        if url is None:
            # Every untried endpoint is ejected: better to try one than to fail without trying.
            url = choose_endpoint(endpoints, self.outstanding, tried, self._turn)
        return url

    def _connect_failed(self, pool: PoolName, url: str, tried: set[str], kind: str) -> None:
        tried.add(url)
        self._ejected_until[url] = self.clock() + self.settings.eject_seconds
        self.metrics.upstream_errors.labels(pool, kind).inc()
        self.metrics.retries.labels(pool).inc()
        log.warning(
            "pool %s: cannot connect to %s (%s); ejected for %gs",
            pool,
            url,
            kind,
            self.settings.eject_seconds,
        )

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        classification: Classification,
        pool: PoolName,
        started: float,
    ) -> tuple[web.StreamResponse, int]:
        """Copy the engine's answer to the client as it arrives, unbuffered; returns the status to record.

        A small answer of known length (a non-streaming completion) is read whole first and sent in one
        write: the client could not use half a JSON document anyway, it saves a send per request, and an
        engine failure while reading it can still be answered with a clean 502.
        """
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in upstream.headers.items():
            lower = name.lower()
            if lower not in HOP_BY_HOP and lower not in RESPONSE_HEADERS_SET_BY_SERVER:
                headers.add(name, value)
        headers[SERVED_POOL_HEADER] = pool
        headers[CLASS_HEADER] = classification.pool
        headers[REASON_HEADER] = classification.reason.value
        is_sse = upstream.content_type == "text/event-stream"
        labels = (classification.pool, pool)
        length = upstream.content_length
        if not is_sse and length is not None and length <= WHOLE_BODY_LIMIT:
            try:
                body = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as err:
                self.metrics.upstream_errors.labels(pool, "mid_stream").inc()
                log.warning("pool %s: engine answer broke before it was complete: %r", pool, err)
                message = "the engine's answer was interrupted"
                return error_response(502, message, "upstream_interrupted"), 502
            self.metrics.time_to_first_byte.labels(*labels).observe(self.clock() - started)
            whole = web.Response(body=body, status=upstream.status, reason=upstream.reason, headers=headers)
            return whole, upstream.status
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        request[RESPONSE_STARTED] = True
        first = True
        while True:
            try:
                chunk = await upstream.content.readany()
            except (aiohttp.ClientError, TimeoutError) as err:
                await self._cut_mid_stream(request, response, pool, is_sse, err)
                return response, upstream.status
            if not chunk:
                break
            if first:
                first = False
                self.metrics.time_to_first_byte.labels(*labels).observe(self.clock() - started)
            try:
                await response.write(chunk)
            except ConnectionError:
                # The client left; the caller's `async with` closes the engine leg, which aborts it there.
                log.debug("client %s went away mid-response", request.remote)
                return response, CLIENT_CLOSED
        try:
            await response.write_eof()
        except ConnectionError:
            return response, CLIENT_CLOSED
        return response, upstream.status

    async def _cut_mid_stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        pool: PoolName,
        is_sse: bool,
        err: BaseException,
    ) -> None:
        self.metrics.upstream_errors.labels(pool, "mid_stream").inc()
        log.warning("pool %s: engine stream broke after the response started: %r", pool, err)
        if is_sse:
            # The status line is gone already; an SSE error event is how the client learns of it.
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                await response.write(
                    sse_error_event("the engine stream was interrupted", "upstream_interrupted")
                )
                await response.write_eof()
            return
        # Anything else: drop the connection, so the client sees a short body rather than a bad one.
        if request.transport is not None:
            request.transport.abort()


def _log_task_end(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("background task %s died: %r", task.get_name(), error, exc_info=error)


@web.middleware
async def openai_errors(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """Every error leaves in OpenAI's format; nothing a client sends can crash the handler."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(exc.status, exc.reason, codes.get(exc.status, "http_error"), headers=headers)
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        if request.get(RESPONSE_STARTED):
            raise  # the status line is sent: aiohttp can only close the connection now
        return error_response(500, "internal router error", "internal_error")


ROUTER_KEY = web.AppKey("router", Router)


def create_app(router: Router) -> web.Application:
    """The aiohttp application around `router`."""
    # Size limits are enforced by read_body, with an OpenAI-format 413.
    app = web.Application(middlewares=[openai_errors], client_max_size=router.settings.max_body_bytes)
    app[ROUTER_KEY] = router
    app.cleanup_ctx.append(router.lifespan)
    app.on_shutdown.append(router.on_shutdown)
    app.router.add_get("/healthz", router.healthz)
    app.router.add_get("/readyz", router.readyz)
    app.router.add_get("/metrics", router.metrics_handler)
    app.router.add_get("/v1/models", router.models)
    app.router.add_get("/v1/models/{model}", router.model)
    app.router.add_post("/v1/completions", router.proxy)
    app.router.add_post("/v1/chat/completions", router.proxy)
    app.router.add_route("*", "/v1/{tail:.*}", router.proxy)
    return app
