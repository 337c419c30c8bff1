"""Reading a request body within bounds: size, time, and the bytes that arrived for all requests.

Every refusal is a `Refusal` carrying the OpenAI-format error to send, so the handler has one place
that turns them into responses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from specfleet_runtime.router.message import BadRequestBody, Request
from specfleet_runtime.router.metrics import RouterMetrics


class Refusal(Exception):
    """A request the router answers itself with an OpenAI-format error."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, message, code, param)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers


# A body still arriving that has sent nothing for this long may be shed when the budget is full.
STALL_SECONDS = 1.0


@dataclass(eq=False, slots=True)
class BodyHold:
    """The bytes one request's body holds in the budget while it arrives."""

    request: Request
    last: float  # when its last bytes arrived
    held: int = 0
    shed: bool = False

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(self, request: Request, last: float, held: int = 0, shed: bool = False) -> None:
        self.request = request
        self.last = last
        self.held = held
        self.shed = shed


class ByteBudget:
    """Request body bytes that arrived and are held by all requests together, against a cap (0: none).

    Bytes count as they arrive, never from a declared Content-Length, so declaring a large body reserves
    nothing. When arriving bytes do not fit, bodies still arriving that sent nothing for `STALL_SECONDS`
    are shed to make room, stalest first (their senders get 408): a slow body costs its sender, not
    everyone. Only if that is not enough is the arriving request refused (503). One request never holds
    more than the body limit (413).
    """

    def __init__(self, cap: int, metrics: RouterMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.cap = cap
        self.used = 0
        self.clock = clock
        self._arriving: set[BodyHold] = set()
        self._gauge = metrics.value(metrics.bytes_in_flight)

    def take(self, size: int, hold: BodyHold | None = None) -> bool:
        """Count `size` more bytes (for `hold`, a body still arriving, if given); False if they do not fit."""
        if self.cap and self.used + size > self.cap and not self._shed_stalled(size, hold):
            return False
        self.used += size
        self._gauge.inc(size)
        if hold is not None:
            hold.held += size
            hold.last = self.clock()
        return True

    def give(self, size: int) -> None:
        self.used -= size
        self._gauge.dec(size)

    def arriving(self, request: Request) -> BodyHold:
        hold = BodyHold(request, self.clock())
        self._arriving.add(hold)
        return hold

    def arrived(self, hold: BodyHold) -> None:
        """The body is complete (or refused): it can no longer be shed."""
        self._arriving.discard(hold)

    def _shed_stalled(self, size: int, keep: BodyHold | None) -> bool:
        now = self.clock()
        stalled = sorted(
            (h for h in self._arriving if h is not keep and not h.shed and now - h.last >= STALL_SECONDS),
            key=lambda h: h.last,
        )
        for hold in stalled:
            if self.used + size <= self.cap:
                break
            hold.shed = True
            self._arriving.discard(hold)
            self.give(hold.held)
            hold.held = 0
            # Wakes its reader, which answers 408 (see read_body).
            hold.request._fail("shed")
        return self.used + size <= self.cap


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    timeout: float
    retry_after_seconds: int = 1


def _too_large(limit: int) -> Refusal:
    return Refusal(413, f"request body exceeds {limit} bytes", "request_too_large")


def _overloaded(limits: BodyLimits) -> Refusal:
    return Refusal(
        503,
        "the router holds too many request bytes; retry shortly",
        "overloaded",
        headers={"Retry-After": str(limits.retry_after_seconds)},
    )


async def read_body(request: Request, limits: BodyLimits, budget: ByteBudget) -> tuple[bytes, int]:
    """The request body and the bytes it holds in `budget` (the caller gives them back).

    Refuses past `limits.max_bytes` (413, as soon as it is declared or arrives), when the budget cannot
    hold the bytes that arrived (503 + Retry-After), when the whole body does not arrive within
    `limits.timeout` (408: a body shorter than its Content-Length, or a client trickling it), when the
    budget shed it as stalled (408), and broken chunked framing (400). Nothing beyond the limit is kept.
    """
    declared = request.content_length
    if declared is not None and declared > limits.max_bytes:
        raise _too_large(limits.max_bytes)
    if request.body_complete and request.error is None:
        # The whole body came with the head (the common case): no wait, so no timer to arm (an
        # asyncio.timeout costs several µs a request).
        body = request.take()
        if len(body) > limits.max_bytes:
            raise _too_large(limits.max_bytes)
        if not budget.take(len(body)):
            raise _overloaded(limits)
        return body, len(body)
    hold = budget.arriving(request)
    try:
        return await _read_arriving(request, limits, budget, hold)
    except BaseException:
        budget.give(hold.held)
        hold.held = 0
        raise
    finally:
        budget.arrived(hold)


async def _read_arriving(
    request: Request, limits: BodyLimits, budget: ByteBudget, hold: BodyHold
) -> tuple[bytes, int]:
    try:
        async with asyncio.timeout(limits.timeout):
            chunks: list[bytes] = []
            size = 0
            while chunk := await request.read_chunk():
                size += len(chunk)
                if size > limits.max_bytes:
                    raise _too_large(limits.max_bytes)
                if not budget.take(len(chunk), hold):
                    raise _overloaded(limits)
                chunks.append(chunk)
            return b"".join(chunks), hold.held
    except TimeoutError:
        raise Refusal(
            408, f"request body not received within {limits.timeout:g}s", "request_timeout"
        ) from None
    except BadRequestBody as err:
        if hold.shed:
            raise Refusal(
                408,
                f"request body stalled for {STALL_SECONDS:g}s while the router was short of memory",
                "request_timeout",
            ) from None
        raise Refusal(400, f"malformed HTTP request: {err}", "invalid_request") from None
    except asyncio.IncompleteReadError:
        raise Refusal(400, "request body shorter than its Content-Length", "invalid_request") from None
