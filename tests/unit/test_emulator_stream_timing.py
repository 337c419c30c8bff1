"""When the emulator's streamed chunks leave, against the engine's steps: vLLM's order and framing.

A benchmark client (vLLM's own included) takes the first chunk with `choices` as the first token, so a
chat stream's opening role delta must not leave before the prefill step produced that token.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator

MODEL = "llama-3.1-8b"
# Steps take real time here: the first step (prefill and first token) lasts FIRST_STEP_S at least.
TIME_SCALE = 20.0
CONFIG = EmulatorConfig(served_model_name=MODEL, time_scale=TIME_SCALE)
FIRST_STEP_S = CONFIG.profile.step_time_s(1, 0) * TIME_SCALE


@dataclass(frozen=True)
class Event:
    at_s: float  # seconds after the request was sent
    data: Any  # the parsed JSON, or "[DONE]"


@pytest.fixture
async def emulator() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(CONFIG) as emu:
        yield emu


async def stream_events(url: str, body: dict[str, Any]) -> list[Event]:
    """Every SSE `data:` event of a streamed request, with its arrival time."""
    events: list[Event] = []
    async with aiohttp.ClientSession() as session:
        sent = time.monotonic()
        async with session.post(url, json={**body, "stream": True}) as resp:
            assert resp.status == 200
            async for line in resp.content:
                text = line.decode().strip()
                if text.startswith("data: "):
                    payload = text.removeprefix("data: ")
                    data = payload if payload == "[DONE]" else json.loads(payload)
                    events.append(Event(time.monotonic() - sent, data))
    return events


def test_the_first_step_takes_measurable_time() -> None:
    assert FIRST_STEP_S >= 0.1  # else the timing tests below could not tell early from on time


async def test_chat_role_chunk_leaves_with_the_first_token(emulator: RunningEmulator) -> None:
    events = await stream_events(
        f"{emulator.base_url}/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 4,
            "stream_options": {"include_usage": True},
        },
    )
    role, first_token = events[0], events[1]
    assert role.data["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first_token.data["choices"][0]["delta"]["content"]
    # Not sent when the response started: only once the prefill step produced the first token.
    assert role.at_s >= 0.9 * FIRST_STEP_S
    assert first_token.at_s - role.at_s < 0.5 * FIRST_STEP_S
    # vLLM's framing: usage last, alone (no choices), then [DONE].
    usage, done = events[-2], events[-1]
    assert usage.data["choices"] == []
    assert usage.data["usage"]["completion_tokens"] == 4
    assert done.data == "[DONE]"
    assert all("usage" not in e.data for e in events[:-2])


async def test_chat_with_n_opens_every_choice_before_its_tokens(emulator: RunningEmulator) -> None:
    events = await stream_events(
        f"{emulator.base_url}/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 3, "n": 2},
    )
    choices = [c for e in events[:-1] for c in e.data["choices"]]
    assert [c["delta"] for c in choices[:2]] == [{"role": "assistant", "content": ""}] * 2
    assert {c["index"] for c in choices[:2]} == {0, 1}
    assert all("role" not in c["delta"] for c in choices[2:])
    assert events[0].at_s >= 0.9 * FIRST_STEP_S


async def test_completion_stream_first_chunk_is_the_first_token(emulator: RunningEmulator) -> None:
    events = await stream_events(
        f"{emulator.base_url}/completions",
        {"model": MODEL, "prompt": "Once", "max_tokens": 3, "stream_options": {"include_usage": True}},
    )
    assert events[0].data["choices"][0]["text"]
    assert events[0].at_s >= 0.9 * FIRST_STEP_S
    assert events[-2].data["choices"] == []
    assert events[-2].data["usage"]["completion_tokens"] == 3
    assert events[-1].data == "[DONE]"
