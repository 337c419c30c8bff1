"""The router's request/response interface (`Request`, `Headers`) and what its HTTP server says without
a request: canned whole answers for refusals, the Date header, a rate-limited log for what clients can
trigger at will. `Request` sees its connection only through `RequestConnection` (server.py's
`Connection` implements it), so the request path does not depend on how connections are served."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, ClassVar, Protocol

from specfleet_runtime.router.errors import error_body
from specfleet_runtime.router.reply import Reply

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


def short(text: str) -> str:
    return " ".join(text.split())[:200]


class DateHeader:
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


class RequestConnection(Protocol):
    """What a `Request` needs of the connection it arrived on."""

    loop: asyncio.AbstractEventLoop
    lost: bool
    closing: bool
    task: asyncio.Task[None] | None  # the task serving the connection's requests (a stall watch cancels it)

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def abort(self) -> None: ...


@dataclass(eq=False, slots=True)
class Request:
    """One request, as the handler sees it. The body arrives through `take`/`read_chunk` (see intake)."""

    connection: RequestConnection
    method: str
    target: str
    headers: Headers
    remote: str | None
    keep_alive: bool
    http11: bool
    content_length: int | None
    expect_continue: bool = False
    # The request's state as it is served, never given to the constructor.
    complete: bool = field(default=False, init=False)  # the whole message (body included) arrived
    too_large: bool = field(default=False, init=False)
    error: str | None = field(default=None, init=False)
    started: bool = field(default=False, init=False)  # the response head went out
    finished: bool = field(default=False, init=False)  # the response is complete
    close_after: bool = field(default=False, init=False)
    _chunks: list[bytes] = field(default_factory=list, init=False)
    _buffered: int = field(default=0, init=False)
    _waiter: asyncio.Future[None] | None = field(default=None, init=False)
    _chunked_out: bool = field(default=False, init=False)
    _head_only: bool = field(default=False, init=False)

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(
        self,
        connection: RequestConnection,
        method: str,
        target: str,
        headers: Headers,
        remote: str | None,
        keep_alive: bool,
        http11: bool,
        content_length: int | None,
        expect_continue: bool = False,
    ) -> None:
        self.connection = connection
        self.method = method
        self.target = target
        self.headers = headers
        self.remote = remote
        self.keep_alive = keep_alive
        self.http11 = http11
        self.content_length = content_length
        self.expect_continue = expect_continue
        self.complete = False
        self.too_large = False
        self.error = None
        self.started = False
        self.finished = False
        self.close_after = False
        self._chunks = []
        self._buffered = 0
        self._waiter = None
        self._chunked_out = False
        self._head_only = False

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
        return "".join(lines).encode("latin-1", "replace") + DateHeader.get() + b"\r\n"

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
