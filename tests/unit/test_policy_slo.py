"""A pool with a latency objective (`policy.rules.slo`): the setting predicted to have the most requests within
every target, from the throughput model's means and the measured histograms' tail; throughput breaks ties,
and without an SLO or histograms the decision is Goodput's, unchanged."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.api.pools import LatencySlo
from specfleet.policy import PoolObservation, PoolState, decide
from specfleet.policy.decision.pool import window_loads
from specfleet.policy.inputs.observation import Histogram
from specfleet.policy.predict.throughput import PoolModel, pool_model
from specfleet.policy.rules.results import Wanted
from specfleet.policy.rules.slo import (
    OFF,
    SettingShares,
    setting_shares,
    slo_allows,
    slo_along_path,
    slo_retune,
    slo_wanted,
)
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, default_profile

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
ACC = tuple(PUBLISHED_ACCEPTANCE[:3])
PROFILE = default_profile()
POLICY = PolicySpec.model_validate({})
GOAL = 0.95  # an SLO's default percentile, as a share
# Measured under the current setting: TTFT spread over 0.1-1 s, TPOT over 5-25 ms, so that a target in
# the middle of either is met by a share that moves with the predicted means.
TTFT: Histogram = ((0.1, 0.0), (0.25, 3.0), (0.5, 8.0), (0.75, 9.5), (1.0, 10.0), (math.inf, 10.0))
TPOT: Histogram = ((0.005, 0.0), (0.01, 2.0), (0.015, 6.0), (0.02, 9.0), (0.025, 10.0), (math.inf, 10.0))
TTFT_TIGHT = LatencySlo.model_validate({"timeToFirstTokenMilliseconds": 300})
TPOT_TIGHT = LatencySlo.model_validate({"timePerOutputTokenMilliseconds": 12})


def _obs(running: float, histograms: bool = True) -> PoolObservation:
    return PoolObservation(
        pool="latency",
        at=NOW,
        acceptance_length=1 + sum(ACC),
        per_position=ACC,
        acceptance_source="pool",
        running_per_replica=running,
        waiting=0.0,
        replicas_reporting=2,
        mean_prompt_tokens=1000.0,
        mean_output_tokens=200.0,
        ttft_histogram=TTFT if histograms else (),
        tpot_histogram=TPOT if histograms else (),
    )


def _decide(mode: str, running: float, slo: LatencySlo | None, histograms: bool = True):
    state = PoolState(mode=mode, last_transition=NOW - timedelta(days=1), k=3)
    slos = None if slo is None else {"latency": slo}
    return decide(
        POLICY, 3, {"latency": state}, {"latency": _obs(running, histograms)}, NOW, PROFILE, slos=slos
    )[0]


def test_a_ttft_tight_slo_turns_a_busy_speculating_pool_off_where_throughput_keeps_it_on():
    # Throughput alone keeps the drafter: it still yields more tokens per second at this load.
    assert _decide("On", 48.0, None).target == "On"
    d = _decide("On", 48.0, TTFT_TIGHT)
    # The drafter's share of each prompt's prefill and its longer step cost TTFT, which the SLO binds.
    assert (d.target, d.reason) == ("Off", r.SLO_TTFT_BOUND)
    assert float(d.observations["predictedSloAttainmentOff"]) > float(
        d.observations["predictedSloAttainmentOn"]
    )
    # Nor does a pool that is off turn on for the throughput.
    assert _decide("Off", 16.0, None).target == "On"
    held = _decide("Off", 16.0, TTFT_TIGHT)
    assert (held.target, held.reason) == ("Off", r.SLO_TTFT_BOUND)


def test_a_tpot_tight_slo_turns_speculation_on_where_throughput_holds_off():
    assert _decide("Off", 96.0, None).target == "Off"
    d = _decide("Off", 96.0, TPOT_TIGHT)
    # More tokens per step at the batch serves each token sooner: the TPOT target decides.
    assert (d.target, d.reason) == ("On", r.SLO_TPOT_BOUND)
    assert d.target_k is not None
    assert d.target_k >= 1


def test_without_an_slo_or_its_histograms_the_decision_is_goodputs():
    for mode, running in (("On", 48.0), ("Off", 16.0), ("Off", 96.0), ("On", 128.0)):
        plain = _decide(mode, running, None)
        for slo in (TTFT_TIGHT, TPOT_TIGHT):
            assert _decide(mode, running, slo, histograms=False) == plain
        # An SLO on a pool the policy does not steer by (the batch pool here) changes nothing either.
        state = PoolState(mode=mode, last_transition=NOW - timedelta(days=1), k=3)
        other = decide(
            POLICY,
            3,
            {"latency": state},
            {"latency": _obs(running)},
            NOW,
            PROFILE,
            slos={"batch": TTFT_TIGHT},
        )[0]
        assert other == plain


def _shares(off: float, on: float) -> list[SettingShares]:
    return [
        SettingShares(OFF, 0, {"TTFT": off}, 100.0, off),
        SettingShares("K3", 3, {"TTFT": on}, 120.0, on),
    ]


def test_a_flip_only_the_slo_asks_for_must_cut_the_missed_share_by_the_margin():
    state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    keep = Wanted("On", r.GOODPUT_WITHIN_MARGIN, "keeps", {})
    # 0.500 -> 0.5005: a tie; 0.50 -> 0.51 cuts the missed share by 2%, inside the 5% margin: throughput's
    # hold stands; 0.50 -> 0.55 cuts it by 10%: the pool turns off.
    tied = slo_wanted(POLICY, state, "K3", _shares(0.5005, 0.50), keep, GOAL)
    assert tied == replace(keep, numbers=tied.numbers)
    assert slo_wanted(POLICY, state, "K3", _shares(0.51, 0.50), keep, GOAL).reason == r.GOODPUT_WITHIN_MARGIN
    flipped = slo_wanted(POLICY, state, "K3", _shares(0.55, 0.50), keep, GOAL)
    assert (flipped.mode, flipped.reason) == ("Off", r.SLO_TTFT_BOUND)
    # Throughput's ask stands on a tie, with the predicted shares shown.
    tie = slo_wanted(POLICY, state, "K3", _shares(0.90, 0.90), keep, GOAL)
    assert replace(tie, numbers={}) == keep
    assert tie.numbers["predictedSloAttainmentOff"] == "0.900"


def test_a_flip_throughput_asks_for_must_cut_the_missed_share_by_the_margin_too():
    off = PoolState(mode="Off", last_transition=NOW - timedelta(days=1), k=3)
    turn_on = Wanted("On", r.GOODPUT_ABOVE_BREAK_EVEN, "faster", {}, k=3)
    # A burst's tail: on predicted at 0.758 against off's 0.749 cuts the missed share by 3.6%, inside the
    # 5% margin: the pool stays off, the SLO saying why.
    held = slo_wanted(POLICY, off, OFF, _shares(0.749, 0.758), turn_on, GOAL)
    assert (held.mode, held.reason) == ("Off", r.SLO_TTFT_BOUND)
    assert "only from 0.749 to 0.758, within the margin" in held.message
    # Where few requests meet it and the gain is not known to hold at every load, the missed share
    # decides: 0.027 -> 0.049 cuts it by 2%.
    assert slo_wanted(POLICY, off, OFF, _shares(0.027, 0.049), turn_on, GOAL).mode == "Off"
    # 0.749 -> 0.80 cuts it by 20%: throughput's flip stands; a tie (both 0.90) leaves it to throughput.
    assert (
        slo_wanted(POLICY, off, OFF, _shares(0.749, 0.80), turn_on, GOAL).reason == r.GOODPUT_ABOVE_BREAK_EVEN
    )
    assert (
        slo_wanted(POLICY, off, OFF, _shares(0.90, 0.90), turn_on, GOAL).reason == r.GOODPUT_ABOVE_BREAK_EVEN
    )


def _roomy(off: float, on: float, off_capacity: float, on_capacity: float) -> list[SettingShares]:
    return [
        SettingShares(OFF, 0, {"TTFT": off}, 100.0, off, capacity=off_capacity),
        SettingShares("K3", 3, {"TTFT": on}, 120.0, on, capacity=on_capacity),
    ]


def test_where_every_setting_meets_the_slo_alike_the_one_with_more_capacity_runs():
    on = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    off = replace(on, mode="Off")
    keep = Wanted("On", r.GOODPUT_WITHIN_MARGIN, "keeps", {})
    stay_off = Wanted("Off", r.GOODPUT_BELOW_BREAK_EVEN, "off", {})
    # Both meet it; off serves 10% more arrivals (past the 5% margin): the pool turns off for the headroom.
    flip = slo_wanted(POLICY, on, "K3", _roomy(1.0, 1.0, 1000.0, 900.0), keep, GOAL)
    assert (flip.mode, flip.reason) == ("Off", r.SLO_HEADROOM)
    assert "off serves up to 1000 tokens/s per replica, at K 3 900" in flip.message
    # Off already, throughput agreeing: the SLO's reason all the same (it keeps the canaries down).
    held = slo_wanted(POLICY, off, OFF, _roomy(1.0, 1.0, 1000.0, 900.0), stay_off, GOAL)
    assert (held.mode, held.reason) == ("Off", r.SLO_HEADROOM)
    assert held.message.startswith("stays Off")
    # Capacities within the margin: throughput decides.
    assert (
        slo_wanted(POLICY, on, "K3", _roomy(1.0, 1.0, 1000.0, 960.0), keep, GOAL).reason
        == r.GOODPUT_WITHIN_MARGIN
    )
    # The drafter serving more (a strong one): it turns on where throughput would leave it off ...
    up = slo_wanted(POLICY, off, OFF, _roomy(1.0, 1.0, 900.0, 1000.0), stay_off, GOAL)
    assert (up.mode, up.reason, up.k) == ("On", r.SLO_HEADROOM, 3)
    # ... and throughput keeps its own reason (and any retune) where it asks for On too.
    assert (
        slo_wanted(POLICY, on, "K3", _roomy(1.0, 1.0, 900.0, 1000.0), keep, GOAL).reason
        == r.GOODPUT_WITHIN_MARGIN
    )
    # Alike, but neither keeps the SLO's promise (95%): no headroom to keep; throughput decides.
    assert slo_wanted(POLICY, on, "K3", _roomy(0.10, 0.10, 1000.0, 900.0), keep, GOAL) == replace(
        keep, numbers=slo_wanted(POLICY, on, "K3", _roomy(0.10, 0.10, 1000.0, 900.0), keep, GOAL).numbers
    )
    # Not alike (off 0.90, on 0.95 by the TPOT target, say): attainment decides, not headroom.
    assert (
        slo_wanted(POLICY, on, "K3", _roomy(0.90, 0.95, 1000.0, 900.0), keep, GOAL).reason != r.SLO_HEADROOM
    )


def test_a_loose_slo_keeps_a_weak_drafters_pool_off_without_canaries():
    # TTFT within 1 s and TPOT within 25 ms measured; targets of 5 s and 100 ms: every setting meets them.
    loose = LatencySlo.model_validate(
        {"timeToFirstTokenMilliseconds": 5000, "timePerOutputTokenMilliseconds": 100}
    )
    policy = PolicySpec.model_validate({"reentry": {"canaryReplicas": 1}})
    weak = (0.3, 0.1, 0.03)
    obs = replace(_obs(16.0), per_position=weak, acceptance_length=1 + sum(weak))
    on = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    flip = decide(policy, 3, {"latency": on}, {"latency": obs}, NOW, PROFILE, slos={"latency": loose})[0]
    assert (flip.target, flip.reason, flip.canary_replicas) == ("Off", r.SLO_HEADROOM, 0)
    off = PoolState(mode="Off", last_transition=NOW - timedelta(days=1), k=3, canary_replicas=1)
    held = decide(policy, 3, {"latency": off}, {"latency": obs}, NOW, PROFILE, slos={"latency": loose})[0]
    assert (held.target, held.reason, held.canary_replicas) == ("Off", r.CANARIES_SCALED_DOWN, 0)
    assert "the SLO holds the pool off: stays Off: the SLO is met alike" in held.message


def test_no_canaries_serve_a_pool_the_slo_keeps_off():
    policy = PolicySpec.model_validate({"reentry": {"canaryReplicas": 1}})
    on = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    slos = {"latency": TTFT_TIGHT}
    flip = decide(policy, 3, {"latency": on}, {"latency": _obs(48.0)}, NOW, PROFILE, slos=slos)[0]
    assert (flip.target, flip.reason, flip.canary_replicas) == ("Off", r.SLO_TTFT_BOUND, 0)
    # Off with its canaries up (policy.reentry.canaryReplicas), the SLO still preferring off: down.
    off = PoolState(mode="Off", last_transition=NOW - timedelta(days=1), k=3, canary_replicas=1)
    held = decide(policy, 3, {"latency": off}, {"latency": _obs(16.0)}, NOW, PROFILE, slos=slos)[0]
    assert (held.target, held.reason, held.canary_replicas) == ("Off", r.CANARIES_SCALED_DOWN, 0)
    plain = decide(policy, 3, {"latency": off}, {"latency": _obs(16.0)}, NOW, PROFILE)[0]
    assert plain.target == "On"  # without the SLO, throughput turns it on


def test_the_slo_retunes_k_of_a_pool_that_stays_on():
    # Throughput keeps K 3 at 64 running per replica; the TPOT target is met more at K 1 (a shorter step
    # at this batch), so the SLO retunes it, through the adjustment gate as any retune.
    assert (_decide("On", 64.0, None).target, _decide("On", 64.0, None).target_k) == ("On", None)
    d = _decide("On", 64.0, TPOT_TIGHT)
    assert (d.target, d.flip, d.target_k, d.reason) == ("On", False, 1, r.SLO_TPOT_BOUND)
    assert d.message.startswith("K 3 -> 1: predicted share within the SLO")
    assert "predictedChangeSpeedup" in d.observations


def _on_shares(k3: float, k2: float) -> list[SettingShares]:
    return [
        SettingShares(OFF, 0, {"TPOT": 0.1}, 100.0, 0.1),
        SettingShares("K2", 2, {"TPOT": k2}, 110.0, k2),
        SettingShares("K3", 3, {"TPOT": k3}, 120.0, k3),
    ]


def test_an_slo_retune_must_cut_the_missed_share_by_the_margin():
    state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    keep = Wanted("On", r.GOODPUT_WITHIN_MARGIN, "keeps", {})
    # 0.500 -> 0.5005: a tie; -> 0.51 cuts the missed share by 2%, inside the 5% margin: K 3 stays.
    assert slo_retune(POLICY, state, "K3", _on_shares(0.50, 0.5005), keep) is None
    assert slo_retune(POLICY, state, "K3", _on_shares(0.50, 0.51), keep) is None
    # -> 0.55 cuts it by 10%: K 2, the TPOT target deciding, at 110/120 of K 3's tokens per second.
    retune = slo_retune(POLICY, state, "K3", _on_shares(0.50, 0.55), keep)
    assert retune is not None
    best, reason, _, gain = retune
    assert (best.k, reason, round(gain, 3)) == (2, r.SLO_TPOT_BOUND, round(110 / 120, 3))
    # Nor does throughput retune it back where that costs the SLO more than a tie.
    assert not slo_allows(_on_shares(0.50, 0.55), "K2", "K3")
    assert slo_allows(_on_shares(0.5005, 0.50), "K2", "K3")
    # Nothing to retune while the pool is off, or throughput turns it off (a flip, `slo_wanted`'s).
    off = Wanted("Off", r.GOODPUT_BELOW_BREAK_EVEN, "off", {})
    assert slo_retune(POLICY, state, "K3", _on_shares(0.50, 0.90), off) is None
    assert slo_retune(POLICY, replace(state, mode="Off"), OFF, _on_shares(0.50, 0.90), keep) is None


def test_the_batch_pool_is_not_retuned_by_the_latency_pools_slo():
    state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    states = {"latency": state, "batch": state}
    obs = {"latency": _obs(64.0), "batch": replace(_obs(64.0), pool="batch")}
    plain = decide(POLICY, 3, states, obs, NOW, PROFILE)
    steered = decide(POLICY, 3, states, obs, NOW, PROFILE, slos={"latency": TPOT_TIGHT})
    assert (steered[0].target_k, steered[0].reason) == (1, r.SLO_TPOT_BOUND)
    assert plain[0].target_k is None
    assert steered[1] == plain[1]
    assert steered[1].target_k is None


def _across(off: float, on: float, off_load: tuple[float, float], on_load: tuple[float, float]):
    """Off and K3 sharing one target (TTFT), with their shares idle and at a fluctuation above the demand."""
    return [
        SettingShares(OFF, 0, {"TTFT": off, "TPOT": 1.0}, 100.0, off, across_load=off_load),
        SettingShares("K3", 3, {"TTFT": on, "TPOT": 1.0}, 120.0, on, across_load=on_load),
    ]


def test_where_few_requests_meet_the_slo_a_gain_sure_at_every_load_flips_by_the_met_share():
    # A long prompt's prefill nears the TTFT target: 0.217 meet it on, 0.238 off (the drafter's share of the
    # prefill). The missed share falls by 2.7% only, inside the 5% margin, but the met share grows by 10%,
    # off trades no target (TPOT met by all alike) and is ahead idle and above the demand too: off.
    state = PoolState(mode="On", last_transition=NOW - timedelta(days=1), k=3)
    keep = Wanted("On", r.GOODPUT_WITHIN_MARGIN, "keeps", {})
    flipped = slo_wanted(POLICY, state, "K3", _across(0.238, 0.217, (0.25, 0.23), (0.217, 0.217)), keep, GOAL)
    assert (flipped.mode, flipped.reason) == ("Off", r.SLO_TTFT_BOUND)
    # A crossover: ahead at the demand measured and above it, behind idle (TPOT's gain turning with the
    # batch): the sign is the load's, so the missed share must fall by the margin, and it does not.
    crossing = _across(0.238, 0.217, (0.20, 0.25), (0.217, 0.217))
    assert slo_wanted(POLICY, state, "K3", crossing, keep, GOAL).mode == "On"
    # A trade (TTFT met more often, TPOT less) is not sure either.
    traded = _across(0.238, 0.217, (0.25, 0.23), (0.217, 0.217))
    traded[0] = replace(traded[0], by_target={"TTFT": 0.30, "TPOT": 0.79})
    assert slo_wanted(POLICY, state, "K3", traded, keep, GOAL).mode == "On"
    # A TPOT gain alone, however sure it looks, turns with the batch: the missed share decides it.
    by_tpot = [
        replace(x, by_target={"TTFT": 1.0, "TPOT": x.attainment})
        for x in _across(0.238, 0.217, (0.25, 0.23), (0.217, 0.217))
    ]
    assert slo_wanted(POLICY, state, "K3", by_tpot, keep, GOAL).mode == "On"
    # Not predicted away from the demand measured: the missed share decides, as before.
    unknown = _across(0.238, 0.217, (), ())
    assert slo_wanted(POLICY, state, "K3", unknown, keep, GOAL).mode == "On"


def _decode_bound(running: float) -> tuple[PoolObservation, PoolModel]:
    """A pool of short prompts at K 3 whose TPOT histogram spreads over 5-25 ms, and its model."""
    obs = replace(_obs(running), replicas_reporting=1, mean_prompt_tokens=10.0)
    return obs, pool_model(PROFILE, obs, [1, 3], mode="On", current_k=3)


def test_tpot_shares_scale_the_histogram_from_the_load_its_requests_near_the_target_ran_at():
    # The histogram spreads over 5-25 ms around the 12 ms target. Over a window that rose from 4 to 200
    # running, its requests near the target ran where K 3's mean TPOT is the target (a lighter load):
    # at 200, where K 3's mean is past it, every setting (K 3 too) is predicted to meet it less often
    # than a ratio of means both taken at 200 says, and their order stays the model's at 200.
    obs, model = _decode_bound(200.0)

    def shares(demand: float, loads: tuple[float, float] | None, o=obs, m=model) -> dict[str, float]:
        found = setting_shares(TPOT_TIGHT, o, m, ACC, [demand], 3, False, window_loads=loads) or []
        return {s.name: s.attainment for s in found}

    held, rose = shares(200.0, None), shares(200.0, (4.0, 200.0))
    for name in (OFF, "K1", "K3"):
        assert rose[name] < held[name] - 0.1
    assert sorted(rose, key=rose.__getitem__) == sorted(held, key=held.__getitem__)
    # A window that held still reads as the ratio at the demand now, as does one whose loads all keep
    # K 3 under the target (the histogram then is the lightest load's, which the demand now is).
    assert shares(200.0, (200.0, 200.0)) == held
    obs64, model64 = _decode_bound(64.0)
    assert shares(64.0, (4.0, 64.0), obs64, model64) == pytest.approx(shares(64.0, None, obs64, model64))
    # A window that fell from 200 to 20: its slow requests ran at the heavier load, so at 20 more meet it.
    obs20, model20 = _decode_bound(20.0)
    fell, light = shares(20.0, (20.0, 200.0), obs20, model20), shares(20.0, None, obs20, model20)
    assert all(fell[name] > light[name] + 0.1 for name in (OFF, "K1", "K3"))


def test_the_histograms_window_loads_are_the_demands_measured_over_the_last_window():
    state = PoolState(
        mode="On",
        last_transition=NOW - timedelta(days=1),
        k=3,
        recent_load=(
            (NOW - timedelta(seconds=300), 1.0),
            (NOW - timedelta(seconds=90), 20.0),
            (NOW - timedelta(seconds=30), 80.0),
        ),
    )
    # Each evaluation's demand is a mean over the window before it: only the last half window's count.
    assert window_loads(POLICY, state, NOW, 150.0) == (80.0, 150.0)
    assert window_loads(POLICY, state, NOW, 50.0) == (50.0, 80.0)
    assert window_loads(POLICY, replace(state, recent_load=()), NOW, 150.0) == (150.0, 150.0)


def _falling(running: float, step: float, loads: int = 10) -> PoolState:
    """A pool off with its canaries down, whose demand fell by `step` per replica every evaluation to
    `running` now."""
    recent = tuple(
        (
            NOW - timedelta(seconds=POLICY.evaluation_interval_seconds * (loads - i)),
            running + step * (loads - i),
        )
        for i in range(loads)
    )
    return PoolState(
        mode="Off", last_transition=NOW - timedelta(days=1), k=3, canary_replicas=0, recent_load=recent
    )


def test_where_the_load_falls_the_slo_holds_a_pool_off_only_if_its_verdict_holds_along_the_path():
    # A weak drafter at 80 running per replica: speculation's step costs TPOT there (past break-even), so
    # at the demand measured the SLO keeps the pool off, canaries down, while the load holds still.
    policy = PolicySpec.model_validate({"reentry": {"canaryReplicas": 1}})
    weak = (0.3, 0.1, 0.03)
    obs = replace(_obs(80.0), per_position=weak, acceptance_length=1 + sum(weak), replicas_reporting=3)
    slos = {"latency": TPOT_TIGHT}

    def run(state: PoolState):
        return decide(policy, 3, {"latency": state}, {"latency": obs}, NOW, PROFILE, slos=slos)[0]

    held = run(_falling(80.0, 0.0))
    assert (held.target, held.reason) == ("Off", r.SLO_TPOT_BOUND)
    # Falling fast, the flip's commit path runs down to where the drafter cuts TPOT: the verdict at the
    # demand measured does not hold along it, so throughput decides, and brings the canaries back up.
    falling = run(_falling(80.0, 8.0))
    assert (falling.target, falling.reason, falling.canary_replicas) == ("Off", r.CANARIES_SCALED_UP, 1)
    # Far past break-even the verdict holds along the path down as well: still held off.
    far = replace(obs, running_per_replica=112.0)
    state = _falling(112.0, 8.0)
    assert decide(policy, 3, {"latency": state}, {"latency": far}, NOW, PROFILE, slos=slos)[0].reason == (
        r.SLO_TPOT_BOUND
    )


def test_the_slo_defers_to_throughput_where_its_verdicts_part():
    keep = Wanted("Off", r.GOODPUT_WITHIN_MARGIN, "throughput keeps it off", {"a": "1"})
    slo_off = Wanted(
        "Off", r.SLO_TPOT_BOUND, "stays Off: ...", {"a": "1", "predictedSloAttainmentOff": "0.3"}
    )
    # Throughput's own ask at the demand measured stands, whatever the path says.
    assert slo_along_path(keep, slo_off, keep) is keep
    # The same override along the path: the SLO's ask at the demand measured.
    assert slo_along_path(slo_off, slo_off, keep) is slo_off
    # Along the path throughput's ask (or the other mode): throughput's, with the SLO's numbers.
    for along in (keep, Wanted("On", r.SLO_TPOT_BOUND, "on", {})):
        out = slo_along_path(slo_off, along, keep)
        assert (out.mode, out.reason, out.numbers) == ("Off", r.GOODPUT_WITHIN_MARGIN, slo_off.numbers)
        assert "the SLO defers" in out.message
