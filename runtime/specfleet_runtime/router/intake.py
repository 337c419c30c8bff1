"""Reading a request body within bounds: size, time, and the bytes all requests hold together.

Every refusal is a `Refusal` carrying the OpenAI-format error to send, so the handler has one place
that turns them into responses.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
from dataclasses import dataclass
from typing import Any

from specfleet_runtime.router.classify import InvalidRequest
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.server import BadRequestBody, Request


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


class ByteBudget:
    """Request body bytes held by all requests together, against a cap (0: no cap)."""

    def __init__(self, cap: int, metrics: RouterMetrics) -> None:
        self.cap = cap
        self.used = 0
        self._gauge = metrics.value(metrics.bytes_in_flight)

    def take(self, size: int) -> bool:
        if self.cap and self.used + size > self.cap:
            return False
        self.used += size
        self._gauge.inc(size)
        return True

    def give(self, size: int) -> None:
        self.used -= size
        self._gauge.dec(size)


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
    """The request body and the bytes reserved for it in `budget` (the caller gives them back).

    Refuses past `limits.max_bytes` (413), when the budget cannot hold it (503 + Retry-After), when
    the whole body does not arrive within `limits.timeout` (408: a body shorter than its
    Content-Length, or a client trickling it), and broken chunked framing (400). Nothing beyond the
    limit is kept.
    """
    declared = request.content_length
    if declared is not None:
        if declared > limits.max_bytes:
            raise _too_large(limits.max_bytes)
        if not budget.take(declared):
            raise _overloaded(limits)
        reserved = declared
    else:
        reserved = 0
    if request.body_complete and request.error is None:
        # The whole body came with the head (the common case): no wait, so no timer to arm (an
        # asyncio.timeout costs several µs a request).
        body = request.take()
        if declared is not None:
            return body, reserved
        if len(body) > limits.max_bytes:
            raise _too_large(limits.max_bytes)
        if not budget.take(len(body)):
            raise _overloaded(limits)
        return body, len(body)
    try:
        async with asyncio.timeout(limits.timeout):
            chunks: list[bytes] = []
            size = 0
            while chunk := await request.read_chunk():
                size += len(chunk)
                if size > limits.max_bytes:
                    raise _too_large(limits.max_bytes)
                if declared is None:
                    if not budget.take(len(chunk)):
                        raise _overloaded(limits)
                    reserved += len(chunk)
                chunks.append(chunk)
            return b"".join(chunks), reserved
    except TimeoutError:
        budget.give(reserved)
        raise Refusal(
            408, f"request body not received within {limits.timeout:g}s", "request_timeout"
        ) from None
    except BadRequestBody as err:
        budget.give(reserved)
        raise Refusal(400, f"malformed HTTP request: {err}", "invalid_request") from None
    except asyncio.IncompleteReadError:
        budget.give(reserved)
        raise Refusal(400, "request body shorter than its Content-Length", "invalid_request") from None
    except BaseException:
        budget.give(reserved)
        raise


# json's own C scanner, made for the default decoder as json.loads uses it, and json's whitespace.
# (typeshed types its argument as a scanner; it is the decoder whose settings it copies)
_scan_once = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_WHITESPACE = " \t\n\r"


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or InvalidRequest (400) for anything else.

    Exactly `json.loads(body)`, without its Python-level steps in the common case: UTF-8 without a
    byte order mark is decoded here and handed to json's own scanner (the C one) once, with json's
    whitespace rule and errors; anything else (a byte order mark, UTF-16/32, lone surrogates) goes
    through json.loads itself.
    """
    try:
        try:
            text = body.decode()
        except UnicodeDecodeError:
            text = ""
        if not text or text[0] == "\ufeff":
            doc = json.loads(body)
        else:
            start = len(text) - len(text.lstrip(_WHITESPACE))
            try:
                doc, end = _scan_once(text, start)
            except StopIteration as stop:
                raise json.JSONDecodeError("Expecting value", text, stop.value) from None
            rest = text[end:]
            if rest:
                extra = len(rest) - len(rest.lstrip(_WHITESPACE))
                if extra != len(rest):
                    raise json.JSONDecodeError("Extra data", text, end + extra)
    except (ValueError, RecursionError) as err:
        # ValueError covers JSONDecodeError, bad UTF-8 and integers past Python's digit limit;
        # RecursionError very deep nesting.
        raise InvalidRequest(f"request body is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object")
    return doc
