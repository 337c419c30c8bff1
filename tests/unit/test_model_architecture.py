"""A model's KV cache from its own config: the parser on real config.json files, the shipped tables of
models and GPUs, the CLI's reader of the local Hugging Face cache, and an unknown model left unknown."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from specfleet.cli.local_models import architecture_of, local_architecture, model_directory
from specfleet.policy import PoolObservation
from specfleet.policy.predict.gpu_products import GPU_PRODUCTS, H100_80GB_BYTES, gpu_memory_bytes
from specfleet.policy.predict.known_models import KNOWN_MODELS, known_architecture
from specfleet.policy.predict.kv_cache import ASSUMED_MEMORY, capacities, models_memory, profile_capacity
from specfleet.policy.predict.model_architecture import (
    ESTIMATED,
    SAFETENSORS_INDEX,
    ModelConfigError,
    eagle3_drafter_params,
    parse_model_config,
)
from specfleet_runtime.cost_profile import MemoryProfile, default_profile

# meta-llama/Llama-3.1-8B-Instruct's config.json, whole (no head_dim: hidden_size / heads).
LLAMA31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
# Qwen/Qwen3-32B's config.json, whole: head_dim 128 is given (hidden_size / heads would be 80).
QWEN3_32B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 25600,
    "max_position_embeddings": 40960,
    "max_window_layers": 64,
    "model_type": "qwen3",
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
H200 = 143771 * 2**20  # nvidia-smi: "NVIDIA H200, 143771 MiB"
NOW = datetime(2026, 12, 2, tzinfo=UTC)


# ---- the parser ---------------------------------------------------------------------------------------


def test_llama_31_8b_from_its_config_and_index() -> None:
    arch = parse_model_config(LLAMA31_8B, {"metadata": {"total_size": 16_060_522_496}, "weight_map": {}})
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.dtype_bytes) == (32, 8, 128, 2)
    assert (arch.weight_bytes, arch.weight_source) == (16_060_522_496, SAFETENSORS_INDEX)
    # 128 KiB of KV a token over all layers (2 x 32 x 8 x 128 x 2 B).
    assert arch.kv_bytes_per_token() == 131072
    # Without the index the estimate from the config is the checkpoint's exact size (8,030,261,248
    # parameters in bf16: a Llama has no biases).
    estimated = parse_model_config(LLAMA31_8B)
    assert (estimated.weight_bytes, estimated.weight_source) == (16_060_522_496, ESTIMATED)


def test_qwen3_32b_from_its_config() -> None:
    arch = parse_model_config(QWEN3_32B)
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.dtype_bytes) == (64, 8, 128, 2)
    # 32,762,106,880 parameters (the Hub says 32.8B; the q/k norms' 16k are left out), two bytes each.
    assert arch.weight_bytes == 2 * 32_762_106_880
    assert arch.weight_source == ESTIMATED


def test_fallbacks_and_what_cannot_be_estimated() -> None:
    # No num_key_value_heads: every attention head has its own KV (no grouped-query attention).
    mha = parse_model_config({**LLAMA31_8B, "num_key_value_heads": None})
    assert mha.kv_heads == 32
    # Multimodal configs nest the language model.
    nested = parse_model_config({"architectures": ["X"], "text_config": QWEN3_32B})
    assert nested == parse_model_config(QWEN3_32B)
    # A quantized checkpoint or a mixture of experts without its index: weights unknown, KV still known.
    fp8 = parse_model_config({**LLAMA31_8B, "quantization_config": {"quant_method": "fp8"}})
    assert fp8.weight_bytes is None
    assert fp8.layers == 32
    assert parse_model_config({**LLAMA31_8B, "num_local_experts": 8}).weight_bytes is None
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        parse_model_config({k: v for k, v in LLAMA31_8B.items() if k != "num_hidden_layers"})
    with pytest.raises(ModelConfigError, match="torch_dtype"):
        parse_model_config({**LLAMA31_8B, "torch_dtype": "int3"})


def test_an_eagle3_drafter_is_one_layer_and_its_draft_head() -> None:
    arch = known_architecture("yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")
    assert arch is not None
    assert arch.layers == 1
    assert eagle3_drafter_params(8192, 28672, 8, 128, 32000) == 1_402_994_688
    assert arch.weight_bytes == 2 * 1_402_994_688
    eight = known_architecture("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    # 424.7e6 parameters in float16: the 0.85e9 B the published profile's engine assumes, unrounded.
    assert eight is not None
    assert eight.weight_bytes == pytest.approx(ASSUMED_MEMORY.drafter_weight_bytes, rel=0.001)


# ---- the shipped tables -------------------------------------------------------------------------------


def test_every_shipped_model_parses_and_cites_its_source() -> None:
    for model_id, known in KNOWN_MODELS.items():
        arch = known.architecture()
        assert arch.weight_bytes is not None
        assert arch.weight_bytes > 0
        assert known.source.startswith(f"https://huggingface.co/{model_id}")
    assert known_architecture("META-LLAMA/llama-3.1-70b-instruct") == known_architecture(
        "meta-llama/Meta-Llama-3.1-70B-Instruct"
    )
    assert known_architecture("Qwen/Qwen3-32B") == parse_model_config(QWEN3_32B)
    # By exact id only: a quantized or renamed checkpoint is not guessed from its name.
    assert known_architecture("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8") is None
    assert known_architecture(None) is None


def test_the_8b_in_the_table_is_the_published_engine_the_defaults_describe() -> None:
    arch = known_architecture("meta-llama/Llama-3.1-8B-Instruct")
    assert arch is not None
    assert (arch.layers, arch.kv_heads, arch.head_dim) == (
        ASSUMED_MEMORY.layers,
        ASSUMED_MEMORY.kv_heads,
        ASSUMED_MEMORY.head_dim,
    )
    assert arch.weight_bytes == pytest.approx(ASSUMED_MEMORY.target_weight_bytes, rel=1e-4)


def test_gpus_by_nvidia_smi_name_and_by_node_label() -> None:
    assert gpu_memory_bytes("NVIDIA H200") == gpu_memory_bytes("NVIDIA-H200") == H200
    assert (
        gpu_memory_bytes("NVIDIA-H100-80GB-HBM3")
        == gpu_memory_bytes("nvidia h100 80gb hbm3")
        == H100_80GB_BYTES
    )
    assert gpu_memory_bytes("NVIDIA-A100-SXM4-80GB") == 81920 * 2**20
    assert gpu_memory_bytes("AMD-Instinct-MI300X") == 205_822_885_888
    assert gpu_memory_bytes("NVIDIA-A10G") is None
    assert gpu_memory_bytes(None) is None
    assert all(gpu.source for gpu in GPU_PRODUCTS.values())


# ---- capacity from the model's own layers -------------------------------------------------------------


def test_qwen3_32b_on_two_h200s_gets_its_own_kv_cache() -> None:
    model = models_memory("Qwen/Qwen3-32B", None, "NVIDIA-H200")
    assert model is not None
    assert (model.layers, model.gpu_bytes) == (64, H200)
    # blocks = floor((u x gpu - weights/TP - overhead) / (page x layers)), kv_cache.py's formula:
    # 0.9 x 150,754,820,096 - 65,524,213,760 / 2 - 2 GiB = 100,769,747,558.4 B per rank; a page is
    # 2 x 16 tokens x 8/2 heads x 128 x 2 B = 32,768 B, x 64 layers = 2,097,152 B a block:
    # 48,050.76 -> 48,050 blocks, x 16 = 768,800 tokens.
    free = 0.9 * H200 - 65_524_213_760 / 2 - 2 * 2**30
    assert int(free // (32768 * 64)) == 48050
    assert model.kv_tokens(0.9, 2, False) == 768_800
    # TP 4: the 1.79M the issue expected from the config (the 8B's layers gave 1.66M).
    assert model.kv_tokens(0.9, 4, False) == 1_787_568


def test_an_unknown_model_has_no_capacity_beyond_its_measurement() -> None:
    assert models_memory("acme/Mystery-7B", None, "NVIDIA H200") is None
    assert models_memory("Qwen/Qwen3-32B", None, "NVIDIA-A10G") is None  # a GPU not in the table
    measured = MemoryProfile(
        kv_cache_tokens=100_000,
        kv_cache_tokens_with_drafter=90_000,
        model="acme/Mystery-7B",
        gpu="NVIDIA H200",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,
    )
    assert profile_capacity(measured) is None
    profile = dataclasses.replace(default_profile(), memory=measured)
    obs = PoolObservation(pool="latency", at=NOW, running_per_replica=2.0, waiting=0.0)
    # At the setting it was measured at, the measurement; anywhere else nothing is memory-bound.
    assert capacities(profile, obs) == ((100_000, "profile"), (90_000, "profile"))
    assert capacities(profile, obs, 0.8, 1) is None
    assert capacities(profile, obs, 0.9, 2) is None


# ---- the CLI's reader of local files ------------------------------------------------------------------


def hub_cache(root: Path, model_id: str, config: dict[str, Any], total_size: int | None = None) -> Path:
    """`model_id` laid out as huggingface_hub caches it: a snapshot named by refs/main."""
    repo = root / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if total_size is not None:
        index = {"metadata": {"total_size": total_size}, "weight_map": {}}
        (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_a_model_not_in_the_table_is_read_from_the_local_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {**QWEN3_32B, "num_hidden_layers": 48}
    snapshot = hub_cache(tmp_path, "acme/Qwen3-Shorter", config, total_size=50_000_000_000)
    assert model_directory("acme/Qwen3-Shorter", tmp_path) == snapshot
    arch = local_architecture("acme/Qwen3-Shorter", tmp_path)
    assert arch is not None
    assert (arch.layers, arch.kv_heads, arch.head_dim, arch.weight_bytes) == (48, 8, 128, 50e9)
    assert arch.weight_source == SAFETENSORS_INDEX
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert architecture_of("acme/Qwen3-Shorter") == arch
    # A directory given as the model name; nothing where there is no config.
    assert architecture_of(str(snapshot)) == arch
    assert architecture_of("acme/Not-Downloaded") is None
    (snapshot / "config.json").write_text("not json")
    assert architecture_of("acme/Qwen3-Shorter") is None
