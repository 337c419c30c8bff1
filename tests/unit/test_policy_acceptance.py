"""Acceptance the policy trusts (measured, remembered, extrapolated) and the status it keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import parse_status
from specfleet.policy import MeasuredAcceptance, PoolObservation, PoolState, decide
from specfleet.policy.decision.record import record
from specfleet.policy.inputs.observation import PoolRolloutState
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.inputs.status import pool_states
from specfleet.policy.predict.acceptance import estimate, extend, merge, trusted_positions
from specfleet_runtime.cost_profile import default_profile

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
# Who should scrape the pools (named only when Prometheus does not scrape a pool's Ready pods).
SCRAPE = ScrapeSetup("default", "llama", pod_monitor=False, scrape_annotations=True)
PROFILE = default_profile()
probabilities = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def obs(per_position, load=4.0, at=NOW, source="pool"):
    return PoolObservation(
        pool="latency",
        at=at,
        acceptance_length=1 + sum(per_position) if per_position else None,
        per_position=tuple(per_position),
        acceptance_source=source if per_position else None,
        running_per_replica=load,
        replicas_reporting=2,
        drafts_in_window=1000,
    )


@settings(max_examples=200, deadline=None)
@given(
    memory=st.lists(probabilities, min_size=0, max_size=6),
    measured=st.lists(probabilities, min_size=1, max_size=6),
)
def test_merge_never_shrinks_and_keeps_what_it_measured(memory, measured):
    old = MeasuredAcceptance(1.0, tuple(memory), NOW - timedelta(minutes=5)) if memory else None
    merged = merge(old, measured, NOW, 1.5)
    assert len(merged.per_position) == max(len(memory), len(measured))
    assert merged.per_position[: len(measured)] == pytest.approx(measured)
    assert all(0.0 <= p <= 1.0 for p in merged.per_position)
    # Deeper positions never exceed the deepest measured one (cumulative acceptance cannot increase).
    assert all(p <= measured[-1] + 1e-12 for p in merged.per_position[len(measured) :])
    # Remembered positions keep the time they were measured.
    assert all(merged.measured_at(i) == NOW - timedelta(minutes=5) for i in range(len(measured), len(memory)))


def test_merge_rescales_the_deeper_positions_with_the_deepest_measured_one():
    old = MeasuredAcceptance(2.27, (0.68, 0.39, 0.2), NOW - timedelta(minutes=5))
    merged = merge(old, [0.34], NOW, 1.34)
    assert merged.per_position == pytest.approx((0.34, 0.195, 0.1))


def test_extend_continues_with_the_last_conditional_acceptance():
    assert extend((0.8, 0.4), 4) == pytest.approx((0.8, 0.4, 0.2, 0.1))
    assert extend((0.5,), 3) == pytest.approx((0.5, 0.25, 0.125))
    assert extend((), 3) == ()


def test_a_window_that_overlaps_a_rollout_trusts_only_positions_every_engine_drafted():
    rollout = PoolRolloutState(at=NOW - timedelta(seconds=90), drafted_before=1, drafted_after=3)
    state = PoolState("On", rollout=rollout)
    assert trusted_positions(state, obs((0.7, 0.2, 0.1)), NOW, 120) == 1
    settled = PoolRolloutState(
        at=NOW - timedelta(seconds=400),
        drafted_before=1,
        drafted_after=3,
        settled_at=NOW - timedelta(seconds=300),
    )
    assert trusted_positions(PoolState("On", rollout=settled), obs((0.7, 0.5, 0.3)), NOW, 120) == 3


def test_stale_positions_are_extrapolated():
    memory = MeasuredAcceptance(
        2.27, (0.68, 0.39, 0.2), NOW, (NOW, NOW - timedelta(hours=2), NOW - timedelta(hours=2))
    )
    est = estimate(
        PoolState("Off", last_acceptance=memory),
        obs(()),
        NOW,
        window_seconds=120,
        max_age_seconds=3600,
        length=3,
    )
    assert est is not None
    assert est.extrapolated == 2
    assert est.per_position == pytest.approx((0.68, 0.68**2, 0.68**3))
    assert est.source == "lastMeasured"
    assert est.remember is None


def test_nothing_fresh_is_no_estimate():
    memory = MeasuredAcceptance(2.27, (0.68, 0.39, 0.2), NOW - timedelta(hours=2))
    state = PoolState("Off", last_acceptance=memory)
    assert estimate(state, obs(()), NOW, window_seconds=120, max_age_seconds=3600, length=3) is None


def _spec():
    return SpeculativeDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "drafter": {"model": "d", "numSpeculativeTokens": 3},
            "pools": {"batch": {"speculation": "Off"}},
            "policy": {"reentry": {"canaryReplicas": 0}},
        }
    )


def test_status_keeps_flip_times_memory_and_rollout_across_a_restart():
    spec = _spec()
    status = SpeculativeDeploymentStatus()
    pools = status.pools.model_copy(deep=True)
    pools.latency = pools.latency.model_copy(update={"settled": True})
    status = status.model_copy(update={"pools": pools})
    observation = obs((0.68, 0.39, 0.2), load=300)
    states = pool_states(spec, status, NOW)
    decisions = decide(spec.policy, 3, states, {"latency": observation}, NOW, PROFILE)
    assert decisions[0].flip
    recorded = record(status, decisions, {"latency": observation}, 1, NOW, SCRAPE, window_seconds=60)
    # Through the wire and back, as a restarted operator reads it.
    again = parse_status(recorded.status.to_wire())
    latency = again.pools.latency
    assert latency.recent_flip_times == ["2026-11-29T12:00:00Z"]
    assert latency.rollout is not None
    assert (latency.rollout.from_mode, latency.rollout.drafted_before) == ("On", 3)
    assert latency.per_position_measured_at == ["2026-11-29T12:00:00Z"] * 3
    state = pool_states(spec, again, NOW + timedelta(seconds=30))["latency"]
    assert state.recent_flips == (NOW,)
    assert state.rollout is not None
    assert state.rollout.settled_at is None
    assert state.last_acceptance is not None
    assert state.last_acceptance.per_position == pytest.approx((0.68, 0.39, 0.2))
    # Once the pool reads settled, the next evaluation records when.
    pools = again.pools.model_copy(deep=True)
    pools.latency = pools.latency.model_copy(update={"settled": True})
    settled = again.model_copy(update={"pools": pools})
    later = NOW + timedelta(seconds=90)
    quiet = obs((), load=300, at=later)
    d = decide(spec.policy, 3, pool_states(spec, settled, later), {"latency": quiet}, later, PROFILE)
    after = record(settled, d, {"latency": quiet}, 1, later, SCRAPE, window_seconds=60).status
    assert after.pools.latency.rollout is not None
    assert after.pools.latency.rollout.settled_time == "2026-11-29T12:01:30Z"


def test_flip_times_older_than_an_hour_are_dropped():
    spec = _spec()
    old = [(NOW - timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M:%SZ") for m in (90, 70, 30)]
    status = parse_status(
        {"pools": {"latency": {"speculation": "On", "settled": True, "recentFlipTimes": old}}}
    )
    assert pool_states(spec, status, NOW)["latency"].recent_flips == (NOW - timedelta(minutes=30),)
