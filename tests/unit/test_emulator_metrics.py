"""The emulator's `/metrics`: vLLM's families, types and labels, and counters that add up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.metrics import FINISH_REASONS
from specfleet_runtime.emulator.testing import RunningEmulator, serve_emulator
from specfleet_runtime.vllm_args import SpeculativeConfig

MODEL = "served-llama"
K = 4
SPEC = SpeculativeConfig(method="eagle3", num_speculative_tokens=K, model="drafter")
CONFIG = EmulatorConfig(served_model_name=MODEL, model="/models/llama", speculative=SPEC, time_scale=0.0)
# Another engineer captures a real vLLM exposition here; when it exists, the emulator must match it.
REAL_EXPOSITION = Path(__file__).parents[1] / "vllm" / "data" / "vllm-0.32.0-metrics.txt"


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return await r.text()


def vllm_families(text: str) -> dict[str, str]:
    """Family name -> type, for the `vllm:` families of an exposition.

    `*_created` series (which vLLM exposes too, through prometheus_client) have no TYPE line of their
    own; the text parser turns them into families of their own, which are left out here.
    """
    return {
        f.name: f.type
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }


def samples(text: str) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text) if f.name.startswith("vllm:") for s in f.samples]


def value(text: str, name: str, **labels: str) -> float:
    """The sum of a sample's values over series whose labels include `labels`."""
    return sum(s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items())


@pytest.fixture
async def emulator() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(CONFIG) as emu:
        yield emu


async def test_speculating_engine_exposes_exactly_the_operator_families(emulator: RunningEmulator) -> None:
    assert vllm_families(await scrape(emulator.url)) == {
        **vm.OPERATOR_FAMILIES,
        **vm.PREFIX_CACHE_FAMILIES,
        **vm.SLEEP_FAMILIES,
    }


async def test_non_speculating_engine_has_no_spec_decode_families() -> None:
    # As vLLM: SpecDecodingProm registers nothing when speculative_config is None.
    async with serve_emulator(replace(CONFIG, speculative=None)) as emu:
        assert vllm_families(await scrape(emu.url)) == {
            **vm.LOAD_FAMILIES,
            **vm.PREFIX_CACHE_FAMILIES,
            **vm.SLEEP_FAMILIES,
        }


async def test_labels(emulator: RunningEmulator) -> None:
    async with AsyncOpenAI(base_url=emulator.base_url, api_key="unused", max_retries=0) as c:
        await c.completions.create(model=MODEL, prompt="hello", max_tokens=8)
    text = await scrape(emulator.url)
    all_samples = samples(text)
    assert all_samples
    for s in all_samples:
        if s.name == vm.CACHE_CONFIG_INFO:  # as vLLM's: the engine label, no model_name
            assert s.labels[vm.LABEL_ENGINE] == "0"
            assert vm.LABEL_MODEL_NAME not in s.labels
            continue
        assert s.labels[vm.LABEL_MODEL_NAME] == MODEL, s
        assert s.labels[vm.LABEL_ENGINE] == "0", s
    positions = {s.labels[vm.LABEL_POSITION] for s in all_samples if s.name == vm.SPEC_ACCEPTED_PER_POS}
    assert positions == {str(i) for i in range(K)}
    reasons = {s.labels["finished_reason"] for s in all_samples if s.name == vm.REQUEST_SUCCESS}
    assert reasons == set(FINISH_REASONS)
    # Only the per-position counter carries `position`, only request_success `finished_reason`, only
    # the sleep gauge `sleep_state`.
    extra = {
        s.name: set(s.labels) - {vm.LABEL_MODEL_NAME, vm.LABEL_ENGINE, "le"}
        for s in all_samples
        if set(s.labels) - {vm.LABEL_MODEL_NAME, vm.LABEL_ENGINE, "le"}
        and not s.name.endswith("_created")
        and s.name != vm.CACHE_CONFIG_INFO
    }
    assert extra == {
        vm.SPEC_ACCEPTED_PER_POS: {vm.LABEL_POSITION},
        vm.REQUEST_SUCCESS: {"finished_reason"},
        vm.ENGINE_SLEEP_STATE: {vm.LABEL_SLEEP_STATE},
    }


