"""A Standby pool's flip, one replica at a time: the pure plan (`reconcile.standby_flip`) and its I/O
(`controller.standby_flips`) against real engine emulators speaking vLLM's sleep API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from specfleet.controller.standby_flips import StandbyFlipper, switch_engines
from specfleet.reconcile.standby_flip import (
    FLIP_ANNOTATION,
    FLIPPING,
    MAX_FLIPPING,
    FlipMark,
    Replica,
    next_steps,
    settled,
)
from specfleet_runtime.emulator.config import PUBLISHED_ACCEPTANCE, EmulatorConfig
from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator
from specfleet_runtime.names import LABEL_SPECULATION
from specfleet_runtime.vllm_args import SpeculativeConfig

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
MODEL = "llama-3.1-8b"
SPEC = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, model="drafter")
# Both engines of a Standby pod: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; instant steps.
PLAIN = EmulatorConfig(
    served_model_name=MODEL,
    model="meta-llama/Llama-3.1-8B-Instruct",
    enable_sleep_mode=True,
    server_dev_mode=True,
    time_scale=0.0,
)
SPECULATIVE = replace(PLAIN, speculative=SPEC)
GRACE = 30.0


def replica(pod: str, label: str, **kw: Any) -> Replica:
    return Replica(pod, label, kw.pop("mark", None), kw.pop("ready", True), **kw)


# --------------------------------------------------------------------------------------------------
# The plan


def test_a_pool_that_serves_the_desired_setting_has_nothing_to_do() -> None:
    pods = [replica("a", "On"), replica("b", "On")]
    assert next_steps("On", pods, NOW, GRACE) == []
    assert settled("On", pods)
    assert not settled("Off", pods)


def test_a_flip_begins_on_one_pod_at_a_time() -> None:
    pods = [replica("a", "Off"), replica("b", "Off"), replica("c", "Off")]
    steps = next_steps("On", pods, NOW, GRACE)
    assert [(s.kind, s.pod, s.to) for s in steps] == [("Begin", "a", "On")]
    assert MAX_FLIPPING == 1
    # While one is mid-flip no other begins.
    mid = [replica("a", FLIPPING, mark=FlipMark("On", NOW), listed=True), *pods[1:]]
    assert [s.kind for s in next_steps("On", mid, NOW, GRACE)] == ["Wait"]


def test_a_pod_switches_once_unlisted_and_empty_or_when_the_grace_period_is_over() -> None:
    mark = FlipMark("On", NOW - timedelta(seconds=5))

    def kind(**kw: Any) -> str:
        (step,) = next_steps("On", [replica("a", FLIPPING, mark=mark, **kw)], NOW, GRACE)
        return step.kind

    assert kind(listed=True, in_flight=0.0) == "Wait"  # a router may still send it a request
    assert kind(listed=None, in_flight=0.0) == "Wait"  # not known: taken as listed
    assert kind(listed=False, in_flight=2.0) == "Wait"
    assert kind(listed=False, in_flight=None) == "Wait"  # not measured: not taken as empty
    assert kind(listed=False, in_flight=0.0) == "Switch"
    late = FlipMark("On", NOW - timedelta(seconds=GRACE + 1))
    (step,) = next_steps("On", [replica("a", FLIPPING, mark=late, listed=True, in_flight=3.0)], NOW, GRACE)
    assert step.kind == "Switch"


def test_a_pod_not_ready_is_not_flipped_and_a_lost_mark_starts_over() -> None:
    assert next_steps("On", [replica("a", "Off", ready=False)], NOW, GRACE) == []
    assert settled("On", [replica("a", "Off", ready=False)])
    (step,) = next_steps("Off", [replica("a", FLIPPING)], NOW, GRACE)
    assert (step.kind, step.to) == ("Begin", "Off")


def test_the_flip_mark_round_trips_and_garbage_is_no_mark() -> None:
    mark = FlipMark("Off", NOW)
    assert FlipMark.parse(mark.text()) == mark
    for text in (None, "", "{", '{"to": "Maybe", "since": "2026-12-06T12:00:00+00:00"}', '{"to": "On"}'):
        assert FlipMark.parse(text) is None
    assert FlipMark.parse('{"to": "On", "since": "2026-12-06T12:00:00"}') is None  # no time zone


# --------------------------------------------------------------------------------------------------
# The switch, against two emulators


@dataclass
class Pod:
    """One Standby pod: its two engines, the speculative one asleep as the supervisor leaves it."""

    name: str
    ip: str
    engines: dict[str, RunningEmulator]

    @property
    def urls(self) -> dict[str, str]:
        return {setting: emu.url for setting, emu in self.engines.items()}


async def _post(url: str, path: str) -> int:
    async with aiohttp.ClientSession() as http, http.post(url + path) as r:
        return r.status


async def start_pod(stack: AsyncExitStack, name: str, ip: str, **kw: Any) -> Pod:
    spec = await stack.enter_async_context(serve_emulator(kw.get("speculative", SPECULATIVE)))
    plain = await stack.enter_async_context(serve_emulator(kw.get("plain", PLAIN)))
    assert await _post(spec.url, "/sleep?level=1") == 200
    return Pod(name, ip, {"On": spec, "Off": plain})


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


async def test_a_switch_on_wakes_the_drafter_and_parks_the_plain_engine(stack: AsyncExitStack) -> None:
    pod = await start_pod(stack, "a", "10.0.0.1")
    result = await asyncio.to_thread(switch_engines, pod.urls, "On", MODEL, 2.5)
    assert result.ok, result.why
    assert not pod.engines["On"].sleep_mode.is_sleeping
    assert pod.engines["Off"].sleep_mode.is_sleeping
    # The check measured the woken drafter's acceptance: the emulator's, 1 + p0 + p1 + p2 at K 3.
    assert result.acceptance_length is not None
    assert result.acceptance_length == pytest.approx(1 + sum(PUBLISHED_ACCEPTANCE[:3]), abs=0.5)
    back = await asyncio.to_thread(switch_engines, pod.urls, "Off", MODEL, 2.5)
    assert back.ok
    assert back.acceptance_length is None
    assert pod.engines["On"].sleep_mode.is_sleeping
    assert not pod.engines["Off"].sleep_mode.is_sleeping


async def test_a_drafter_that_wakes_accepting_next_to_nothing_is_put_back(stack: AsyncExitStack) -> None:
    lost = replace(SPECULATIVE, acceptance=(0.02, 0.0, 0.0))
    pod = await start_pod(stack, "a", "10.0.0.1", speculative=lost)
    result = await asyncio.to_thread(switch_engines, pod.urls, "On", MODEL, 2.5)
    assert not result.ok
    assert "acceptance length" in result.why
    assert "baseline 2.50" in result.why
    # Back where it was: the plain engine serves, the drafter's engine sleeps.
    assert pod.engines["On"].sleep_mode.is_sleeping
    assert not pod.engines["Off"].sleep_mode.is_sleeping


async def test_an_engine_without_the_sleep_api_fails_the_switch_and_keeps_serving(
    stack: AsyncExitStack,
) -> None:
    pod = await start_pod(stack, "a", "10.0.0.1", plain=replace(PLAIN, server_dev_mode=False))
    result = await asyncio.to_thread(switch_engines, pod.urls, "On", MODEL, 2.5)
    assert not result.ok
    assert "POST /sleep?level=1 answered 404" in result.why
    assert not pod.engines["Off"].sleep_mode.is_sleeping


# --------------------------------------------------------------------------------------------------
# The flipper over a pool: pods and Service membership in memory, engines real


class Pods:
    """The pods of one pool and the Services' endpoints their labels put them in."""

    def __init__(self, pods: list[Pod]) -> None:
        self.labels = {p.name: "Off" for p in pods}
        self.annotations: dict[str, dict[str, str]] = {p.name: {} for p in pods}
        self.ips = {p.name: p.ip for p in pods}
        self.patches: list[tuple[str, Mapping[str, str | None]]] = []

    def pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        return [
            {
                "metadata": {
                    "name": name,
                    "labels": {LABEL_SPECULATION: label},
                    "annotations": self.annotations[name],
                },
                "spec": {"terminationGracePeriodSeconds": 30},
                "status": {"podIP": self.ips[name], "conditions": [{"type": "Ready", "status": "True"}]},
            }
            for name, label in self.labels.items()
        ]

    def endpoint_slices(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        # Each engine's Service lists the Ready pods labelled with its setting.
        return [
            {
                "endpoints": [
                    {"targetRef": {"kind": "Pod", "name": n}, "conditions": {"ready": True}}
                    for n, label in self.labels.items()
                    if label == setting
                ]
            }
            for setting in ("On", "Off")
        ]

    def patch_pod(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        self.patches.append((name, labels))
        for k, v in labels.items():
            assert k == LABEL_SPECULATION
            assert v is not None
            self.labels[name] = v
        for k, v in annotations.items():
            if v is None:
                self.annotations[name].pop(k, None)
            else:
                self.annotations[name][k] = v


def flipper_for(api: Pods, pods: list[Pod]) -> StandbyFlipper:
    urls = {p.ip: p.urls for p in pods}
    return StandbyFlipper(api, engine_url=lambda address, setting: urls[address][setting])


async def test_a_pool_flips_pod_by_pod_without_failing_the_request_in_flight(stack: AsyncExitStack) -> None:
    paced = replace(PLAIN, time_scale=1.0)
    pods = [await start_pod(stack, n, f"10.0.0.{i}", plain=paced) for i, n in enumerate(("a", "b"), 1)]
    api = Pods(pods)
    flipper = flipper_for(api, pods)

    async def tick() -> Any:
        return await asyncio.to_thread(flipper.tick, "ns", {}, "On", MODEL, 2.5)

    # A long request on pod a's serving engine when the flip begins.
    body = {"model": MODEL, "prompt": "a long answer", "max_tokens": 120, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        request = asyncio.create_task(http.post(pods[0].engines["Off"].url + "/v1/completions", json=body))
        while pods[0].engines["Off"].engine.num_in_flight == 0:
            await asyncio.sleep(0.01)
        first = await tick()
        assert [(s.kind, s.pod) for s in first.steps] == [("Begin", "a")]
        assert api.labels == {"a": FLIPPING, "b": "Off"}
        assert FlipMark.parse(api.annotations["a"][FLIP_ANNOTATION]) is not None
        waiting = await tick()
        assert [(s.kind, s.why) for s in waiting.steps] == [("Wait", "1.0 requests still in the engine")]
        response = await request
        assert response.status == 200
        await response.read()
    switched = await tick()
    assert [s.kind for s in switched.steps] == ["Switch"]
    assert switched.finished[0][0] == "a"
    assert api.labels == {"a": "On", "b": "Off"}
    assert api.annotations["a"] == {}
    assert not pods[0].engines["On"].sleep_mode.is_sleeping
    assert pods[0].engines["Off"].sleep_mode.is_sleeping
    await tick()  # b begins
    done = await tick()  # b switches
    assert done.finished[0][0] == "b"
    assert api.labels == {"a": "On", "b": "On"}
    assert (await tick()).settled


async def test_a_failed_switch_puts_the_pod_back_and_says_why(stack: AsyncExitStack) -> None:
    lost = replace(SPECULATIVE, acceptance=(0.02, 0.0, 0.0))
    pods = [await start_pod(stack, "a", "10.0.0.1", speculative=lost)]
    api = Pods(pods)
    flipper = flipper_for(api, pods)
    await asyncio.to_thread(flipper.tick, "ns", {}, "On", MODEL, 2.5)
    result = await asyncio.to_thread(flipper.tick, "ns", {}, "On", MODEL, 2.5)
    assert result.reverted
    assert result.reverted[0][0] == "a"
    assert "acceptance length" in result.reverted[0][1]
    assert api.labels == {"a": "Off"}
    assert api.annotations["a"] == {}
