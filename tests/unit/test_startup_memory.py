"""Refusing what vLLM cannot start: weights that leave no KV cache in the GPU memory vLLM is given, or a
maxModelLen whose one sequence does not fit the cache; nothing refused where the model or GPU is unknown.
The model's memory comes from its own config: the shipped table, or (as the CLI reads it) a checkpoint
in the local Hugging Face cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api import reasons
from specfleet.api.validation import parse_resource
from specfleet.cli.local_models import architecture_of
from specfleet.policy.predict.known_models import KNOWN_MODELS
from specfleet.policy.predict.kv_cache import models_memory
from specfleet.policy.predict.startup_memory import engines_that_cannot_start, startup_memory_problem
from specfleet.reconcile.desired import spec_problems

EXAMPLE = Path(__file__).parents[2] / "examples" / "01-minimal-eagle3.yaml"
H100 = "NVIDIA-H100-80GB-HBM3"
SEVENTY_B = "meta-llama/Llama-3.1-70B-Instruct"
SEVENTY_B_FP8 = "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"
DRAFTER_70B = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
NO_CACHE = "No available memory for the cache blocks"


@pytest.fixture(autouse=True)
def fp8_70b_in_the_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An FP8 Llama-3.1-70B checkpoint in the local Hugging Face cache (not in the shipped table): the
    70B's config with a quantization_config, and an index of 70.6e9 B (one byte a parameter, rounded)."""
    snapshot = tmp_path / f"models--{SEVENTY_B_FP8.replace('/', '--')}" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    config = {**KNOWN_MODELS[SEVENTY_B].config, "quantization_config": {"quant_method": "compressed-tensors"}}
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 70_600_000_000}})
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))


def spec(model: str = SEVENTY_B_FP8, gpu: str | None = H100, **engine: Any) -> Any:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["name"] = model
    if "70B" in model:
        doc["spec"]["drafter"]["model"] = DRAFTER_70B
    doc["spec"]["engine"] = {**({"nodeSelector": {"nvidia.com/gpu.product": gpu}} if gpu else {}), **engine}
    return parse_resource(doc).spec


def cannot_start(sd_spec: Any) -> list[str]:
    """What the CLI refuses: the table, then the local cache."""
    return engines_that_cannot_start(sd_spec, architecture_of)


def test_the_model_is_known_from_the_table_or_the_local_cache_and_the_gpu_from_the_label() -> None:
    fp8 = models_memory(SEVENTY_B_FP8, DRAFTER_70B, H100, architecture_of)
    assert fp8 is not None
    assert (fp8.target_weight_bytes, fp8.layers) == (70.6e9, 80)
    # The operator reads the table only: the cached FP8 checkpoint is unknown there.
    assert models_memory(SEVENTY_B_FP8, DRAFTER_70B, H100) is None
    assert models_memory(SEVENTY_B, DRAFTER_70B, H100) is not None
    assert models_memory(SEVENTY_B, DRAFTER_70B, "NVIDIA-A10G") is None
    assert (
        models_memory("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", None, H100, architecture_of)
        is None
    )


def test_a_model_that_fits_starts() -> None:
    assert cannot_start(spec("meta-llama/Llama-3.1-8B-Instruct")) == []
    assert cannot_start(spec(gpuMemoryUtilizationPercent=90)) == []  # 70B FP8 on one H100
    two = spec(gpuMemoryUtilizationPercent=60, tensorParallelSize=2, resources={"gpus": 2})
    assert engines_that_cannot_start(two) == []


def test_weights_that_do_not_fit_the_utilisations_share_are_refused_in_vllms_words() -> None:
    # 70B FP8 on one H100 at 60%: 70.6 GB of weights for 51.3 GB.
    (problem,) = cannot_start(spec(gpuMemoryUtilizationPercent=60))
    assert problem.startswith("pools latency and batch: ")
    assert "without the drafter on NVIDIA-H100-80GB-HBM3" in problem
    assert "70.6 GB per GPU at tensorParallelSize 1" in problem
    assert "51.3 GB" in problem
    assert NO_CACHE in problem
    assert "Try increasing `gpu_memory_utilization`" in problem


