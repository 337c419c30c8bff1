"""What a model's memory is made of, read from its Hugging Face `config.json` and safetensors index (pure:
takes the parsed files; `specfleet.cli.local_models` reads them, `known_models` ships common ones).

vLLM sizes the KV cache from the same fields: every attention layer holds K and V of
`num_key_value_heads x head_dim` values per token in the model's dtype, and the weights take what
the checkpoint's tensors take. The weights come from the safetensors index's `metadata.total_size`
(the checkpoint's exact bytes) where it is given, else from a parameter count estimated from the
config (`weight_source` says which): a dense decoder's embedding, LM head, attention, gated MLP and
norms, or an EAGLE-3 drafter's one layer, fusion layer and draft head. A mixture of experts or a
quantized checkpoint without its index has no estimate here: its weights are unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

SAFETENSORS_INDEX: Final = "safetensors index"
ESTIMATED: Final = "estimated from config"
# Bytes of one value of each `torch_dtype` (vLLM's KV cache takes the model's dtype by default).
DTYPE_BYTES: Final[dict[str, int]] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
# Config keys that mark a mixture of experts, whose parameter count this module does not estimate.
_EXPERT_KEYS: Final = ("num_local_experts", "num_experts", "n_routed_experts")


class ModelConfigError(ValueError):
    """A config.json that lacks what the KV cache needs."""


@dataclass(frozen=True)
class ModelArchitecture:
    """One checkpoint's memory: its attention layers' KV per token and its weights.

    - `layers`, `kv_heads`, `head_dim`: the attention layers and the K/V heads each holds per token.
    - `dtype_bytes`: bytes of one KV value (the config's torch_dtype).
    - `weight_bytes`: the checkpoint's weights in bytes (None: unknown), `weight_source` how they were
      found (`SAFETENSORS_INDEX`, `ESTIMATED`, or why they are unknown).
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    weight_bytes: float | None
    weight_source: str

    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, on one GPU (tensor parallel 1)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def eagle3_drafter_params(hidden: int, intermediate: int, kv_heads: int, head_dim: int, vocab: int) -> float:
    """Weights of an EAGLE-3 drafter: one decoder layer whose q, k, v read 2 x hidden (embedding and
    fused hidden state), the 3 x hidden -> hidden fusion layer and the draft-vocabulary head (the
    embedding is the target's)."""
    kv = kv_heads * head_dim
    attention = 2 * hidden * hidden + 2 * (2 * hidden * kv) + hidden * hidden
    return attention + 3 * hidden * intermediate + 3 * hidden * hidden + vocab * hidden


def dense_decoder_params(
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    tied: bool,
) -> float:
    """Parameters of a dense decoder (Llama, Qwen, Mistral): embedding, LM head unless tied to it, and
    per layer q/k/v/o projections, a gated MLP (gate, up, down) and two norms; biases and q/k norms,
    a few parameters in a million, are left out."""
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    per_layer = attention + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's fields (multimodal configs nest them under text_config)."""
    nested = config.get("text_config")
    return nested if "num_hidden_layers" not in config and isinstance(nested, Mapping) else config


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelConfigError(f"config.json has no positive integer {key}")
    return value


def is_eagle3_drafter(config: Mapping[str, Any]) -> bool:
    """Whether a config is an EAGLE-3 drafter's (its architecture says so, or it has a draft vocabulary)."""
    architectures = config.get("architectures") or []
    return "draft_vocab_size" in config or any("eagle3" in str(a).lower() for a in architectures)


def parse_model_config(
    config: Mapping[str, Any], safetensors_index: Mapping[str, Any] | None = None
) -> ModelArchitecture:
    """A model's architecture from its config.json (and its model.safetensors.index.json, where given).

    Layers: num_hidden_layers; KV heads: num_key_value_heads, else num_attention_heads (no grouped
    query attention); head dim: head_dim, else hidden_size / num_attention_heads; dtype: torch_dtype
    (or dtype, as newer transformers write it). Raises ModelConfigError where one is missing."""
    text = _text_config(config)
    layers = _int(text, "num_hidden_layers")
    heads = _int(text, "num_attention_heads")
    kv_heads = _int(text, "num_key_value_heads") if text.get("num_key_value_heads") is not None else heads
    hidden = _int(text, "hidden_size")
    head_dim = _int(text, "head_dim") if text.get("head_dim") is not None else hidden // heads
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "")
    if dtype not in DTYPE_BYTES:
        raise ModelConfigError(
            f"config.json's torch_dtype {dtype or '(none)'} is not one of {sorted(DTYPE_BYTES)}"
        )
    dtype_bytes = DTYPE_BYTES[dtype]
    weights, source = _weights(
        text, config, safetensors_index, layers, heads, kv_heads, hidden, head_dim, dtype_bytes
    )
    return ModelArchitecture(layers, kv_heads, head_dim, dtype_bytes, weights, source)


def _weights(
    text: Mapping[str, Any],
    config: Mapping[str, Any],
    safetensors_index: Mapping[str, Any] | None,
    layers: int,
    heads: int,
    kv_heads: int,
    hidden: int,
    head_dim: int,
    dtype_bytes: int,
) -> tuple[float | None, str]:
    """The weights' bytes and where they come from (see the module docstring)."""
    metadata = (safetensors_index or {}).get("metadata") or {}
    total = metadata.get("total_size")
    if isinstance(total, int | float) and not isinstance(total, bool) and total > 0:
        return float(total), SAFETENSORS_INDEX
    if "quantization_config" in config or "quantization_config" in text:
        return None, "unknown: a quantized checkpoint without its safetensors index"
    if any(text.get(key) for key in _EXPERT_KEYS):
        return None, "unknown: a mixture of experts without its safetensors index"
    intermediate = _int(text, "intermediate_size")
    vocab = _int(text, "vocab_size")
    if is_eagle3_drafter(config):
        draft_vocab = text.get("draft_vocab_size") or vocab
        params = eagle3_drafter_params(hidden, intermediate, kv_heads, head_dim, int(draft_vocab))
    else:
        tied = bool(text.get("tie_word_embeddings", False))
        params = dense_decoder_params(hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tied)
    return float(params * dtype_bytes), ESTIMATED
