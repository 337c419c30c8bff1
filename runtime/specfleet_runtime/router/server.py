"""The router's HTTP/1.1 server: an asyncio protocol over httptools' C parser, with a client-facing
proxy's guards, behind a small request/response interface of the router's own (`Request`).

The proxy and the small handlers see only `Request`: method, raw target, headers, the body (read
through `intake`), `send` for a whole answer, `start`/`write`/`end` for a streamed one, `abort`; a
client that goes away cancels the handler's task (one task per connection serves its requests in
turn). Everything about connections stays here:

- Connection cap: beyond `max_connections` open connections, a new one gets a canned OpenAI-format
  503 and is closed before any request is parsed.
- Parse errors (bad request line, oversized request line or header, bad Content-Length, bad chunk)
  get an OpenAI-format 400 and one rate-limited WARNING line without a traceback (no client can flood
  the log); the connection closes. So do heads the router does not serve: an HTTP version other than
  1.0 and 1.1, an HTTP/1.1 request without a Host or any request with two (HTTP/1.0 does not require
  Host: allowed), a protocol upgrade or CONNECT; and more than `max_header_fields` fields (431).
- Trailer fields of a chunked body are dropped: never forwarded, never classified (a recipient may
  discard them, RFC 9110 6.5.1, and nothing the router serves reads them). They count against the
  head's limits all the same.
- Idle and slow-header connections close after `idle_timeout`: the timer is armed when a connection
  opens and again after each answer, and only a complete request head stops it.
- One request at a time per connection: a pipelined request waits (and the socket is not read on)
  until the answer before it is complete.
- Request bodies (Content-Length or chunked) are buffered per request up to `READ_LIMIT` bytes not yet
  taken by the handler; beyond it the socket is not read until the handler takes them.
- Streamed answers of unknown length go out with chunked transfer encoding, each piece as it comes.
- Clients that do not read: the transport's user-space write buffer is kept at zero (high-water mark
  0), so it pauses as soon as the kernel's socket buffer is full; a streaming handler waits there, and
  if the pause lasts `write_timeout` the connection is aborted, which cancels the handler (a stream's
  engine leg closes at once) and frees what the router held for it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, ClassVar, cast

import httptools

from specfleet_runtime.router.errors import error_body
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.reply import Reply, json_reply

log = logging.getLogger(__name__)

# Request body bytes received and not yet taken by the handler before the socket stops being read.
READ_LIMIT = 256 * 1024
REASONS = {status.value: status.phrase for status in HTTPStatus}


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


def _short(text: str) -> str:
    return " ".join(text.split())[:200]


class _Date:
    """The Date header, formatted once a second."""

    second: ClassVar[int] = 0
    line: ClassVar[bytes] = b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second = now
            cls.line = f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
        return cls.line


class Headers(Mapping[str, str]):
    """A request's header fields in arrival order; lookups are case-insensitive (first value wins)."""

    __slots__ = ("_first", "fields")

    def __init__(self, fields: list[tuple[str, str, str]]) -> None:
        # (lower-case name, name as sent, value)
        self.fields = fields
        first: dict[str, str] = {}
        for lower, _, value in fields:
            if lower not in first:
                first[lower] = value
        self._first = first

    def __getitem__(self, name: str) -> str:
        return self._first[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:
        return self._first.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def __iter__(self) -> Iterator[str]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def getall(self, name: str) -> list[str]:
        lower = name.lower()
        return [value for key, _, value in self.fields if key == lower]


class BadRequestBody(Exception):
    """The request body broke the HTTP framing (a bad chunk); the message says how."""


@dataclass(eq=False, slots=True)
class Request:
    """One request, as the handler sees it. The body arrives through `take`/`read_chunk` (see intake)."""

    connection: Connection
    method: str
    target: str
    headers: Headers
    remote: str | None
    keep_alive: bool
    http11: bool
    content_length: int | None
    expect_continue: bool = False
    complete: bool = False  # the whole message (body included) arrived
    too_large: bool = False
    error: str | None = None
    started: bool = False  # the response head went out
    finished: bool = False  # the response is complete
    close_after: bool = False
    _chunks: list[bytes] = field(default_factory=list)
    _buffered: int = 0
    _waiter: asyncio.Future[None] | None = None
    _chunked_out: bool = False
    _head_only: bool = False

    # ---- from the connection ---------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self.finished:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > READ_LIMIT:
            self.connection.pause_reading()
        self._wake()

    def _done(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, message: str) -> None:
        self.error = message
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # ---- the body ----------------------------------------------------------------------------------

    @property
    def body_complete(self) -> bool:
        """Whether every body byte arrived (nothing more will come for this request)."""
        return self.complete

    def take(self) -> bytes:
        """The body bytes that arrived and were not taken yet."""
        chunks = self._chunks
        if not chunks:
            data = b""
        elif len(chunks) == 1:
            data = chunks[0]
        else:
            data = b"".join(chunks)
        self._chunks = []
        if self._buffered > READ_LIMIT:
            self.connection.resume_reading()
        self._buffered = 0
        return data

    async def read_chunk(self) -> bytes:
        """The next body bytes as they arrive; b"" once the body is complete.

        Raises `BadRequestBody` on broken framing, `asyncio.IncompleteReadError` when the client closed
        before the body was complete.
        """
        while not self._chunks:
            if self.error is not None:
                raise BadRequestBody(self.error)
            if self.complete:
                return b""
            if self.connection.lost:
                raise asyncio.IncompleteReadError(b"", None)
            if self.expect_continue:
                self.expect_continue = False
                self.connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            waiter = self.connection.loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        return self.take()

    # ---- the answer --------------------------------------------------------------------------------

    def _head(
        self,
        status: int,
        reason: str | None,
        headers: Sequence[tuple[str, str]] | Mapping[str, str],
        content_type: str | None,
        length: int | None,
    ) -> bytes:
        if self.close_after or not self.keep_alive or self.connection.closing:
            self.close_after = True
        lines = [f"HTTP/1.1 {status} {reason or REASONS.get(status, 'Unknown')}\r\n"]
        # A list of pairs (the proxy's answers) skips the ABC isinstance check.
        items = (
            headers if type(headers) is list else headers.items() if isinstance(headers, Mapping) else headers
        )
        for name, value in items:
            lines.append(f"{name}: {value}\r\n")
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}\r\n")
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        elif self.http11:
            self._chunked_out = True
            lines.append("Transfer-Encoding: chunked\r\n")
        else:
            self.close_after = True  # an HTTP/1.0 answer of unknown length ends with the connection
        if self.close_after:
            lines.append("Connection: close\r\n")
        elif not self.http11:
            lines.append("Connection: keep-alive\r\n")
        return "".join(lines).encode("latin-1", "replace") + _Date.get() + b"\r\n"

    def send(self, reply: Reply) -> None:
        """Answer with `reply` in one write."""
        if reply.close:
            self.close_after = True
        head = self._head(reply.status, reply.reason, reply.headers, reply.content_type, len(reply.body))
        self.started = self.finished = True
        self.connection.write(head if self.method == "HEAD" else head + reply.body)

    async def start(
        self,
        status: int,
        reason: str | None,
        headers: Sequence[tuple[str, str]] | Mapping[str, str],
        content_length: int | None,
    ) -> None:
        """Send the head of a streamed answer (chunked transfer when `content_length` is None)."""
        self._head_only = self.method == "HEAD"
        head = self._head(status, reason, headers, None, content_length)
        self.started = True
        self.connection.write(head)
        await self.connection.drain()

    async def write(self, data: bytes) -> None:
        """Send the next piece of a streamed answer; waits while the client does not read.

        ConnectionError once the client is gone.
        """
        if self._head_only or not data:
            return
        if self._chunked_out:
            self.connection.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.connection.write(data)
        await self.connection.drain()

    async def end(self) -> None:
        if self._chunked_out and not self._head_only:
            self.connection.write(b"0\r\n\r\n")
        self.finished = True
        await self.connection.drain()

    def abort(self) -> None:
        """Drop the connection (the client sees a short answer rather than a wrong one)."""
        self.connection.abort()


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
            context if isinstance(context, _Refused) else _Refused(_short(str(err) or type(err).__name__))
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
        wanted = _short(headers.get("upgrade", "") or "CONNECT")[:40]
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
