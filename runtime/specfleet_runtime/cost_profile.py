"""The cost model of speculative decoding: how long a decode step takes, and what it yields.

A decode step of a vLLM engine advances every running request at once. Its duration depends on the
batch size (how many requests run) and on K (how many draft tokens each request verifies). What a
step yields per request depends on the drafter's acceptance. Together they give the *goodput* that
decides whether speculation pays:

    goodput(batch, K) = (1 + p_0 + ... + p_{K-1}) / step_time(batch, K)     tokens/s per request

where p_i is the per-position *cumulative* acceptance (the probability that drafts 0..i are all
accepted; vLLM exposes it as accepted_per_pos[i] / drafts).

Prefill is priced where the workload is known: a request of P prompt tokens and L generated tokens
costs its engine P x prefillMsPerToken of prefill (x (1 + drafterPrefillFraction) in an engine started
with a drafter, whose drafter runs over every prompt token too). Per generated token that is
r x prefill x (1 + f) with r = P / L (`prompt_per_output`), so with c requests running

    goodput(c, K) = m_K / (step_time(c, K) + c x m_K x r x prefill x (1 + f_K))     m_K = 1 + p_0 + ...

Speculation speeds up only the decode part: the longer the prompts per generated token, the closer
every speedup is to 1, and the drafter's prefill share can turn a small decode gain into a loss.

`StepTimeProfile` holds a measured table of step times (batch sizes x K values) and interpolates it.
The default is the published H100 / Llama-3.1-8B profile, per drafter method (`default_profile`:
EAGLE-1's measured table, and for "eagle3" that table plus the EAGLE-3 drafter's longer step); other
hardware loads from a file (`load_profile`, format below). The engine emulator runs on this module,
and the operator's policy reuses it, so everything here is pure: no I/O except the explicit loader.

Profile file format (YAML or JSON; one row per batch size, one column per K; K=0 is required)::

    name: h100-llama-3.1-8b-eagle
    batchSizes: [1, 64, 256]
    numSpeculativeTokens: [0, 1, 3, 5]
    stepTimeMs:
      - [6.52, 7.37, 8.84, 10.33]
      - [7.77, 9.66, 13.50, 16.83]
      - [14.49, 27.14, 41.85, 57.40]
    prefillMsPerToken: 0.04   # optional: extra step time per prompt token a step prefills
    drafterPrefillFraction: 0.038  # optional: the drafter's pass over a prompt token, as a share of it
    memory:                   # optional (older profiles lack it); both kvCache keys required if present
      kvCacheTokens: 448304             # KV cache of one engine started without the drafter, in tokens
      kvCacheTokensWithDrafter: 428432  # the same engine started with the drafter (its weights + KV)
      model: meta-llama/Llama-3.1-8B-Instruct   # what it was measured for (all optional)
      drafter: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
      gpu: NVIDIA H100 80GB HBM3
      tensorParallelSize: 1       # the setting it was measured at (unset: 1), and ...
      maxModelLen: 131072
      gpuMemoryUtilization: 0.9   # ... (unset: vLLM's 0.9): the capacity model predicts other settings
      blockSize: 16
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import yaml

from specfleet_runtime.step_roofline import Roofline

# Per-position cumulative acceptance of the published step-time profile: the EAGLE-1 drafter
# yuhuili/EAGLE-LLaMA3.1-Instruct-8B on Llama-3.1-8B-Instruct, from vLLM's Dynamic SD work (vllm PR
# #32374 "[V1][Spec Decode] Add Dynamic SD", E. Ranjan, opened 2026-01-15; values as quoted in
# shared/reference/vllm-facts.md, the PR's own table not seen).
PUBLISHED_ACCEPTANCE: Final[tuple[float, ...]] = (0.68, 0.39, 0.20, 0.10, 0.05)

# Per-position cumulative acceptance of an EAGLE-3 drafter at K=3 (about 75% / 55% / 41%, acceptance
# length 2.71): vLLM's figures as quoted by "Speculative Decoding in Production: When EAGLE-3 Pays
# Off" (shared/reference). A preset for simulations (`--acceptance eagle3`), not the policy's prior:
# every example names an EAGLE-3 drafter, so switching the prior would move every benchmark figure.
PUBLISHED_EAGLE3_ACCEPTANCE: Final[tuple[float, ...]] = (0.75, 0.55, 0.41)

# Prefill of Llama-3.1-8B on an H100: 2 x 8.03e9 FLOPs per prompt token at 40% of the GPU's 989 dense
# bf16 TFLOPS is 0.0406 ms per token (an estimate; `specfleet profile` measures a real one).
H100_LLAMA31_8B_PREFILL_MS_PER_TOKEN: Final = 0.04

# The EAGLE-3 drafter's pass over each prompt token, as a share of Llama-3.1-8B's (multiply-adds per
# token: its 3h -> h fusion layer, 3 x 4096 x 4096 = 50.3e6, and its one decoder layer, 218e6, against
# the target's 32 decoder layers of 218e6 each; the LM heads run only on the last position): 3.85%.
EAGLE3_LLAMA31_8B_DRAFTER_PREFILL_FRACTION: Final = (3 * 4096 * 4096 + 218e6) / (32 * 218e6)

# Keys of a profile's `memory` section that must be present wherever the section is.
MEMORY_REQUIRED_KEYS: Final = ("kvCacheTokens", "kvCacheTokensWithDrafter")


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through the points (xs strictly increasing), clamped at both ends."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)  # xs[i-1] <= x < xs[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class MemoryProfile:
    """KV cache of one engine with and without the drafter, and what that was measured for.

    The two capacities are what vLLM reports at start-up ("KV cache size: N tokens") and in
    `vllm:cache_config_info{kv_cache_size_tokens=...}`; the rest says which setup they hold for.
    """

    kv_cache_tokens: int
    kv_cache_tokens_with_drafter: int
    model: str | None = None
    drafter: str | None = None
    gpu: str | None = None
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_tokens < 1 or self.kv_cache_tokens_with_drafter < 1:
            raise ValueError("memory: kvCacheTokens and kvCacheTokensWithDrafter must be >= 1")
        if self.kv_cache_tokens_with_drafter > self.kv_cache_tokens:
            # The drafter's weights and KV only take memory from the target's KV cache.
            raise ValueError("memory: kvCacheTokensWithDrafter cannot exceed kvCacheTokens")
        for key, value in (
            ("tensorParallelSize", self.tensor_parallel_size),
            ("maxModelLen", self.max_model_len),
            ("blockSize", self.block_size),
        ):
            if value is not None and value < 1:
                raise ValueError(f"memory: {key} must be >= 1")
        util = self.gpu_memory_utilization
        if util is not None and not (math.isfinite(util) and 0 < util <= 1):
            raise ValueError("memory: gpuMemoryUtilization must be within (0, 1]")

    def kv_tokens(self, speculative: bool) -> int:
        """Tokens of KV cache of an engine started with (`speculative`) or without the drafter."""
        return self.kv_cache_tokens_with_drafter if speculative else self.kv_cache_tokens

    def to_dict(self) -> dict[str, Any]:
        """The `memory` section (inverse of `from_dict`); unknown setup keys are left out."""
        doc: dict[str, Any] = {
            "kvCacheTokens": self.kv_cache_tokens,
            "kvCacheTokensWithDrafter": self.kv_cache_tokens_with_drafter,
        }
        for key, value in (
            ("model", self.model),
            ("drafter", self.drafter),
            ("gpu", self.gpu),
            ("tensorParallelSize", self.tensor_parallel_size),
            ("maxModelLen", self.max_model_len),
            ("gpuMemoryUtilization", self.gpu_memory_utilization),
            ("blockSize", self.block_size),
        ):
            if value is not None:
                doc[key] = value
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> MemoryProfile:
        """Build the section from a profile's `memory` mapping; raises ValueError naming what is wrong."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"memory must be a mapping, not {type(doc).__name__}")
        missing = [key for key in MEMORY_REQUIRED_KEYS if doc.get(key) is None]
        if missing:
            raise ValueError("memory lacks " + ", ".join(repr(key) for key in missing))

        def integer(key: str, required: bool = False) -> int | None:
            value = doc.get(key)
            if value is None and not required:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
                raise ValueError(f"memory: {key} must be an integer, got {value!r}")
            return int(value)

        def text(key: str) -> str | None:
            value = doc.get(key)
            return None if value is None else str(value)

        util = doc.get("gpuMemoryUtilization")
        if util is not None and (isinstance(util, bool) or not isinstance(util, int | float)):
            raise ValueError(f"memory: gpuMemoryUtilization must be a number, got {util!r}")
        return cls(
            kv_cache_tokens=integer("kvCacheTokens", required=True) or 0,
            kv_cache_tokens_with_drafter=integer("kvCacheTokensWithDrafter", required=True) or 0,
            model=text("model"),
            drafter=text("drafter"),
            gpu=text("gpu"),
            tensor_parallel_size=integer("tensorParallelSize"),
            max_model_len=integer("maxModelLen"),
            gpu_memory_utilization=None if util is None else float(util),
            block_size=integer("blockSize"),
        )