def test_a_max_model_len_whose_one_sequence_does_not_fit_the_cache_is_refused() -> None:
    (problem,) = cannot_start(spec(gpuMemoryUtilizationPercent=90, maxModelLen=131072))
    assert "To serve at least one request with the model's max seq len (131072)" in problem
    assert "the estimated maximum model length is 12880" in problem
    assert "decreasing `max_model_len`" in problem
    assert cannot_start(spec(gpuMemoryUtilizationPercent=90, maxModelLen=4096)) == []


def test_only_the_drafters_engine_may_be_the_one_that_cannot_start() -> None:
    # 8192 tokens fit without the drafter (12,880) but not beside it (4,256): an Auto pool may start it.
    (problem,) = cannot_start(spec(gpuMemoryUtilizationPercent=90, maxModelLen=8192))
    assert "with the drafter" in problem
    model = models_memory(SEVENTY_B_FP8, DRAFTER_70B, H100, architecture_of)
    assert model is not None
    assert startup_memory_problem(model, 0.9, 1, False, 8192) is None
    assert startup_memory_problem(model, 0.9, 1, True, 8192) is not None


@pytest.mark.parametrize(
    ("model", "gpu", "extra"),
    [
        (SEVENTY_B_FP8, None, []),  # no GPU named
        (SEVENTY_B_FP8, "NVIDIA-A10G", []),  # a GPU whose memory is not known
        ("acme/Mystery-32B", H100, []),  # a model neither the table nor the local cache knows
        (SEVENTY_B_FP8, H100, ["--kv-cache-dtype=fp8"]),  # memory the config does not describe
    ],
)
def test_nothing_is_refused_where_nothing_is_known(model: str, gpu: str | None, extra: list[str]) -> None:
    assert cannot_start(spec(model, gpu, gpuMemoryUtilizationPercent=10, extraArgs=extra)) == []


def test_the_operator_reports_it_as_its_own_degraded_reason() -> None:
    # The operator knows the shipped table's models: BF16 70B over two H100s at 60% (70.6 GB of
    # weights per GPU for 51.3 GB).
    found = spec_problems(
        spec(SEVENTY_B, gpuMemoryUtilizationPercent=60, tensorParallelSize=2, resources={"gpus": 2})
    )
    assert found is not None
    assert found.reason == reasons.INSUFFICIENT_GPU_MEMORY
    assert NO_CACHE in found.problems[0]
    assert "70.6 GB per GPU at tensorParallelSize 2" in found.problems[0]
    # A spec the image cannot run says that first.
    old = spec_problems(spec(SEVENTY_B, gpuMemoryUtilizationPercent=60, image="vllm/vllm-openai:v0.6.0"))
    assert old is not None
    assert old.reason == reasons.UNSUPPORTED_CONFIGURATION
    assert (
        spec_problems(
            spec(SEVENTY_B, gpuMemoryUtilizationPercent=90, tensorParallelSize=2, resources={"gpus": 2})
        )
        is None
    )
    # The FP8 checkpoint only the local cache holds: unknown to the operator, refused by the CLI.
    assert spec_problems(spec(gpuMemoryUtilizationPercent=60)) is None
    assert spec_problems(spec(gpuMemoryUtilizationPercent=60), architecture_of) is not None


def test_qwen3_32b_on_h200s_is_sized_from_its_own_layers() -> None:
    # 65.5 GB of weights: on one H200 at 50% (75.4 GB) it starts, at 40% (60.3 GB) it cannot.
    assert cannot_start(spec("Qwen/Qwen3-32B", "NVIDIA-H200", gpuMemoryUtilizationPercent=50)) == []
    (problem,) = cannot_start(spec("Qwen/Qwen3-32B", "NVIDIA-H200", gpuMemoryUtilizationPercent=40))
    assert "65.5 GB per GPU at tensorParallelSize 1" in problem
