"""The policy: decisions from observations, stability gates, and properties checked with hypothesis."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.api.policy import PolicySpec
from specfleet.policy import MeasuredAcceptance, PoolObservation, PoolState, decide, predicted_speedup
from specfleet_runtime.cost_profile import default_profile
from support.manifests import CLASSIC_THRESHOLDS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PROFILE = default_profile()
THRESHOLD = PolicySpec.model_validate({"mode": "Threshold", "thresholds": CLASSIC_THRESHOLDS})
GOODPUT = PolicySpec.model_validate({})
LONG_AGO = NOW - timedelta(days=1)


def obs(pool="latency", *, accept=2.4, load=4.0, per_position=(0.68, 0.39, 0.2), problem=None, source="pool"):
    return PoolObservation(
        pool=pool,
        at=NOW,
        problem=problem,
        acceptance_length=accept,
        per_position=per_position if accept is not None else (),
        acceptance_source=source if accept is not None else None,
        running_per_replica=load,
        replicas_reporting=2,
    )


def state(mode="On", *, last=LONG_AGO, flips=(), settled=True, memory=None):
    return PoolState(
        mode=mode, last_transition=last, recent_flips=tuple(flips), settled=settled, last_acceptance=memory
    )


def one(policy, st_, ob, k=3, now=NOW):
    return decide(policy, k, {ob.pool: st_}, {ob.pool: ob}, now, PROFILE)[0]


# ---- Threshold mode -------------------------------------------------------------------------


def test_low_acceptance_stops():
    d = one(THRESHOLD, state("On"), obs(accept=1.2))
    assert (d.flip, d.target, d.reason) == (True, "Off", "AcceptanceBelowThreshold")
    assert d.observations["acceptanceLength"] == "1.2"


def test_high_concurrency_stops():
    d = one(THRESHOLD, state("On"), obs(load=60))
    assert (d.flip, d.target, d.reason) == (True, "Off", "ConcurrencyAboveThreshold")


def test_inside_band_keeps_on():
    d = one(THRESHOLD, state("On"), obs(accept=1.5, load=40))
    assert (d.flip, d.target) == (False, "On")


def test_resume_needs_both_low_load_and_good_acceptance():
    memory = MeasuredAcceptance(2.5, (0.7, 0.5, 0.3), NOW - timedelta(minutes=10))
    assert (
        one(THRESHOLD, state("Off", memory=memory), obs(accept=None, load=40)).reason
        == "ConcurrencyStillHigh"
    )
    d = one(THRESHOLD, state("Off", memory=memory), obs(accept=None, load=10))
    assert (d.flip, d.target, d.reason) == (True, "On", "ConditionsRecovered")
    assert d.observations["reentryAcceptanceSource"] == "lastMeasured"


def test_resume_blocked_by_low_remembered_acceptance():
    memory = MeasuredAcceptance(1.3, (0.2, 0.1, 0.0), NOW - timedelta(minutes=10))
    d = one(THRESHOLD, state("Off", memory=memory), obs(accept=None, load=1))
    assert (d.flip, d.reason) == (False, "AcceptanceStillLow")


def test_canary_acceptance_beats_memory():
    memory = MeasuredAcceptance(1.3, (0.2,), NOW - timedelta(minutes=10))
    d = one(THRESHOLD, state("Off", memory=memory), obs(accept=2.6, load=1, source="canary"))
    assert (d.flip, d.reason) == (True, "ConditionsRecovered")
    assert "canary" in d.message


def test_expired_memory_probes_when_load_is_low():
    memory = MeasuredAcceptance(1.3, (0.2,), NOW - timedelta(hours=2))
    d = one(THRESHOLD, state("Off", memory=memory), obs(accept=None, load=1))
    assert (d.flip, d.target, d.reason) == (True, "On", "ProbeAcceptance")


# ---- Goodput mode -----------------------------------------------------------------------------


def test_published_profile_break_even():
    published = (0.68, 0.39, 0.20, 0.10, 0.05)
    assert predicted_speedup(PROFILE, 1, 3, published) == pytest.approx(1.65, abs=0.03)
    assert predicted_speedup(PROFILE, 256, 3, published) == pytest.approx(0.79, abs=0.02)


def test_goodput_turns_off_at_high_batch_and_on_at_low():
    off = one(GOODPUT, state("On"), obs(load=256))
    assert (off.flip, off.target, off.reason) == (True, "Off", "GoodputBelowBreakEven")
    assert float(off.observations["predictedSpeedup"]) < 0.95
    memory = MeasuredAcceptance(2.3, (0.68, 0.39, 0.2), NOW - timedelta(minutes=5))
    on = one(GOODPUT, state("Off", memory=memory), obs(accept=None, load=2))
    assert (on.flip, on.target, on.reason) == (True, "On", "GoodputAboveBreakEven")


def test_goodput_low_acceptance_turns_off_even_at_low_batch():
    d = one(GOODPUT, state("On"), obs(accept=1.05, per_position=(0.03, 0.01, 0.0), load=2))
    assert (d.flip, d.target) == (True, "Off")


def test_goodput_reports_best_k():
    d = one(GOODPUT, state("On"), obs(load=64, per_position=(0.68, 0.39, 0.2)), k=3)
    assert d.observations["bestK"] == "1"


# ---- stability gates ---------------------------------------------------------------------------


def test_missing_metrics_hold():
    d = one(THRESHOLD, state("On"), obs(accept=1.0, load=99, problem="Prometheus unreachable"))
    assert (d.flip, d.reason, d.message) == (False, "MetricsUnavailable", "Prometheus unreachable")


@pytest.mark.parametrize("policy", [THRESHOLD, GOODPUT], ids=["Threshold", "Goodput"])
@pytest.mark.parametrize("load", [None, float("nan"), float("inf"), -1000.0])
def test_an_off_pool_without_a_measured_load_never_turns_on(policy, load):
    # Acceptance well above resume and break-even: only the load is missing (zero would turn it on).
    good = obs(accept=2.6, per_position=(0.8, 0.5, 0.3))
    assert one(policy, state("Off"), replace(good, running_per_replica=2.0)).flip
    d = one(policy, state("Off"), replace(good, running_per_replica=load))
    assert (d.flip, d.target, d.reason) == (False, "Off", "MetricsUnavailable")
    assert "pool latency" in d.message


def test_rollout_in_progress_holds():
    d = one(THRESHOLD, state("On", settled=False), obs(load=99))
    assert (d.flip, d.reason) == (False, "RolloutInProgress")


def test_dwell_holds():
    d = one(
        THRESHOLD,
        state("On", last=NOW - timedelta(seconds=10), flips=[NOW - timedelta(seconds=10)]),
        obs(load=99),
    )
    assert (d.flip, d.reason) == (False, "MinDwell")
    assert "wants Off" in d.message


def test_cooldown_spans_pools():
    states = {
        "latency": state("On"),
        "batch": state("On", flips=[NOW - timedelta(seconds=400)], last=NOW - timedelta(seconds=400)),
    }
    policy = THRESHOLD.model_copy(update={"min_dwell_seconds": 60, "cooldown_seconds": 600})
    decisions = decide(policy, 3, states, {"latency": obs(load=99), "batch": obs("batch")}, NOW, PROFILE)
    assert decisions[0].reason == "Cooldown"


def test_flip_budget():
    flips = [NOW - timedelta(minutes=m) for m in (50, 40, 30, 20)]
    policy = THRESHOLD.model_copy(
        update={"min_dwell_seconds": 0, "cooldown_seconds": 0, "max_flips_per_hour": 4}
    )
    d = one(policy, state("On", last=flips[-1], flips=flips), obs(load=99))
    assert d.reason == "FlipBudgetExhausted"


def test_one_pool_flips_at_a_time():
    states = {"latency": state("On"), "batch": state("On")}
    observations = {"latency": obs(load=99), "batch": obs("batch", load=99)}
    latency, batch = decide(THRESHOLD, 3, states, observations, NOW, PROFILE)
    assert latency.flip
    assert (batch.flip, batch.reason) == (False, "OtherPoolFlipping")


def test_unsettled_other_pool_blocks():
    states = {"latency": state("On"), "batch": state("Off", settled=False)}
    latency, _ = decide(THRESHOLD, 3, states, {"latency": obs(load=99), "batch": obs("batch")}, NOW, PROFILE)
    assert (latency.flip, latency.reason) == (False, "OtherPoolFlipping")


# ---- properties -------------------------------------------------------------------------------

accepts = st.floats(min_value=1.0, max_value=4.0, allow_nan=False)
loads = st.floats(min_value=0.0, max_value=300.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    accept=st.floats(min_value=1.41, max_value=1.69),
    load=st.floats(min_value=32.0, max_value=48.0),
    mode=st.sampled_from(["On", "Off"]),
)
def test_noise_inside_hysteresis_band_never_flips(accept, load, mode):
    memory = MeasuredAcceptance(accept, (accept - 1,), NOW - timedelta(minutes=1))
    observation = obs(accept=accept if mode == "On" else None, load=load)
    d = one(THRESHOLD, state(mode, memory=memory), observation)
    assert not d.flip


@settings(max_examples=200, deadline=None)
@given(
    accept=accepts,
    load=loads,
    age=st.integers(min_value=0, max_value=299),
    mode=st.sampled_from(["On", "Off"]),
)
def test_no_flip_inside_dwell(accept, load, age, mode):
    last = NOW - timedelta(seconds=age)
    for policy in (THRESHOLD, GOODPUT):
        d = one(policy, state(mode, last=last, flips=[last]), obs(accept=accept, load=load))
        assert not d.flip


@settings(max_examples=200, deadline=None)
@given(
    accept=st.one_of(st.none(), accepts),
    load=loads,
    mode=st.sampled_from(["On", "Off"]),
    goodput=st.booleans(),
)
def test_same_observations_same_decision(accept, load, mode, goodput):
    policy = GOODPUT if goodput else THRESHOLD
    a = one(policy, state(mode), obs(accept=accept, load=load))
    b = one(policy, state(mode), obs(accept=accept, load=load))
    assert a == b


@settings(max_examples=200, deadline=None)
@given(
    accept=st.one_of(st.none(), accepts),
    load=loads,
    mode=st.sampled_from(["On", "Off"]),
    goodput=st.booleans(),
    problem=st.sampled_from(["stale: newest sample 900s old", "no samples", "query error: timeout"]),
)
def test_unusable_observation_never_flips(accept, load, mode, goodput, problem):
    d = one(GOODPUT if goodput else THRESHOLD, state(mode), obs(accept=accept, load=load, problem=problem))
    assert not d.flip
    assert d.reason == "MetricsUnavailable"


@settings(max_examples=200, deadline=None)
@given(load=loads, accept=accepts)
def test_flip_always_changes_mode_and_explains_itself(load, accept):
    for mode in ("On", "Off"):
        d = one(THRESHOLD, state(mode), obs(accept=accept, load=load))
        if d.flip:
            assert d.target != d.current
            assert d.reason
            assert d.message
            assert "runningPerReplica" in d.observations


# ---- Goodput chooses K --------------------------------------------------------------------------


def test_goodput_retunes_k_when_a_smaller_k_pays_more():
    # At 128 running per replica K=1 predicts ~1.09x and K=3 ~0.99x: keep speculating, at K=1.
    d = one(GOODPUT, state("On"), obs(load=128, per_position=(0.68, 0.39, 0.2)), k=3)
    assert (d.flip, d.target, d.reason) == (False, "On", "GoodputRetune")
    assert (d.current_k, d.target_k) == (3, 1)
    assert d.changes


def test_goodput_keeps_k_inside_the_retune_margin():
    # At 48, K=1 beats K=3 by ~0.4%: inside the 2% retune margin, no rollout for it.
    d = one(GOODPUT, state("On"), obs(load=48, per_position=(0.68, 0.39, 0.2)), k=3)
    assert not d.changes
    # At 64 it is ~3% better: past the retune margin.
    d = one(GOODPUT, state("On"), obs(load=64, per_position=(0.68, 0.39, 0.2)), k=3)
    assert (d.reason, d.target_k) == ("GoodputRetune", 1)


def test_goodput_retune_has_its_own_interval_not_the_flip_dwell():
    # 30 s after a flip: the retune waits for minRetuneIntervalSeconds (120 s), not the 300 s dwell.
    recent = state("On", last=NOW - timedelta(seconds=30), flips=[NOW - timedelta(seconds=30)])
    d = one(GOODPUT, recent, obs(load=128, per_position=(0.68, 0.39, 0.2)), k=3)
    assert (d.changes, d.reason) == (False, "MinRetuneInterval")
    assert "K 3 -> 1" in d.message
    later = state("On", last=NOW - timedelta(seconds=150), flips=[NOW - timedelta(seconds=150)])
    d = one(GOODPUT, later, obs(load=128, per_position=(0.68, 0.39, 0.2)), k=3)
    assert (d.reason, d.target_k) == ("GoodputRetune", 1)


def test_goodput_pool_at_small_k_grows_back_when_load_falls():
    d = one(GOODPUT, replace(state("On"), k=1), obs(load=1, per_position=(0.68, 0.39, 0.2, 0.1, 0.05)), k=5)
    assert (d.reason, d.current_k, d.target_k) == ("GoodputRetune", 1, 3)


def test_goodput_turning_on_starts_at_best_k():
    memory = MeasuredAcceptance(2.3, (0.68, 0.39, 0.2), NOW - timedelta(minutes=5))
    d = one(GOODPUT, state("Off", memory=memory), obs(accept=None, load=1), k=5)
    assert (d.flip, d.target, d.target_k) == (True, "On", 3)


def test_a_change_records_its_own_predicted_speedup_over_the_setting_it_leaves():
    off = one(GOODPUT, state("On"), obs(load=256))
    assert off.flip
    assert off.target == "Off"
    # Turning off: no drafter over the current setting, the inverse of speculation's speedup.
    assert float(off.observations["predictedChangeSpeedup"]) == pytest.approx(
        1 / float(off.observations["predictedSpeedup"]), rel=0.01
    )
    memory = MeasuredAcceptance(2.3, (0.68, 0.39, 0.2), NOW - timedelta(minutes=5))
    on = one(GOODPUT, state("Off", memory=memory), obs(accept=None, load=2))
    assert on.flip
    assert on.observations["predictedChangeSpeedup"] == on.observations["bestKSpeedup"]
    held = one(GOODPUT, state("On"), obs(load=4))
    assert not held.changes
    assert "predictedChangeSpeedup" not in held.observations
    assert "predictedChangeSpeedup" not in one(THRESHOLD, state("On"), obs(load=60)).observations
