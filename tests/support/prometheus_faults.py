"""A proxy in front of a real Prometheus that can be switched to answer badly, for fault tests.

Modes: "pass" forwards every request; "garbage" answers 200 with bodies that are not Prometheus
answers (HTML, JSON of the wrong shape, a sample without a value, in turn); "empty" answers every
query with an empty vector; "slow" holds each request `slow_seconds` (past the client's timeout) and
then forwards it. Each answer is counted per mode, and each round of the operator's fleet queries
(they share one evaluation `time` parameter) once per mode, so a test can wait for N evaluations.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("pass", "garbage", "empty", "slow")
EMPTY_VECTOR = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()


def _garbage_bodies() -> list[bytes]:
    sample_without_value = {
        "metric": {"namespace": "x", "specfleet_io_deployment": "x", "specfleet_io_pool": "latency"}
    }
    return [
        b"<html><body>502 Bad Gateway</body></html>",
        json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": {"not": "a list"}}}
        ).encode(),
        json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": [sample_without_value]}}
        ).encode(),
    ]


class FaultyPrometheus:
    """`url` stands in for the Prometheus at `upstream`; set `mode` at any time."""

    def __init__(self, upstream: str, slow_seconds: float = 4.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.slow_seconds = slow_seconds
        self.mode = "pass"
        self.answers: Counter[str] = Counter()
        self._rounds: dict[str, set[str]] = {m: set() for m in MODES}
        self._garbage = itertools.cycle(_garbage_bodies())
        self._lock = threading.Lock()
        # No proxy from the environment: loopback only.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="faulty-prometheus", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultyPrometheus:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def rounds(self, mode: str) -> int:
        """Rounds of fleet queries answered in `mode` so far (distinct evaluation times)."""
        with self._lock:
            return len(self._rounds[mode])

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
        with self._lock:
            self.answers[mode] += 1
            self._rounds[mode].add((query.get("time") or [""])[0])
            garbage = next(self._garbage)
        try:
            if mode == "garbage":
                self._reply(handler, 200, garbage, "application/json")
            elif mode == "empty":
                self._reply(handler, 200, EMPTY_VECTOR, "application/json")
            else:
                if mode == "slow":
                    time.sleep(self.slow_seconds)  # the fault itself: an answer later than the timeout
                self._forward(handler)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a slow answer): nothing to do

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        try:
            with self._opener.open(self.upstream + handler.path, timeout=30) as response:
                status, body = response.status, response.read()
                content_type = response.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as err:
            status, body, content_type = err.code, err.read(), "application/json"
        self._reply(handler, status, body, content_type)

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
