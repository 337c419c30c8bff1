"""The emulated engine's step loop: batching and queueing, K per step, acceptance sampling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.cost_profile import default_profile
from specfleet_runtime.emulator import EmulatorConfig, Engine
from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_runtime.emulator.text import Prompt, generated_text
from specfleet_runtime.vllm_args import DynamicSpeculationRange, SpeculativeConfig

MODEL = "m"
LABELS = {vm.LABEL_MODEL_NAME: MODEL, vm.LABEL_ENGINE: "0"}


def spec(k: int, *schedule: tuple[int, int, int]) -> SpeculativeConfig:
    return SpeculativeConfig(
        method="eagle3",
        num_speculative_tokens=k,
        model="drafter",
        dynamic_schedule=tuple(DynamicSpeculationRange(*row) for row in schedule),
    )


def counter(engine: Engine, name: str, **extra: str) -> float:
    """A counter's current value, read from the engine's own registry."""
    got = engine.metrics.registry.get_sample_value(name, {**LABELS, **extra})
    assert got is not None, name
    return got


@pytest.fixture
async def engine_factory() -> AsyncIterator[list[Engine]]:
    """Engines created by a test; all stopped at its end."""
    engines: list[Engine] = []
    yield engines
    for e in engines:
        await e.stop()


async def started(engines: list[Engine], config: EmulatorConfig) -> Engine:
    engine = Engine(config)
    engines.append(engine)
    await engine.start()
    return engine


def fill(engine: Engine, n: int, max_tokens: int = 10**9) -> list[Prompt]:
    prompts = [Prompt.from_text(f"request {i}") for i in range(n)]
    for p in prompts:
        engine.submit(p, max_tokens, ignore_eos=True)
    return prompts


async def steps(engine: Engine, n: int) -> None:
    for _ in range(n):
        await engine.wait_for_step()


# --------------------------------------------------------------------------------------------------
# Batching and queueing


async def test_requests_beyond_max_num_seqs_wait_in_fifo_order(engine_factory: list[Engine]) -> None:
    engine = await started(
        engine_factory, EmulatorConfig(served_model_name=MODEL, max_num_seqs=2, time_scale=0)
    )
    reqs = [engine.submit(Prompt.from_text(f"r{i}"), 10**9, ignore_eos=True) for i in range(5)]
    await steps(engine, 2)
    assert (engine.num_running, engine.num_waiting) == (2, 3)
    assert engine.stats.last_batch == 2
    registry = engine.metrics.registry
    assert registry.get_sample_value(vm.REQUESTS_RUNNING, LABELS) == 2
    assert registry.get_sample_value(vm.REQUESTS_WAITING, LABELS) == 3
    assert all(len(r.tokens) > 0 for r in reqs[:2])
    assert all(len(r.tokens) == 0 for r in reqs[2:])
    # A freed slot goes to the oldest waiting request.
    engine.abort(reqs[0])
    await steps(engine, 2)
    assert (engine.num_running, engine.num_waiting) == (2, 2)
    assert len(reqs[2].tokens) > 0
    assert len(reqs[3].tokens) == len(reqs[4].tokens) == 0
    assert (await reqs[0].finished).finish_reason == "abort"
    assert counter(engine, vm.REQUEST_SUCCESS, finished_reason="abort") == 1


async def test_queueing_over_http() -> None:
    # Real step times (time_scale 1) so the batch is still running while the test looks at it.
    config = EmulatorConfig(served_model_name=MODEL, max_num_seqs=2, time_scale=1.0)
    async with (
        serve_emulator(config) as emu,
        AsyncOpenAI(base_url=emu.base_url, api_key="unused", max_retries=0) as client,
    ):
        prompts = [f"queued {i}" for i in range(5)]
        tasks = [
            asyncio.create_task(
                client.completions.create(
                    model=MODEL, prompt=p, max_tokens=60, extra_body={"ignore_eos": True}
                )
            )
            for p in prompts
        ]
        engine = emu.engine
        while engine.num_running + engine.num_waiting < 5:
            await asyncio.sleep(0.001)
        await engine.wait_for_step()  # the loop admits at the start of a step
        assert (engine.num_running, engine.num_waiting) == (2, 3)
        async with aiohttp.ClientSession() as http, http.get(f"{emu.url}/metrics") as r:
            text = await r.text()
        assert f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 3.0' in text
        assert f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 2.0' in text
        results = await asyncio.gather(*tasks)
    for p, out in zip(prompts, results, strict=True):
        assert out.choices[0].text == generated_text(Prompt.from_text(p), 60)


async def test_a_request_ends_at_max_tokens_even_mid_step(engine_factory: list[Engine]) -> None:
    config = EmulatorConfig(served_model_name=MODEL, speculative=spec(5), acceptance=(1.0,) * 5, time_scale=0)
    engine = await started(engine_factory, config)
    prompt = Prompt.from_text("all drafts accepted")
    req = engine.submit(prompt, 8, ignore_eos=True)
    done = await req.finished
    # Steps: prefill (1 token), then 6 tokens per step; the second verifying step is cut to 1.
    assert done.completion_tokens == 8
    assert done.text == generated_text(prompt, 8)
    assert engine.stats.steps == 3


# --------------------------------------------------------------------------------------------------
# K per step


@pytest.mark.parametrize(("batch", "k"), [(1, 3), (2, 3), (5, 1), (8, 1), (12, 0)])
async def test_dynamic_sd_schedule_picks_k_by_batch_size(
    engine_factory: list[Engine], batch: int, k: int
) -> None:
    config = EmulatorConfig(
        served_model_name=MODEL, speculative=spec(3, (1, 2, 3), (3, 8, 1), (9, 64, 0)), time_scale=0
    )
    engine = await started(engine_factory, config)
    fill(engine, batch)
    await steps(engine, 3)
    drafts0 = counter(engine, vm.SPEC_DRAFTS)
    draft_tokens0 = counter(engine, vm.SPEC_DRAFT_TOKENS)
    generated0 = counter(engine, vm.GENERATION_TOKENS)
    await steps(engine, 20)
    assert engine.stats.last_batch == batch
    assert engine.stats.last_k == k
    drafts = counter(engine, vm.SPEC_DRAFTS) - drafts0
    assert drafts == (20 * batch if k else 0)
    assert counter(engine, vm.SPEC_DRAFT_TOKENS) - draft_tokens0 == k * drafts
    if k == 0:  # no drafting: exactly one token per request per step
        assert counter(engine, vm.GENERATION_TOKENS) - generated0 == 20 * batch


def test_k_for_batch() -> None:
    config = EmulatorConfig(served_model_name=MODEL, speculative=spec(3, (1, 4, 5), (5, 16, 2)))
    assert config.k_for_batch(1) == 3  # clamped to num_speculative_tokens, as vLLM
    assert config.k_for_batch(16) == 2
    assert config.k_for_batch(500) == 2  # beyond every range: the last range's K
    assert replace(config, speculative=spec(4)).k_for_batch(300) == 4
    assert replace(config, speculative=None).k_for_batch(1) == 0


async def test_step_time_follows_the_profile_and_k(engine_factory: list[Engine]) -> None:
    scale = 1e-3  # tiny real waits; the scheduled time is what the cost model asked for
    config = EmulatorConfig(
        served_model_name=MODEL,
        speculative=spec(3, (1, 4, 3), (5, 64, 0)),
        time_scale=scale,
        spec_k0_overhead=0.1,
    )
    profile = default_profile()
    for batch, expected_ms in [(2, profile.step_time_ms(2, 3)), (6, profile.step_time_ms(6, 0) * 1.1)]:
        engine = await started(engine_factory, config)
        fill(engine, batch)
        await steps(engine, 2)
        s0 = engine.stats.scheduled_s
        await steps(engine, 10)
        assert (engine.stats.scheduled_s - s0) / 10 == pytest.approx(expected_ms / 1000 * scale)
        await engine.stop()


# --------------------------------------------------------------------------------------------------
# Acceptance


def per_position(text: str, k: int) -> tuple[float, list[float]]:
    """(drafts, accepted per position) read from an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {
        (s.name, s.labels.get(vm.LABEL_POSITION)): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    return values[(vm.SPEC_DRAFTS, None)], [values[(vm.SPEC_ACCEPTED_PER_POS, str(i))] for i in range(k)]


async def test_acceptance_from_the_counters_matches_the_configured_rates_and_shifts() -> None:
    configured = (0.8, 0.6, 0.4, 0.2, 0.1)
    config = EmulatorConfig(
        served_model_name=MODEL, speculative=spec(5), acceptance=configured, time_scale=0, seed=3
    )
    async with serve_emulator(config) as emu, aiohttp.ClientSession() as http:

        async def scrape() -> tuple[float, list[float]]:
            async with http.get(f"{emu.url}/metrics") as r:
                return per_position(await r.text(), 5)

        engine = emu.engine
        fill(engine, 64)
        await steps(engine, 320)  # ~20,000 drafts: the standard error of each rate is < 0.004
        drafts, accepted = await scrape()
        assert drafts >= 20_000
        measured = [a / drafts for a in accepted]
        assert measured == pytest.approx(configured, abs=0.02)
        # vLLM's mean acceptance length: 1 + accepted / drafts = 1 + sum(p_i).
        accepted_total = engine.metrics.registry.get_sample_value(vm.SPEC_ACCEPTED_TOKENS, LABELS)
        assert accepted_total is not None
        assert 1 + accepted_total / drafts == pytest.approx(1 + sum(configured), abs=0.05)

        # Content shift: the drafter suddenly fits the traffic much worse.
        async with http.post(f"{emu.url}/admin/acceptance", json={"perPosition": [0.3, 0.1]}) as r:
            assert r.status == 200
            assert await r.json() == {"perPosition": [0.3, 0.1]}
        await steps(engine, 1)  # the step that was running when the change arrived
        drafts0, accepted0 = await scrape()
        await steps(engine, 320)
        drafts1, accepted1 = await scrape()
        shifted = [(a1 - a0) / (drafts1 - drafts0) for a0, a1 in zip(accepted0, accepted1, strict=True)]
        assert shifted == pytest.approx([0.3, 0.1, 0.0, 0.0, 0.0], abs=0.02)
        async with http.get(f"{emu.url}/admin/acceptance") as r:
            assert await r.json() == {"perPosition": [0.3, 0.1]}
        async with http.get(f"{emu.url}/admin/state") as r:
            state = await r.json()
        assert state["perPosition"] == [0.3, 0.1]
        assert state["running"] == 64
        assert state["lastK"] == 5


async def test_extreme_acceptance(engine_factory: list[Engine]) -> None:
    base = EmulatorConfig(served_model_name=MODEL, speculative=spec(3), time_scale=0)
    always = await started(engine_factory, replace(base, acceptance=(1.0, 1.0, 1.0)))
    never = await started(engine_factory, replace(base, acceptance=()))
    for engine in (always, never):
        fill(engine, 4)
        await steps(engine, 11)
    assert counter(always, vm.SPEC_ACCEPTED_TOKENS) == 3 * counter(always, vm.SPEC_DRAFTS) > 0
    assert counter(never, vm.SPEC_ACCEPTED_TOKENS) == 0 < counter(never, vm.SPEC_DRAFTS)


async def test_acceptance_follows_the_content_a_marker_names_and_a_probe_keeps_the_drafters_own(
    engine_factory: list[Engine],
) -> None:
    # A content shift as traffic: chats about the new topic draft at its acceptance, the rest (an
    # operator's fixed probe, a completion) at the engine's; the counters see the mix.
    shifted = (0.1, 0.0, 0.0)
    config = EmulatorConfig(
        served_model_name=MODEL,
        speculative=spec(3),
        acceptance=(1.0, 1.0, 1.0),
        content_acceptance=(("[topic: tax law]", shifted), ("unused", (0.5,))),
        time_scale=0,
    )
    engine = await started(engine_factory, config)
    topic = Prompt.from_chat([("user", "[topic: tax law] Question 1, please.")])
    probe = Prompt.from_text("Write one sentence about the sea.")
    assert engine.content_acceptance(topic) == shifted
    assert engine.content_acceptance(probe) is None
    assert engine.content_acceptance(Prompt.from_token_ids([1, 2, 3])) is None
    topics = [engine.submit(topic, 10**9, ignore_eos=True) for _ in range(8)]
    await steps(engine, 201)  # prefill, then 200 verification steps of 8 drafts each
    drafts, accepted = counter(engine, vm.SPEC_DRAFTS), counter(engine, vm.SPEC_ACCEPTED_TOKENS)
    assert drafts == 1600
    assert accepted / drafts == pytest.approx(0.1, abs=0.03)
    probe_req = engine.submit(probe, 10**9, ignore_eos=True)
    assert probe_req.acceptance is None
    before = [len(r.tokens) for r in topics]
    await steps(engine, 51)
    # The probe: every draft accepted, 4 tokens a verification step; the topic's ~1.1.
    assert len(probe_req.tokens) >= 1 + 4 * 48
    per_step = [(len(r.tokens) - b) / 51 for r, b in zip(topics, before, strict=True)]
    assert all(1.0 <= x <= 1.4 for x in per_step), per_step


async def test_a_topic_the_drafter_never_fits_accepts_nothing(engine_factory: list[Engine]) -> None:
    # An empty acceptance is a topic's own (no draft accepted), not "use the engine's".
    config = EmulatorConfig(
        served_model_name=MODEL,
        speculative=spec(3),
        acceptance=(1.0, 1.0, 1.0),
        content_acceptance=(("[gibberish]", ()),),
        time_scale=0,
    )
    engine = await started(engine_factory, config)
    engine.submit(Prompt.from_text("[gibberish] go"), 10**9, ignore_eos=True)
    await steps(engine, 11)
    assert counter(engine, vm.SPEC_ACCEPTED_TOKENS) == 0 < counter(engine, vm.SPEC_DRAFTS)


def test_content_acceptance_is_validated_and_parsed_from_the_command_line() -> None:
    from specfleet_runtime.emulator.__main__ import config_from_argv

    with pytest.raises(ValueError, match="marker"):
        EmulatorConfig(served_model_name=MODEL, content_acceptance=(("", (0.5,)),))
    with pytest.raises(ValueError, match="cannot increase"):
        EmulatorConfig(served_model_name=MODEL, content_acceptance=(("x", (0.1, 0.2)),))
    config, _, _ = config_from_argv(
        ["--model", "m", "--content-acceptance", "a=b=0.2,0.1", "--content-acceptance", "c=0.5"], environ={}
    )
    assert config.content_acceptance == (("a=b", (0.2, 0.1)), ("c", (0.5,)))


def test_set_acceptance_validates() -> None:
    engine = Engine(EmulatorConfig(served_model_name=MODEL))
    with pytest.raises(ValueError, match="cannot increase"):
        engine.set_acceptance([0.1, 0.2])
    engine.set_acceptance([0.5])
    assert engine.acceptance == (0.5,)


async def test_a_crashed_step_loop_fails_requests_and_health(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_step(self: Engine, *_: object) -> None:
        raise RuntimeError("injected bug")

    monkeypatch.setattr(Engine, "_apply_step", broken_step)
    config = EmulatorConfig(served_model_name=MODEL, time_scale=0)
    async with serve_emulator(config) as emu, aiohttp.ClientSession() as http:
        async with http.post(f"{emu.url}/v1/completions", json={"prompt": "x"}) as r:
            assert r.status == 500
            error = (await r.json())["error"]
        assert error["type"] == "InternalServerError"
        assert "injected bug" in error["message"]
        async with http.get(f"{emu.url}/health") as r:
            assert r.status == 503


async def test_a_crash_mid_stream_sends_an_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    config = EmulatorConfig(served_model_name=MODEL, time_scale=0)
    async with serve_emulator(config) as emu, aiohttp.ClientSession() as http:
        engine = emu.engine
        original = Engine._apply_step
        calls = 0

        def crash_on_third_step(self: Engine, *args: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise RuntimeError("injected bug")
            original(self, *args)

        monkeypatch.setattr(Engine, "_apply_step", crash_on_third_step)
        body = {"prompt": "x", "max_tokens": 100, "stream": True, "ignore_eos": True}
        async with http.post(f"{emu.url}/v1/completions", json=body) as r:
            events = [line async for line in r.content if line.strip()]
        assert not engine.healthy
        assert events[-1] == b"data: [DONE]\n"
        assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == 500
        assert len(events) == 4  # two steps' chunks, the error, [DONE]
