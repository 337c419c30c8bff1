"""The cost profile's `memory` section: KV cache tokens without and with the drafter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specfleet.cli.profile import config_map, parse_output, profile_document
from specfleet.cli.simulate import _profile_file
from specfleet.policy.inputs.profile_source import CostProfileError, profile_from_config_map
from specfleet.policy.predict.kv_cache import CapacityModel
from specfleet.sim.workload import parse_acceptance
from specfleet_runtime.cost_profile import (
    PUBLISHED_EAGLE3_ACCEPTANCE,
    PUBLISHED_H100_LLAMA31_8B_EAGLE,
    MemoryProfile,
    StepTimeProfile,
    default_profile,
    load_profile,
    validate_acceptance,
)
from specfleet_runtime.vllm_profile import kv_cache_tokens

TABLE: dict[str, Any] = {
    "name": "x",
    "batchSizes": [1, 4],
    "numSpeculativeTokens": [0, 1],
    "stepTimeMs": [[1.0, 1.5], [2.0, 3.0]],
}
MEMORY: dict[str, Any] = {
    "kvCacheTokens": 12900,
    "kvCacheTokensWithDrafter": 4300,
    "model": "meta-llama/Llama-3.3-70B-Instruct",
    "drafter": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
    "gpu": "NVIDIA H100 80GB HBM3",
    "tensorParallelSize": 1,
    "maxModelLen": 8192,
    "gpuMemoryUtilization": 0.9,
    "blockSize": 16,
}
REAL_EXPOSITION = Path(__file__).parents[1] / "vllm" / "data" / "vllm-0.32.0-metrics.txt"


def test_the_section_parses_into_typed_data() -> None:
    profile = StepTimeProfile.from_dict({**TABLE, "memory": MEMORY})
    assert profile.memory == MemoryProfile(
        kv_cache_tokens=12900,
        kv_cache_tokens_with_drafter=4300,
        model="meta-llama/Llama-3.3-70B-Instruct",
        drafter="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
        gpu="NVIDIA H100 80GB HBM3",
        tensor_parallel_size=1,
        max_model_len=8192,
        gpu_memory_utilization=0.9,
        block_size=16,
    )
    assert profile.memory.kv_tokens(speculative=True) == 4300
    assert profile.memory.kv_tokens(speculative=False) == 12900


def test_a_profile_without_the_section_stays_valid() -> None:
    profile = StepTimeProfile.from_dict(TABLE)
    assert profile.memory is None
    assert "memory" not in profile.to_dict()
    # Only the two capacities are required: the setup keys are optional.
    only = StepTimeProfile.from_dict(
        {**TABLE, "memory": {"kvCacheTokens": 10, "kvCacheTokensWithDrafter": 8}}
    )
    assert only.memory == MemoryProfile(10, 8)
    assert only.to_dict()["memory"] == {"kvCacheTokens": 10, "kvCacheTokensWithDrafter": 8}


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        ({}, "memory lacks 'kvCacheTokens', 'kvCacheTokensWithDrafter'"),
        ({"kvCacheTokensWithDrafter": 4300}, "memory lacks 'kvCacheTokens'$"),
        ({"kvCacheTokens": 12900}, "memory lacks 'kvCacheTokensWithDrafter'$"),
        # Spelled otherwise is missing: the keys are exactly these.
        ({"kvCacheTokens": 12900, "kvCacheTokensWithDraft": 4300}, "lacks 'kvCacheTokensWithDrafter'"),
        ({"kv_cache_tokens": 1, "kvCacheTokensWithDrafter": 1}, "lacks 'kvCacheTokens'"),
        ({"kvCacheTokens": 12900, "kvCacheTokensWithDrafter": 12901}, "cannot exceed kvCacheTokens"),
        ({"kvCacheTokens": 0, "kvCacheTokensWithDrafter": 0}, ">= 1"),
        ({"kvCacheTokens": "many", "kvCacheTokensWithDrafter": 1}, "kvCacheTokens must be an integer"),
        ({"kvCacheTokens": 2.5, "kvCacheTokensWithDrafter": 1}, "kvCacheTokens must be an integer"),
        ({"kvCacheTokens": 2, "kvCacheTokensWithDrafter": 1, "gpuMemoryUtilization": 90}, r"within \(0, 1\]"),
        ({"kvCacheTokens": 2, "kvCacheTokensWithDrafter": 1, "tensorParallelSize": 0}, "tensorParallelSize"),
        ([12900, 4300], "memory must be a mapping"),
    ],
)
def test_invalid_sections_are_refused_naming_what_is_wrong(memory: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepTimeProfile.from_dict({**TABLE, "memory": memory})


def test_the_published_profile_holds_what_the_simulator_assumes() -> None:
    memory = default_profile().memory
    assert memory is not None
    model = CapacityModel()
    assert (memory.gpu_memory_utilization, memory.block_size) == (0.9, 16)
    assert memory.kv_cache_tokens == model.kv_tokens(0.9, 1, speculative=False) == 448304
    assert memory.kv_cache_tokens_with_drafter == model.kv_tokens(0.9, 1, speculative=True) == 428432
    assert (memory.model, memory.gpu, memory.tensor_parallel_size) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "NVIDIA H100 80GB HBM3",
        1,
    )
    assert (
        StepTimeProfile.from_dict(PUBLISHED_H100_LLAMA31_8B_EAGLE.to_dict())
        == PUBLISHED_H100_LLAMA31_8B_EAGLE
    )


def test_round_trip_through_the_file_and_the_config_map(tmp_path: Path) -> None:
    profile = StepTimeProfile.from_dict({**TABLE, "memory": MEMORY})
    text = profile_document(profile, {"model": "m"})
    assert yaml.safe_load(text)["memory"] == MEMORY
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert load_profile(path) == profile
    # What `specfleet profile --config-map` prints is what the operator reads from
    # policy.goodput.costProfileConfigMap and what `simulate` / `plan --profile` read from a file.
    cm = config_map("h100-profile", "inference", text)
    assert profile_from_config_map(cm, "inference", "h100-profile").memory == profile.memory
    cm_file = tmp_path / "cm.yaml"
    cm_file.write_text(yaml.safe_dump(cm))
    assert _profile_file(str(cm_file)).memory == profile.memory
    assert _profile_file(str(path)).memory == profile.memory


def test_an_older_config_map_without_the_section_still_loads() -> None:
    text = yaml.safe_dump(TABLE)
    assert profile_from_config_map(config_map("old", "ns", text), "ns", "old").memory is None


def test_a_config_map_with_a_broken_section_says_which_key() -> None:
    text = yaml.safe_dump({**TABLE, "memory": {"kvCacheTokens": 12900}})
    with pytest.raises(CostProfileError, match=r"ConfigMap ns/p .*memory lacks 'kvCacheTokensWithDrafter'"):
        profile_from_config_map(config_map("p", "ns", text), "ns", "p")


def test_the_measurement_output_carries_the_section() -> None:
    profile, _ = parse_output("INFO KV cache size: 12,900 tokens\n" + json.dumps({**TABLE, "memory": MEMORY}))
    assert profile.memory is not None
    assert profile.memory.kv_cache_tokens_with_drafter == 4300


def _cache_config_labels() -> dict[str, str]:
    for family in text_string_to_metric_families(REAL_EXPOSITION.read_text()):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return dict(sample.labels)
    raise AssertionError("the fixture has no vllm:cache_config_info")


def test_the_measurement_reads_vllms_cache_config_info() -> None:
    labels = _cache_config_labels()  # from a real vLLM 0.32.0 /metrics
    assert kv_cache_tokens(labels) == 116480
    # Without kv_cache_size_tokens (or with "None"): num_gpu_blocks x block_size (910 x 128).
    del labels["kv_cache_size_tokens"]
    assert kv_cache_tokens(labels) == 116480
    assert kv_cache_tokens({**labels, "kv_cache_size_tokens": "None"}) == 116480


def test_the_eagle3_preset_is_a_valid_acceptance_vector() -> None:
    assert validate_acceptance(PUBLISHED_EAGLE3_ACCEPTANCE) == (0.75, 0.55, 0.41)
    assert parse_acceptance("eagle3") == PUBLISHED_EAGLE3_ACCEPTANCE