@dataclass(frozen=True)
class StepTimeProfile:
    """Step time (ms) of one decode step as a function of batch size and K, from a measured table.

    `step_ms[i][j]` is the step time at `batch_sizes[i]` requests with `speculative_tokens[j]` draft
    tokens per request (K=0 means no speculation). Inside the table the time is linear in batch and
    linear in K between its points; below the smallest batch it is clamped.

    Past the table (a batch above the largest measured, or a K above the largest) it follows the
    roofline fitted to the table (`step_roofline.Roofline`): a step reads the weights once and runs
    the drafter's K passes, a floor that is the smallest batch's time at that K, and on top of it
    does work per running request (more in an engine with the drafter) and compute in proportion to
    the tokens it verifies, batch x (1 + K):

        roofline(b, K) = floor(K) + (b - b_min) x (a + s x min(K, 1) + c x (1 + K))

    with a, s and c >= 0 fitted by least squares over every point of the table. Past the edge the
    time is the table's value at the nearest edge point plus the roofline's growth from there, so it
    is continuous at the edge, grows by a + s min(K, 1) + c (1 + K) per request beyond the largest batch, and
    is monotone in batch and K wherever the table is. On the published table the fit is a 0.0044,
    s 0.0180 and c 0.0262 ms (16 GFLOP a verified token of Llama-3.1-8B at about 610 TFLOPS); it is
    within 3% of the batch-256 row and over-predicts the batch-64 row (9-29%: the step is partly
    memory-bound there, below the roofline's knee), which the model never uses: inside the table the
    measured points are interpolated. `memory` is the KV cache the engine has with and without the
    drafter, None for a profile measured before profiles carried it.
    """

    batch_sizes: tuple[int, ...]
    speculative_tokens: tuple[int, ...]
    step_ms: tuple[tuple[float, ...], ...]
    name: str = "custom"
    prefill_ms_per_token: float = 0.0
    memory: MemoryProfile | None = None
    drafter_prefill_fraction: float = 0.0

    def __post_init__(self) -> None:
        if not self.batch_sizes or not self.speculative_tokens:
            raise ValueError("a profile needs at least one batch size and one K")
        if any(b < 1 for b in self.batch_sizes) or list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError("batch sizes must be >= 1 and strictly increasing")
        if list(self.speculative_tokens) != sorted(set(self.speculative_tokens)):
            raise ValueError("K values must be strictly increasing")
        if self.speculative_tokens[0] != 0:
            raise ValueError("the K values must start at 0 (the non-speculative baseline)")
        if len(self.step_ms) != len(self.batch_sizes) or any(
            len(row) != len(self.speculative_tokens) for row in self.step_ms
        ):
            raise ValueError("stepTimeMs needs one row per batch size and one column per K")
        if any(not (math.isfinite(t) and t > 0) for row in self.step_ms for t in row):
            raise ValueError("step times must be positive, finite numbers")
        if not (math.isfinite(self.prefill_ms_per_token) and self.prefill_ms_per_token >= 0):
            raise ValueError("prefillMsPerToken must be >= 0")
        if not (math.isfinite(self.drafter_prefill_fraction) and self.drafter_prefill_fraction >= 0):
            raise ValueError("drafterPrefillFraction must be >= 0")

    @property
    def max_k(self) -> int:
        """The largest K the table measured."""
        return self.speculative_tokens[-1]

    def step_time_ms(self, batch: float, k: float) -> float:
        """Milliseconds one decode step takes with `batch` running requests drafting `k` tokens each."""
        if batch <= 0:
            raise ValueError(f"batch size must be > 0, got {batch}")
        if k < 0:
            raise ValueError(f"K must be >= 0, got {k}")
        b = max(float(batch), self.batch_sizes[0])
        b_in, k_in = min(b, self.batch_sizes[-1]), min(float(k), self.max_k)
        at_k = [_interpolate(self.speculative_tokens, row, k_in) for row in self.step_ms]
        inside = _interpolate(self.batch_sizes, at_k, b_in)
        if b_in == b and k_in == k:
            return inside
        roofline = self.roofline
        return inside + roofline.step_ms(b, k) - roofline.step_ms(b_in, k_in)

    @functools.cached_property
    def roofline(self) -> Roofline:
        """The roofline fitted to the table, which the step time follows past it."""
        return Roofline.fit(self.batch_sizes, self.speculative_tokens, self.step_ms)

    def step_time_s(self, batch: float, k: float) -> float:
        """Seconds one decode step takes (see `step_time_ms`)."""
        return self.step_time_ms(batch, k) / 1000.0

    def prefill_time_ms(self, prompt_tokens: int) -> float:
        """Extra milliseconds a step spends prefilling `prompt_tokens` new prompt tokens."""
        return self.prefill_ms_per_token * prompt_tokens

    def prefill_s_per_output(self, prompt_per_output: float, speculative: bool) -> float:
        """Engine seconds of prefill per generated token, at `prompt_per_output` prompt tokens per
        generated token, in an engine started with (`speculative`) or without the drafter."""
        share = 1.0 + (self.drafter_prefill_fraction if speculative else 0.0)
        return max(0.0, prompt_per_output) * self.prefill_ms_per_token / 1000.0 * share

    def to_dict(self) -> dict[str, Any]:
        """The file format's document (inverse of `from_dict`)."""
        return {
            "name": self.name,
            "batchSizes": list(self.batch_sizes),
            "numSpeculativeTokens": list(self.speculative_tokens),
            "stepTimeMs": [list(row) for row in self.step_ms],
            "prefillMsPerToken": self.prefill_ms_per_token,
            **(
                {"drafterPrefillFraction": self.drafter_prefill_fraction}
                if self.drafter_prefill_fraction
                else {}
            ),
            **({"memory": self.memory.to_dict()} if self.memory is not None else {}),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StepTimeProfile:
        """Build a profile from the file format's document; raises ValueError when it is invalid."""
        try:
            batch_sizes = tuple(int(b) for b in doc["batchSizes"])
            ks = tuple(int(k) for k in doc["numSpeculativeTokens"])
            step_ms = tuple(tuple(float(t) for t in row) for row in doc["stepTimeMs"])
        except KeyError as err:
            raise ValueError(f"profile lacks {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"profile has a malformed table: {err}") from None
        memory = doc.get("memory")
        return cls(
            batch_sizes=batch_sizes,
            speculative_tokens=ks,
            step_ms=step_ms,
            name=str(doc.get("name", "custom")),
            prefill_ms_per_token=float(doc.get("prefillMsPerToken", 0.0)),
            drafter_prefill_fraction=float(doc.get("drafterPrefillFraction", 0.0)),
            memory=None if memory is None else MemoryProfile.from_dict(memory),
        )


# KV cache of the published setup, from the capacity model (operator/specfleet/policy/predict/kv_cache.py) at
# gpu-memory-utilization 0.9 on an H100 80GB (81559 MiB = 85,520,809,984 B), in vLLM's 16-token blocks:
#   usable       0.9 x 85,520,809,984 B                           = 76,968,728,985.6 B
#   - weights    8.03e9 params x 2 B (bf16)                       = 16,060,000,000 B
#   - overhead   activations, CUDA graphs (estimate) 2 GiB        =  2,147,483,648 B
#   = KV memory                                                   = 58,761,245,337.6 B
#   a block: 16 tokens x 2 (K, V) x 32 layers x 8 KV heads x 128 dim x 2 B = 2,097,152 B
#   kvCacheTokens = floor(58,761,245,337.6 / 2,097,152) = 28,019 blocks x 16 = 448,304
#   with the EAGLE-3 drafter: - 0.85e9 B weights (one layer + fusion + 32k head, bf16), and its one
#   layer's KV in every block (33 layers, 2,162,688 B a block):
#   kvCacheTokensWithDrafter = floor(57,911,245,337.6 / 2,162,688) = 26,777 blocks x 16 = 428,432
PUBLISHED_H100_LLAMA31_8B_MEMORY: Final = MemoryProfile(
    kv_cache_tokens=448304,
    kv_cache_tokens_with_drafter=428432,
    model="meta-llama/Llama-3.1-8B-Instruct",
    drafter="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    gpu="NVIDIA H100 80GB HBM3",
    tensor_parallel_size=1,
    max_model_len=131072,  # the model's default; the capacity above does not depend on it
    gpu_memory_utilization=0.9,
    block_size=16,
)

# Llama-3.1-8B-Instruct with the EAGLE-1 drafter yuhuili/EAGLE-LLaMA3.1-Instruct-8B on one H100, from
# vLLM's Dynamic SD work (vllm PR #32374, 2026; see PUBLISHED_ACCEPTANCE). Its memory section is the
# simulator's EAGLE-3 estimate above (no published measurement of it).
PUBLISHED_H100_LLAMA31_8B_EAGLE: Final = StepTimeProfile(
    name="h100-llama-3.1-8b-eagle",
    batch_sizes=(1, 64, 256),
    speculative_tokens=(0, 1, 3, 5),
    step_ms=(
        (6.52, 7.37, 8.84, 10.33),
        (7.77, 9.66, 13.50, 16.83),
        (14.49, 27.14, 41.85, 57.40),
    ),
    prefill_ms_per_token=H100_LLAMA31_8B_PREFILL_MS_PER_TOKEN,
    drafter_prefill_fraction=EAGLE3_LLAMA31_8B_DRAFTER_PREFILL_FRACTION,
    memory=PUBLISHED_H100_LLAMA31_8B_MEMORY,
)


# Batch-1 time per output token (ms) and mean acceptance length by K of Llama-3.1-8B-Instruct on
# MT-bench in vLLM, with no drafter and with each of the EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B) and
# EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) drafters, from vLLM issue #20780
# (https://github.com/vllm-project/vllm/issues/20780; the GPU is not stated, the author's H100 assumed).
# A step at K yields AL(K) tokens, so TPOT(K) x AL(K) is the step time at that K.
VLLM_20780_VANILLA_TPOT_MS: Final = 7.07
VLLM_20780_EAGLE1_TPOT_MS: Final[Mapping[int, float]] = MappingProxyType(
    {2: 4.37, 3: 4.29, 4: 4.48, 5: 4.71, 6: 4.94, 7: 5.2}
)
VLLM_20780_EAGLE3_TPOT_MS: Final[Mapping[int, float]] = MappingProxyType(
    {2: 4.32, 3: 4.09, 4: 4.05, 5: 4.13, 6: 4.2, 7: 4.29}
)
VLLM_20780_EAGLE1_AL: Final[Mapping[int, float]] = MappingProxyType(
    {2: 2.1, 3: 2.29, 4: 2.39, 5: 2.43, 6: 2.45, 7: 2.47}
)
VLLM_20780_EAGLE3_AL: Final[Mapping[int, float]] = MappingProxyType(
    {2: 2.36, 3: 2.79, 4: 3.08, 5: 3.32, 6: 3.46, 7: 3.54}
)


def _eagle3_drafter_extra_ms() -> dict[int, float]:
    steps = {
        k: VLLM_20780_EAGLE3_TPOT_MS[k] * VLLM_20780_EAGLE3_AL[k]
        - VLLM_20780_EAGLE1_TPOT_MS[k] * VLLM_20780_EAGLE1_AL[k]
        for k in VLLM_20780_EAGLE3_TPOT_MS
    }
    # K=0 runs no drafter; K=1 was not measured: half of K=2's extra (an assumption).
    return {0: 0.0, 1: steps[2] / 2, **steps}


# How much longer a step of the EAGLE-3 drafter is than one of the EAGLE-1 drafter at the same K (ms):
# its step less EAGLE-1's in vLLM issue #20780, each TPOT x AL, at batch 1 (K=1: half of K=2's, not
# measured). K 3: 1.587 ms, K 5: 2.266 ms.
EAGLE3_DRAFTER_EXTRA_STEP_MS: Final[Mapping[int, float]] = MappingProxyType(_eagle3_drafter_extra_ms())


def with_drafter_extra(base: StepTimeProfile, extra_ms: Mapping[int, float], name: str) -> StepTimeProfile:
    """`base` with `extra_ms[K]` added to every batch's step at each K of its table (the same term at
    every batch: a drafter pass costs the same whatever the batch, as the roofline's floor does)."""
    missing = [k for k in base.speculative_tokens if k not in extra_ms]
    if missing:
        raise ValueError(f"no drafter extra for K {missing}")
    rows = tuple(
        tuple(round(t + extra_ms[k], 3) for k, t in zip(base.speculative_tokens, row, strict=True))
        for row in base.step_ms
    )
    return dataclasses.replace(base, name=name, step_ms=rows)


# The published profile with the EAGLE-3 drafter's longer step: PUBLISHED_H100_LLAMA31_8B_EAGLE plus
# EAGLE3_DRAFTER_EXTRA_STEP_MS at every batch size (see `default_profile`).
PUBLISHED_H100_LLAMA31_8B_EAGLE3: Final = with_drafter_extra(
    PUBLISHED_H100_LLAMA31_8B_EAGLE, EAGLE3_DRAFTER_EXTRA_STEP_MS, "h100-llama-3.1-8b-eagle3"
)


def default_profile(method: str | None = None) -> StepTimeProfile:
    """The published H100 / Llama-3.1-8B profile for vLLM speculative `method`.

    Measured: the step times of the EAGLE-1 drafter (vllm PR #32374, batch 1, 64 and 256 at K 0, 1, 3
    and 5), the table every method other than "eagle3" gets (None, "eagle", "ngram", ...: unchanged);
    and the EAGLE-3 drafter's step less EAGLE-1's at batch 1 and K 2-7 (vLLM issue #20780, TPOT x
    acceptance length). "eagle3" gets the EAGLE-1 table plus that extra at each K of the table.
    Assumed: the extra at batch 64 and 256 equals the batch-1 extra (not measured there: a free input,
    a drafter pass taken to cost the same whatever the batch), and K=1's is half of K=2's (K=1 was not
    measured). A measured profile (`specfleet profile`, `costProfileConfigMap`) replaces both.
    """
    return PUBLISHED_H100_LLAMA31_8B_EAGLE3 if method == "eagle3" else PUBLISHED_H100_LLAMA31_8B_EAGLE


def load_profile(path: str | Path) -> StepTimeProfile:
    """Read a profile from a YAML or JSON file (format in the module docstring)."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: a profile file must hold a mapping")
    return StepTimeProfile.from_dict(doc)


def _check_probabilities(per_position_acceptance: Iterable[float]) -> tuple[float, ...]:
    values = tuple(float(p) for p in per_position_acceptance)
    for i, p in enumerate(values):
        if not (0.0 <= p <= 1.0):
            raise ValueError(f"acceptance at position {i} must be within [0, 1], got {p}")
    return values


def validate_acceptance(per_position_acceptance: Iterable[float]) -> tuple[float, ...]:
    """Check a per-position cumulative acceptance vector and return it as a tuple.

    Each value must lie in [0, 1] and the vector must not increase: accepting draft i requires
    accepting drafts 0..i-1, so p_i <= p_{i-1}.
    """
    values = _check_probabilities(per_position_acceptance)
    for i in range(1, len(values)):
        if values[i] > values[i - 1]:
            raise ValueError(
                f"cumulative acceptance cannot increase with position: p[{i}]={values[i]} > "
                f"p[{i - 1}]={values[i - 1]}"
            )
    return values


def expected_tokens_per_step(per_position_acceptance: Sequence[float], k: int) -> float:
    """Mean tokens a request gains per step when drafting `k` tokens: 1 + sum(p_i for i < k).

    Positions beyond the vector count as never accepted. The vector need not be monotone here
    (measured rates can be noisy); each value must lie in [0, 1].
    """
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    return 1.0 + sum(_check_probabilities(per_position_acceptance)[:k])


def goodput(
    profile: StepTimeProfile,
    batch: float,
    k: int,
    per_position_acceptance: Sequence[float],
    prompt_per_output: float = 0.0,
) -> float:
    """Generated tokens per second per request at `batch` running requests drafting `k` tokens, with
    the prefill of `prompt_per_output` prompt tokens per generated token priced (0: decode only)."""
    m = expected_tokens_per_step(per_position_acceptance, k)
    prefill = batch * m * profile.prefill_s_per_output(prompt_per_output, k > 0)
    return m / (profile.step_time_s(batch, k) + prefill)


def speedup(
    profile: StepTimeProfile,
    batch: float,
    k: int,
    per_position_acceptance: Sequence[float],
    prompt_per_output: float = 0.0,
) -> float:
    """Goodput with `k` draft tokens relative to no speculation (K=0) at the same batch size."""
    return goodput(profile, batch, k, per_position_acceptance, prompt_per_output) / goodput(
        profile, batch, 0, per_position_acceptance, prompt_per_output
    )


def end_to_end_speedup(
    profile: StepTimeProfile, batch: float, decode_speedup: float, prompt_per_output: float
) -> float:
    """The speedup over no speculation of an engine started with the drafter whose decode alone is
    `decode_speedup` times faster (an in-engine schedule, K 0 inside it), with prefill priced."""
    decode = profile.step_time_s(batch, 0) / batch  # seconds per generated token, decode, no drafter
    off = decode + profile.prefill_s_per_output(prompt_per_output, False)
    on = decode / decode_speedup + profile.prefill_s_per_output(prompt_per_output, True)
    return off / on


def best_k(
    profile: StepTimeProfile,
    batch: float,
    per_position_acceptance: Sequence[float],
    candidates: Iterable[int] | None = None,
) -> int:
    """The K with the highest goodput at `batch` (the smaller K on a tie).

    By default only the K values the profile measured are candidates: interpolated columns are a
    guess, and a decision should not hinge on a guess.
    """
    ks = sorted(set(profile.speculative_tokens if candidates is None else candidates))
    if not ks:
        raise ValueError("no candidate K")
    return max(ks, key=lambda k: (goodput(profile, batch, k, per_position_acceptance), -k))


# The largest concurrency `concurrency_at_speedup` reports.
MAX_CONCURRENCY: Final = 100000.0


@functools.lru_cache(maxsize=256)
def concurrency_at_speedup(
    profile: StepTimeProfile,
    k: int,
    per_position_acceptance: tuple[float, ...],
    target: float,
    prompt_per_output: float = 0.0,
) -> float:
    """The highest running requests per engine at which drafting `k` still predicts `target` speedup.

    `target` 1.0 gives the break-even point. 0 when even one request does not reach it;
    MAX_CONCURRENCY when every load does. Speedup falls with load (verifying K drafts costs more per
    step as batches grow compute-bound), so a bisection finds it.
    """
    if speedup(profile, 1.0, k, per_position_acceptance, prompt_per_output) < target:
        return 0.0
    if speedup(profile, MAX_CONCURRENCY, k, per_position_acceptance, prompt_per_output) >= target:
        return MAX_CONCURRENCY
    lo, hi = 1.0, MAX_CONCURRENCY
    for _ in range(60):
        mid = (lo + hi) / 2
        if speedup(profile, mid, k, per_position_acceptance, prompt_per_output) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def break_even_concurrency(
    profile: StepTimeProfile,
    per_position_acceptance: Sequence[float],
    ks: Iterable[int],
    target: float = 1.0,
    prompt_per_output: float = 0.0,
) -> float:
    """The highest running requests per engine at which the best of `ks` still predicts `target`.

    The one break-even function: the policy's Threshold defaults and `specfleet plan` both use it.
    Each K's speedup falls with load, so the best K reaches `target` exactly up to the highest of the
    per-K points (`concurrency_at_speedup`). 0 when no K reaches it at one request; MAX_CONCURRENCY
    when one does at every load.
    """
    acc = tuple(float(p) for p in per_position_acceptance)
    values = [concurrency_at_speedup(profile, k, acc, target, prompt_per_output) for k in ks]
    if not values:
        raise ValueError("no candidate K")
    return max(values)
