"""Every field of the cost profile reaches the simulated engines: change one, and the run changes.

The fleet is small and memory-bound (a profile measured with a few thousand tokens of KV cache), so the
`memory` section's fields bind as much as the step-time table and the prefill figures do.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.sim.fleet import SimOptions, Strategy, simulate
from specfleet.sim.workload import Trace, TraceRequest
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile

EXAMPLE = Path(__file__).parents[2] / "examples" / "01-minimal-eagle3.yaml"

# The published profile, with the memory of an engine that holds about a dozen of the requests below,
# measured at TP 2 and utilisation 0.9 (the fleet runs at 0.91, so the capacity model predicts its cache).
BASELINE: dict[str, Any] = {
    **default_profile().to_dict(),
    "memory": {
        "kvCacheTokens": 6000,
        "kvCacheTokensWithDrafter": 5000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "drafter": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "gpu": "NVIDIA H100 80GB HBM3",
        "tensorParallelSize": 2,
        "maxModelLen": 131072,
        "gpuMemoryUtilization": 0.9,
        "blockSize": 16,
    },
}

# One changed value per field the simulated engines take from the profile.
CHANGES: dict[str, Any] = {
    "batchSizes": [1, 16, 256],
    "numSpeculativeTokens": [0, 1, 2, 5],
    "stepTimeMs": [[t * 1.5 for t in row] for row in BASELINE["stepTimeMs"]],
    "prefillMsPerToken": 0.2,
    "drafterPrefillFraction": 0.3,
    "memory.kvCacheTokens": 12000,
    "memory.kvCacheTokensWithDrafter": 2500,
    "memory.model": "meta-llama/Llama-3.1-70B-Instruct",
    # The drafter the measurement was taken with: one the tables do not know counts as none (its
    # layers' share of each KV page goes), which moves the capacities away from the measured setting.
    "memory.drafter": "something else",
    "memory.tensorParallelSize": 1,
    "memory.gpuMemoryUtilization": 0.5,
    "memory.blockSize": 32,
}
# Fields that say what a profile was measured for without being a figure of it: no run depends on them.
DESCRIPTIVE = {"name", "memory.gpu", "memory.maxModelLen"}


def _fields(doc: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in doc.items():
        out |= _fields(value, f"{key}.") if isinstance(value, dict) else {prefix + key}
    return out


def _with(field: str, value: Any) -> StepTimeProfile:
    doc = copy.deepcopy(BASELINE)
    *parents, key = field.split(".")
    target = doc
    for parent in parents:
        target = target[parent]
    target[key] = value
    return StepTimeProfile.from_dict(doc)


def _run(profile: StepTimeProfile, options: SimOptions | None = None) -> tuple[Any, ...]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["engine"] = {
        "tensorParallelSize": 2,
        "gpuMemoryUtilizationPercent": 91,
        "resources": {"gpus": 2},
    }
    sd = parse_resource(doc)
    # A burst of long prompts of varied lengths, more than the engine's cache holds at once, and one
    # late request that keeps the run going while the burst drains.
    burst = [TraceRequest(i * 0.02, prompt_tokens=1200 + 37 * (i % 9), output_tokens=400) for i in range(100)]
    trace = Trace((*burst, TraceRequest(30.0, prompt_tokens=10, output_tokens=10)))
    # Engines with the drafter and without it: each takes its own figures of the profile.
    runs = [
        simulate(sd, trace, strategy, options or SimOptions(startup_seconds=1.0), profile)
        for strategy in (
            Strategy("alwaysOnK3", "static", mode="On", k=3),
            Strategy("alwaysOff", "static", mode="Off"),
        )
    ]
    return tuple(
        (round(p.tokens, 6), tuple(round(t, 9) for t in p.ttft), p.preemptions)
        for run in runs
        for p in run.pools.values()
    )


BASELINE_RUN = _run(StepTimeProfile.from_dict(BASELINE))


def test_every_field_of_the_profile_is_either_changed_below_or_descriptive() -> None:
    # A field added to the profile must say here whether the simulated engines use it.
    assert _fields(BASELINE) == set(CHANGES) | DESCRIPTIVE


def test_the_baseline_engines_are_bound_by_memory() -> None:
    # Otherwise the memory fields could not show in the run.
    (_, _, on_preemptions), _, (_, _, off_preemptions), _ = BASELINE_RUN
    assert on_preemptions > 0
    assert off_preemptions > 0


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_changing_a_profile_field_changes_the_simulation(field: str) -> None:
    assert _run(_with(field, CHANGES[field])) != BASELINE_RUN


@pytest.mark.parametrize("field", sorted(DESCRIPTIVE))
def test_a_descriptive_field_changes_nothing(field: str) -> None:
    assert _run(_with(field, "something else" if field != "memory.maxModelLen" else 4096)) == BASELINE_RUN


def test_an_option_overrides_the_profile_only_when_given() -> None:
    profile = _with("drafterPrefillFraction", 0.3)
    changed = _run(profile)
    assert _run(profile, SimOptions(startup_seconds=1.0, drafter_prefill_fraction=None)) == changed
    assert _run(profile, SimOptions(startup_seconds=1.0, drafter_prefill_fraction=0.3)) == changed
    overridden = SimOptions(startup_seconds=1.0, drafter_prefill_fraction=BASELINE["drafterPrefillFraction"])
    assert _run(profile, overridden) == BASELINE_RUN
