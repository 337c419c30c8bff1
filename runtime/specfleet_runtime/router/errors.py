"""Errors in OpenAI's JSON format: `{"error": {"message", "type", "param", "code"}}`.

Every error the router itself produces goes through `error_response`, so clients (the `openai`
package included) get the exception class that matches the status code and a readable message.
"""

from __future__ import annotations

import json
from typing import Any

from specfleet_runtime.router.reply import Reply, json_reply

# Status -> OpenAI error `type` for the errors the router produces.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


def clip(text: str, limit: int = 100) -> str:
    """A client's text quoted in a message: its first `limit` characters, "…" if there were more."""
    return text if len(text) <= limit else text[:limit] + "…"


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    return json_reply(error_body(status, message, code, param), status, headers)


def sse_error_event(message: str, code: str) -> bytes:
    """An SSE event carrying an error; the openai client raises APIError when it reads one."""
    return f"data: {json.dumps(error_body(502, message, code))}\n\n".encode()
