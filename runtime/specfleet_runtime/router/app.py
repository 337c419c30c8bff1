"""The router: an OpenAI-compatible reverse proxy over the latency and batch pools.

Request path: match the normalized path against the allow-list (`paths`) -> read the body within its
bounds (`intake`) -> check it and classify (`admission`, over the pure `classify`) -> resolve the pool
and pick an endpoint (`backends`) -> forward under the canonical path and relay (`proxy`). The config
in force lives in `configuration`; the HTTP server and its connection guards in `server`.

`Router` only wires these together and answers the small endpoints; everything long-lived (HTTP client
session, config source, EndpointSlice watches, housekeeping) starts in `Router.start()` and stops in
`Router.stop()`; `serving.serve_router` runs a router on a socket (this module has no async generator,
so mypyc compiles it: see scripts/compile-router.sh).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specfleet_runtime.names import PoolName, other_pool
from specfleet_runtime.router.admission import Admission
from specfleet_runtime.router.backends import Backends, WatchKey
from specfleet_runtime.router.classify import Classification, ClientLoadTracker, Endpoint, Reason
from specfleet_runtime.router.configuration import ConfigStore
from specfleet_runtime.router.conversations import shared_board, shared_table
from specfleet_runtime.router.endpoints import AddressMap
from specfleet_runtime.router.errors import clip, error_response
from specfleet_runtime.router.intake import BodyLimits, ByteBudget, Refusal, read_body
from specfleet_runtime.router.message import RateLimitedLog, Request
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.paths import CHAT_PATH, METHODS, MODEL_PREFIX, PROXIED, TOKENIZER, Route, match
from specfleet_runtime.router.proxy import CLIENT_CLOSED, Proxy, ProxySettings, RequestResult
from specfleet_runtime.router.reply import Reply, json_reply
from specfleet_runtime.router.server import HttpServer, ServerLimits
from specfleet_runtime.router.sources import ConfigSource, SliceWatchFactory
from specfleet_runtime.routing_config import RoutingConfig

log = logging.getLogger(__name__)

# Re-exported for callers that know them from here.
__all__ = ["CLIENT_CLOSED", "Router", "RouterSettings"]


def _flag(default: Any, text: str) -> Any:
    """A setting that is also a command-line flag (`--name-with-dashes`) with this help text."""
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class RouterSettings:
    """Process-level knobs; routing itself lives in `RoutingConfig`. Fields made with `_flag` are the
    router's command-line flags, with their help and default (see `__main__.settings_arguments`)."""

    namespace: str = "default"
    connect_timeout: float = _flag(5.0, "longest wait for a TCP connection to an engine")
    read_timeout: float = _flag(
        600.0, "longest wait for the next byte from an engine (also for a healthy engine to appear)"
    )
    stall_seconds: float = _flag(
        10.0,
        "no byte from an engine this long before its first: probe it; a failed probe ejects it "
        "and the request is retried elsewhere",
    )
    probe_timeout: float = _flag(2.0, "a stalled engine's health probe fails after this long")
    stream_stall_timeout: float = _flag(
        60.0,
        "an answer that started and then gives no byte for this long is ended (a stream with an "
        "OpenAI-format error event) and its engine probed, ejected if the probe fails; 0: --read-timeout",
    )
    max_body_bytes: int = _flag(32 * 1024 * 1024, "larger bodies get 413")
    max_bytes_in_flight: int = _flag(
        256 * 1024 * 1024,
        "request bytes all requests may hold together (beyond: 503 + Retry-After); 0: no cap",
    )
    body_timeout: float = _flag(
        30.0, "whole body within this (else 408): a body shorter than its Content-Length, a trickle"
    )
    idle_timeout: float = _flag(
        15.0, "close a connection without a complete request head for this long (idle or slow headers)"
    )
    write_timeout: float = _flag(
        30.0,
        "drop a client that takes no byte of its answer for this long (its engine leg closes); 0: never",
    )
    max_connections: int = _flag(4096, "open client connections (beyond: 503 and close); 0: no cap")
    max_in_flight: int = _flag(0, "requests in flight (beyond: 429); 0: no cap")
    max_attempts: int = _flag(3, "endpoints tried per request on connection failures and stalls")
    eject_seconds: float = _flag(
        5.0, "an endpoint that refused a connection or stalled is skipped this long while others are up"
    )
    shutdown_delay_seconds: float = _flag(
        5.0,
        "after SIGTERM, keep serving this long with /readyz failing before the listener closes "
        "(the time the Service needs to stop sending new connections here)",
    )
    drain_seconds: float = _flag(
        30.0, "then in-flight requests (streams included) get up to this long to finish"
    )
    warm_timeout: float = _flag(
        10.0,
        "with --reuse-port (each worker of --workers): listen once the routing config and every "
        "pool's first endpoint list are in, or after this many seconds",
    )
    housekeeping_seconds: float = 1.0
    # Request line and each header line at most this long (400 beyond).
    max_header_bytes: int = 16 * 1024
    # Header fields of a request (its trailer fields too) at most this many (431 beyond).
    max_header_fields: int = 100
    # Rewrites EndpointSlice addresses (a test bed's fake pod IPs to loopback twins); empty in clusters.
    endpoint_address_map: AddressMap = ()


