"""Checks for specs the schema accepts but that can never work (they end as Degraded=True).

Pure: a spec in, a list of human-readable problems out. The operator reports them as a Degraded
condition and an Event and does not retry until the spec changes.
"""

from __future__ import annotations

import re

from specfleet.api.constants import POOLS
from specfleet.api.effective import pool_engine
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet_runtime.vllm_args import operator_owned_option

# First vLLM release known to run each method (from vLLM's release notes); older images cannot.
MIN_VLLM_FOR_METHOD: dict[str, tuple[int, int, int]] = {
    "eagle3": (0, 8, 5),
    "eagle": (0, 7, 0),
    "draft_model": (0, 3, 0),
    "ngram": (0, 4, 0),
    "medusa": (0, 5, 0),
    "mtp": (0, 9, 0),
    "suffix": (0, 11, 0),
}
# num_speculative_tokens_per_batch_size: the release this project verified it with.
MIN_VLLM_FOR_DYNAMIC_SCHEDULE = (0, 32, 0)

_VLLM_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def vllm_version_of_image(image: str) -> tuple[int, int, int] | None:
    """The vLLM version an image tag names (vllm/vllm-openai:v0.32.0 -> (0, 32, 0)), if recognisable."""
    repo, _, tag = image.rpartition(":")
    if not repo or "/" in tag or "vllm" not in repo.rsplit("/", 1)[-1]:
        return None
    match = _VLLM_TAG.match(tag)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def engine_schedules(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether the Goodput policy gives speculating pools a Dynamic SD schedule of its own
    (policy.goodput.engineSchedule; unset: where the image names a vLLM that has Dynamic SD)."""
    if spec.policy.mode != "Goodput" or spec.drafter.dynamic_schedule:
        return False
    chosen = spec.policy.goodput.engine_schedule
    if chosen is not None:
        return chosen
    version = vllm_version_of_image(spec.engine.image)
    return version is not None and version >= MIN_VLLM_FOR_DYNAMIC_SCHEDULE


def _fmt(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def find_problems(spec: SpeculativeDeploymentSpec) -> list[str]:
    """Everything that makes this spec unrunnable, each as one sentence."""
    problems: list[str] = []
    drafter = spec.drafter
    version = vllm_version_of_image(spec.engine.image)
    if version is not None:
        needed = MIN_VLLM_FOR_METHOD.get(drafter.method)
        if needed is not None and version < needed:
            problems.append(
                f"image {spec.engine.image} (vLLM {_fmt(version)}) cannot run speculative method "
                f"{drafter.method}: it needs vLLM >= {_fmt(needed)}"
            )
        if drafter.dynamic_schedule and version < MIN_VLLM_FOR_DYNAMIC_SCHEDULE:
            problems.append(
                f"image {spec.engine.image} (vLLM {_fmt(version)}) has no Dynamic SD "
                f"(drafter.dynamicSchedule needs vLLM >= {_fmt(MIN_VLLM_FOR_DYNAMIC_SCHEDULE)})"
            )
    for pool in POOLS:
        engine = pool_engine(spec, pool)
        for arg in engine.extra_args:
            owned = operator_owned_option(arg)
            if owned is not None:
                spelled = arg.split("=", 1)[0]
                as_written = "" if spelled == owned else f" (as {spelled})"
                problems.append(
                    f"pool {pool}: extraArgs sets {owned}{as_written}, which the operator owns; "
                    "use the typed field instead"
                )
        tp = engine.tensor_parallel_size
        if engine.resources.gpus < tp:
            problems.append(
                f"pool {pool}: tensorParallelSize {tp} needs {tp} GPUs per replica, "
                f"but resources.gpus is {engine.resources.gpus}"
            )
        draft_tp = drafter.draft_tensor_parallel_size
        if draft_tp is not None and draft_tp not in (1, tp):
            problems.append(
                f"pool {pool}: drafter.draftTensorParallelSize must be 1 or the target's tensorParallelSize ({tp})"
            )
    return problems
