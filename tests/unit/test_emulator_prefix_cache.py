"""The emulator's prefix cache, as vLLM V1's automatic prefix caching.

Full prompt blocks are hashed over their token ids, each hash chained with its parent's; a request
reuses the longest run of leading blocks already cached (at most num_tokens - 1 tokens, as vLLM), its
prefill is priced for the rest only, free cached blocks are evicted least recently used first, and
vllm:prefix_cache_queries / _hits count tokens as vLLM does. Block size 4 keeps the numbers small.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.cost_profile import default_profile
from specfleet_runtime.emulator import EmulatorConfig, Engine
from specfleet_runtime.emulator.__main__ import config_from_argv
from specfleet_runtime.emulator.engine import EngineRequest
from specfleet_runtime.emulator.kv_cache import BlockPool, block_hashes
from specfleet_runtime.emulator.metrics import cache_config_labels
from specfleet_runtime.emulator.text import Prompt
from specfleet_runtime.vllm_args import EngineArgs, build_vllm_args

MODEL = "m"
LABELS = {vm.LABEL_MODEL_NAME: MODEL, vm.LABEL_ENGINE: "0"}
# 17 blocks of 4 tokens: 16 usable.
CONFIG = EmulatorConfig(
    served_model_name=MODEL, block_size=4, kv_cache_tokens=68, max_model_len=64, time_scale=0
)
REAL_EXPOSITION = Path(__file__).parents[1] / "vllm" / "data" / "vllm-0.32.0-metrics.txt"


def words(n: int, stem: str = "w") -> str:
    """A text prompt of `n` tokens (one per word)."""
    return " ".join(f"{stem}{i}" for i in range(n))


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for e in made:
        await e.stop()


async def started(engines: list[Engine], config: EmulatorConfig = CONFIG) -> Engine:
    engine = Engine(config)
    engines.append(engine)
    await engine.start()
    return engine


async def run(engine: Engine, prompt: Prompt, max_tokens: int = 2) -> EngineRequest:
    req = engine.submit(prompt, max_tokens, ignore_eos=True)
    await req.finished
    return req


def counters(engine: Engine) -> tuple[float | None, float | None]:
    """(queries, hits) as exposed."""
    get = engine.metrics.registry.get_sample_value
    return get(vm.PREFIX_CACHE_QUERIES, LABELS), get(vm.PREFIX_CACHE_HITS, LABELS)


# --------------------------------------------------------------------------------------------------
# Hashes and the block pool


def test_block_hashes_cover_full_blocks_and_chain_with_the_parent() -> None:
    assert len(block_hashes(list(range(11)), 4)) == 2  # the partial third block has no hash
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert a[0] != b[0]
    assert a[1] != b[1]  # same tokens, different parent: a different block
    assert block_hashes([1, 2, 3, 4, 0, 0, 0, 0], 4)[0] == a[0]


def test_free_cached_blocks_are_evicted_least_recently_used_first() -> None:
    """6 usable blocks. A and B each cache 2 blocks and finish; D reuses A's blocks, so A's become the
    most recently freed. C then needs 4 new blocks: the 2 never used, then B's (least recent)."""
    pool = BlockPool(num_gpu_blocks=7, block_size=4, max_model_len=24)
    ha = block_hashes(list(range(8)), 4)
    hb = block_hashes(list(range(100, 108)), 4)
    for owner, hashes in (("A", ha), ("B", hb)):
        assert pool.allocate(owner, 8)
        pool.cache_blocks(owner, hashes)
        pool.free(owner)
    # Cached but free: they count as free blocks (vLLM's free block queue), the usage is 0.
    assert (pool.num_free_blocks, pool.num_cached_blocks, pool.usage) == (6, 4, 0.0)
    hit = pool.find_cached(ha, 9)
    assert len(hit) == 2
    assert pool.allocate("D", 9, hit)  # 2 shared blocks + 1 new
    assert pool.num_free_blocks == 3
    pool.free("D")
    assert pool.allocate("C", 16)  # 4 blocks, none cached: the two fresh ones, then B's
    assert pool.find_cached(hb, 9) == []
    assert len(pool.find_cached(ha, 9)) == 2
    assert pool.num_free_blocks == 2


def test_a_lookup_stops_at_the_first_missing_block_and_before_the_last_token() -> None:
    pool = BlockPool(num_gpu_blocks=7, block_size=4, max_model_len=24)
    hashes = block_hashes(list(range(12)), 4)
    assert pool.allocate("A", 12)
    pool.cache_blocks("A", hashes)
    assert len(pool.find_cached(hashes, 11)) == 2  # a 12-token prompt looks up 11 tokens: 2 blocks
    assert len(pool.find_cached(hashes, 12)) == 3
    other = block_hashes([*range(4), 99, 99, 99, 99, *range(8, 12)], 4)
    assert len(pool.find_cached(other, 11)) == 1  # block 2 differs, so block 3 cannot match


