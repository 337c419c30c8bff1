"""The engine leg's HTTP/1.1 client: asyncio protocols, httptools' C parser, a keep-alive pool per engine.

aiohttp's `ClientSession` builds a request object, a response object, timers and header multidicts
for every request; on the router's hot path that was a large share of its CPU. This client does only
what the proxy needs: one write of the request head and body, the response head parsed into a status,
a reason and a header list, and the body handed over chunk by chunk as it arrives (chunked transfer
decoded), with flow control so a slow client does not make the router buffer an engine's answer.

Errors say what the proxy's retry rules need to know: whether the connection failed before anything
was sent (`ConnectFailed`, `ConnectTimedOut`), whether the engine dropped the connection before any
byte of its answer (`Disconnected`: often a pooled connection it closed, safe to retry), whether it went
silent (`ReadTimedOut`), or whether its answer broke after it started (`BrokenResponse`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterable

import httptools

# Body bytes held for one response before the engine's socket stops being read.
READ_BUFFER_LIMIT = 256 * 1024
KEEPALIVE_SECONDS = 30.0


class UpstreamError(Exception):
    """The engine leg failed."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, reset while connecting."""


class ConnectTimedOut(UpstreamError):
    """No connection within the connect timeout."""


class Disconnected(UpstreamError):
    """The engine closed the connection before the first byte of its answer."""


class ReadTimedOut(UpstreamError):
    """No byte from the engine within the read timeout."""


class BrokenResponse(UpstreamError):
    """The answer broke after it started: cut short, or not HTTP."""


class _Connection(asyncio.Protocol):
    """One connection to an engine; at most one request on it at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.response: Response | None = None
        # The read timer is lazy (see `wait`): one handle per connection, re-armed only when it fires.
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        self._timeout = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when that handle fires
        # One parser for every answer on this connection, its callbacks handed to the answer being
        # read. (A parser per answer, holding that answer as its callbacks, made a reference cycle per
        # request that only the garbage collector freed.)
        self.parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    # ---- httptools callbacks -------------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        if self.response is not None:
            self.response.on_status(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response.on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.on_body(body)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response.on_message_complete()

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            # Bytes with no request outstanding: the connection is unusable.
            self.abort()
            return
        response.feed(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.transport = None
        self._drop_timer()
        if self.response is not None:
            self.response.lost(exc)

    def abort(self) -> None:
        self.closed = True
        self._drop_timer()
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def arm(self, waiter: asyncio.Future[None], timeout: float) -> None:
        """Fail `waiter` with ReadTimedOut if it is still pending `timeout` seconds from now.

        Lazy: arming sets a deadline and creates a timer handle only if none is pending that fires no
        later (`disarm` clears the deadline and leaves the handle); the handle, when it fires, re-arms
        itself for a deadline that moved on, drops itself if none is set, and fails the waiter only once
        its deadline passed. A pooled connection under load so costs a clock read per wait instead of a
        timer created and cancelled.
        """
        deadline = self.loop.time() + timeout
        self._waiter = waiter
        self._deadline = deadline
        self._timeout = timeout
        timer = self._timer
        if timer is None or deadline < self._timer_at:
            # None pending, or one for a longer timeout (the wait for an answer's head) that would fire late.
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(deadline, self._check)
            self._timer_at = deadline

    def disarm(self) -> None:
        self._waiter = None
        self._deadline = None

    def _check(self) -> None:
        deadline = self._deadline
        if deadline is None:
            self._timer = None
            return
        if self.loop.time() < deadline:
            self._timer = self.loop.call_at(deadline, self._check)
            self._timer_at = deadline
            return
        self._timer = None
        waiter = self._waiter
        if waiter is not None:
            _time_out(waiter, self._timeout)

    def _drop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Response:
    """An engine's answer: head once `Client.request` returns, body through `read_chunk`/`read_all`."""

    def __init__(self, connection: _Connection, pool: Pool, read_timeout: float) -> None:
        self._connection = connection
        self._pool = pool
        # The longest silence waited for; the proxy shortens it once the answer started.
        self.read_timeout = read_timeout
        self._parser = connection.parser
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.content_length: int | None = None
        self.content_type = ""
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._head_done = False
        self._complete = False
        self._started = False  # any byte of the answer arrived
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._released = False
        self._chunked = False
        self._keep_alive = False

    # ---- httptools callbacks (through the connection) ----------------------------------------------

    def on_status(self, status: bytes) -> None:
        self.reason = status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        for name, value in self.headers:
            lower = name.lower()
            if lower == "content-length":
                try:
                    self.content_length = int(value)
                except ValueError:
                    self.content_length = None
            elif lower == "content-type":
                self.content_type = value.partition(";")[0].strip().lower()
            elif lower == "transfer-encoding":
                self._chunked = "chunked" in value.lower()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > READ_BUFFER_LIMIT and not self._paused:
            transport = self._connection.transport
            if transport is not None:
                self._paused = True
                transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        # Asked now: the parser forgets once it is ready for the next message.
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()

    # ---- from the connection -------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        self._started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(BrokenResponse(f"malformed answer from the engine: {err}"))
            self._connection.abort()

    def lost(self, exc: BaseException | None) -> None:
        if self._complete:
            return
        if self._head_done and self.content_length is None and not self._chunked:
            # An answer delimited by the end of the connection (no length, not chunked).
            self._complete = True
            self._wake()
            return
        if not self._started:
            self._fail(Disconnected(f"the engine closed the connection before answering ({exc or 'EOF'})"))
        else:
            self._fail(BrokenResponse(f"the engine's answer was cut short ({exc or 'EOF'})"))

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        """Until the next event on this response, or ReadTimedOut after read_timeout of silence."""
        connection = self._connection
        waiter = connection.loop.create_future()
        self._waiter = waiter
        connection.arm(waiter, self.read_timeout)
        try:
            await waiter
        finally:
            connection.disarm()
            self._waiter = None

    # ---- for the proxy -------------------------------------------------------------------------

    async def read_head(self) -> None:
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read_chunk(self) -> bytes:
        """The next body bytes as they arrived; b"" at the end of the answer."""
        while not self._chunks:
            if self._complete:
                self.release()
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        if len(self._chunks) == 1:
            data = self._chunks.popleft()
        else:
            data = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            transport = self._connection.transport
            if transport is not None:
                transport.resume_reading()
        return data

    async def read_all(self, limit: int | None = None) -> bytes:
        """The whole body (or its first `limit` bytes or more, if given)."""
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await self.read_chunk()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
        return b"".join(parts)

    def release(self) -> None:
        """Done with this answer: a complete one leaves its connection pooled, anything else closes it."""
        if self._released:
            return
        self._released = True
        connection = self._connection
        connection.response = None
        if self._complete and self._keep_alive and self._error is None and not connection.closed:
            if self._paused and connection.transport is not None:
                connection.transport.resume_reading()
            self._pool.put(connection)
        else:
            connection.abort()

    def close(self) -> None:
        """Stop: an unfinished answer's connection is dropped, which tells the engine to stop."""
        if not self._complete:
            self._connection.response = None
            self._connection.abort()
            self._released = True
            return
        self.release()


