"""spec.drafter: how tokens are drafted (vLLM's --speculative-config), its Dynamic SD schedule and
the retrain Job started when acceptance drifts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from specfleet.api.base import ApiModel, Rule
from specfleet.api.fields import MAX_SCHEDULE_RANGES, MAX_SPECULATIVE_TOKENS, NOT_A_FLAG_MESSAGE

SpeculativeMethod = Literal["eagle3", "eagle", "draft_model", "ngram", "mtp", "medusa", "suffix"]
# Methods that load a separate drafter checkpoint, so `drafter.model` must name it.
METHODS_NEEDING_MODEL: tuple[str, ...] = ("eagle3", "eagle", "draft_model", "medusa")
# Methods that must not name a drafter model (they draft from the prompt or the target's own heads).
METHODS_WITHOUT_MODEL: tuple[str, ...] = ("ngram", "suffix")


def _quote(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


class DynamicScheduleRange(ApiModel):
    """One row of vLLM's Dynamic SD table: batches of minBatchSize..maxBatchSize draft K tokens."""

    rules = (
        Rule(
            cel="self.minBatchSize <= self.maxBatchSize",
            message="minBatchSize must not exceed maxBatchSize",
            check=lambda r: r.min_batch_size <= r.max_batch_size,
        ),
    )

    min_batch_size: int = Field(ge=1, le=65536, description="First batch size of the range (inclusive).")
    max_batch_size: int = Field(ge=1, le=65536, description="Last batch size of the range (inclusive).")
    num_speculative_tokens: int = Field(
        ge=0,
        le=MAX_SPECULATIVE_TOKENS,
        description="Tokens drafted per step at these batch sizes; 0 drafts nothing.",
    )


def _starts_at_one(ranges: list[DynamicScheduleRange] | None) -> bool:
    return ranges is None or any(r.min_batch_size == 1 for r in ranges)


def _non_overlapping(ranges: list[DynamicScheduleRange] | None) -> bool:
    # Each range's start must lie in that range alone: exactly the CEL rule below.
    return ranges is None or all(
        sum(1 for b in ranges if b.min_batch_size <= a.min_batch_size <= b.max_batch_size) == 1
        for a in ranges
    )


class RetrainTemplate(ApiModel):
    """The pod of a retrain Job: a Kubernetes PodTemplateSpec (metadata and spec)."""

    metadata: dict[str, Any] | None = Field(
        default=None, description="Labels and annotations of the retrain pod (ObjectMeta)."
    )
    spec: dict[str, Any] = Field(
        description="The retrain pod's PodSpec (containers, volumes, ...). restartPolicy defaults to Never; "
        "every container gets the observed numbers as SPECFLEET_* environment variables."
    )


class RetrainSpec(ApiModel):
    """Start a drafter retraining Job from your own pod template when a pool's acceptance drifts."""

    template: RetrainTemplate = Field(
        description="Pod template of the Job. Its containers receive SPECFLEET_POOL, SPECFLEET_MODEL, "
        "SPECFLEET_DRAFTER, SPECFLEET_BASELINE_ACCEPTANCE_LENGTH, SPECFLEET_CURRENT_ACCEPTANCE_LENGTH, "
        "SPECFLEET_DRIFT_PERCENT (and the per-position values, the resource's namespace and name)."
    )
    period_seconds: int = Field(
        default=86400,
        ge=600,
        le=31536000,
        description="At most one retrain Job per pool in this period; the last start is in "
        "status.pools.<pool>.lastRetrainTime. A finished Job is kept for one period.",
    )
    backoff_limit: int = Field(default=0, ge=0, le=10, description="Retries of a failed retrain pod.")


