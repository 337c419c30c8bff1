"""What an emulated engine is: the vLLM engine arguments plus the emulator's own knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    StepTimeProfile,
    default_profile,
    validate_acceptance,
)
from specfleet_runtime.vllm_args import EngineArgs, SpeculativeConfig

# vLLM's default for `--max-num-seqs` on the OpenAI server (older releases and most docs).
DEFAULT_MAX_NUM_SEQS: Final = 256
# Used when `--max-model-len` is absent (vLLM would read it from the model's config).
DEFAULT_MAX_MODEL_LEN: Final = 8192
# KV cache capacity in tokens: Llama-3.1-8B in bf16 takes 128 KiB of KV per token; an 80 GB H100 at
# gpu_memory_utilization 0.9 minus 16 GB of weights leaves ~56 GB, about 450k tokens.
DEFAULT_KV_CACHE_TOKENS: Final = 450_000
# vLLM's version string that `/version` reports.
EMULATED_VLLM_VERSION: Final = "0.32.0"


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything that fixes an emulated engine's behaviour.

    The first group mirrors vLLM's command line (`from_engine_args` fills it from `parse_vllm_args`);
    the second group is the emulator's own.
    """

    served_model_name: str
    model: str = ""
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    # None = a true non-speculative engine (vLLM started without `--speculative-config`).
    speculative: SpeculativeConfig | None = None

    # Step-time cost model; every step takes profile.step_time(batch, K) * time_scale of wall time.
    profile: StepTimeProfile = field(default_factory=default_profile)
    time_scale: float = 1.0
    # Per-position cumulative acceptance of draft tokens (changeable at run time on the engine).
    acceptance: tuple[float, ...] = PUBLISHED_ACCEPTANCE
    # When set, accepted draft tokens differ from what the model would generate without speculation.
    break_losslessness: bool = False
    # Seed of the acceptance sampler, so a run is reproducible.
    seed: int = 0
    kv_cache_tokens: int = DEFAULT_KV_CACHE_TOKENS
    # Extra step time (fraction) of a K=0 step inside a speculating engine (Dynamic SD at K=0):
    # vLLM measured 6-22% TPOT over a true non-speculative engine. 0 keeps the profile exact.
    spec_k0_overhead: float = 0.0
    # Range of output lengths at which a prompt "naturally" ends (finish_reason "stop").
    natural_length: tuple[int, int] = (16, 256)
    # When the step loop falls behind its schedule by more than this, it forgives the debt instead of
    # rushing steps to catch up (a stalled machine must not turn into a burst of instant steps).
    max_catch_up_s: float = 0.5

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("served_model_name must not be empty")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if not (math.isfinite(self.time_scale) and self.time_scale >= 0):
            raise ValueError("time_scale must be >= 0")
        if self.kv_cache_tokens < 1:
            raise ValueError("kv_cache_tokens must be >= 1")
        if self.spec_k0_overhead < 0:
            raise ValueError("spec_k0_overhead must be >= 0")
        if not (1 <= self.natural_length[0] <= self.natural_length[1]):
            raise ValueError("natural_length must be (shortest, longest) with 1 <= shortest <= longest")
        validate_acceptance(self.acceptance)

    @classmethod
    def from_engine_args(cls, engine: EngineArgs, **emulator_options: Any) -> EmulatorConfig:
        """The config of an emulator started with vLLM's command line `engine`."""
        return cls(
            served_model_name=engine.served_model_name,
            model=engine.model,
            max_num_seqs=engine.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            max_model_len=engine.max_model_len or DEFAULT_MAX_MODEL_LEN,
            speculative=engine.speculative,
            **emulator_options,
        )

    def k_for_batch(self, batch: int) -> int:
        """Draft tokens per request in a step with `batch` running requests.

        0 without speculation; with a Dynamic SD schedule, the K of the range holding `batch`
        (clamped to num_speculative_tokens, as vLLM does); a batch beyond every range takes the K of
        the range that ends last. Without a schedule, num_speculative_tokens.
        """
        spec = self.speculative
        if spec is None:
            return 0
        if not spec.dynamic_schedule:
            return spec.num_speculative_tokens
        for r in spec.dynamic_schedule:
            if r.start <= batch <= r.end:
                return max(0, min(r.k, spec.num_speculative_tokens))
        last = max(spec.dynamic_schedule, key=lambda r: r.end)
        return max(0, min(last.k, spec.num_speculative_tokens))