def _time_out(waiter: asyncio.Future[None], seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(ReadTimedOut(f"no byte from the engine in {seconds:g}s"))


class Pool:
    """Idle keep-alive connections to one engine, most recently used first."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: list[_Connection] = []

    def get(self, now: float) -> _Connection | None:
        idle = self.idle
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            connection.abort()
        return None

    def put(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self.idle.append(connection)

    def close(self) -> None:
        for connection in self.idle:
            connection.abort()
        self.idle.clear()


class Client:
    """Requests to engines named by base URL (`http://host:port`), over pooled connections."""

    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._pools: dict[str, Pool] = {}

    def _pool(self, base: str) -> Pool:
        pool = self._pools.get(base)
        if pool is None:
            rest = base.partition("://")[2]
            host, _, port = rest.rpartition(":")
            if not host or not port.isdigit():
                host, port = rest, "80"
            pool = self._pools[base] = Pool(host.strip("[]"), int(port))
        return pool

    async def _connect(self, pool: Pool) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(lambda: _Connection(loop), pool.host, pool.port)
        except TimeoutError:
            raise ConnectTimedOut(
                f"no connection to {pool.host}:{pool.port} within {self.connect_timeout:g}s"
            ) from None
        except OSError as err:
            raise ConnectFailed(f"cannot connect to {pool.host}:{pool.port}: {err}") from None
        return connection

    async def request(
        self, method: str, base: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> Response:
        """Send one request; returns once the answer's head arrived (its body is read from the Response)."""
        pool = self._pool(base)
        connection = pool.get(time.monotonic())
        if connection is None:
            connection = await self._connect(pool)
        response = Response(connection, pool, self.read_timeout)
        connection.response = response
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {pool.host}:{pool.port}\r\n"]
        for name, value in headers:
            lines.append(f"{name}: {value}\r\n")
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
        head = "".join(lines).encode("utf-8", "surrogateescape")
        try:
            transport = connection.transport
            if transport is None:
                raise Disconnected("the pooled connection closed before the request was sent")
            transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                transport.write(body)
            await response.read_head()
        except BaseException:
            response.close()
            raise
        return response

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
