"""Refusing what vLLM cannot start: weights that leave no KV cache in the GPU memory vLLM is given, or a
maxModelLen whose one sequence does not fit the cache; nothing refused where the model or GPU is unknown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api import reasons
from specfleet.api.validation import parse_resource
from specfleet.policy.predict.kv_cache import (
    H100_80GB_BYTES,
    LLAMA31_70B_EAGLE3_H100,
    gpu_memory_bytes,
    known_preset,
)
from specfleet.policy.predict.startup_memory import engines_that_cannot_start, startup_memory_problem
from specfleet.reconcile.desired import spec_problems

EXAMPLE = Path(__file__).parents[2] / "examples" / "01-minimal-eagle3.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"
SEVENTY_B_FP8 = "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"
NO_CACHE = "No available memory for the cache blocks"


def spec(model: str = SEVENTY_B_FP8, gpu: str | None = H100, **engine: Any) -> Any:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["name"] = model
    doc["spec"]["engine"] = {**({"nodeSelector": {"nvidia.com/gpu.product": gpu}} if gpu else {}), **engine}
    return parse_resource(doc).spec


def test_the_model_and_gpu_are_known_only_where_named_for_certain() -> None:
    assert (
        gpu_memory_bytes("NVIDIA-H100-80GB-HBM3")
        == gpu_memory_bytes("NVIDIA H100 80GB HBM3")
        == H100_80GB_BYTES
    )
    assert gpu_memory_bytes("NVIDIA-A10G") is None
    fp8 = known_preset(SEVENTY_B_FP8)
    assert fp8 is not None
    assert fp8.target_weight_bytes == LLAMA31_70B_EAGLE3_H100.target_weight_bytes / 2
    assert known_preset("meta-llama/Llama-3.1-70B-Instruct") == LLAMA31_70B_EAGLE3_H100
    assert known_preset("Qwen/Qwen3-32B") is None
    assert known_preset("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4") is None


def test_a_model_that_fits_starts() -> None:
    assert engines_that_cannot_start(spec("meta-llama/Llama-3.1-8B-Instruct")) == []
    assert engines_that_cannot_start(spec(gpuMemoryUtilizationPercent=90)) == []  # 70B FP8 on one H100
    two = spec(gpuMemoryUtilizationPercent=60, tensorParallelSize=2, resources={"gpus": 2})
    assert engines_that_cannot_start(two) == []


def test_weights_that_do_not_fit_the_utilisations_share_are_refused_in_vllms_words() -> None:
    # 70B FP8 on one H100 at 60%: 70.6 GB of weights for 51.3 GB.
    (problem,) = engines_that_cannot_start(spec(gpuMemoryUtilizationPercent=60))
    assert problem.startswith("pools latency and batch: ")
    assert "without the drafter on NVIDIA-H100-80GB-HBM3" in problem
    assert "70.6 GB per GPU at tensorParallelSize 1" in problem
    assert "51.3 GB" in problem
    assert NO_CACHE in problem
    assert "Try increasing `gpu_memory_utilization`" in problem


def test_a_max_model_len_whose_one_sequence_does_not_fit_the_cache_is_refused() -> None:
    (problem,) = engines_that_cannot_start(spec(gpuMemoryUtilizationPercent=90, maxModelLen=131072))
    assert "To serve at least one request with the model's max seq len (131072)" in problem
    assert "the estimated maximum model length is 12880" in problem
    assert "decreasing `max_model_len`" in problem
    assert engines_that_cannot_start(spec(gpuMemoryUtilizationPercent=90, maxModelLen=4096)) == []


def test_only_the_drafters_engine_may_be_the_one_that_cannot_start() -> None:
    # 8192 tokens fit without the drafter (12,880) but not beside it (4,256): an Auto pool may start it.
    (problem,) = engines_that_cannot_start(spec(gpuMemoryUtilizationPercent=90, maxModelLen=8192))
    assert "with the drafter" in problem
    model = known_preset(SEVENTY_B_FP8)
    assert model is not None
    assert startup_memory_problem(model, 0.9, 1, False, 8192) is None
    assert startup_memory_problem(model, 0.9, 1, True, 8192) is not None


@pytest.mark.parametrize(
    ("model", "gpu", "extra"),
    [
        (SEVENTY_B_FP8, None, []),  # no GPU named
        (SEVENTY_B_FP8, "NVIDIA-A10G", []),  # a GPU whose memory is not known
        ("Qwen/Qwen3-32B", H100, []),  # a model no preset identifies
        (SEVENTY_B_FP8, H100, ["--kv-cache-dtype=fp8"]),  # memory the preset does not describe
    ],
)
def test_nothing_is_refused_where_nothing_is_known(model: str, gpu: str | None, extra: list[str]) -> None:
    assert engines_that_cannot_start(spec(model, gpu, gpuMemoryUtilizationPercent=10, extraArgs=extra)) == []


def test_the_operator_reports_it_as_its_own_degraded_reason() -> None:
    found = spec_problems(spec(gpuMemoryUtilizationPercent=60))
    assert found is not None
    assert found.reason == reasons.INSUFFICIENT_GPU_MEMORY
    assert NO_CACHE in found.problems[0]
    # A spec the image cannot run says that first.
    old = spec_problems(spec(gpuMemoryUtilizationPercent=60, image="vllm/vllm-openai:v0.6.0"))
    assert old is not None
    assert old.reason == reasons.UNSUPPORTED_CONFIGURATION
    assert spec_problems(spec(gpuMemoryUtilizationPercent=90)) is None
