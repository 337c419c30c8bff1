"""The router's /tokenize and /detokenize: forwarded to an engine serving the model, as vLLM answers
them, under the same body bounds and model check as inference; not classified as inference."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specfleet_runtime.emulator.testing import serve_emulator
from support.router_harness import (
    FAST,
    MODEL,
    assert_openai_error,
    emulator_config,
    raw_exchange,
    raw_request,
    recording_engine,
    routing,
    running_router,
)

pytestmark = pytest.mark.timeout(60)

BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/tokenize", {"model": MODEL, "prompt": "Hello, tokenizer world."}),
    ("/tokenize", {"model": MODEL, "prompt": "Hi there", "return_token_strs": True}),
    ("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "Hi!"}]}),
    ("/tokenize", {"prompt": "no model named: the served one"}),
    ("/detokenize", {"model": MODEL, "tokens": [0, 1, 2]}),
]


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_tokenizer_routes_answer_as_the_engine_does(tmp_path: Path) -> None:
    async with (
        serve_emulator(emulator_config(time_scale=0.0)) as emu,
        running_router(tmp_path, routing([emu.url], [emu.url])) as rr,
    ):
        for path, body in BODIES:
            direct = await post(f"{emu.url}{path}", body)
            through = await post(f"{rr.url}{path}", body)
            assert direct[0] == 200, (path, body, direct)
            assert through == direct, (path, body)
        # An engine's refusal of a bad id comes back as it is (OpenAI's format).
        status, doc = await post(f"{rr.url}/detokenize", {"model": MODEL, "tokens": [-1]})
        assert status == 400
        assert_openai_error(doc, param="tokens")


async def test_tokenizer_requests_are_not_counted_as_inference(tmp_path: Path) -> None:
    async with (
        serve_emulator(emulator_config(time_scale=0.0)) as emu,
        running_router(tmp_path, routing([emu.url], [])) as rr,
    ):
        status, _ = await post(f"{rr.url}/tokenize", {"model": MODEL, "prompt": "x"})
        assert status == 200
        samples = [s for family in rr.router.metrics.registry.collect() for s in family.samples]
        counted = [s for s in samples if s.name == "specfleet_router_requests_total" and s.value]
        ttfb = [s for s in samples if s.name == "specfleet_router_time_to_first_byte_seconds_count"]
        assert counted == []
        assert all(s.value == 0 for s in ttfb)


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model_not_found"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model_not_found"),
        ("/tokenize", {"model": 5, "prompt": "x"}, 400, "invalid_request"),
        ("/tokenize", [1, 2], 400, "invalid_request"),
    ],
)
async def test_refused_before_any_engine_sees_it(
    tmp_path: Path, path: str, body: Any, status: int, code: str
) -> None:
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        got, doc = await post(f"{rr.url}{path}", body)
        assert got == status
        assert_openai_error(doc, code=code)
        assert engine.seen == []


async def test_body_limits_hold_for_tokenizer_routes(tmp_path: Path) -> None:
    settings = replace(FAST, max_body_bytes=1024)
    async with (
        recording_engine() as engine,
        running_router(tmp_path, routing([engine.url], []), settings) as rr,
    ):
        body = json.dumps({"model": MODEL, "prompt": "x" * 2048}).encode()
        resp = await raw_exchange(rr.url, raw_request("POST", "/tokenize", body))
        assert resp is not None
        assert resp.status == 413
        assert_openai_error(resp.json())
        assert engine.seen == []


async def test_only_post_and_only_the_canonical_path_reach_the_engine(tmp_path: Path) -> None:
    async with recording_engine() as engine, running_router(tmp_path, routing([engine.url], [])) as rr:
        resp = await raw_exchange(rr.url, raw_request("GET", "/tokenize"))
        assert resp is not None
        assert resp.status == 405
        body = json.dumps({"model": MODEL, "prompt": "x"}).encode()
        await raw_exchange(rr.url, raw_request("POST", "/v1/../tokenize?x=1", body))
        assert engine.seen == ["/tokenize?x=1"]
