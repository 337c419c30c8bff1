"""The router's HTTP/1.1 server: an asyncio protocol over httptools' C parser with a client-facing
proxy's guards (connection cap, parse errors, idle and write timeouts, pipelining, body buffering),
behind the router's own small request/response interface (`Request`). What each guard does and why:
docs/architecture.md, "The router's HTTP server"."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools

from specfleet_runtime.router.errors import error_body
from specfleet_runtime.router.message import (
    REASONS,
    TOO_MANY_CONNECTIONS,
    Headers,
    RateLimitedLog,
    Request,
    canned_response,
    short,
)
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.reply import json_reply

log = logging.getLogger(__name__)


Handler = Callable[[Request], Awaitable[None]]


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 0
    write_timeout: float = 0.0  # 0: never
    idle_timeout: float = 15.0
    max_header_bytes: int = 16 * 1024
    max_header_fields: int = 100  # trailer fields included; beyond it 431


class _Refused(Exception):
    """A request head the router refuses: a limit, or something it does not serve (see module doc)."""

    def __init__(self, detail: str, status: int = 400, code: str = "invalid_request", malformed: bool = True):
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code
        self.malformed = malformed  # said as "malformed HTTP request: <detail>"

    @property
    def message(self) -> str:
        return f"malformed HTTP request: {self.detail}" if self.malformed else self.detail


class Connection(asyncio.Protocol):
    """One client connection: parse with httptools, one request handled at a time."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.counted = False
        self.lost = False
        self.closing = False  # no further request is started on this connection
        self.remote: str | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.parsing: Request | None = None
        self.active: Request | None = None
        self.task: asyncio.Task[None] | None = None  # serves every request of this connection
        self._next: asyncio.Future[None] | None = None  # what that task waits on between requests
        self.queue: collections.deque[Request] = collections.deque()
        self.pending_error: _Refused | None = None
        self.broken = False
        self._url: list[bytes] = []
        self._fields: list[tuple[str, str, str]] = []
        self._head_bytes = 0
        self._field_count = 0
        self._in_head = False  # False once the head is complete: fields then are trailers
        self._idle: asyncio.TimerHandle | None = None
        self._idle_deadline: float | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._read_paused = False

    # ---- asyncio protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, so no isinstance checks here.)
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        limits = server.limits
        if limits.max_connections and server.open_count >= limits.max_connections:
            server.metrics.protocol_errors.labels("too_many_connections").inc()
            server.errors_log.warning(
                "too_many_connections", "refused a connection: %d open", server.open_count
            )
            self.transport.write(TOO_MANY_CONNECTIONS)
            self.transport.close()
            self.closing = self.broken = True
            return
        self.counted = True
        server.opened(self)
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        # Pause as soon as anything waits in user space: the kernel's socket buffer is the buffer.
        self.transport.set_write_buffer_limits(high=0)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Upgrade/CONNECT: not served; the request is answered as it stands, then the connection closes.
            self.broken = True
            self.closing = True
            if self.parsing is not None:
                self.parsing._done()
                self.parsing = None
        except httptools.HttpParserError as err:
            self._parse_error(err)

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a handler in progress is cancelled in connection_lost

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self.closing = True
        self._drop_idle_timer()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))
            waiter.exception()  # retrieved: nobody may be waiting any more
        self._drain_waiter = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
        for request in (self.active, *self.queue):
            if request is not None:
                request._wake()
        self.queue.clear()
        if self.counted:
            self.counted = False
            self.server.closed(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        timeout = self.server.limits.write_timeout
        if timeout and self._write_deadline is None:
            self._write_deadline = self.loop.call_later(timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        waiter = self._drain_waiter
        if waiter is not None:
            self._drain_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _write_timed_out(self) -> None:
        """The client accepted nothing for write_timeout: drop it and everything held for it."""
        self._write_deadline = None
        server = self.server
        server.metrics.protocol_errors.labels("write_timeout").inc()
        server.errors_log.warning(
            "write_timeout",
            "aborted a connection whose client read nothing for %gs",
            server.limits.write_timeout,
        )
        self.abort()

    # ---- writing ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.lost or self.transport is None:
            raise ConnectionResetError("the client closed the connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if self.lost:
            raise ConnectionResetError("the client closed the connection")
        if not self._write_paused:
            return
        waiter = self._drain_waiter
        if waiter is None:
            waiter = self._drain_waiter = self.loop.create_future()
        await waiter

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def pause_reading(self) -> None:
        if not self._read_paused and self.transport is not None and not self.lost:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._read_paused and self.transport is not None and not self.lost:
            self._read_paused = False
            self.transport.resume_reading()

    # ---- timers ----------------------------------------------------------------------------------

    # The idle timer is lazy: arming sets a deadline and creates a timer handle only if none is
    # pending; disarming clears the deadline and leaves the handle. When the handle fires it re-arms
    # itself for a deadline that moved on, drops itself if none is set, and closes the connection only
    # once the deadline in force has passed. A keep-alive connection under load so costs a clock read
    # per request instead of a timer created and cancelled.

    def _arm_idle(self) -> None:
        timeout = self.server.limits.idle_timeout
        if not timeout:
            self._idle_deadline = None
            return
        deadline = self.loop.time() + timeout
        self._idle_deadline = deadline
        if self._idle is None:
            self._idle = self.loop.call_at(deadline, self._idle_check)

    def _cancel_idle(self) -> None:
        self._idle_deadline = None

    def _drop_idle_timer(self) -> None:
        self._idle_deadline = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_check(self) -> None:
        deadline = self._idle_deadline
        if deadline is None:
            self._idle = None
            return
        if self.loop.time() < deadline:
            self._idle = self.loop.call_at(deadline, self._idle_check)
            return
        self._idle = None
        self._idle_deadline = None
        self._idle_timed_out()

    def _idle_timed_out(self) -> None:
        if self.active is None and self.transport is not None and not self.lost:
            self.closing = True
            self.transport.close()

    # ---- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = []
        self._fields = []
        self._head_bytes = 0
        self._field_count = 0
        self._in_head = True

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self.server.limits.max_header_bytes:
            raise _Refused(f"request line longer than {self.server.limits.max_header_bytes} bytes")
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.server.limits
        size = len(name) + len(value)
        if size > limits.max_header_bytes:
            raise _Refused(f"header line longer than {limits.max_header_bytes} bytes")
        self._head_bytes += size
        if self._head_bytes > 8 * limits.max_header_bytes:
            raise _Refused("request head too large")
        self._field_count += 1
        if self._field_count > limits.max_header_fields:
            raise _Refused(
                f"more than {limits.max_header_fields} header fields",
                431,
                "request_header_fields_too_large",
                malformed=False,
            )
        if not self._in_head:
            return  # a trailer field: dropped (see the module docstring)
        text = name.decode("latin-1")
        self._fields.append((text.lower(), text, value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._cancel_idle()
        self._in_head = False
        parser = self.parser
        headers = Headers(self._fields)
        version = parser.get_http_version()
        _check_head(version, headers, parser.should_upgrade())
        length_text = headers.get("content-length")
        request = Request(
            connection=self,
            method=parser.get_method().decode("latin-1"),
            target=b"".join(self._url).decode("utf-8", "surrogateescape"),
            headers=headers,
            remote=self.remote,
            keep_alive=parser.should_keep_alive(),
            http11=version == "1.1",
            content_length=int(length_text) if length_text is not None else None,
            expect_continue=headers.get("expect", "").lower() == "100-continue",
        )
        self.parsing = request
        if self.active is None:
            self._start(request)
        else:
            self.queue.append(request)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        if self.parsing is not None:
            self.parsing._feed(body)

    def on_message_complete(self) -> None:
        if self.parsing is not None:
            self.parsing._done()
            self.parsing = None

    # ---- requests --------------------------------------------------------------------------------

    def _parse_error(self, err: Exception) -> None:
        self.broken = True
        self.closing = True
        context = err.__context__
        refused = (
            context if isinstance(context, _Refused) else _Refused(short(str(err) or type(err).__name__))
        )
        server = self.server
        server.metrics.protocol_errors.labels("parse_error").inc()
        server.errors_log.warning(
            "parse_error", "refused a request from %s: %d %s", self.remote, refused.status, refused.detail
        )
        request = self.parsing
        self.parsing = None
        if request is not None:
            # Its head was fine, its body (or trailer) broke: its handler answers (see intake).
            request._fail(refused.detail)
        elif self.active is None:
            self._send_parse_error(refused)
        else:
            self.pending_error = refused

    def _send_parse_error(self, refused: _Refused) -> None:
        if self.transport is None or self.lost:
            return
        status = refused.status
        self.transport.write(
            canned_response(status, REASONS.get(status, "Bad Request"), refused.message, refused.code)
        )
        self.transport.close()

    def _start(self, request: Request) -> None:
        self.active = request
        if self.task is None:
            # One task per connection, not per request: it serves this request and every later one
            # on the connection (creating and registering a task per request is measurable).
            self.task = self.loop.create_task(self._serve_all())
        elif self._next is not None and not self._next.done():
            self._next.set_result(None)

    async def _serve_all(self) -> None:
        """Serve the connection's requests in order; wait between them; end when it closes or breaks."""
        while not self.lost:
            request = self.active
            if request is None:
                waiter = self._next = self.loop.create_future()
                try:
                    await waiter
                finally:
                    self._next = None
                continue
            if not await self._serve(request):
                return

    async def _serve(self, request: Request) -> bool:
        """Answer one request; whether the connection may serve another (False: it is closing)."""
        try:
            await self.server.handler(request)
        except asyncio.CancelledError:
            # The client went away, or the connection was aborted: nothing more on it.
            if not self.lost:
                self.abort()
            return False
        except ConnectionError:
            self.abort()
            return False
        except Exception as err:  # a handler bug: one line, the client gets a 500 if it can
            self.server.errors_log.warning("internal", "internal error serving a request: %r", err)
            log.debug("internal error", exc_info=True)
        if self.lost:
            return False
        if not request.finished:
            if request.started:
                self.abort()
                return False
            try:
                request.send(
                    json_reply(error_body(500, "internal router error", "internal_error"), 500, close=True)
                )
            except ConnectionError:
                return False
        return self._answered(request)

    def _answered(self, request: Request) -> bool:
        """After an answer: start the next request, wait for one, or close; whether the connection lives."""
        self.active = None
        transport = self.transport
        if transport is None or self.lost:
            return False
        if request.close_after or not request.complete or self.server.draining:
            self.closing = True
            transport.close()
            return False
        if self.queue:
            following = self.queue.popleft()
            if not self.queue:
                self.resume_reading()
            self._start(following)
        elif self.pending_error is not None:
            self._send_parse_error(self.pending_error)
            return False
        elif self.broken:
            self.closing = True
            transport.close()
            return False
        else:
            self._arm_idle()
        return True

    def close_if_idle(self) -> bool:
        """Close now if no request is in progress (shutdown); whether it was."""
        if self.active is None and self.transport is not None and not self.lost:
            self.closing = True
            self.transport.close()
            return True
        return False


def _check_head(version: str, headers: Headers, upgrade: bool) -> None:
    """Refuse (`_Refused`) a well-formed head the router does not serve."""
    if version not in ("1.1", "1.0"):
        raise _Refused(f"HTTP/{version} is not served here (HTTP/1.1 and HTTP/1.0 are)")
    hosts = headers.getall("host") if "host" in headers else ()
    if len(hosts) > 1:
        raise _Refused("more than one Host header")
    if not hosts and version == "1.1":
        raise _Refused("an HTTP/1.1 request needs a Host header")
    if upgrade:
        # llhttp reads nothing past such a head (its body would be another protocol's bytes).
        wanted = short(headers.get("upgrade", "") or "CONNECT")[:40]
        raise _Refused(
            f"protocol upgrades and CONNECT are not supported (asked: {wanted}); send plain HTTP/1.1",
            code="upgrade_not_supported",
            malformed=False,
        )


class HttpServer:
    """The router's listening side: connections, their count and guards, and a drain on shutdown."""

    def __init__(self, handler: Handler, metrics: RouterMetrics, limits: ServerLimits) -> None:
        self.handler = handler
        self.metrics = metrics
        self.limits = limits
        self.errors_log = RateLimitedLog(log)
        self.open_count = 0
        self.draining = False
        self.connections: set[Connection] = set()
        self._gauge = metrics.value(metrics.open_connections)
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def opened(self, connection: Connection) -> None:
        self.open_count += 1
        self.connections.add(connection)
        self._gauge.inc()

    def closed(self, connection: Connection) -> None:
        self.open_count -= 1
        self.connections.discard(connection)
        self._gauge.dec()

    async def listen(self, host: str, port: int, reuse_port: bool = False) -> list[Any]:
        """Start accepting; returns the bound addresses."""
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: Connection(self), host, port, reuse_port=reuse_port or None, backlog=1024
        )
        # uvloop's Server.sockets is a list where typeshed says tuple; the compiled module checks
        # declared types, so read it untyped.
        sockets: Any = getattr(self._server, "sockets")  # noqa: B009
        return [sock.getsockname() for sock in sockets]

    async def shutdown(self, timeout: float) -> None:
        """Stop accepting, close idle connections, give requests in progress `timeout`, then drop them."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + timeout
        while True:
            for connection in list(self.connections):
                connection.closing = True
                connection.close_if_idle()
            if not self.connections or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()
