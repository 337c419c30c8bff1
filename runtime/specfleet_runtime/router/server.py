"""The router's HTTP server: aiohttp's low-level server with the guards a client-facing proxy needs.

- Connection cap: beyond `max_connections` open connections, a new one gets a canned OpenAI-format
  503 and is closed before any request is parsed.
- Parse errors (bad request line, oversized headers, bad Content-Length, ...) get an OpenAI-format
  400 instead of aiohttp's text page, and one rate-limited WARNING line without a traceback instead of
  an ERROR with a traceback per request (so no client can flood the log).
- Idle and slow-header connections close after `keepalive_timeout` (aiohttp arms it when a connection
  opens and again after each answer; a request whose head has not arrived by then is dropped).
- Clients that do not read: a connection's user-space write buffer is kept at zero (high-water mark 0),
  so it pauses as soon as the kernel's socket buffer is full; if it stays paused for `write_timeout`
  the connection is aborted. That cancels the handler (a stream's engine leg closes at once) and frees
  what the router held for it, including a whole answer a closing connection was still trying to send.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from specfleet_runtime.router.errors import error_body
from specfleet_runtime.router.metrics import RouterMetrics

log = logging.getLogger(__name__)


class RateLimitedLog:
    """At most one line per `interval` seconds and key; the next line says how many were dropped."""

    def __init__(
        self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._next: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        now = self.clock()
        if now < self._next.get(key, 0.0):
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return
        self._next[key] = now + self.interval
        dropped = self._dropped.pop(key, 0)
        if dropped:
            message += f" ({dropped} more like it in the last {self.interval:g}s not logged)"
        self.logger.warning(message, *args)


def canned_response(status: int, reason: str, message: str, code: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with an OpenAI-format body that closes the connection."""
    body = json.dumps(error_body(status, message, code)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


TOO_MANY_CONNECTIONS = canned_response(
    503, "Service Unavailable", "the router has too many open connections", "too_many_connections",
    "Retry-After: 1\r\n",
)  # fmt: skip


def _short_reason(exc: BaseException | None, message: str | None) -> str:
    text = message or (str(exc) if exc is not None else "") or type(exc).__name__
    return " ".join(text.split())[:200]


class GuardedRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, with the connection cap and OpenAI-format parse errors."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._manager
        assert isinstance(server, GuardedServer)
        if server.max_connections and server.open_count >= server.max_connections:
            server.metrics.protocol_errors.labels("too_many_connections").inc()
            server.errors_log.warning(
                "too_many_connections", "refused a connection: %d open", server.open_count
            )
            transport = cast(asyncio.Transport, transport)
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            self._manager = None  # connection_lost has nothing to undo
            return
        server.opened()
        self._write_deadline: asyncio.TimerHandle | None = None
        self._guarded_transport = transport
        # (uvloop's transports are not asyncio.Transport subclasses, so no isinstance checks here.)
        # Pause as soon as anything waits in user space: the kernel's socket buffer is the buffer.
        cast(asyncio.WriteTransport, transport).set_write_buffer_limits(high=0)
        super().connection_made(transport)

    def pause_writing(self) -> None:
        super().pause_writing()
        server = self._manager
        if isinstance(server, GuardedServer) and server.write_timeout and self._write_deadline is None:
            self._write_deadline = self._loop.call_later(server.write_timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        super().resume_writing()

    def _write_timed_out(self) -> None:
        """The client accepted nothing for write_timeout: drop it and everything held for it."""
        self._write_deadline = None
        server = self._manager
        if isinstance(server, GuardedServer):
            server.metrics.protocol_errors.labels("write_timeout").inc()
            server.errors_log.warning(
                "write_timeout",
                "aborted a connection whose client read nothing for %gs",
                server.write_timeout,
            )
        cast(asyncio.Transport, self._guarded_transport).abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        server = self._manager
        deadline = getattr(self, "_write_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._write_deadline = None
        super().connection_lost(exc)
        if isinstance(server, GuardedServer):
            server.closed()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        server = self._manager
        reason = "parse_error" if status == 400 else f"http_{status}"
        if isinstance(server, GuardedServer):
            server.metrics.protocol_errors.labels(reason).inc()
            server.errors_log.warning(
                reason,
                "refused a request from %s: %d %s",
                request.remote,
                status,
                _short_reason(exc, message),
            )
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        code = "invalid_request" if status == 400 else "internal_error" if status == 500 else "http_error"
        text = "malformed HTTP request" if status == 400 else "internal router error"
        if status == 400 and message:
            text = f"malformed HTTP request: {_short_reason(exc, message)}"
        response = web.json_response(error_body(status, text, code), status=status)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp's "Unhandled exception" and similar: one line, rate-limited, no traceback.
        server = self._manager
        exc = kw.get("exc_info")
        if isinstance(server, GuardedServer):
            server.errors_log.warning("protocol", "connection error: %s", _short_reason(exc, str(args[0])))


class GuardedServer(web.Server):
    """A low-level aiohttp server whose connections are `GuardedRequestHandler`s."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        metrics: RouterMetrics,
        max_connections: int,
        write_timeout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.metrics = metrics
        self.max_connections = max_connections
        # A connection whose client has taken no byte for this long is aborted; 0: never.
        self.write_timeout = write_timeout
        self.errors_log = RateLimitedLog(log)
        # Connections accepted and not yet lost (aiohttp's own list keeps a closed one until its task ends).
        self.open_count = 0
        self._gauge = metrics.open_connections

    def opened(self) -> None:
        self.open_count += 1
        self._gauge.inc()

    def closed(self) -> None:
        self.open_count -= 1
        self._gauge.dec()

    def __call__(self) -> RequestHandler:
        return GuardedRequestHandler(self, loop=self._loop, **self._kwargs)
