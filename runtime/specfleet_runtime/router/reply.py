"""A whole answer the router sends in one write (see `server.Request.send`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    """A whole answer: status, body, headers; `close` ends the connection after it."""

    status: int
    body: bytes = b""
    headers: Sequence[tuple[str, str]] | Mapping[str, str] = ()
    reason: str | None = None
    close: bool = False
    content_type: str | None = "application/json"  # None: it is among `headers`

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] | Mapping[str, str] = (),
        reason: str | None = None,
        close: bool = False,
        content_type: str | None = "application/json",
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.reason = reason
        self.close = close
        self.content_type = content_type


def json_reply(
    doc: Any, status: int = 200, headers: Mapping[str, str] | None = None, close: bool = False
) -> Reply:
    return Reply(status, json.dumps(doc).encode(), headers or {}, close=close)
