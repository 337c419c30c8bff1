"""What a benchmark client (vLLM's own `vllm bench serve`) sees, real vLLM against the emulator.

Per-chunk arrival times of the same streamed request: the order of events must match (a chat stream's
role chunk not before the first token, usage last, then [DONE]), since clients take the first chunk
with choices as the first token. And /tokenize, /detokenize answer in the same shape.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_models import TinyModels
from vllm_harness import SERVED_MODEL_NAME, ServerProcess, engine_args, start_server, wait_all_healthy

from specfleet_runtime.vllm_args import build_vllm_args

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def emulator(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The emulator with the `off` server's vLLM arguments, its steps in real time."""
    engine = engine_args(tiny.target, None)
    server = start_server(
        "emulator",
        [sys.executable, "-m", "specfleet_runtime.emulator"],
        engine,
        build_vllm_args(engine),
        os.environ,
        Path(tmp_path_factory.mktemp("emulator")),
    )
    try:
        wait_all_healthy([server], timeout_s=120)
        yield server
    finally:
        server.stop(grace_s=10)


def post(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def stream_events(base: str, path: str, body: dict[str, Any]) -> list[tuple[float, str]]:
    """(seconds after sending, kind) of each SSE event: role, token, finish, usage or done."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    events: list[tuple[float, str]] = []
    try:
        sent = time.monotonic()
        conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            at = time.monotonic() - sent
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                events.append((at, "done"))
                continue
            data = json.loads(payload)
            if not data["choices"]:
                events.append((at, "usage" if data.get("usage") else "empty"))
                continue
            [choice] = data["choices"]
            if choice.get("finish_reason"):
                events.append((at, "finish"))
            elif "role" in choice.get("delta", {}):
                events.append((at, "role"))
            else:
                events.append((at, "token"))
    finally:
        conn.close()
    return events


def collapsed(events: list[tuple[float, str]]) -> list[str]:
    """The kinds in order, a run of tokens as one."""
    kinds: list[str] = []
    for _, kind in events:
        if not (kind == "token" and kinds and kinds[-1] == "token"):
            kinds.append(kind)
    return kinds


REQUESTS = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "ignore_eos": True},
    ),
    "completion": ("/v1/completions", {"prompt": "hello", "max_tokens": 8, "ignore_eos": True}),
}


@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_streamed_events_come_in_vllms_order(
    kind: str, off_server: ServerProcess, emulator: ServerProcess
) -> None:
    path, body = REQUESTS[kind]
    body = {**body, "model": SERVED_MODEL_NAME, "stream_options": {"include_usage": True}}
    seen = {
        who: stream_events(s.base_url, path, body)
        for who, s in (("vLLM", off_server), ("emulator", emulator))
    }
    print(f"{kind} events (s, kind):", seen, file=sys.stderr)
    orders = {who: collapsed(events) for who, events in seen.items()}
    assert orders["emulator"] == orders["vLLM"]
    expected = ["token", "finish", "usage", "done"]
    assert orders["vLLM"] == (["role", *expected] if kind == "chat" else expected)
    for who, events in seen.items():
        if kind == "chat":
            (role_at, _), (token_at, _) = events[0], events[1]
            # The role chunk leaves with the first token, not when the response starts.
            assert role_at >= 0.5 * token_at, (who, events[:3])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": "hello world"}),
        ("/tokenize", {"prompt": "hello world", "return_token_strs": True}),
        ("/tokenize", {"messages": [{"role": "user", "content": "hello"}]}),
        ("/tokenize", {"messages": [{"role": "user", "content": "hello"}], "add_generation_prompt": False}),
        ("/detokenize", {"tokens": [1, 2, 3]}),
        ("/tokenize", {"model": "no-such-model", "prompt": "x"}),
    ],
)
def test_tokenizer_endpoints_answer_in_vllms_shape(
    path: str, body: dict[str, Any], off_server: ServerProcess, emulator: ServerProcess
) -> None:
    body = {"model": SERVED_MODEL_NAME, **body}
    (real_status, real), (fake_status, fake) = (post(s.base_url, path, body) for s in (off_server, emulator))
    assert fake_status == real_status, (real, fake)
    assert set(fake) == set(real), (real, fake)
    if "error" in real:
        assert set(fake["error"]) == set(real["error"])
        return
    for key, value in real.items():
        assert type(fake[key]) is type(value), (key, real, fake)
    if path == "/tokenize":
        assert fake["max_model_len"] == real["max_model_len"]
        assert fake["count"] == len(fake["tokens"])
        # The count is what a completion of the same prompt reports (each server by its own rule).
        if "prompt" in body:
            gen = {"model": SERVED_MODEL_NAME, "prompt": body["prompt"], "max_tokens": 1}
            for s, doc in ((off_server, real), (emulator, fake)):
                assert post(s.base_url, "/v1/completions", gen)[1]["usage"]["prompt_tokens"] == doc["count"]