async def test_counters_add_up(emulator: RunningEmulator) -> None:
    async with AsyncOpenAI(base_url=emulator.base_url, api_key="unused", max_retries=0) as c:
        a = await c.completions.create(model=MODEL, prompt="one two three", max_tokens=50)
        b = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=30
        )
    assert a.usage is not None
    assert b.usage is not None
    text = await scrape(emulator.url)
    assert value(text, vm.GENERATION_TOKENS) == a.usage.completion_tokens + b.usage.completion_tokens
    assert value(text, vm.PROMPT_TOKENS) == a.usage.prompt_tokens + b.usage.prompt_tokens
    assert value(text, vm.REQUEST_SUCCESS, finished_reason="length") == 2
    assert value(text, vm.REQUEST_SUCCESS) == 2
    for histogram in (vm.TIME_TO_FIRST_TOKEN, vm.E2E_REQUEST_LATENCY, vm.TIME_PER_OUTPUT_TOKEN):
        assert value(text, f"{histogram}_count") == 2, histogram
    drafts = value(text, vm.SPEC_DRAFTS)
    # Every step after a request's prefill step verifies K drafts of that request.
    assert value(text, vm.SPEC_DRAFT_TOKENS) == K * drafts
    assert value(text, f"{vm.INTER_TOKEN_LATENCY}_count") == drafts
    accepted = value(text, vm.SPEC_ACCEPTED_TOKENS)
    per_pos = [value(text, vm.SPEC_ACCEPTED_PER_POS, position=str(i)) for i in range(K)]
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # cumulative: never more at a later position
    # Tokens = prefill tokens (1 per request) + per verifying step 1 + accepted (minus what
    # max_tokens cut off at the end, at most K per request).
    produced = 2 + drafts + accepted
    assert 0 <= produced - value(text, vm.GENERATION_TOKENS) <= 2 * K
    # Load gauges are back to idle.
    assert value(text, vm.REQUESTS_RUNNING) == 0
    assert value(text, vm.REQUESTS_WAITING) == 0
    assert value(text, vm.KV_CACHE_USAGE) == 0


@pytest.mark.skipif(not REAL_EXPOSITION.exists(), reason="no real vLLM exposition captured yet")
async def test_matches_a_real_vllm_exposition(emulator: RunningEmulator) -> None:
    real_text = REAL_EXPOSITION.read_text()
    real = vllm_families(real_text)
    ours = vllm_families(await scrape(emulator.url))
    for name, kind in ours.items():
        assert real.get(name) == kind, f"{name}: real vLLM has {real.get(name)}, emulator {kind}"
    real_labels = {s.name: set(s.labels) for s in samples(real_text)}
    for s in samples(await scrape(emulator.url)):
        if s.name in real_labels and not s.name.endswith("_created"):
            assert set(s.labels) == real_labels[s.name], s.name


@pytest.mark.skipif(not REAL_EXPOSITION.exists(), reason="no real vLLM exposition captured yet")
async def test_latency_histograms_have_the_buckets_of_real_vllm(emulator: RunningEmulator) -> None:
    # A pool's SLO attainment interpolates within these buckets: the emulator must count as vLLM does.
    def bounds(text: str, histogram: str) -> list[str]:
        return [s.labels["le"] for s in samples(text) if s.name == f"{histogram}_bucket"]

    real_text, ours = REAL_EXPOSITION.read_text(), await scrape(emulator.url)
    for histogram in (
        vm.TIME_TO_FIRST_TOKEN,
        vm.TIME_PER_OUTPUT_TOKEN,
        vm.INTER_TOKEN_LATENCY,
        vm.E2E_REQUEST_LATENCY,
    ):
        assert bounds(ours, histogram) == bounds(real_text, histogram), histogram
    # The operator's alerts select a bucket by the `le` string: written as vLLM writes it.
    for histogram, shared in (
        (vm.TIME_TO_FIRST_TOKEN, vm.TIME_TO_FIRST_TOKEN_BUCKETS),
        (vm.TIME_PER_OUTPUT_TOKEN, vm.TOKEN_LATENCY_BUCKETS),
    ):
        assert [vm.bucket_label(b) for b in shared] + ["+Inf"] == bounds(real_text, histogram), histogram


async def test_a_one_token_request_counts_a_time_per_output_token_of_zero(emulator: RunningEmulator) -> None:
    # As vLLM: every finished request is counted, at 0 when it has no token after the first.
    async with AsyncOpenAI(base_url=emulator.base_url, api_key="unused", max_retries=0) as c:
        await c.completions.create(model=MODEL, prompt="one two three", max_tokens=1)
    text = await scrape(emulator.url)
    assert value(text, f"{vm.TIME_PER_OUTPUT_TOKEN}_count") == 1
    assert value(text, f"{vm.TIME_PER_OUTPUT_TOKEN}_bucket", le="0.01") == 1
