"""The emulator's vLLM sleep mode (emulator/sleep.py), over HTTP against a server on 127.0.0.1.

Transition times are never measured on the wall clock: each test swaps the sleep mode's `wait` for a
recorder (or a gate it releases itself) and checks the emulated seconds it was asked to wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.__main__ import config_from_argv
from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator
from specfleet_runtime.emulator.text import Prompt, generated_text
from specfleet_runtime.sleep_mode import (
    EAGLE3_LLAMA31_8B_DRAFTER_WEIGHT_BYTES,
    HOST_LINK_BYTES_PER_S,
    LLAMA31_8B_WEIGHT_BYTES,
    transfer_seconds,
)
from specfleet_runtime.vllm_args import EngineArgs, SpeculativeConfig, build_vllm_args, parse_vllm_args

MODEL = "llama-3.1-8b"
SPEC = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, model="drafter")
GIB = 2**30
# A standby engine: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1. time_scale 0: steps are instant.
CONFIG = EmulatorConfig(
    served_model_name=MODEL,
    model="meta-llama/Llama-3.1-8B-Instruct",
    speculative=SPEC,
    enable_sleep_mode=True,
    server_dev_mode=True,
    time_scale=0.0,
)
# Steps at the profile's pace (~7 ms), so a long request stays in flight while a test acts.
PACED = replace(CONFIG, time_scale=1.0)


class Recorder:
    """A `wait` that records the seconds asked for and returns at once."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


