"""A bounded fuzz of the router's HTTP surface (hypothesis): whatever bytes arrive, the router answers
with OpenAI-format errors or a proxied answer, logs no traceback, holds no memory afterwards, only
ever sends allow-listed paths to an engine, and still serves a normal request at the end.

The router and a recording engine run on an event loop in a thread, so hypothesis drives plain
sockets from the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import resource
import socket
import string
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfleet_runtime.router.app import Router
from specfleet_runtime.router.body import FIELDS as BODY_FIELDS
from specfleet_runtime.router.body import MAX_DEPTH, read_body_fields
from specfleet_runtime.router.classify import InvalidRequest
from support.router_harness import (
    FAST,
    GOOD,
    MODEL,
    RecordingEngine,
    recording_engine,
    routing,
    running_router,
)

pytestmark = pytest.mark.timeout(300)

ENGINE_PATHS = {"/v1/completions", "/v1/chat/completions"}
# Statuses seen over the whole fuzz: it must reach past the parser into routing, checks and the engine.
SEEN: Counter[int | None] = Counter()


class Target:
    """Router + recording engine on a private event loop; stopped at the end of the module."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.url = ""
        self.router: Router | None = None
        self.engine: RecordingEngine | None = None
        self.tmp = tmp
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self.stop = asyncio.Event()
        settings = replace(
            FAST,
            body_timeout=0.3,
            idle_timeout=1.0,
            max_body_bytes=64 * 1024,
            max_bytes_in_flight=1024 * 1024,
        )
        async with recording_engine() as engine:
            # Both identity headers trusted, so the fuzzed values of each are read.
            doc = routing(
                [engine.url],
                [],
                tenantRules=[{"pool": "latency", "tenants": ["t"]}],
                tenantHeaderTrust="Trusted",
                clientHeaderTrust="Trusted",
            )
            async with running_router(self.tmp, doc, settings) as rr:
                self.url, self.router, self.engine = rr.url, rr.router, engine
                self.ready.set()
                await self.stop.wait()

    def __enter__(self) -> Target:
        self.thread.start()
        assert self.ready.wait(30), "router did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with Target(tmp_path_factory.mktemp("fuzz")) as t:
        yield t