class Router:
    """Wires configuration, backends, admission and proxy together and answers every request."""

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
        self.metrics = metrics if metrics is not None else RouterMetrics()
        self.clock = clock
        self.backends = Backends(
            settings.namespace,
            settings.eject_seconds,
            settings.endpoint_address_map,
            self.metrics,
            clock,
            slice_watch_factory,
            shared_table(),
            shared_board(),
        )
        self.configuration = ConfigStore(self.metrics, self.backends.apply_config)
        self.admission = Admission(self.metrics, clock)
        self.proxy = Proxy(
            ProxySettings(
                connect_timeout=settings.connect_timeout,
                read_timeout=settings.read_timeout,
                max_attempts=settings.max_attempts,
                stall_seconds=settings.stall_seconds,
                probe_timeout=settings.probe_timeout,
                stream_stall_timeout=settings.stream_stall_timeout,
            ),
            self.backends,
            self.metrics,
            clock,
        )
        self.body_limits = BodyLimits(settings.max_body_bytes, settings.body_timeout)
        self.budget = ByteBudget(settings.max_bytes_in_flight, self.metrics, self.clock)
        self.errors_log = RateLimitedLog(log)
        self.in_flight = 0
        self.draining = False
        self.server: HttpServer | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._created = int(time.time())
        self._handlers = {
            Route.MODELS: self._models,
            Route.MODEL: self._model,
            Route.HEALTHZ: self._healthz,
            Route.READYZ: self._readyz,
            Route.METRICS: self._metrics,
        }

    # ---- views kept for callers and tests -------------------------------------------------------

    @property
    def config(self) -> RoutingConfig | None:
        return self.configuration.config

    @property
    def pool_endpoints(self) -> dict[str, tuple[str, ...]]:
        return self.backends.pool_endpoints

    @property
    def tracker(self) -> ClientLoadTracker:
        return self.admission.tracker

    def apply_config_text(self, text: str | None, origin: str) -> bool:
        return self.configuration.apply_text(text, origin)

    def apply_slices(self, key: WatchKey, slices: list[dict[str, Any]]) -> None:
        self.backends.apply_slices(key, slices)

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.config is None:
            return False, "no routing config loaded"
        if not any(self.pool_endpoints.values()):
            return False, "no pool has a ready endpoint"
        if not self.backends.has_serving_endpoint():
            return False, "no static endpoint answered its last health check"
        return True, "ok"

    def warm(self) -> tuple[bool, str]:
        """Whether this process knows what it serves (and if not, what it lacks): a routing config, and
        the first EndpointSlice list of every pool's Service (an empty list counts: that pool has none)."""
        if self.config is None:
            return False, "no routing config loaded"
        unlisted = self.backends.unlisted()
        if unlisted:
            return False, "no EndpointSlice list yet for " + ", ".join(unlisted)
        return True, "ok"

    async def wait_warm(self, timeout: float) -> bool:
        """Wait until `warm()`, at most `timeout` seconds; whether it is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.warm()[0]:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # ---- lifespan ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the client session, config source and housekeeping (`stop` ends them all)."""
        self.proxy.open()
        self._tasks = [asyncio.create_task(self._housekeeping(), name="router-housekeeping")]
        if self.config_source is not None:
            self._tasks.append(
                asyncio.create_task(
                    self.config_source.run(self.apply_config_text),
                    name=f"config {self.config_source.description}",
                )
            )
        for task in self._tasks:
            task.add_done_callback(_log_task_end)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.backends.stop()
        await self.proxy.close()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.settings.housekeeping_seconds)
            self.admission.expire(self.config)
            self.backends.expire_ejections(self.clock())

    # ---- every request --------------------------------------------------------------------------

    async def handle(self, request: Request) -> None:
        """Entry point for every request (the server calls it): answer it, unless it was streamed."""
        if self.draining:
            request.close_after = True  # the client's next request opens a connection the Service places
        reply = await self._dispatch(request)
        if reply is not None:
            request.send(reply)

    async def _dispatch(self, request: Request) -> Reply | None:
        """Allow-list, then the route's handler; a whole answer, or None once one was streamed."""
        route, path = match(request.target)
        if route is None:
            return self._refuse(404, f"no route for {path[:200]}", "not_found")
        if request.method not in METHODS[route]:
            allowed = ", ".join(METHODS[route])
            return self._refuse(
                405,
                f"{request.method} is not allowed on {path}",
                "method_not_allowed",
                headers={"Allow": allowed},
            )
        try:
            if route in PROXIED:
                return await self._proxy(request, path)
            if route in TOKENIZER:
                return await self._tokenizer(request, path)
            return await self._handlers[route](request, path)
        except Refusal as refusal:
            response = self._refuse(
                refusal.status, refusal.message, refusal.code, refusal.param, refusal.headers
            )
            if not request.body_complete:
                # The body was left unread (too large, too slow): close rather than drain it.
                response.close = True
            return response
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as err:
            self.errors_log.warning("internal", "internal error serving %s %s: %r", request.method, path, err)
            log.debug("internal error", exc_info=True)
            return self._refuse(500, "internal router error", "internal_error")

    def _refuse(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        classification: Classification | None = None,
    ) -> Reply:
        klass = classification.pool if classification else "none"
        self.metrics.requests.labels(klass, "none", str(status), "refused").inc()
        return error_response(status, message, code, param, headers)

    async def _proxy(self, request: Request, path: str) -> Reply | None:
        received = self.clock()
        config = self.config
        if config is None:
            raise Refusal(503, "the router has no routing config yet", "not_ready")
        body, reserved = await read_body(request, self.body_limits, self.budget)
        try:
            endpoint: Endpoint = "chat" if path == CHAT_PATH else "completions"
            facts = self.admission.facts(config, request.headers, body, request.remote, endpoint)
            if self.settings.max_in_flight and self.in_flight >= self.settings.max_in_flight:
                raise Refusal(
                    429,
                    "too many requests in flight at the router",
                    "too_many_requests",
                    headers={"Retry-After": "1"},
                )
            classification = self.admission.begin(config, facts)
            try:
                pool = self.backends.resolve(classification.pool, config)
                if pool is None:
                    return self._refuse(
                        503,
                        f"no ready endpoint for pool {classification.pool}",
                        "no_endpoints",
                        classification=classification,
                    )
                pools: list[PoolName] = [pool]
                if config.fallback == "otherPool":
                    # Failed engines may still move the request on, as long as nothing was sent.
                    pools.append(other_pool(pool))
                query = request.target.partition("?")[2]
                target = f"{path}?{query}" if query else path
                # Forwarded here rather than in a coroutine of its own: one frame less per resume.
                metrics = self.metrics
                gauge = metrics.value(metrics.in_flight, classification.pool, pool)
                # What is recorded if the client goes away and the handler is cancelled.
                result = RequestResult(CLIENT_CLOSED, pool, "client_closed")
                self.in_flight += 1
                gauge.inc()
                try:
                    response, result = await self.proxy.forward(
                        request, target, body, classification, pools, received, facts.prefix
                    )
                    return response
                finally:
                    self.in_flight -= 1
                    gauge.dec()
                    labels = (classification.pool, result.pool)
                    if result.pool != classification.pool:
                        metrics.value(metrics.fallbacks, *labels).inc()
                    metrics.value(metrics.requests, *labels, str(result.status), result.error).inc()
                    metrics.histogram(metrics.duration, *labels).observe(self.clock() - received)
            finally:
                self.admission.end(config, facts)
        finally:
            self.budget.give(reserved)

    async def _tokenizer(self, request: Request, path: str) -> Reply | None:
        """/tokenize, /detokenize: to an engine of the default pool (the other one if it has none), as
        every engine serves the one model. Read-only, so not inference: the same body bounds and model
        check, but no classification, no client load, no request metrics, retried like any request."""
        config = self.config
        if config is None:
            raise Refusal(503, "the router has no routing config yet", "not_ready")
        body, reserved = await read_body(request, self.body_limits, self.budget)
        try:
            self.admission.check_body(config, body)
            pool = self.backends.resolve(config.default_pool, config)
            if pool is None:
                return self._refuse(503, f"no ready endpoint for pool {config.default_pool}", "no_endpoints")
            classification = Classification(pool, Reason.DEFAULT)
            query = request.target.partition("?")[2]
            target = f"{path}?{query}" if query else path
            pools: list[PoolName] = [pool, other_pool(pool)]
            response, _ = await self.proxy.forward(request, target, body, classification, pools, None)
            return response
        finally:
            self.budget.give(reserved)

    # ---- small handlers ---------------------------------------------------------------------------

    async def _healthz(self, request: Request, path: str) -> Reply:
        return json_reply({"status": "ok"})

    async def _readyz(self, request: Request, path: str) -> Reply:
        await self.backends.check_static(self.proxy.probe)
        ok, reason = self.ready()
        body = {
            "status": "ready" if ok else "not ready",
            "reason": reason,
            "endpoints": {pool: len(urls) for pool, urls in self.pool_endpoints.items()},
        }
        return json_reply(body, 200 if ok else 503)

    async def _metrics(self, request: Request, path: str) -> Reply:
        self.metrics.segmented_clients.set(self.tracker.segmented_count())
        return Reply(200, generate_latest(self.metrics.scrape_registry()), content_type=CONTENT_TYPE_LATEST)

    def _model_card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "specfleet",
            "root": name,
            "parent": None,
        }

    async def _models(self, request: Request, path: str) -> Reply:
        config = self.config
        if config is None:
            raise Refusal(503, "the router has no routing config yet", "not_ready")
        return json_reply({"object": "list", "data": [self._model_card(config.served_model_name)]})

    async def _model(self, request: Request, path: str) -> Reply:
        config = self.config
        if config is None:
            raise Refusal(503, "the router has no routing config yet", "not_ready")
        name = path[len(MODEL_PREFIX) :]
        if name != config.served_model_name:
            raise Refusal(404, f"The model `{clip(name)}` does not exist.", "model_not_found", "model")
        return json_reply(self._model_card(name))

    # ---- the server -------------------------------------------------------------------------------

    def make_server(self) -> HttpServer:
        """The HTTP server for this router (see `server`); a client that hangs up cancels its handler."""
        settings = self.settings
        self.server = HttpServer(
            self.handle,
            self.metrics,
            ServerLimits(
                max_connections=settings.max_connections,
                write_timeout=settings.write_timeout,
                idle_timeout=settings.idle_timeout,
                max_header_bytes=settings.max_header_bytes,
                max_header_fields=settings.max_header_fields,
            ),
        )
        return self.server


def _log_task_end(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("background task %s died: %r", task.get_name(), error, exc_info=error)