class Gate:
    """A `wait` that holds every transition until the test opens it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.entered.set()
        await self.opened.wait()


@pytest.fixture
async def emulator() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(CONFIG) as emu:
        emu.sleep_mode.wait = Recorder()
        yield emu


# No call here should wait on a transition (they are recorded, not waited out): a call that hangs
# (a sleep that drains instead of refusing) fails the test instead of stalling the suite.
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)


async def post(url: str, path: str, **params: Any) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        http.post(f"{url}{path}", params=params) as r,
    ):
        return r.status, await r.text()


async def post_json(url: str, path: str, **params: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        http.post(f"{url}{path}", params=params) as r,
    ):
        return r.status, await r.json()


async def is_sleeping(url: str) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/is_sleeping") as r:
        assert r.status == 200
        body = await r.json()
        assert set(body) == {"is_sleeping"}
        return bool(body["is_sleeping"])


async def complete(url: str, prompt: str, max_tokens: int = 12) -> tuple[int, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/completions", json=body) as r:
        return r.status, await r.json()


async def metric(url: str, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        text = await r.text()
    found = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def admin_sleep(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/admin/state") as r:
        state: dict[str, Any] = (await r.json())["sleep"]
        return state


# --------------------------------------------------------------------------------------------------
# The routes exist only where vLLM's would


@pytest.mark.parametrize("enable_sleep_mode", [False, True])
async def test_routes_are_absent_without_the_dev_mode_env(enable_sleep_mode: bool) -> None:
    # vLLM's attach_router adds them only with VLLM_SERVER_DEV_MODE, whatever --enable-sleep-mode says.
    config = replace(CONFIG, server_dev_mode=False, enable_sleep_mode=enable_sleep_mode)
    async with serve_emulator(config) as emu, aiohttp.ClientSession() as http:
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            async with http.request(method, f"{emu.url}{path}") as r:
                assert r.status == 404, path
        assert not emu.sleep_mode.is_sleeping
        status, _ = await complete(emu.url, "still serving")
        assert status == 200


def test_the_flag_and_the_env_reach_the_config() -> None:
    engine = EngineArgs(model="m", served_model_name=MODEL, enable_sleep_mode=True)
    argv = build_vllm_args(engine)
    assert "--enable-sleep-mode" in argv
    assert parse_vllm_args(argv)[0] == engine
    on, _, _ = config_from_argv(argv, environ={"VLLM_SERVER_DEV_MODE": "1"})
    assert on.enable_sleep_mode
    assert on.server_dev_mode
    off, _, _ = config_from_argv(build_vllm_args(replace(engine, enable_sleep_mode=False)), environ={})
    assert not off.enable_sleep_mode
    assert not off.server_dev_mode
    assert "--enable-sleep-mode" not in build_vllm_args(replace(engine, enable_sleep_mode=False))
    zero, _, _ = config_from_argv([*argv, "--no-enable-sleep-mode"], environ={"VLLM_SERVER_DEV_MODE": "0"})
    assert not zero.enable_sleep_mode
    assert not zero.server_dev_mode
    with pytest.raises(SystemExit):
        config_from_argv(argv, environ={"VLLM_SERVER_DEV_MODE": "yes"})


# --------------------------------------------------------------------------------------------------
# Sleep and wake


async def test_asleep_it_serves_nothing_and_holds_no_kv_cache(emulator: RunningEmulator) -> None:
    url = emulator.url
    status, _ = await complete(url, "a prompt long enough to fill a few full blocks of the cache " * 4)
    assert status == 200
    assert emulator.engine.kv.num_cached_blocks > 0  # the prefix cache holds the prompt's blocks
    assert not await is_sleeping(url)

    assert await post(url, "/sleep", level=1) == (200, "")  # vLLM: 200, empty body
    assert await is_sleeping(url)
    status, body = await complete(url, "hello")
    assert status == 503
    assert body["error"]["type"] == "ServiceUnavailableError"
    assert "asleep" in body["error"]["message"]
    assert emulator.engine.kv.num_cached_blocks == 0
    assert await metric(url, vm.KV_CACHE_USAGE) == 0
    assert await metric(url, vm.ENGINE_SLEEP_STATE, sleep_state="awake") == 0
    assert await metric(url, vm.ENGINE_SLEEP_STATE, sleep_state="weights_offloaded") == 1
    assert await metric(url, vm.ENGINE_SLEEP_STATE, sleep_state="discard_all") == 0
    state = await admin_sleep(url)
    assert state["hostBytes"] == LLAMA31_8B_WEIGHT_BYTES + EAGLE3_LLAMA31_8B_DRAFTER_WEIGHT_BYTES
    assert state["asleepTags"] == ["kv_cache", "weights"]
    # Health stays 200 asleep, as vLLM's check_health does not look at sleep.
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as r:
        assert r.status == 200


async def test_awake_again_it_serves_the_same_greedy_output(emulator: RunningEmulator) -> None:
    url = emulator.url
    prompt = "The capital of France is"
    status, before = await complete(url, prompt)
    assert status == 200
    assert (await post(url, "/sleep"))[0] == 200  # level 1 is the default
    assert (await post(url, "/wake_up"))[0] == 200
    assert not await is_sleeping(url)
    status, after = await complete(url, prompt)
    assert status == 200
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
    assert after["choices"][0]["text"] == generated_text(Prompt.from_text(prompt), 12)
    assert await metric(url, vm.ENGINE_SLEEP_STATE, sleep_state="awake") == 1
    assert (await admin_sleep(url))["hostBytes"] == 0


async def test_sleep_is_refused_with_requests_in_flight() -> None:
    async with serve_emulator(PACED) as emu:
        emu.sleep_mode.wait = Recorder()
        req = emu.engine.submit(Prompt.from_text("a long answer"), 100_000, ignore_eos=True)
        await emu.engine.wait_for_step()
        for mode in ("abort", "keep"):
            status, body = await post_json(emu.url, "/sleep", level=1, mode=mode)
            assert status == 409
            assert body["error"]["type"] == "ConflictError"
            assert "1 requests in flight" in body["error"]["message"]
        status, body = await post_json(emu.url, "/sleep")  # mode abort by default
        assert status == 409
        assert not await is_sleeping(emu.url)
        assert not req.done  # nothing was aborted
        tokens = len(req.tokens)
        await emu.engine.wait_for_step()
        assert len(req.tokens) > tokens  # still generating
        emu.engine.abort(req)


async def test_mode_wait_drains_then_sleeps() -> None:
    async with serve_emulator(PACED) as emu:
        emu.sleep_mode.wait = Recorder()
        req = emu.engine.submit(Prompt.from_text("short"), 20, ignore_eos=True)
        await emu.engine.wait_for_step()
        sleeping = asyncio.create_task(post(emu.url, "/sleep", level=1, mode="wait"))
        while emu.sleep_mode.phase != "draining":
            await asyncio.sleep(0)
        status, _ = await complete(emu.url, "new while draining")
        assert status == 503  # new requests are refused while it drains
        assert await sleeping == (200, "")
        completion = await req.finished
        assert completion.finish_reason == "length"  # finished, not aborted
        assert completion.completion_tokens == 20
        assert await is_sleeping(emu.url)


async def test_is_sleeping_until_the_wake_has_copied_the_weights_back(emulator: RunningEmulator) -> None:
    url = emulator.url
    assert (await post(url, "/sleep"))[0] == 200
    gate = Gate()
    emulator.sleep_mode.wait = gate
    waking = asyncio.create_task(post(url, "/wake_up"))
    await gate.entered.wait()
    assert emulator.sleep_mode.phase == "waking"
    assert await is_sleeping(url)
    assert (await complete(url, "too early"))[0] == 503
    gate.opened.set()
    assert await waking == (200, "")
    assert not await is_sleeping(url)
    assert (await complete(url, "now"))[0] == 200


async def test_a_partial_wake_keeps_refusing_requests(emulator: RunningEmulator) -> None:
    url = emulator.url
    recorder = emulator.sleep_mode.wait
    assert isinstance(recorder, Recorder)
    assert (await post(url, "/sleep"))[0] == 200
    assert (await post(url, "/wake_up", tags="weights"))[0] == 200
    assert await is_sleeping(url)  # the KV cache is still asleep
    assert (await complete(url, "hello"))[0] == 503
    assert (await admin_sleep(url))["asleepTags"] == ["kv_cache"]
    assert (await post(url, "/wake_up", tags="bogus"))[0] == 200  # vLLM: a warning, nothing woken
    assert await is_sleeping(url)
    assert (await post(url, "/wake_up", tags="kv_cache"))[0] == 200
    assert not await is_sleeping(url)
    assert (await complete(url, "hello"))[0] == 200
    copy = transfer_seconds(CONFIG.resolved_weight_bytes) * CONFIG.time_scale
    assert recorder.seconds == [copy, copy, 0.0]  # sleep, weights, kv_cache


async def test_repeated_tags_wake_both(emulator: RunningEmulator) -> None:
    assert (await post(emulator.url, "/sleep"))[0] == 200
    async with aiohttp.ClientSession() as http:
        url = f"{emulator.url}/wake_up?tags=weights&tags=kv_cache"
        async with http.post(url) as r:
            assert r.status == 200
    assert not await is_sleeping(emulator.url)


async def test_sleeping_twice_and_waking_an_awake_engine_are_no_ops(emulator: RunningEmulator) -> None:
    url = emulator.url
    assert (await post(url, "/wake_up"))[0] == 200
    assert not await is_sleeping(url)
    assert (await post(url, "/sleep"))[0] == 200
    assert (await post(url, "/sleep", level=2))[0] == 200
    assert (await admin_sleep(url))["level"] == 1


async def test_bad_level_and_mode_are_400(emulator: RunningEmulator) -> None:
    status, body = await post_json(emulator.url, "/sleep", level="deep")
    assert status == 400
    assert body["error"]["type"] == "BadRequestError"
    status, body = await post_json(emulator.url, "/sleep", mode="later")
    assert status == 400
    assert body["error"]["message"] == "Invalid pause mode: later"
    assert not await is_sleeping(emulator.url)


# --------------------------------------------------------------------------------------------------
# How long it takes, and what it frees


def test_transfer_time_is_the_weights_over_the_host_link() -> None:
    assert transfer_seconds(64 * GIB) == pytest.approx(3.0)  # the llm-d figure the constant comes from
    assert transfer_seconds(32 * GIB, 16 * GIB) == 2.0
    with pytest.raises(ValueError, match="bandwidth"):
        transfer_seconds(1.0, 0.0)
    with pytest.raises(ValueError, match="weight bytes"):
        transfer_seconds(-1.0)


@pytest.mark.parametrize(
    ("weight_bytes", "link", "time_scale"),
    [
        (64 * GIB, HOST_LINK_BYTES_PER_S, 1.0),
        (128 * GIB, HOST_LINK_BYTES_PER_S, 1.0),
        (16 * GIB, 8 * GIB, 0.5),
    ],
)
async def test_level_1_times_scale_with_weights_over_bandwidth(
    weight_bytes: float, link: float, time_scale: float
) -> None:
    config = replace(CONFIG, weight_bytes=weight_bytes, host_link_bytes_per_s=link, time_scale=time_scale)
    async with serve_emulator(config) as emu:
        recorder = Recorder()
        emu.sleep_mode.wait = recorder
        assert (await post(emu.url, "/sleep"))[0] == 200
        assert (await post(emu.url, "/wake_up"))[0] == 200
    expected = weight_bytes / link * time_scale
    assert recorder.seconds == [pytest.approx(expected), pytest.approx(expected)]
    assert [t.kind for t in emu.sleep_mode.transitions] == ["sleep", "wake"]


async def test_without_enable_sleep_mode_sleep_succeeds_but_frees_nothing() -> None:
    # As vLLM without --enable-sleep-mode: 200 and is_sleeping, but no weights left the GPU.
    async with serve_emulator(replace(CONFIG, enable_sleep_mode=False)) as emu:
        recorder = Recorder()
        emu.sleep_mode.wait = recorder
        assert await post(emu.url, "/sleep") == (200, "")
        assert await is_sleeping(emu.url)
        state = await admin_sleep(emu.url)
        assert state["hostBytes"] == 0
        assert not state["enableSleepMode"]
        assert (await complete(emu.url, "hello"))[0] == 503  # the scheduler is paused all the same
        assert (await post(emu.url, "/wake_up"))[0] == 200
        assert recorder.seconds == [0.0, 0.0]


async def test_level_2_copies_nothing_and_loses_the_drafter() -> None:
    async with serve_emulator(CONFIG) as emu:
        recorder = Recorder()
        emu.sleep_mode.wait = recorder
        assert (await post(emu.url, "/sleep", level=2))[0] == 200
        assert await metric(emu.url, vm.ENGINE_SLEEP_STATE, sleep_state="discard_all") == 1
        assert (await admin_sleep(emu.url))["hostBytes"] == 0
        assert (await post(emu.url, "/wake_up"))[0] == 200
        assert recorder.seconds == [0.0, 0.0]
        assert set(emu.engine.acceptance) == {0.0}  # vllm#52479: the EAGLE-3 drafter is not reloaded


async def test_level_0_only_pauses() -> None:
    async with serve_emulator(CONFIG) as emu:
        emu.sleep_mode.wait = Recorder()
        status, _ = await complete(emu.url, "a prompt long enough to fill a few full blocks " * 4)
        assert status == 200
        cached = emu.engine.kv.num_cached_blocks
        assert (await post(emu.url, "/sleep", level=0))[0] == 200
        assert await is_sleeping(emu.url)
        assert emu.engine.kv.num_cached_blocks == cached  # vLLM clears the prefix cache only at >= 1
        assert await metric(emu.url, vm.ENGINE_SLEEP_STATE, sleep_state="awake") == 0
        assert (await post(emu.url, "/wake_up", tags="scheduling"))[0] == 200
        assert not await is_sleeping(emu.url)
