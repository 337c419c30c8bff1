"""The simulator's Replace rollouts: old engines stop first (drained as the kubelet does) and each new
one starts on the GPUs one of them frees, so ready capacity dips below the spec, never above it."""

from __future__ import annotations

from pathlib import Path

import yaml

from specfleet.api.validation import parse_resource
from specfleet.sim.accounts import RunResult
from specfleet.sim.fleet import SimOptions, Strategy, simulate
from specfleet.sim.workload import Trace, TraceRequest

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"
STARTUP = 60.0


def _flip(rollout: dict[str, object], grace_seconds: int = 3600) -> RunResult:
    """3 latency engines under steady load (10 requests/s for 10 min), turned off at 30 s."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 3
    doc["spec"]["pools"]["latency"]["rollout"] = rollout
    doc["spec"]["engine"] = {**doc["spec"].get("engine", {}), "terminationGracePeriodSeconds": grace_seconds}
    sd = parse_resource(doc)
    trace = Trace(
        tuple(TraceRequest(arrival=i / 10, prompt_tokens=200, output_tokens=300) for i in range(6000))
    )
    flip = Strategy("flip", "schedule", schedule=((0.0, "latency", "On", 3), (30.0, "latency", "Off", None)))
    return simulate(sd, trace, flip, SimOptions(startup_seconds=STARTUP))


def _latency(run: RunResult, key: str) -> list[int]:
    return [row["latency"][key] for row in run.timeline]


def test_a_replace_flip_dips_ready_capacity_and_never_surges() -> None:
    run = _flip({"strategy": "Replace", "maxUnavailable": 1})
    ready, replicas = _latency(run, "readyReplicas"), _latency(run, "replicas")
    assert max(replicas) <= 3  # no pod beyond the spec: no spare GPU needed
    assert max(ready) == 3
    assert min(ready) == 2  # one engine out of service at a time (maxUnavailable 1), never two
    # Each of the 3 engines restarts in turn after its predecessor is gone: about 3 start-ups of dip.
    dipped = run.bin_seconds * sum(1 for r in ready if r < 3)
    assert 2 * STARTUP <= dipped <= 3 * STARTUP + 6 * run.bin_seconds
    assert _latency(run, "mode")[-1] == "Off"
    # The drained engines finished what they held; nothing failed.
    assert run.failed == 0
    assert run.completed == run.submitted == 6000


def test_two_at_a_time_dips_deeper_and_ends_sooner() -> None:
    one = _flip({"strategy": "Replace", "maxUnavailable": 1})
    two = _flip({"strategy": "Replace", "maxUnavailable": 2})
    ready = _latency(two, "readyReplicas")
    assert min(ready) == 1
    assert max(_latency(two, "replicas")) <= 3
    dips = [sum(1 for r in _latency(run, "readyReplicas") if r < 3) for run in (one, two)]
    assert dips[1] < dips[0]
    assert two.failed == 0


def test_a_surge_flip_keeps_ready_capacity_with_one_pod_beyond_the_spec() -> None:
    run = _flip({"strategy": "Surge"})
    assert min(_latency(run, "readyReplicas")) == 3
    assert max(_latency(run, "replicas")) == 4
    assert run.failed == 0


def test_status_carries_the_engines_start_up_as_the_operator_measures_it() -> None:
    run = _flip({"strategy": "Replace", "maxUnavailable": 1})
    assert run.status.pools.latency.startup_seconds == round(STARTUP)
