"""The policy's check on its own predictions (`policy.rules.realized_guard`): which windows it samples,
when a setting that falls short of its prediction turns its pool off, how the shortfall holds an off
pool off, and the whole loop on the fleet simulator with a wrong cost profile and a right one."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.api.validation import parse_resource
from specfleet.policy import PoolObservation, PoolState, decide
from specfleet.policy.inputs.observation import PoolRolloutState, RealizedRecord
from specfleet.policy.predict.acceptance import Estimate
from specfleet.policy.predict.throughput import OFF, pool_model
from specfleet.policy.rules import realized_guard as guard
from specfleet.policy.rules.goodput import GoodputPrediction
from specfleet.policy.rules.results import Wanted
from specfleet.sim.fleet import SimOptions, simulate
from specfleet.sim.options import Strategy
from specfleet.sim.workload import ACCEPTANCE_PROFILES, ClosedLoop
from specfleet_runtime.cost_profile import PUBLISHED_H100_LLAMA31_8B_EAGLE as PUBLISHED

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
POLICY = PolicySpec.model_validate({})  # Goodput, margin 5%: the guard's floor is 0.90
ACC = (0.68, 0.39, 0.2)
RUNNING = 32.0


def steady(load: float = RUNNING, minutes: int = 4) -> tuple[tuple[datetime, float], ...]:
    """One demand sample per evaluation over the last `minutes`, all at `load`."""
    return tuple((NOW - timedelta(seconds=30 * i), load) for i in range(2 * minutes, 0, -1))


def state(mode: str = "On", **more: object) -> PoolState:
    base = PoolState(mode=mode, last_transition=NOW - timedelta(hours=1), recent_load=steady())
    return replace(base, **more)  # type: ignore[arg-type]


def obs(factor: float, mode: str = "On", running: float = RUNNING, waiting: float = 0.0) -> PoolObservation:
    """Two replicas delivering `factor` times what the published profile predicts for the setting."""
    model = pool_model(PUBLISHED, PoolObservation("latency", NOW), [1, 3], mode=mode, current_k=3)
    name = "K3" if mode == "On" else OFF
    predicted = model.tokens_per_second(name, ACC, running)
    return PoolObservation(
        "latency",
        NOW,
        acceptance_length=1 + sum(ACC) if mode == "On" else None,
        per_position=ACC if mode == "On" else (),
        acceptance_source="pool" if mode == "On" else None,
        running_per_replica=running,
        waiting=waiting,
        generation_tokens_per_second=2 * predicted * factor,
        replicas_reporting=2,
    )


def sample(
    st: PoolState, ob: PoolObservation, now: datetime = NOW, policy: PolicySpec = POLICY
) -> RealizedRecord | None:
    model = pool_model(PUBLISHED, ob, [1, 3], mode=st.mode, current_k=3)
    est = Estimate(ACC, "pool", 3, 0) if st.mode == "On" else None
    return guard.realized_sample(policy, st, ob, model, est, now)


def windows(st: PoolState, factor: float, count: int) -> PoolState:
    """`st` after `count` policy windows of the same measurement, one sample each."""
    window = timedelta(seconds=POLICY.window_seconds)
    start = NOW if st.realized is None else st.realized.sampled_at + window
    for i in range(count):
        at = start + window * i
        st = replace(st, recent_load=tuple((t + (at - NOW), v) for t, v in steady()))
        check = sample(st, replace(obs(factor, st.mode), at=at), at)
        assert check is not None
        st = replace(st, realized=check)
    return st


def test_a_setting_delivering_its_prediction_measures_one():
    check = sample(state(), obs(1.0))
    assert check is not None
    assert check.on_ratio == pytest.approx(1.0)
    assert check.realized_over_predicted == pytest.approx(1.0)
    assert check.below_windows == 0


def test_three_windows_below_twice_the_margin_set_the_shortfall_and_turn_the_pool_off():
    st = windows(state(), 0.8, 2)
    assert st.realized is not None
    assert (st.realized.below_windows, st.realized.shortfall) == (2, None)
    wanted = Wanted("On", r.GOODPUT_WITHIN_MARGIN, "keeps On", {"predictedSpeedup": "1.200"})
    g = GoodputPrediction(ACC, "pool", 3, gain_best=1.2, gain_now=1.2)
    assert guard.guard_wanted(POLICY, st, st.realized, wanted, g) is wanted  # two windows are not enough
    st = windows(st, 0.8, 1)
    assert st.realized is not None
    assert st.realized.below_windows == 3
    assert st.realized.shortfall == pytest.approx(0.8)
    out = guard.guard_wanted(POLICY, st, st.realized, wanted, g)
    assert (out.mode, out.reason) == ("Off", r.REALIZED_BELOW_PREDICTION)
    assert "0.80 of its predicted gain" in out.message
    assert "1.20x predicted, ~0.96x delivered" in out.message
    assert out.numbers["realizedOverPredicted"] == "0.800"
    assert out.gain == pytest.approx(1 / (1.2 * 0.8))
    # Short of its promise, yet faster than no drafter: it stays.
    paying = GoodputPrediction(ACC, "pool", 3, gain_best=1.4, gain_now=1.4)
    assert guard.guard_wanted(POLICY, st, st.realized, wanted, paying) is wanted


def test_a_shortfall_inside_twice_the_margin_is_the_margins_work_not_the_guards():
    st = windows(state(), 0.93, 5)
    assert st.realized is not None
    assert (st.realized.below_windows, st.realized.shortfall) == (0, None)


def test_a_window_that_delivers_ends_the_streak_and_clears_the_shortfall():
    st = windows(state(), 0.8, 4)
    st = windows(st, 1.0, 1)
    assert st.realized is not None
    assert (st.realized.below_windows, st.realized.shortfall) == (0, None)


@pytest.mark.parametrize(
    ("why", "st", "ob"),
    [
        ("a queue", state(), obs(0.8, waiting=20.0)),
        ("a demand that swung", state(recent_load=steady()[:6] + steady(3 * RUNNING)[6:]), obs(0.8)),
        ("not a whole window measured yet", state(recent_load=steady(minutes=1)), obs(0.8)),
        ("a rollout in progress", state(settled=False), obs(0.8)),
        (
            "a rollout settled less than a window ago",
            state(
                rollout=PoolRolloutState(NOW - timedelta(minutes=3), settled_at=NOW - timedelta(seconds=60))
            ),
            obs(0.8),
        ),
        ("no request running", state(), obs(0.8, running=0.5)),
    ],
)
def test_only_a_steady_window_of_one_setting_is_compared(why, st, ob):
    assert sample(st, ob) is None, why


def test_one_sample_per_window():
    st = state(realized=RealizedRecord(NOW - timedelta(seconds=60), on_ratio=1.0))
    assert sample(st, obs(0.8)) is None


def test_the_plain_engines_ratio_is_the_reference_and_canaries_keep_it_unmeasured():
    canaries = PolicySpec.model_validate({"reentry": {"canaryReplicas": 1}})
    check = sample(state("Off", canary_replicas=0), obs(0.9, mode="Off"), policy=canaries)
    assert check is not None
    assert check.off_ratio == pytest.approx(0.9)
    # With canaries up the pool's numbers mix in their speculating engines.
    assert sample(state("Off"), obs(0.9, mode="Off"), policy=canaries) is None
    # Both settings 0.85 of the model: a shared error, the gain as predicted.
    after = windows(state(realized=check), 0.85, 1).realized
    assert after is not None
    assert after.realized_over_predicted == pytest.approx(0.85 / 0.9)
    assert after.below_windows == 0


def test_a_streak_of_an_earlier_setting_does_not_turn_off_the_new_one():
    st = windows(state(), 0.8, 3)
    assert st.realized is not None
    retuned = replace(st, last_retune=NOW + timedelta(hours=1))
    wanted = Wanted("On", r.GOODPUT_WITHIN_MARGIN, "keeps On")
    g = GoodputPrediction(ACC, "pool", 3, gain_best=1.1, gain_now=1.1)
    assert guard.guard_wanted(POLICY, retuned, st.realized, wanted, g) is wanted


def test_an_off_pool_judges_turning_on_with_the_shortfall():
    light = obs(1.0, mode="Off", running=2.0)
    plain = state("Off", canary_replicas=0, recent_load=steady(2.0))
    [d] = decide(POLICY, 3, {"latency": plain}, {"latency": light}, NOW, PUBLISHED)
    assert d.target == "On"
    short = replace(plain, realized=RealizedRecord(NOW - timedelta(minutes=1), off_ratio=1.0, shortfall=0.5))
    [d] = decide(POLICY, 3, {"latency": short}, {"latency": light}, NOW, PUBLISHED)
    assert d.target == "Off"
    assert d.reason == r.GOODPUT_WITHIN_MARGIN


def _run(factor: float, strategy: Strategy | None = None):
    """Example 02's latency pool held at 12 running per replica for 15 minutes, on engines whose
    speculating steps cost `factor` times the published profile's, the policy deciding with it."""
    sd = parse_resource(yaml.safe_load(EXAMPLE.read_text()))
    replicas = sd.spec.pools.latency.replicas
    sizes = tuple((400 + 37 * (i % 11), 200 + 13 * (i % 7)) for i in range(200))
    workload = ClosedLoop(((0.0, 12.0 * replicas), (900.0, 12.0 * replicas)), sizes, pool="latency")
    p = PUBLISHED
    rows = tuple(
        tuple(t if k == 0 else t * factor for k, t in zip(p.speculative_tokens, row, strict=True))
        for row in p.step_ms
    )
    engines = dataclasses.replace(p, step_ms=rows)
    options = SimOptions(seed=0, acceptance=ACCEPTANCE_PROFILES["published"], policy_profile=PUBLISHED)
    return simulate(sd, workload, strategy, options, profile=engines)


