"""Common models' memory, shipped for clusters and laptops without the checkpoint at hand (pure data).

Each entry is the subset of the model's Hub `config.json` that `model_architecture.parse_model_config`
reads, plus the safetensors index's `metadata.total_size` where it was checked; without it the
weights are estimated from the config (the record says which). Each cites its source: the files on the
model's Hub page, https://huggingface.co/<id>/blob/main/config.json (and model.safetensors.index.json).
Only models whose numbers were checked against a copy of those files are here; any other model is
read from the local Hugging Face cache by the CLI (`specfleet.cli.local_models`) or is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from specfleet.policy.predict.model_architecture import ModelArchitecture, parse_model_config


@dataclass(frozen=True)
class KnownModel:
    """One Hub model's config fields and, where checked, its safetensors index's total_size."""

    config: dict[str, Any]
    source: str
    total_size: int | None = None
    aliases: tuple[str, ...] = field(default=())

    def architecture(self) -> ModelArchitecture:
        index = {"metadata": {"total_size": self.total_size}} if self.total_size else None
        return parse_model_config(self.config, index)


def _hub(model_id: str, index: bool = False) -> str:
    files = "config.json and model.safetensors.index.json" if index else "config.json"
    return f"https://huggingface.co/{model_id}: {files}"


def _dense(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, **more: Any
) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **more,
    }


# Llama-3.1/3.3 70B share one shape (DeepSeek-R1-Distill-Llama-70B is a fine-tune of 3.3).
_LLAMA_70B: Final = _dense(8192, 28672, 80, 64, 8, 128256)
# EAGLE-3 drafters (the EAGLE authors' checkpoints): one decoder layer of the target's width and a
# 32k-token draft vocabulary, saved in float16.
_EAGLE3: Final = {"num_hidden_layers": 1, "draft_vocab_size": 32000, "torch_dtype": "float16"}

KNOWN_MODELS: Final[dict[str, KnownModel]] = {
    "meta-llama/Llama-3.1-8B-Instruct": KnownModel(
        _dense(4096, 14336, 32, 32, 8, 128256),
        _hub("meta-llama/Llama-3.1-8B-Instruct", index=True),
        total_size=16_060_522_496,
        aliases=("meta-llama/Meta-Llama-3.1-8B-Instruct",),
    ),
    "meta-llama/Llama-3.1-70B-Instruct": KnownModel(
        _LLAMA_70B,
        _hub("meta-llama/Llama-3.1-70B-Instruct", index=True),
        total_size=141_107_412_992,
        aliases=("meta-llama/Meta-Llama-3.1-70B-Instruct",),
    ),
    "meta-llama/Llama-3.3-70B-Instruct": KnownModel(_LLAMA_70B, _hub("meta-llama/Llama-3.3-70B-Instruct")),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": KnownModel(
        _LLAMA_70B, _hub("deepseek-ai/DeepSeek-R1-Distill-Llama-70B")
    ),
    "Qwen/Qwen3-8B": KnownModel(_dense(4096, 12288, 36, 32, 8, 151936, head_dim=128), _hub("Qwen/Qwen3-8B")),
    "Qwen/Qwen3-32B": KnownModel(
        _dense(5120, 25600, 64, 64, 8, 151936, head_dim=128), _hub("Qwen/Qwen3-32B")
    ),
    "Qwen/Qwen2.5-72B-Instruct": KnownModel(
        _dense(8192, 29568, 80, 64, 8, 152064), _hub("Qwen/Qwen2.5-72B-Instruct")
    ),
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": KnownModel(
        {**_dense(4096, 14336, 32, 32, 8, 128256), **_EAGLE3},
        _hub("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    ),
    "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B": KnownModel(
        {**_LLAMA_70B, **_EAGLE3}, _hub("yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")
    ),
}

_BY_ID: Final[dict[str, KnownModel]] = {
    name.lower(): model for key, model in KNOWN_MODELS.items() for name in (key, *model.aliases)
}


def known_architecture(model_id: str | None) -> ModelArchitecture | None:
    """The shipped architecture of a model by its exact Hub id (case-insensitive); None: not shipped."""
    known = _BY_ID.get(model_id.strip().lower()) if model_id else None
    return known.architecture() if known is not None else None