def test_shared_blocks_are_freed_only_when_no_request_holds_them() -> None:
    pool = BlockPool(num_gpu_blocks=7, block_size=4, max_model_len=24)
    hashes = block_hashes(list(range(8)), 4)
    assert pool.allocate("A", 9)
    pool.cache_blocks("A", hashes)
    assert pool.allocate("B", 9, pool.find_cached(hashes, 8))  # shares 2, takes 1
    assert pool.num_free_blocks == 2
    pool.free("A")
    assert pool.num_free_blocks == 3  # A's own third block only
    pool.free("B")
    assert pool.num_free_blocks == 6


# --------------------------------------------------------------------------------------------------
# The engine


async def test_a_repeated_prompt_hits_its_full_blocks(engines: list[Engine]) -> None:
    engine = await started(engines)
    prompt = Prompt.from_text(words(10))  # 2 full blocks and 2 tokens
    await run(engine, prompt)
    assert counters(engine) == (10, 0)
    await run(engine, prompt)
    assert counters(engine) == (20, 8)
    assert engine.kv.usage == 0.0  # cached blocks of finished requests are free


async def test_a_block_aligned_prompt_recomputes_its_last_block(engines: list[Engine]) -> None:
    """As vLLM: at most num_tokens - 1 tokens are looked up (the last one is computed for its logits)."""
    engine = await started(engines)
    prompt = Prompt.from_text(words(8))
    await run(engine, prompt)
    await run(engine, prompt)
    assert counters(engine) == (16, 4)


async def test_a_shared_system_prompt_hits_its_blocks_and_not_the_user_turns(engines: list[Engine]) -> None:
    engine = await started(engines)
    system = ("system", words(23, "s"))
    first = Prompt.from_chat([system, ("user", words(6, "a"))])
    second = Prompt.from_chat([system, ("user", words(6, "b"))])
    # The template's `<|system|>\n` (5 tokens), 23 words, then `<|user|>\n` (5): 33 shared tokens.
    shared = next(
        i for i, (x, y) in enumerate(zip(first.token_ids, second.token_ids, strict=False)) if x != y
    )
    assert shared == 33
    await run(engine, first)
    await run(engine, second)
    assert counters(engine) == (first.num_tokens + second.num_tokens, 32)  # 8 full blocks


async def test_cached_blocks_shorten_the_prefill(engines: list[Engine]) -> None:
    """The prefill is priced for the uncached tokens only: the step that gives the repeated prompt its
    first token is 8 prompt tokens cheaper, and so is its time to first token."""
    profile = replace(default_profile(), prefill_ms_per_token=20.0)
    engine = await started(engines, replace(CONFIG, profile=profile, time_scale=1.0))
    prompt = Prompt.from_text(words(10))
    before = engine.stats.scheduled_s
    cold = await run(engine, prompt, max_tokens=1)
    cold_s = engine.stats.scheduled_s - before
    before = engine.stats.scheduled_s
    warm = await run(engine, prompt, max_tokens=1)
    warm_s = engine.stats.scheduled_s - before
    assert cold_s - warm_s == pytest.approx(8 * 0.020)
    assert cold.first_token_time is not None
    assert warm.first_token_time is not None
    cold_ttft = cold.first_token_time - cold.arrival_time
    warm_ttft = warm.first_token_time - warm.arrival_time
    assert warm_ttft < cold_ttft - 0.08  # 160 ms less prefill; leaves room for a busy machine


async def test_without_prefix_caching_nothing_hits(engines: list[Engine]) -> None:
    config = replace(CONFIG, enable_prefix_caching=False)
    engine = await started(engines, config)
    prompt = Prompt.from_text(words(10))
    await run(engine, prompt)
    await run(engine, prompt)
    # As vLLM: no lookup, so nothing counted; the counters exist at 0.
    assert counters(engine) == (0, 0)
    assert engine.kv.num_cached_blocks == 0
    assert cache_config_labels(config)["enable_prefix_caching"] == "False"
    assert cache_config_labels(CONFIG)["enable_prefix_caching"] == "True"


def test_the_vllm_flags_switch_prefix_caching() -> None:
    argv = build_vllm_args(EngineArgs(model="tiny", served_model_name="tiny", max_model_len=256))
    assert config_from_argv(argv)[0].enable_prefix_caching  # on by default, as vLLM V1
    assert config_from_argv([*argv, "--enable-prefix-caching"])[0].enable_prefix_caching
    assert not config_from_argv([*argv, "--no-enable-prefix-caching"])[0].enable_prefix_caching


async def test_the_counters_have_the_real_vllm_families(engines: list[Engine]) -> None:
    """Same family names, types and label names as a real vLLM 0.32.0 /metrics."""

    def families(text: str) -> dict[str, tuple[str, set[frozenset[str]]]]:
        return {
            f.name: (f.type, {frozenset(s.labels) for s in f.samples if s.name.endswith("_total")})
            for f in text_string_to_metric_families(text)
            if f.name in vm.PREFIX_CACHE_FAMILIES
        }

    engine = await started(engines)
    ours = families(engine.metrics.exposition().decode())
    real = families(REAL_EXPOSITION.read_text())
    assert ours == real
    assert {name: kind for name, (kind, _) in ours.items()} == vm.PREFIX_CACHE_FAMILIES
