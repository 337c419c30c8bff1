"""What an emulated engine is: the vLLM engine arguments plus the emulator's own knobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    PUBLISHED_H100_LLAMA31_8B_MEMORY,
    MemoryProfile,
    StepTimeProfile,
    default_profile,
    validate_acceptance,
)
from specfleet_runtime.sleep_mode import (
    EAGLE3_LLAMA31_8B_DRAFTER_WEIGHT_BYTES,
    HOST_LINK_BYTES_PER_S,
    LLAMA31_8B_WEIGHT_BYTES,
)
from specfleet_runtime.vllm_args import (
    LOOKAHEAD_METHODS,
    METHODS_WITH_DRAFTER_MODEL,
    EngineArgs,
    SpeculativeConfig,
)

# vLLM's default for `--max-num-seqs` on the OpenAI server (older releases and most docs).
DEFAULT_MAX_NUM_SEQS: Final = 256
# Used when `--max-model-len` is absent (vLLM would read it from the model's config).
DEFAULT_MAX_MODEL_LEN: Final = 8192
# vLLM's default `--block-size` on GPUs (tokens per KV cache block).
DEFAULT_BLOCK_SIZE: Final = 16
# vLLM's default `--gpu-memory-utilization` (only reported, in vllm:cache_config_info).
DEFAULT_GPU_MEMORY_UTILIZATION: Final = 0.9
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
    # vLLM's --enable-sleep-mode: without it /sleep still "succeeds" but frees nothing (see sleep.py).
    enable_sleep_mode: bool = False
    # The environment variable VLLM_SERVER_DEV_MODE=1: vLLM serves /sleep, /wake_up and /is_sleeping
    # only then (404 otherwise).
    server_dev_mode: bool = False

    # Step-time cost model; every step takes profile.step_time(batch, K) * time_scale of wall time.
    profile: StepTimeProfile = field(default_factory=default_profile)
    time_scale: float = 1.0
    # Per-position cumulative acceptance of draft tokens (changeable at run time on the engine).
    acceptance: tuple[float, ...] = PUBLISHED_ACCEPTANCE
    # Acceptance is a property of the content: a prompt whose text holds one of these markers is
    # drafted at that marker's acceptance (the first that matches), every other prompt at `acceptance`.
    # A content shift is then traffic the drafter predicts poorly, not a switch on the engine: a fixed
    # probe (the operator's check of a woken drafter) still sees the drafter's own acceptance.
    content_acceptance: tuple[tuple[str, tuple[float, ...]], ...] = ()
    # When set, accepted draft tokens differ from what the model would generate without speculation.
    break_losslessness: bool = False
    # Seed of the acceptance sampler, so a run is reproducible.
    seed: int = 0
    # Paged KV cache: blocks of `block_size` tokens (vLLM's --block-size). Its size in tokens is
    # `kv_cache_tokens` for an engine started without a drafter and `kv_cache_tokens_with_drafter`
    # with one (its weights and KV take memory from the cache). When only one is given, the other
    # follows from the profile's memory ratio; when neither is, both come from the profile's `memory`
    # section (the published H100 values where the profile has none). See `kv_capacity`.
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_cache_tokens: int | None = None
    kv_cache_tokens_with_drafter: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    # vLLM's --enable-prefix-caching / --no-enable-prefix-caching (on by default in vLLM V1): full
    # prompt blocks already in the KV cache are reused instead of prefilled (see kv_cache.py).
    enable_prefix_caching: bool = True
    # Extra step time (fraction) of a K=0 step inside a speculating engine (Dynamic SD at K=0):
    # vLLM measured 6-22% TPOT over a true non-speculative engine. 0 keeps the profile exact.
    spec_k0_overhead: float = 0.0
    # Range of output lengths at which a prompt "naturally" ends (finish_reason "stop").
    natural_length: tuple[int, int] = (16, 256)
    # Sleep mode (sleep.py): the weights a level-1 sleep copies to host RAM and a wake copies back, in
    # bytes per GPU (None: Llama-3.1-8B in bf16, plus its EAGLE-3 drafter when started with a drafter),
    # over a host link of `host_link_bytes_per_s`; both copies take their time x time_scale.
    weight_bytes: float | None = None
    host_link_bytes_per_s: float = HOST_LINK_BYTES_PER_S
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
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        for name in ("kv_cache_tokens", "kv_cache_tokens_with_drafter"):
            tokens = getattr(self, name)
            if tokens is not None and tokens < 1:
                raise ValueError(f"{name} must be >= 1")
        if (
            self.kv_cache_tokens is not None
            and self.kv_cache_tokens_with_drafter is not None
            and self.kv_cache_tokens_with_drafter > self.kv_cache_tokens
        ):
            raise ValueError("kv_cache_tokens_with_drafter cannot exceed kv_cache_tokens")
        # As vLLM refuses to start when the cache cannot hold one request of max_model_len (one block
        # more here: vLLM's null block, so a lone request can always grow).
        if (self.num_gpu_blocks - 1) * self.block_size < self.max_model_len:
            raise ValueError(
                f"a KV cache of {self.num_gpu_blocks} blocks of {self.block_size} tokens "
                f"({self.kv_capacity().kv_tokens(self.has_drafter)} tokens) cannot hold one request of "
                f"max_model_len {self.max_model_len}: lower --max-model-len or raise the KV cache"
            )
        if self.weight_bytes is not None and not (
            math.isfinite(self.weight_bytes) and self.weight_bytes >= 0
        ):
            raise ValueError("weight_bytes must be >= 0")
        if not (math.isfinite(self.host_link_bytes_per_s) and self.host_link_bytes_per_s > 0):
            raise ValueError("host_link_bytes_per_s must be > 0")
        if self.spec_k0_overhead < 0:
            raise ValueError("spec_k0_overhead must be >= 0")
        if not (1 <= self.natural_length[0] <= self.natural_length[1]):
            raise ValueError("natural_length must be (shortest, longest) with 1 <= shortest <= longest")
        validate_acceptance(self.acceptance)
        for marker, per_position in self.content_acceptance:
            if not marker:
                raise ValueError("a content_acceptance marker must not be empty")
            validate_acceptance(per_position)

    @classmethod
    def from_engine_args(cls, engine: EngineArgs, **emulator_options: Any) -> EmulatorConfig:
        """The config of an emulator started with vLLM's command line `engine`."""
        options: dict[str, Any] = dict(emulator_options)
        if engine.gpu_memory_utilization is not None:
            options["gpu_memory_utilization"] = engine.gpu_memory_utilization
        return cls(
            served_model_name=engine.served_model_name,
            model=engine.model,
            max_num_seqs=engine.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            max_model_len=engine.max_model_len or DEFAULT_MAX_MODEL_LEN,
            speculative=engine.speculative,
            enable_sleep_mode=engine.enable_sleep_mode,
            **options,
        )

    @property
    def has_drafter(self) -> bool:
        """Started with a drafter model (whose weights and KV shrink the KV cache); ngram has none."""
        return self.speculative is not None and self.speculative.method in METHODS_WITH_DRAFTER_MODEL

    @property
    def resolved_weight_bytes(self) -> float:
        """Bytes of weights (target and drafter) one GPU of this engine holds: what level 1 offloads."""
        if self.weight_bytes is not None:
            return self.weight_bytes
        drafter = EAGLE3_LLAMA31_8B_DRAFTER_WEIGHT_BYTES if self.has_drafter else 0.0
        return LLAMA31_8B_WEIGHT_BYTES + drafter

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved per running request for the proposer's next drafts (vLLM's lookahead)."""
        spec = self.speculative
        if spec is None or spec.method not in LOOKAHEAD_METHODS:
            return 0
        return spec.num_speculative_tokens

    def kv_capacity(self) -> MemoryProfile:
        """KV cache tokens of this engine without and with the drafter, resolved as described above."""
        memory = self.profile.memory or PUBLISHED_H100_LLAMA31_8B_MEMORY
        without, with_drafter = self.kv_cache_tokens, self.kv_cache_tokens_with_drafter
        if without is None and with_drafter is None:
            return MemoryProfile(memory.kv_cache_tokens, memory.kv_cache_tokens_with_drafter)
        ratio = memory.kv_cache_tokens_with_drafter / memory.kv_cache_tokens
        if with_drafter is None:
            assert without is not None
            with_drafter = max(1, math.floor(without * ratio))
        if without is None:
            without = math.floor(with_drafter / ratio)
        return MemoryProfile(without, with_drafter)

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks of the KV cache this engine runs with (vLLM's num_gpu_blocks)."""
        return self.kv_capacity().kv_tokens(self.has_drafter) // self.block_size

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
