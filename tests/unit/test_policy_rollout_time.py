"""How long a pool's rollout takes (`policy.predict.rollout_time`): the measured start-up, else the last rollout,
else an estimate from the weights; the batches the strategy starts engines in; how far the load is
projected; and the simulator writing the start-up into status as the operator measures it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.policy import PolicySpec
from specfleet.api.validation import parse_resource
from specfleet.policy.inputs.observation import PoolObservation, PoolRolloutState, PoolState
from specfleet.policy.predict.demand import commit_path, rollout_horizon
from specfleet.policy.predict.kv_cache import ASSUMED_MEMORY, models_memory
from specfleet.policy.predict.rollout_time import (
    CACHE_READ_BYTES_PER_SECOND,
    FIXED_STARTUP_SECONDS,
    RolloutTime,
    estimated_startup_seconds,
    pool_rollout,
    restart_rollout,
    rollout_time,
    standby_startup_seconds,
)
from specfleet.sim.options import SimOptions
from specfleet_runtime.cost_profile import default_profile

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PROFILE = default_profile()
# Llama-3.1-70B with its EAGLE-3 drafter, from the shipped table (the GPU does not change a start-up).
_M70 = models_memory(
    "meta-llama/Llama-3.1-70B-Instruct", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "NVIDIA H100 80GB HBM3"
)
assert _M70 is not None
M70 = _M70


def _obs(replicas: int, **kw: float) -> PoolObservation:
    return PoolObservation(pool="latency", at=NOW, running_per_replica=0.0, replicas_reporting=replicas, **kw)


def test_the_estimate_is_a_fixed_part_and_the_weights_each_gpu_reads():
    # Llama-3.1-8B in BF16 (16.06 GB) and its EAGLE-3 drafter (0.85 GB) at 1 GB/s: 45 + 16.9 s.
    assert estimated_startup_seconds(ASSUMED_MEMORY) == pytest.approx(45 + 16.91, abs=0.01)
    # Llama-3.1-70B in BF16 over two GPUs: each reads half of 141.2 GB and of the 2.8 GB drafter.
    tp2 = estimated_startup_seconds(M70, 2)
    assert tp2 == pytest.approx(45 + (141_107_412_992 + M70.drafter_weight_bytes) / 2 / 1e9)
    # Without the drafter its weights are not read.
    off = estimated_startup_seconds(ASSUMED_MEMORY, drafter=False)
    assert off == pytest.approx(FIXED_STARTUP_SECONDS + 16.06e9 / CACHE_READ_BYTES_PER_SECOND)


def test_a_standby_pools_restart_is_priced_at_two_engines_start_up():
    # A retune or scale-up of a Standby pool starts pods that start both engines and check the sleep.
    standby = PoolState(mode="On", replicas=2, flip="Standby")
    restart = restart_rollout(standby, _obs(2), PROFILE)
    one = estimated_startup_seconds(ASSUMED_MEMORY)
    assert restart.batch_seconds == pytest.approx(standby_startup_seconds(one, ASSUMED_MEMORY), abs=0.01)
    assert 2 * one < restart.batch_seconds < 2 * one + 3
    # Measured (pod created to Ready, both engines included), the measurement is what counts.
    measured = restart_rollout(dataclasses.replace(standby, startup_seconds=130), _obs(2), PROFILE)
    assert measured.batch_seconds == 130


def test_a_rollout_takes_its_batches_of_start_ups():
    r = rollout_time(replicas=5, per_batch=2, measured_startup=100, last_rollout_seconds=500, estimate=60)
    assert (r.batches, r.seconds, r.source) == (3, 300, "measured")
    # The average engine serves the new setting after two of the three batches.
    assert r.mean_switch_seconds == 200
    # Not measured: the last rollout spread over its batches; neither: the estimate.
    assert rollout_time(5, 2, None, 450, 60) == RolloutTime(150, 3, "lastRollout")
    assert rollout_time(5, 2, None, None, 60) == RolloutTime(60, 3, "estimate")
    assert rollout_time(0, 0, None, None, 60).batches == 1


def test_surge_starts_max_surge_engines_at_once_replace_max_unavailable():
    surge = PoolState(mode="On", replicas=4, max_surge=2, startup_seconds=90)
    assert pool_rollout(surge, _obs(4), PROFILE) == RolloutTime(90, 2, "measured")
    replace = PoolState(
        mode="On", replicas=4, rollout_strategy="Replace", max_unavailable=1, startup_seconds=90
    )
    assert pool_rollout(replace, _obs(4), PROFILE).seconds == 360
    # Autoscaled pools (no spec replicas) roll out the engines reporting.
    assert pool_rollout(PoolState(mode="On", startup_seconds=90), _obs(3), PROFILE).batches == 3
    last = PoolRolloutState(at=NOW - timedelta(hours=1), settled_at=NOW - timedelta(hours=1, seconds=-200))
    assert pool_rollout(PoolState(mode="On", replicas=2, rollout=last), _obs(2), PROFILE).batch_seconds == 100
    # The estimate reads the profile's model at the pool's tensor parallel size.
    unmeasured = pool_rollout(PoolState(mode="On", replicas=1), _obs(1), PROFILE)
    assert unmeasured.source == "estimate"
    assert 55 < unmeasured.batch_seconds < 70


def test_the_load_is_projected_to_the_average_engine_switching_at_most_a_window_ahead():
    policy = PolicySpec.model_validate({})
    window = policy.window_seconds
    assert rollout_horizon(policy, RolloutTime(20, 2, "measured")) == window / 2 + 30
    assert rollout_horizon(policy, RolloutTime(600, 5, "measured")) == window / 2 + window
    # The commit path starts at the load observed and reaches the projection at the horizon.
    path = commit_path(policy, RolloutTime(20, 2, "measured"), 10.0, 20.0)
    assert path[0] > 10
    assert path[-1] == 20
    assert path == sorted(path)


def test_the_simulator_estimates_the_start_up_for_the_resources_model():
    sd = parse_resource(
        {
            "apiVersion": "specfleet.io/v1alpha1",
            "kind": "SpeculativeDeployment",
            "metadata": {"name": "big"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-70B-Instruct"},
                "drafter": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"},
                "engine": {"tensorParallelSize": 2, "resources": {"gpus": 2}},
            },
        }
    )
    resolved = SimOptions().resolved(sd.spec)
    assert resolved.startup == pytest.approx(estimated_startup_seconds(M70, 2))
    assert SimOptions(startup_seconds=30).resolved(sd.spec).startup == 30
    with pytest.raises(ValueError, match="not resolved"):
        _ = SimOptions().startup
    assert dataclasses.replace(resolved, seed=3).startup == resolved.startup
