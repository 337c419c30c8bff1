"""The capacity dip of a Replace rollout or a Standby flip (`policy.rules.dip`): the remaining engines must
carry the load (a Standby flip: only where none remain), and the flip's (or a retune's) gain over its
dwell must repay the capacity it removes for the rollout's duration; and a Standby pool's flip during a
retune's rollout (`policy.rules.gates`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy import MeasuredAcceptance, PoolObservation, PoolState, decide
from specfleet.policy.inputs.observation import PoolRolloutState
from specfleet.policy.predict.rollout_time import pool_rollout
from specfleet.policy.rules.dip import Dip, flip_dip, replace_gate
from specfleet.policy.rules.gates import flip_gate, flips_during_restart
from specfleet_runtime.cost_profile import default_profile
from support.manifests import CLASSIC_THRESHOLDS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(days=1)
PROFILE = default_profile()
GOODPUT = PolicySpec.model_validate({})
THRESHOLD = PolicySpec.model_validate({"mode": "Threshold", "thresholds": CLASSIC_THRESHOLDS})


def obs(load: float, *, waiting: float = 0.0, accept: float | None = 2.4) -> PoolObservation:
    return PoolObservation(
        pool="batch",
        at=NOW,
        acceptance_length=accept,
        per_position=(0.68, 0.39, 0.2) if accept is not None else (),
        acceptance_source="pool" if accept is not None else None,
        running_per_replica=load,
        waiting=waiting,
        replicas_reporting=3,
    )


def state(
    mode: str, strategy: str = "Replace", *, replicas: int = 3, unavailable: int = 1, **kw
) -> PoolState:
    return PoolState(
        mode=mode,
        last_transition=LONG_AGO,
        rollout_strategy=strategy,
        max_unavailable=unavailable,
        replicas=replicas,
        **kw,
    )


def dip(s: PoolState, o: PoolObservation) -> Dip | None:
    return flip_dip(s, o, pool_rollout(s, o, PROFILE))


def test_surge_has_no_dip():
    assert dip(state("On", "Surge"), obs(4)) is None
    assert replace_gate(GOODPUT, None, 1e9, 1, 0.5) is None


def test_dip_lasts_each_batch_of_start_ups_measured_else_the_last_rollout_else_estimated():
    # The pool's measured start-up, per batch of maxUnavailable engines.
    assert dip(state("On", replicas=4, unavailable=2, startup_seconds=80), obs(4)) == Dip(4, 2, 160)
    assert dip(state("On", replicas=3, startup_seconds=80), obs(4)) == Dip(3, 1, 240)
    # Not measured: the last rollout's duration.
    measured = PoolRolloutState(
        at=NOW - timedelta(hours=1), settled_at=NOW - timedelta(hours=1) + timedelta(seconds=95)
    )
    assert dip(state("On", rollout=measured), obs(4)).seconds == 95
    # Neither: the estimate for the profile's model (Llama-3.1-8B with EAGLE-3: about a minute).
    estimated = dip(state("On", replicas=3), obs(4))
    assert estimated is not None
    assert 3 * 55 < estimated.seconds < 3 * 70
    # Autoscaled (no spec replicas): the engines reporting; never more stopped than there are.
    assert dip(state("On", replicas=None, unavailable=5, startup_seconds=70), obs(4)) == Dip(3, 3, 70)


def test_remaining_engines_must_carry_the_load():
    dip = Dip(3, 1, 60)
    # 3 x 90 = 270 requests on 2 engines of 128: overload, whatever the gain.
    reason, message = replace_gate(GOODPUT, dip, 90, 128, 3.0)
    assert reason == r.REPLACE_WOULD_OVERLOAD
    assert "the 2 left would hold 270.0 requests, more than the 256" in message
    assert replace_gate(GOODPUT, dip, 85.4, 128, 3.0)[0] == r.REPLACE_WOULD_OVERLOAD
    assert replace_gate(GOODPUT, dip, 85.3, 128, 3.0) is None
    # One replica stopped whole: any demand is more than no engine carries; an idle pool flips.
    assert replace_gate(GOODPUT, Dip(1, 1, 60), 0.1, 256, 3.0)[0] == r.REPLACE_WOULD_OVERLOAD
    assert replace_gate(GOODPUT, Dip(1, 1, 60), 0.0, 256, 3.0) is None


def test_gain_over_the_dwell_must_repay_the_dip():
    dip = Dip(2, 1, 60)  # half the capacity for 60 s: 30
    # minDwellSeconds 300: 1.05x repays 15, 1.2x repays 60.
    assert replace_gate(GOODPUT, dip, 4, 256, 1.05)[0] == r.REPLACE_DIP_NOT_REPAID
    assert replace_gate(GOODPUT, dip, 4, 256, 1.2) is None
    # A flip that pays less than nothing never repays a dip.
    assert replace_gate(GOODPUT, dip, 4, 256, 0.9)[0] == r.REPLACE_DIP_NOT_REPAID
    # Threshold mode predicts no gain: only the load is checked.
    assert replace_gate(THRESHOLD, dip, 4, 256, None) is None
    # The payoff is counted over at least one window even with no dwell.
    no_dwell = PolicySpec.model_validate({"minDwellSeconds": 0, "windowSeconds": 120})
    assert replace_gate(no_dwell, dip, 4, 256, 1.3) is None


def _one(policy, st, ob):
    return decide(policy, 3, {"batch": st}, {"batch": ob}, NOW, PROFILE)[0]


def test_threshold_flip_off_holds_while_the_remaining_engines_would_overload():
    # 60 running per replica is past the stop threshold; 3 x 60 = 180 do not fit 2 engines of 64.
    st = state("On", max_num_seqs=64)
    held = _one(THRESHOLD, st, obs(60))
    assert (held.flip, held.reason) == (False, r.REPLACE_WOULD_OVERLOAD)
    assert "wants Off (ConcurrencyAboveThreshold" in held.message
    # Engines of 128 carry it: the flip starts; a Surge pool flips as before.
    assert _one(THRESHOLD, replace(st, max_num_seqs=128), obs(60)).flip
    assert _one(THRESHOLD, replace(st, rollout_strategy="Surge"), obs(60)).flip


def test_goodput_turns_on_at_low_load_within_the_pools_gpus():
    memory = MeasuredAcceptance(2.3, (0.68, 0.39, 0.2), NOW - timedelta(minutes=5))
    st = state("Off", last_acceptance=memory)
    d = _one(GOODPUT, st, obs(2, accept=None))
    assert (d.flip, d.target) == (True, "On"), d.message
    # The same flip on a pool of one engine would stop all of it under load: it holds.
    d1 = _one(GOODPUT, replace(st, replicas=1), obs(2, accept=None))
    assert (d1.flip, d1.reason) == (False, r.REPLACE_WOULD_OVERLOAD)


def test_a_standby_flip_dips_one_engine_for_its_replicas_flips_whatever_the_strategy():
    # Measured: a 12 s switch per replica after its drain (4 running of 200 tokens at 400 tokens/s per
    # replica: 2 s), one replica at a time, a Surge pool included (no restart).
    measured = replace(obs(4), generation_tokens_per_second=1200.0, mean_output_tokens=200.0)
    for strategy in ("Surge", "Replace"):
        d = dip(state("On", strategy, unavailable=2, flip="Standby", standby_flip_seconds=12), measured)
        assert d == Dip(3, 1, 42, standby=True)
    # Never the restart's start-up, even where one is measured.
    slow = dip(state("On", flip="Standby", startup_seconds=900, standby_flip_seconds=12), measured)
    assert slow is not None
    assert slow.seconds == 42


def test_a_standby_flip_holds_only_where_it_does_not_repay_its_seconds_out():
    # 3 x 90 = 270 requests on the 2 engines left of 128: a Replace rollout holds (minutes of it); a
    # Standby flip takes one engine out for seconds, which the repay question prices.
    standby = Dip(3, 1, 36, standby=True)
    assert replace_gate(GOODPUT, standby, 90, 128, 3.0) is None
    # 1/3 of the pool for 36 s is 12 engine-seconds per engine: 1.03x over 300 s repays 9, 1.05x 15.
    reason, message = replace_gate(GOODPUT, standby, 4, 256, 1.03)
    assert reason == r.STANDBY_DIP_NOT_REPAID
    assert "a Standby flip removes for 36s (12)" in message
    assert replace_gate(GOODPUT, standby, 4, 256, 1.05) is None
    # A pool of one replica has no engine left while it flips: only while idle.
    one = Dip(1, 1, 12, standby=True)
    assert replace_gate(GOODPUT, one, 0.1, 256, 3.0)[0] == r.STANDBY_WOULD_OVERLOAD
    assert replace_gate(GOODPUT, one, 0.0, 256, 3.0) is None


def test_a_memory_bound_standby_pool_turns_off_under_load_a_replace_pool_holds():
    # The remaining engines could not carry 80 per replica (64 each): Replace holds; Standby flips, as
    # its one-engine dip for a few seconds is repaid many times by the turn-off's gain.
    st = state("On", max_num_seqs=64)
    held = _one(THRESHOLD, st, obs(60))
    assert (held.flip, held.reason) == (False, r.REPLACE_WOULD_OVERLOAD)
    flips = _one(THRESHOLD, replace(st, flip="Standby"), obs(60))
    assert (flips.flip, flips.target) == (True, "Off"), flips.message


def test_a_retune_restarts_the_engines_so_on_replace_it_must_repay_its_dip():
    # A weak drafter at 8 per replica: K 1 predicts more than K 3 by more than the retune margin.
    weak = replace(obs(8, accept=1.5), per_position=(0.4, 0.1, 0.02))
    surge = _one(GOODPUT, state("On", "Surge", k=3), weak)
    assert (surge.reason, surge.target_k) == (r.GOODPUT_RETUNE, 1), surge.message
    # On Replace the same retune stops one engine of three for each of three start-ups: its 1.13x
    # over the dwell does not repay that, so it holds.
    held = _one(GOODPUT, state("On", k=3), weak)
    assert (held.reason, held.target_k) == (r.REPLACE_DIP_NOT_REPAID, None)
    assert "the retune's 1.130x" in held.message


def test_a_standby_pool_may_flip_while_a_retune_rolls_out_not_while_a_flip_does():
    retuned = state("Off", "Surge", flip="Standby", settled=False, last_retune=NOW - timedelta(minutes=5))
    assert flips_during_restart(retuned)
    assert flip_gate(GOODPUT, retuned, NOW, None, False) is None
    # Its own flip still settling, or a Restart pool's rollout: the gate holds.
    flipping = replace(retuned, last_transition=NOW - timedelta(minutes=1))
    assert flip_gate(GOODPUT, flipping, NOW, None, False)[0] == r.ROLLOUT_IN_PROGRESS
    restart = replace(retuned, flip="Restart")
    assert flip_gate(GOODPUT, restart, NOW, None, False)[0] == r.ROLLOUT_IN_PROGRESS
