"""How the policy prices a Standby flip (`policy.predict.rollout_time`): one replica at a time, each its
drain + sleep + wake + check, the measured flip where status has one, and never a restart's start-up."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api.semantics import engine_schedules
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment, parse_resource
from specfleet.policy import decide
from specfleet.policy.decision.record import record
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.inputs.status import pool_states
from specfleet.policy.predict.kv_cache import models_memory, profile_capacity
from specfleet.policy.predict.rollout_time import (
    STANDBY_CHECK_SECONDS,
    RolloutTime,
    pool_rollout,
    standby_drain_seconds,
    standby_switch_seconds,
)
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_runtime.cost_profile import MemoryProfile, default_profile

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
PROFILE = default_profile()
GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"
# Llama-3.1-70B in BF16 (the shipped table's) and in FP8 (one byte per parameter, 70.6e9 of them) on
# H100s, its EAGLE-3 drafter in 16 bits.
_BF16_70B = models_memory("meta-llama/Llama-3.1-70B-Instruct", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", H100)
assert _BF16_70B is not None
BF16_70B = _BF16_70B
FP8_70B = dataclasses.replace(BF16_70B, target_weight_bytes=70.6e9)


def _obs(running: float = 0.0, waiting: float = 0.0, gen: float | None = None, out: float | None = None):
    return PoolObservation(
        pool="latency",
        at=NOW,
        running_per_replica=running,
        waiting=waiting,
        replicas_reporting=3,
        generation_tokens_per_second=gen,
        mean_output_tokens=out,
    )


def test_70b_fp8_on_one_gpu_copies_about_70_gb_each_way_at_21_gib_per_second():
    # 64 GiB in 3 s is 21.33 GiB/s (22.9 GB/s). Sleeping the engine with the drafter copies 70.6 GB +
    # the drafter's 2.8 GB (1.40e9 parameters in BF16): 3.20 s; waking the other 70.6 GB: 3.08 s.
    drafter = FP8_70B.drafter_weight_bytes
    assert drafter == pytest.approx(2.81e9, rel=0.01)
    rate = 64 * GIB / 3
    assert rate / GIB == pytest.approx(21.33, abs=0.01)
    sleep, wake = (70.6e9 + drafter) / rate, 70.6e9 / rate
    assert (round(sleep, 2), round(wake, 2)) == (3.20, 3.08)
    assert standby_switch_seconds(FP8_70B, 1) == pytest.approx(sleep + wake)
    # In BF16 over two GPUs each GPU holds half the checkpoint, 70.55 GB (and half the drafter).
    half = 141_107_412_992 / 2
    assert standby_switch_seconds(BF16_70B, 2) == pytest.approx((half + drafter / 2) / rate + half / rate)


def test_the_drain_is_a_whole_request_at_the_decode_rate_bounded_by_the_grace_period():
    # 3 replicas, 4 running each, 300 tokens/s over the pool (100 per replica, 25 per request), 200
    # tokens a request: the last running request needs about 200 / 25 = 8 s.
    assert standby_drain_seconds(_obs(4, 0, 300, 200), 120) == pytest.approx(8.0)
    # The queued ones go back to the router: they add nothing.
    assert standby_drain_seconds(_obs(4, 90, 300, 200), 120) == pytest.approx(8.0)
    # At most the grace period; idle, nothing; a load whose rate is not measured, the grace period.
    assert standby_drain_seconds(_obs(4, 0, 30, 200), 60) == 60
    assert standby_drain_seconds(_obs(0, 9), 120) == 0
    assert standby_drain_seconds(_obs(4, 0, None, 200), 120) == 120


def test_a_standby_pool_flips_one_replica_at_a_time_from_the_estimate_never_the_start_up():
    state = PoolState(
        mode="On", replicas=3, flip="Standby", startup_seconds=600, termination_grace_seconds=120
    )
    rollout = pool_rollout(state, _obs(4, 0, 300, 200), PROFILE)
    # The published 8B (16.06 GB + 0.85 GB drafter): 1.44 s of transfers, 8 s of drain, the check.
    per_replica = 8.0 + standby_switch_seconds(profile_capacity(PROFILE.memory), 1) + STANDBY_CHECK_SECONDS
    assert rollout == RolloutTime(pytest.approx(per_replica), 3, "standbyEstimate")
    assert rollout.standby
    assert 3 * 11 < rollout.seconds < 3 * 12
    # The same pool flipping by restart pays its measured start-up per engine (a surge of one).
    restart = pool_rollout(dataclasses.replace(state, flip="Restart"), _obs(4, 0, 300, 200), PROFILE)
    assert (restart.seconds, restart.standby) == (1800, False)


def test_the_measured_switch_overrides_the_estimate_and_the_drain_is_the_loads():
    state = PoolState(mode="On", replicas=4, flip="Standby", standby_flip_seconds=9)
    busy, calm = _obs(40, 90, 300, 2000), _obs(1, 0, 100, 200)
    drain_busy = standby_drain_seconds(busy, state.termination_grace_seconds)
    drain_calm = standby_drain_seconds(calm, state.termination_grace_seconds)
    assert pool_rollout(state, busy, PROFILE) == RolloutTime(drain_busy + 9, 4, "standbyMeasured")
    # A switch measured under a queue prices a calm flip with the calm drain, not that queue's.
    assert pool_rollout(state, calm, PROFILE) == RolloutTime(drain_calm + 9, 4, "standbyMeasured")
    assert drain_calm < drain_busy


def test_status_and_spec_give_the_policy_the_flip_its_measurement_and_the_grace_period():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["rollout"] = {"flip": "Standby", "standbyHostMemory": "20Gi"}
    doc["spec"]["engine"]["terminationGracePeriodSeconds"] = 45
    sd = parse_resource(doc)
    status = SpeculativeDeploymentStatus.model_validate({"pools": {"latency": {"standbyFlipSeconds": 14}}})
    states = pool_states(sd.spec, status, NOW)
    latency, batch = states["latency"], states["batch"]
    assert (latency.flip, latency.standby_flip_seconds, latency.termination_grace_seconds) == (
        "Standby",
        14,
        45,
    )
    assert (batch.flip, batch.standby_flip_seconds) == ("Restart", None)


def test_a_profile_of_a_quantized_model_gives_the_weights_it_measured_not_the_configs():
    # A 70B profile measured on one H100 (FP8: the BF16 checkpoint's 141 GB cannot fit beside its cache):
    # the weights come out as what the measurement leaves (an upper bound: 70.6 GB plus the overhead
    # the engine had and less than a block of rounding, 3% more), the KV cache as measured.
    memory = MemoryProfile(
        kv_cache_tokens=FP8_70B.kv_tokens(0.9, 1, False),
        kv_cache_tokens_with_drafter=FP8_70B.kv_tokens(0.9, 1, True),
        model="meta-llama/Llama-3.1-70B-Instruct",
        drafter="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
        gpu=H100,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,
    )
    model = profile_capacity(memory)
    assert model is not None
    assert 70.6e9 <= model.target_weight_bytes <= 1.031 * 70.6e9
    assert model.kv_tokens(0.9, 1, False) == memory.kv_cache_tokens
    assert model.kv_tokens(0.9, 1, True) == memory.kv_cache_tokens_with_drafter


# ---- a Standby flip switches engines, it does not re-template them -----------------------------------

SCRAPE = ScrapeSetup("sandbox", "assistant", pod_monitor=False, scrape_annotations=True)
SCHEDULE = [
    {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 3},
    {"minBatchSize": 9, "maxBatchSize": 65536, "numSpeculativeTokens": 1},
]


def _standby_resource(flip: str = "Standby") -> SpeculativeDeployment:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = "sandbox"
    doc["spec"]["pools"]["latency"]["rollout"] = {"flip": flip, "standbyHostMemory": "20Gi"}
    if flip != "Standby":
        doc["spec"]["pools"]["latency"]["rollout"].pop("standbyHostMemory")
    return parse_resource(doc)


def _templates(sd: SpeculativeDeployment, status: SpeculativeDeploymentStatus) -> dict[str, Any]:
    at = dataclasses.replace(sd, status=status)
    return {
        child["metadata"]["name"]: child["spec"]["template"]
        for child in render_children(at, decided_plan(at))
        if child["kind"] == "Deployment" and "-latency" in child["metadata"]["name"]
    }


def _evaluate(sd: SpeculativeDeployment, status: SpeculativeDeploymentStatus, ob: PoolObservation):
    states = {"latency": pool_states(sd.spec, status, NOW)["latency"]}
    schedules = engine_schedules(sd.spec)
    decisions = decide(sd.spec.policy, 3, states, {"latency": ob}, NOW, PROFILE, engine_schedule=schedules)
    recorded = record(status, decisions, {"latency": ob}, 1, NOW, SCRAPE, window_seconds=60)
    return decisions[0], recorded.status


@pytest.mark.parametrize("flip", ["Standby", "Restart"])
def test_a_standby_flip_keeps_the_parked_engines_k_and_schedule_so_no_pod_restarts(flip):
    # A pool speculating by a Dynamic SD schedule (K 3 up to batch 8, then 1) whose drafter stops paying
    # (acceptance near zero after a content shift): it turns off. A Restart pool's flip starts new
    # pods anyway, so it carries the K it would come back with; a Standby pool's pods switch to the
    # engine they hold, and a K or schedule of the flip's own would change the speculating engine's
    # arguments: a new template, every pod restarted, the flip's point lost.
    sd = _standby_resource(flip)
    status = SpeculativeDeploymentStatus.model_validate(
        {
            "pools": {
                "latency": {
                    "speculation": "On",
                    "numSpeculativeTokens": 3,
                    "dynamicSchedule": SCHEDULE,
                    "settled": True,
                    "lastTransitionTime": "2026-12-05T12:00:00Z",
                    "standbyFlipSeconds": 3,
                }
            }
        }
    )
    shifted = (0.05, 0.01, 0.0)
    ob = PoolObservation(
        pool="latency",
        at=NOW,
        acceptance_length=1 + sum(shifted),
        per_position=shifted,
        acceptance_source="pool",
        running_per_replica=2,
        replicas_reporting=3,
        drafts_in_window=1000,
        generation_tokens_per_second=300.0,
        mean_output_tokens=100.0,
    )
    decision, after = _evaluate(sd, status, ob)
    assert (decision.flip, decision.target) == (True, "Off"), decision
    latency = after.pools.latency
    if flip == "Standby":
        assert decision.in_place
        assert (latency.num_speculative_tokens, latency.dynamic_schedule) == (
            3,
            status.pools.latency.dynamic_schedule,
        )
        assert _templates(sd, after) == _templates(sd, status)
        # And back, once the dwell has passed: the pods wake the same engine, the template the one they run.
        earlier = {"settled": True, "last_transition_time": "2026-12-05T12:00:00Z", "recent_flip_times": []}
        back = after.model_copy(
            update={"pools": after.pools.model_copy(update={"latency": latency.model_copy(update=earlier)})}
        )
        calm = (0.7, 0.45, 0.3)
        recovered = dataclasses.replace(
            ob, per_position=calm, acceptance_length=1 + sum(calm), running_per_replica=1
        )
        decision, again = _evaluate(sd, back, recovered)
        assert (decision.flip, decision.target, decision.in_place) == (True, "On", True), decision
        assert _templates(sd, again) == _templates(sd, status)
    else:
        assert not decision.in_place
        assert not latency.dynamic_schedule
        assert _templates(sd, after) != _templates(sd, status)