def test_on_the_simulator_a_misprofiled_pool_turns_off_and_stays_off_and_a_right_profile_never_fires():
    wrong = _run(1.8)
    reasons = [(c.pool, c.to_mode, c.reason) for c in wrong.changes if c.from_mode != c.to_mode]
    assert reasons[0] == ("latency", "Off", r.REALIZED_BELOW_PREDICTION)
    assert all(to == "Off" for _, to, _ in reasons)  # the shortfall holds it off
    off = _run(1.8, Strategy("alwaysOff", "static", "Off"))
    on = _run(1.8, Strategy("alwaysOnK3", "static", "On", 3))
    assert off.tokens_per_second > on.tokens_per_second  # speculation really loses on these engines
    assert wrong.tokens_per_second > on.tokens_per_second
    right = _run(1.0)
    assert not [c for c in right.changes if c.reason == r.REALIZED_BELOW_PREDICTION]


def test_without_a_plain_engine_window_long_prompts_are_not_judged():
    long = replace(obs(0.5), mean_prompt_tokens=4000.0, mean_output_tokens=40.0)
    assert sample(state(), long) is None  # prefill is most of the predicted time: the model's weak term
    referred = state(realized=RealizedRecord(NOW - timedelta(minutes=5), off_ratio=0.5))
    check = sample(referred, long)
    assert check is not None
    assert check.off_ratio == pytest.approx(0.5)


def test_a_plain_engine_that_falls_short_alike_clears_the_shortfall_and_the_canaries_wait_for_it():
    canaries = PolicySpec.model_validate({"reentry": {"canaryReplicas": 1}})
    flipped = NOW - timedelta(minutes=10)
    short = RealizedRecord(flipped - timedelta(minutes=1), on_ratio=0.6, below_windows=3, shortfall=0.6)
    off = state("Off", last_transition=flipped, canary_replicas=0, realized=short)
    assert guard.awaiting_reference(off)
    check = sample(off, obs(0.62, mode="Off"), policy=canaries)
    assert check is not None
    assert (check.off_ratio, check.shortfall) == (pytest.approx(0.62), None)
    assert not guard.awaiting_reference(replace(off, realized=check))
    # A plain engine that delivers what the model says confirms it.
    check = sample(off, obs(1.0, mode="Off"), policy=canaries)
    assert check is not None
    assert check.shortfall == pytest.approx(0.6)
