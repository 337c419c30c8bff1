"""The emulator's /tokenize and /detokenize: vLLM's request and response shapes, over its own token
counting (the `count` of a prompt is the `prompt_tokens` its completion reports)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator
from specfleet_runtime.emulator.text import Prompt, generated_text
from specfleet_runtime.emulator.tokenizer import (
    HASHED_BASE,
    MAX_TOKEN_ID,
    OUTPUT_VOCAB,
    detokenize,
    tokenize,
)

MODEL = "llama-3.1-8b"
CONFIG = EmulatorConfig(served_model_name=MODEL, max_model_len=4096, time_scale=0.0)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, world!"}]


@pytest.fixture
async def emulator() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(CONFIG) as emu:
        yield emu


async def post(emulator: RunningEmulator, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(f"{emulator.url}{path}", json=body) as resp:
        return resp.status, await resp.json()


async def test_tokenize_a_prompt_counts_as_the_completion_does(emulator: RunningEmulator) -> None:
    prompt = "The capital of France is Paris."
    status, doc = await post(emulator, "/tokenize", {"model": MODEL, "prompt": prompt})
    assert status == 200
    assert set(doc) == {"count", "max_model_len", "tokens", "token_strs"}
    assert doc["max_model_len"] == 4096
    assert doc["token_strs"] is None
    assert doc["count"] == len(doc["tokens"])
    _, done = await post(emulator, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert doc["count"] == done["usage"]["prompt_tokens"] == 7


async def test_tokenize_messages_counts_as_the_chat_completion_does(emulator: RunningEmulator) -> None:
    status, doc = await post(emulator, "/tokenize", {"model": MODEL, "messages": MESSAGES})
    assert status == 200
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    _, done = await post(emulator, "/v1/chat/completions", chat)
    assert doc["count"] == done["usage"]["prompt_tokens"]
    # Without the generation prompt the template's assistant header (5 pieces) is left out.
    _, bare = await post(
        emulator, "/tokenize", {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": False}
    )
    assert bare["count"] == doc["count"] - 5
    assert bare["tokens"] == doc["tokens"][:-5]


async def test_token_strs_and_detokenize_round_trip(emulator: RunningEmulator) -> None:
    text = generated_text(Prompt.from_text("seed"), 12)
    _, doc = await post(emulator, "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True})
    assert "".join(doc["token_strs"]) == text
    status, back = await post(emulator, "/detokenize", {"model": MODEL, "tokens": doc["tokens"]})
    assert status == 200
    assert back == {"prompt": text}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
        ("/tokenize", {"model": MODEL}, 400, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": 5}, 400, "prompt"),
        ("/detokenize", {"model": MODEL, "tokens": ["a"]}, 400, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": [MAX_TOKEN_ID + 1]}, 400, "tokens"),
    ],
)
async def test_bad_requests_are_openai_errors(
    emulator: RunningEmulator, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    got, doc = await post(emulator, path, body)
    assert got == status
    assert doc["error"]["code"] == status
    assert doc["error"]["param"] == param


async def test_generation_prompt_and_continuation_together_are_refused(emulator: RunningEmulator) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "continue_final_message": True}
    status, doc = await post(emulator, "/tokenize", body)
    assert status == 400
    assert "continue_final_message" in doc["error"]["message"]


def test_every_id_round_trips_through_its_text() -> None:
    ids = [0, len(OUTPUT_VOCAB) - 1, len(OUTPUT_VOCAB), HASHED_BASE - 1, HASHED_BASE, 10**6, MAX_TOKEN_ID]
    assert tokenize(detokenize(ids))[0] == ids


def test_unknown_words_get_stable_ids_in_the_hashed_range() -> None:
    ids, strs = tokenize("Zanzibar quokka Zanzibar")
    assert ids[0] == ids[2] != ids[1]
    assert all(HASHED_BASE <= i <= MAX_TOKEN_ID for i in ids)
    assert tokenize("".join(strs))[0] == ids