def exchange(url: str, data: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """Send raw bytes and read one answer (None if the router closed without one)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        with contextlib.suppress(OSError):  # the router may close early (answered, or refused the head)
            sock.sendall(data)
        raw = b""
        try:
            while b"\r\n\r\n" not in raw and (chunk := sock.recv(65536)):
                raw += chunk
            head, _, body = raw.partition(b"\r\n\r\n")
            if not head:
                return None
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            while len(body) < length and (chunk := sock.recv(65536)):
                body += chunk
        except ConnectionResetError:
            return None
    return int(lines[0].split()[1]), headers, body


SEGMENTS = st.sampled_from(
    ["v1", "completions", "chat", "models", MODEL, "..", ".", "%2e%2e", "%2E", "%2f", "", "metrics",
     "admin", "healthz", "readyz", "%00", "%ff", "%", "embeddings", "?x=1", "#f", ";p"]
) | st.text(alphabet=string.printable, max_size=6)  # fmt: skip
PATHS = st.sampled_from(
    ["/v1/completions"] * 4
    + ["/v1/chat/completions", "/v1/./completions", "*", "http://x/v1/completions", ""]
) | st.lists(SEGMENTS, max_size=6).map(lambda s: "/" + "/".join(s))
METHODS = st.sampled_from(
    ["POST"] * 6 + ["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW"]
) | st.text(alphabet=string.ascii_letters + string.punctuation + " ", min_size=1, max_size=8)
HEADER_NAMES = st.sampled_from(
    ["x-specfleet-pool", "x-specfleet-tenant", "x-specfleet-client", "authorization", "content-type",
     "transfer-encoding", "expect", "connection", "x-forwarded-for", "host", "upgrade"]
) | st.text(alphabet=string.ascii_letters + "-_:", min_size=1, max_size=12)  # fmt: skip
HEADER_VALUES = st.sampled_from(["latency", "batch", "BATCH", "gpu", "t", "Bearer sk-x", "chunked", "100-continue",
                                 "close", "keep-alive", "websocket", "application/json"]) | st.text(
    alphabet=string.printable, max_size=30
)  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "stream"]
)
VALID = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": st.text(max_size=20)},
    optional={"max_tokens": st.integers(1, 5000), "stream": st.booleans(), "n": st.integers(1, 8)},
).map(lambda d: json.dumps(d).encode())
BODIES = (
    VALID
    | VALID
    | st.binary(max_size=512)
    | st.dictionaries(FIELDS | st.text(max_size=6), JSON_VALUES, max_size=6).map(
        lambda d: json.dumps(d).encode()
    )
    | st.fixed_dictionaries(
        {"model": st.just(MODEL), "prompt": st.text(max_size=20)},
        optional={"max_tokens": JSON_VALUES, "stream": JSON_VALUES, "n": JSON_VALUES},
    ).map(lambda d: json.dumps(d).encode())
    | st.integers(1, 70).map(lambda k: b'{"prompt": ' + b"[" * (k * 20) + b"]" * (k * 20) + b"}")
)
FRAMING = st.sampled_from(["length"] * 4 + ["none", "short", "long", "chunked", "bad-chunked", "two-lengths"])


def build(method: str, path: str, headers: list[tuple[str, str]], body: bytes, framing: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: router", "Connection: close"]
    lines += [
        f"{name}: {value}" for name, value in headers if "\r" not in value + name and "\n" not in value + name
    ]
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
    elif framing == "short":
        lines.append(f"Content-Length: {max(len(body) - 3, 0)}")
    elif framing == "long":
        lines.append(f"Content-Length: {len(body) + 5}")
    elif framing == "two-lengths":
        lines += [f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 1}"]
    elif framing in ("chunked", "bad-chunked"):
        lines.append("Transfer-Encoding: chunked")
        size = f"{len(body):x}" if framing == "chunked" else "zz"
        body = f"{size}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n" + body


def check_answer(answer: tuple[int, dict[str, str], bytes] | None, method: str) -> None:
    if answer is None:
        return  # closed without an answer (the client half-closed inside a request): allowed
    status, headers, body = answer
    assert 100 <= status < 600
    if status >= 400:
        assert headers.get("content-type", "").startswith("application/json"), (status, headers, body[:200])
        if method == "HEAD":
            return  # no body, by definition
        doc: Any = json.loads(body[: int(headers["content-length"])] if "content-length" in headers else body)
        assert set(doc) == {"error"}
        assert set(doc["error"]) == {"message", "type", "param", "code"}
        assert doc["error"]["message"]


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(method=METHODS, path=PATHS, headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=3),
       body=BODIES, framing=FRAMING)  # fmt: skip
def test_fuzzed_requests(
    target: Target, method: str, path: str, headers: list[tuple[str, str]], body: bytes, framing: str
) -> None:
    answer = exchange(target.url, build(method, path, headers, body, framing))
    SEEN[answer[0] if answer else None] += 1
    check_answer(answer, method)
    assert target.engine is not None
    assert {seen.partition("?")[0] for seen in target.engine.seen} <= ENGINE_PATHS


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1//completions", "/v1/%2e/completions"]),
       headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=3), body=BODIES)  # fmt: skip
def test_fuzzed_inference_requests(
    target: Target, path: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    # Well-framed POSTs to the served paths: the body checks, classification and proxying get the fuzz.
    answer = exchange(target.url, build("POST", path, headers, body, "length"))
    SEEN[answer[0] if answer else None] += 1
    check_answer(answer, "POST")
    assert target.engine is not None
    assert {seen.partition("?")[0] for seen in target.engine.seen} <= ENGINE_PATHS


def test_after_the_fuzz(target: Target, caplog: pytest.LogCaptureFixture) -> None:
    # Runs after test_fuzzed_requests (file order): nothing held, no traceback, still serving.
    print("statuses seen:", dict(SEEN))
    assert {200, 400, 404, 405} <= set(SEEN)
    assert SEEN[200] >= 50
    router = target.router
    assert router is not None
    assert router.budget.used == 0
    assert router.in_flight == 0
    assert len(router.tracker) == 0
    assert router.backends.outstanding == {}
    # Memory bounded: the process's peak RSS stays far below what unbounded buffering would take.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 1024 * 1024  # KiB: 1 GiB
    answer = exchange(
        target.url, build("POST", "/v1/completions", [("Content-Type", "application/json")], GOOD, "length")
    )
    assert answer is not None
    assert answer[0] == 200


@pytest.fixture(autouse=True)
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.WARNING)
    yield
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()


# ---- the body reader against json.loads ------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from(["\ud800", "x\udc00", "\ud83d\ude00", "\x01"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from([*sorted(BODY_FIELDS), "prompt", "a"]) | st.text(max_size=8), inner, max_size=4
        )
    ),
    max_leaves=12,
)


def _engine_verdict(body: bytes) -> Any:
    """What an engine's json.loads accepts, less what the router refuses on purpose, and the fields."""
    if len(body) >= 2 and body[:4].count(0):
        return "error"  # UTF-16/32
    try:
        text = body.decode().removeprefix("\ufeff")
        non_finite: list[str] = []

        def finite(number: str) -> float:
            value = float(number)
            if not math.isfinite(value):
                non_finite.append(number)
            return value

        doc = json.loads(text, parse_constant=non_finite.append, parse_float=finite)
        if non_finite or not isinstance(doc, dict):
            return "error"
        json.dumps(doc, ensure_ascii=False).encode()  # a lone surrogate cannot be encoded
    except (ValueError, RecursionError, UnicodeEncodeError):
        return "error"

    def depth(value: Any) -> int:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return 1 + max(map(depth, inner), default=0) if isinstance(value, list | dict) else 0

    if depth(doc) > MAX_DEPTH:
        return "error"
    return {
        k: type(v).__name__ if isinstance(v, list | dict) else v for k, v in doc.items() if k in BODY_FIELDS
    }


def _reader_verdict(body: bytes, whole_parse_max: int) -> Any:
    try:
        read = read_body_fields(body, whole_parse_max)
    except InvalidRequest:
        return "error"
    return {k: type(v).__name__ if isinstance(v, list | dict) else v for k, v in read.fields.items()}


@settings(max_examples=600, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=64),
        JSON_VALUES.map(lambda value: json.dumps(value).encode()),
        st.tuples(
            JSON_VALUES, st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]), st.text(" \t\r\n")
        ).map(
            lambda item: (item[2] + json.dumps(item[0], ensure_ascii=False) + item[2]).encode(
                item[1], "surrogatepass"
            )
        ),
        st.text().map(lambda text: ('{"a": "' + text + '"}').encode("utf-8", "surrogatepass")),
    )
)
def test_body_reader_agrees_with_json_loads(body: bytes) -> None:
    """Parsed whole or scanned, the same verdict and fields as json.loads, less non-finite numbers,
    lone surrogates, UTF-16/32 and nesting past MAX_DEPTH (NaN compared by its text)."""
    expected = repr(_engine_verdict(body))
    assert repr(_reader_verdict(body, 1 << 20)) == expected
    assert repr(_reader_verdict(body, 0)) == expected


def test_a_scanned_body_reads_prompts_fields_and_utf8_across_its_windows() -> None:
    # A 4-byte character straddling the scanner's 1 MiB window, then the fields.
    pad = "x" * ((1 << 20) - 20) + "\U0001f600" * 8
    body = json.dumps({"pad": pad, "model": "m\u00e9", "prompt": [[1], [2], [3]], "n": 2}, ensure_ascii=False)
    read = read_body_fields(body.encode())
    assert read.fields == {"model": "m\u00e9", "n": 2}
    assert read.prompts == 3
    assert read_body_fields(json.dumps({"prompt": list(range(100_000))}).encode()).prompts == 1
    with pytest.raises(InvalidRequest, match="not valid UTF-8"):
        read_body_fields(body.encode()[:-30] + b"\xff" + body.encode()[-29:])