class DrafterSpec(ApiModel):
    """How tokens are drafted: vLLM's `--speculative-config`, used by pools while speculation is on."""

    rules = (
        Rule(
            cel="!has(self.model) || !self.model.startsWith('-')",
            message=f"drafter.model {NOT_A_FLAG_MESSAGE}",
            check=lambda d: d.model is None or not d.model.startswith("-"),
        ),
        Rule(
            cel=f"!(self.method in {_quote(METHODS_NEEDING_MODEL)}) || has(self.model)",
            message="drafter.model is required for methods eagle3, eagle, draft_model and medusa",
            check=lambda d: d.method not in METHODS_NEEDING_MODEL or d.model is not None,
        ),
        Rule(
            cel=f"!(self.method in {_quote(METHODS_WITHOUT_MODEL)}) || !has(self.model)",
            message="drafter.model must not be set for methods ngram and suffix (they draft from the prompt)",
            check=lambda d: d.method not in METHODS_WITHOUT_MODEL or d.model is None,
        ),
        Rule(
            cel="self.method == 'ngram' || (!has(self.promptLookupMin) && !has(self.promptLookupMax))",
            message="promptLookupMin and promptLookupMax apply only to method ngram",
            check=lambda d: (
                d.method == "ngram" or (d.prompt_lookup_min is None and d.prompt_lookup_max is None)
            ),
        ),
        Rule(
            cel="!has(self.promptLookupMin) || !has(self.promptLookupMax) "
            "|| self.promptLookupMin <= self.promptLookupMax",
            message="promptLookupMin must not exceed promptLookupMax",
            check=lambda d: (
                d.prompt_lookup_min is None
                or d.prompt_lookup_max is None
                or d.prompt_lookup_min <= d.prompt_lookup_max
            ),
        ),
        Rule(
            cel="!has(self.dynamicSchedule) || self.dynamicSchedule.exists(r, r.minBatchSize == 1)",
            message="dynamicSchedule must start at batch size 1",
            check=lambda d: _starts_at_one(d.dynamic_schedule),
        ),
        Rule(
            cel="!has(self.dynamicSchedule) || self.dynamicSchedule.all(a, self.dynamicSchedule.filter(b, "
            "b.minBatchSize <= a.minBatchSize && a.minBatchSize <= b.maxBatchSize).size() == 1)",
            message="dynamicSchedule ranges must not overlap",
            check=lambda d: _non_overlapping(d.dynamic_schedule),
        ),
        Rule(
            cel="!has(self.dynamicSchedule) "
            "|| self.dynamicSchedule.all(r, r.numSpeculativeTokens <= self.numSpeculativeTokens)",
            message="dynamicSchedule must not use more tokens than numSpeculativeTokens",
            check=lambda d: (
                d.dynamic_schedule is None
                or all(r.num_speculative_tokens <= d.num_speculative_tokens for r in d.dynamic_schedule)
            ),
        ),
    )

    method: SpeculativeMethod = Field(
        default="eagle3", description="vLLM speculative method (eagle3, eagle, draft_model, ngram, mtp, ...)."
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Drafter checkpoint (HF id or local path). Required for eagle3, eagle, draft_model, medusa.",
    )
    num_speculative_tokens: int = Field(
        default=3,
        ge=1,
        le=MAX_SPECULATIVE_TOKENS,
        description="K, the tokens drafted per step (1..10); also the upper bound of dynamicSchedule.",
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="Tensor parallel size of the drafter: 1 or the target's."
    )
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, le=64, description="ngram only: shortest prompt n-gram to match."
    )
    prompt_lookup_max: int | None = Field(
        default=None, ge=1, le=64, description="ngram only: longest prompt n-gram to match."
    )
    dynamic_schedule: list[DynamicScheduleRange] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SCHEDULE_RANGES,
        description="vLLM Dynamic SD: K per batch-size range, chosen per step inside the engine. "
        "Starts at batch 1, ranges do not overlap, K <= numSpeculativeTokens.",
    )
    retrain: RetrainSpec | None = Field(
        default=None,
        description="Run a Job from this template when a pool's acceptance drifts below its baseline for "
        "policy.acceptanceDrift.forSeconds (at most once per periodSeconds).",
    )
