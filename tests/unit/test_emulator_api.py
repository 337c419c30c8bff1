"""The emulator's OpenAI API, driven by the official `openai` client against a server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.config import EMULATED_VLLM_VERSION
from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator
from specfleet_runtime.emulator.text import Prompt, generated_text, natural_length
from specfleet_runtime.vllm_args import SpeculativeConfig

MODEL = "llama-3.1-8b"
SPEC = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, model="drafter")
# time_scale 0: steps take no wall time, so the tests run as fast as the event loop.
CONFIG = EmulatorConfig(
    served_model_name=MODEL, model="meta-llama/Llama-3.1-8B-Instruct", speculative=SPEC, time_scale=0.0
)


@pytest.fixture
async def emulator() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(CONFIG) as emu:
        yield emu


@pytest.fixture
async def client(emulator: RunningEmulator) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=emulator.base_url, api_key="unused", max_retries=0) as c:
        yield c


async def test_completion(client: AsyncOpenAI) -> None:
    prompt = "The capital of France is"
    out = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12)
    assert out.model == MODEL
    assert out.object == "text_completion"
    assert out.id.startswith("cmpl-")
    [choice] = out.choices
    assert choice.text == generated_text(Prompt.from_text(prompt), 12)
    assert choice.finish_reason == "length"
    assert out.usage is not None
    assert out.usage.prompt_tokens == 5
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == 17


async def test_completion_default_max_tokens_is_16(client: AsyncOpenAI) -> None:
    out = await client.completions.create(model=MODEL, prompt="x", extra_body={"ignore_eos": True})
    assert out.usage is not None
    assert out.usage.completion_tokens == 16


async def test_chat_completion(client: AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]
    out = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9)
    assert out.object == "chat.completion"
    [choice] = out.choices
    assert choice.message.role == "assistant"
    prompt = Prompt.from_chat([("system", "You are terse."), ("user", "Name a colour.")])
    assert choice.message.content == generated_text(prompt, 9)
    assert choice.finish_reason == "length"
    assert out.usage is not None
    assert out.usage.prompt_tokens == prompt.num_tokens
    assert out.usage.completion_tokens == 9


async def test_chat_with_content_parts_equals_plain_content(client: AsyncOpenAI) -> None:
    plain = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=5
    )
    parts = await client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}],
            }
        ],
        max_tokens=5,
    )
    assert plain.choices[0].message.content == parts.choices[0].message.content


async def test_natural_end_and_ignore_eos(client: AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]
    prompt = Prompt.from_chat([("user", "Tell me a story.")])
    natural = natural_length(prompt.seed, *CONFIG.natural_length)
    out = await client.chat.completions.create(model=MODEL, messages=messages)
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None
    assert out.usage.completion_tokens == natural
    forced = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=natural + 5,
        extra_body={"ignore_eos": True},
    )
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage is not None
    assert forced.usage.completion_tokens == natural + 5


async def test_streamed_completion_equals_the_whole_one(client: AsyncOpenAI) -> None:
    prompt = "Once upon a time"
    whole = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=40)
    stream = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, stream=True, stream_options={"include_usage": True}
    )
    texts, reasons, usages = [], [], []
    async for chunk in stream:
        for c in chunk.choices:
            texts.append(c.text)
            reasons.append(c.finish_reason)
        if chunk.usage is not None:
            usages.append(chunk.usage)
    assert "".join(texts) == whole.choices[0].text
    # One chunk per engine step; with speculation a step carries several tokens.
    assert 1 < len(texts) < 40
    assert reasons[-1] == "length"
    assert all(r is None for r in reasons[:-1])
    assert [u.completion_tokens for u in usages] == [40]


async def test_streamed_chat(client: AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Count to ten."}]
    whole = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20)
    stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, stream=True)
    roles, content, reasons = [], [], []
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            content.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert roles == ["assistant"]
    assert "".join(content) == whole.choices[0].message.content
    assert reasons[-1] == "length"


async def test_several_prompts_and_n(client: AsyncOpenAI) -> None:
    out = await client.completions.create(model=MODEL, prompt=["alpha", "beta"], n=2, max_tokens=4)
    by_index = {c.index: c.text for c in out.choices}
    alpha = generated_text(Prompt.from_text("alpha"), 4)
    beta = generated_text(Prompt.from_text("beta"), 4)
    assert by_index == {0: alpha, 1: alpha, 2: beta, 3: beta}
    assert out.usage is not None
    assert out.usage.completion_tokens == 16
    assert out.usage.prompt_tokens == 2  # counted once per prompt, as vLLM


async def test_token_id_prompts(client: AsyncOpenAI) -> None:
    single = await client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=3)
    assert single.usage is not None
    assert single.usage.prompt_tokens == 3
    batch = await client.completions.create(model=MODEL, prompt=[[1, 2, 3], [4]], max_tokens=3)
    assert batch.choices[0].text == single.choices[0].text
    assert batch.choices[1].text == generated_text(Prompt.from_token_ids([4]), 3)


async def test_models_version_health(client: AsyncOpenAI, emulator: RunningEmulator) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{emulator.url}/version") as r:
            assert await r.json() == {"version": EMULATED_VLLM_VERSION}
        async with http.get(f"{emulator.url}/health") as r:
            assert r.status == 200
        await emulator.engine.stop()
        async with http.get(f"{emulator.url}/health") as r:
            assert r.status == 503
        async with http.post(f"{emulator.url}/v1/completions", json={"prompt": "x"}) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == 503


# --------------------------------------------------------------------------------------------------
# Losslessness


async def _texts(config: EmulatorConfig, prompts: list[str], max_tokens: int = 64) -> list[str]:
    async with (
        serve_emulator(config) as emu,
        AsyncOpenAI(base_url=emu.base_url, api_key="unused", max_retries=0) as c,
    ):
        out = await c.completions.create(model=MODEL, prompt=prompts, max_tokens=max_tokens)
        return [choice.text for choice in sorted(out.choices, key=lambda x: x.index)]


PROMPTS = [f"prompt number {i}: tell me about topic {i * 7}" for i in range(8)]


async def test_output_is_deterministic_and_identical_with_and_without_speculation() -> None:
    spec_on = await _texts(replace(CONFIG, acceptance=(0.9, 0.8, 0.7)), PROMPTS)
    spec_on_again = await _texts(replace(CONFIG, acceptance=(0.9, 0.8, 0.7), seed=7), PROMPTS)
    spec_off = await _texts(replace(CONFIG, speculative=None), PROMPTS)
    assert spec_on == spec_on_again == spec_off
    assert len(set(spec_off)) == len(PROMPTS)  # different prompts, different texts


async def test_break_losslessness_flag_makes_speculative_output_differ() -> None:
    broken = replace(CONFIG, acceptance=(0.9, 0.8, 0.7), break_losslessness=True)
    spec_off = await _texts(replace(CONFIG, speculative=None), PROMPTS)
    assert await _texts(broken, PROMPTS) != spec_off
    # Without speculation there are no drafts to get wrong.
    assert await _texts(replace(broken, speculative=None), PROMPTS) == spec_off


async def test_break_losslessness_admin_switch(emulator: RunningEmulator, client: AsyncOpenAI) -> None:
    async def texts() -> list[str]:
        out = await client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=64)
        return [c.text for c in sorted(out.choices, key=lambda x: x.index)]

    lossless = await texts()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{emulator.url}/admin/losslessness", json={"broken": True}) as r:
            assert r.status == 200
            assert await r.json() == {"broken": True}
        assert await texts() != lossless
        async with http.post(f"{emulator.url}/admin/losslessness", json={"broken": False}) as r:
            assert r.status == 200
        assert await texts() == lossless
        async with http.post(f"{emulator.url}/admin/losslessness", json={"broken": "yes"}) as r:
            assert r.status == 400


# --------------------------------------------------------------------------------------------------
# Errors


async def test_unknown_model_is_a_404_in_openai_format(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.completions.create(model="gpt-9", prompt="x")
    assert caught.value.status_code == 404
    assert caught.value.body == {
        "message": "The model `gpt-9` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


async def test_missing_messages_is_a_400(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=[])
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "messages"


async def test_too_long_a_request_is_a_400(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
        await client.completions.create(model=MODEL, prompt="x", max_tokens=9000)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"", None),
        ("/v1/completions", b"\xff\xfe", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b'"a string"', None),
        ("/v1/completions", b"{}", "prompt"),
        ("/v1/completions", b'{"prompt": 5}', "prompt"),
        ("/v1/completions", b'{"prompt": []}', "prompt"),
        ("/v1/completions", b'{"prompt": [[]]}', "prompt"),
        ("/v1/completions", b'{"prompt": [true]}', "prompt"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "many"}', "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "n": 0}', "n"),
        ("/v1/completions", b'{"prompt": "x", "model": 3}', "model"),
        ("/v1/chat/completions", b"{}", "messages"),
        ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
        ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', "messages"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 1}]}', "messages"),
        ("/admin/acceptance", b'{"perPosition": [0.5, 0.9]}', "perPosition"),
        ("/admin/acceptance", b'{"perPosition": [1.5]}', "perPosition"),
        ("/admin/acceptance", b'{"perPosition": "high"}', "perPosition"),
        ("/admin/acceptance", b"{}", "perPosition"),
    ],
)
async def test_malformed_input_is_a_400_in_openai_format(
    emulator: RunningEmulator, path: str, body: bytes, param: str | None
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{emulator.url}{path}", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
            error = (await r.json())["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "BadRequestError"
        assert error["code"] == 400
        assert error["param"] == param
        assert error["message"]
        # The server is still fine.
        async with http.get(f"{emulator.url}/health") as r:
            assert r.status == 200


async def test_client_going_away_mid_stream_aborts_the_request(emulator: RunningEmulator) -> None:
    engine = emulator.engine
    async with aiohttp.ClientSession() as http:
        body = {"prompt": "long", "max_tokens": 5000, "stream": True, "ignore_eos": True}
        async with http.post(f"{emulator.url}/v1/completions", json=body) as r:
            first = await r.content.readline()
            assert first.startswith(b"data: ")
        # Leaving the block closed the connection; the engine stops generating for it.
        for _ in range(1000):
            if engine.num_running == 0:
                break
            await engine.wait_for_step()
        assert engine.num_running == 0


def _bad_bodies() -> dict[str, bytes]:
    model = f'"{MODEL}"'.encode()
    return {
        "deep-nesting": b'{"model": ' + model + b', "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "int-past-digit-limit": b'{"model": '
        + model
        + b', "prompt": "x", "max_tokens": '
        + b"9" * 5000
        + b"}",
        "huge-max-tokens": b'{"model": ' + model + b', "prompt": "x", "max_tokens": ' + b"9" * 30 + b"}",
        "huge-n": b'{"model": ' + model + b', "prompt": "x", "n": ' + b"9" * 30 + b"}",
        "huge-token-id": b'{"model": ' + model + b', "prompt": [' + b"9" * 30 + b"]}",
        "negative-token-id": b'{"model": ' + model + b', "prompt": [-1]}',
        "two-mib-prompt": b'{"model": ' + model + b', "prompt": "' + b"x " * (1024 * 1024) + b'"}',
    }


@pytest.mark.parametrize("name", list(_bad_bodies()))
async def test_bad_input_is_a_400_like_vllms(name: str) -> None:
    # tests/vllm checks the same bodies against real vLLM.
    async with serve_emulator(CONFIG) as emu, aiohttp.ClientSession() as http:
        async with http.post(f"{emu.url}/v1/completions", data=_bad_bodies()[name]) as resp:
            assert resp.status == 400
            body = await resp.json()
            if name in ("deep-nesting", "int-past-digit-limit"):
                # Refused by FastAPI's body parsing in vLLM, in FastAPI's shape (the router rewrites it).
                assert body == {"detail": "There was an error parsing the body"}
            else:
                assert body["error"]["code"] == 400
                assert body["error"]["message"]
        async with http.post(f"{emu.url}/v1/completions", json={"model": MODEL, "prompt": "x"}) as resp:
            assert resp.status == 200
