"""The rollout-paying hindsight oracle (`specfleet.sim.bound`): its schedule, its cost, its run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from specfleet.api.validation import SpeculativeDeployment, parse_resource
from specfleet.sim.bound import (
    NAME,
    REACTION,
    REACTION_REQUESTS,
    REACTIVE,
    best_schedule,
    departure_seconds,
    held_through,
    reaction_bounds,
    reaction_hold_seconds,
    request_scores,
    rollout_mix,
    rollout_paying_oracle,
    schedule_of,
)
from specfleet.sim.compare import compare
from specfleet.sim.fleet import RunResult, SimOptions, Strategy, simulate
from specfleet.sim.workload import ClosedLoop
from specfleet_runtime.cost_profile import default_profile

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"


def example() -> SpeculativeDeployment:
    return parse_resource(yaml.safe_load(EXAMPLE.read_text()))


def static_runs(load: ClosedLoop, seed: int) -> dict[str, RunResult]:
    """Example 02's static settings (off, K 1, K 3) run on `load`: what the bound chooses from."""
    return {
        name: simulate(example(), load, Strategy(name, "static", mode, k), SimOptions(seed=seed))
        for name, mode, k in (("alwaysOff", "Off", None), ("alwaysOnK1", "On", 1), ("alwaysOnK3", "On", 3))
    }


def test_rollout_mix_follows_a_one_by_one_surge() -> None:
    # 3 replicas, maxSurge 1, 60 s start-up, 30 s windows: a third new from 60 s, two thirds from
    # 120 s, all from 180 s; six windows until the last old pod is replaced.
    mix = rollout_mix(3, 1, 60.0, 30.0)
    assert mix == pytest.approx([0, 0, 1 / 3, 1 / 3, 2 / 3, 2 / 3])
    # A surge as large as the pool replaces it in one start-up.
    assert rollout_mix(2, 2, 60.0, 30.0) == pytest.approx([0, 0])
    # A start-up that ends inside a window counts the window's new part.
    assert rollout_mix(1, 1, 45.0, 30.0) == pytest.approx([0, 0.5])


def test_a_change_is_made_only_where_it_pays_for_its_rollout() -> None:
    mix = [0.0, 0.0, 0.5]
    n = 30
    a = np.ones(n)
    # b is 5% better for 2 windows only: going there and back costs more (two rollouts of mostly
    # the worse setting) than those windows gain.
    b = np.full(n, 0.9)
    b[10:12] = 1.05
    assert best_schedule({"a": a, "b": b}, mix) == ["a"] * n
    # b is better for 15 windows: the schedule moves early enough that b serves when it pays, and back.
    b = np.full(n, 0.9)
    b[10:25] = 1.2
    out = best_schedule({"a": a, "b": b}, mix)
    assert out[0] == "a"
    first_b = out.index("b")
    # It starts the rollout before b pays (hindsight) and serves b through the stretch.
    assert first_b <= 10
    assert out[first_b + len(mix) : 25 - len(mix)] == ["b"] * (25 - len(mix) - first_b - len(mix))
    assert out[-1] == "a"


def test_the_reactive_schedule_holds_its_start_until_the_hold_window() -> None:
    mix = [0.0, 0.0, 0.5]
    n = 30
    a = np.ones(n)
    b = np.full(n, 0.9)
    b[10:25] = 1.2
    free = best_schedule({"a": a, "b": b}, mix)
    assert free.index("b") < 10  # hindsight: the rollout starts before b pays
    held = best_schedule({"a": a, "b": b}, mix, start="a", hold=12)
    assert held[:12] == ["a"] * 12
    assert held.index("b") == 12  # at once when allowed: b still pays for its rollout
    # Forced to start in b, it leaves b only from the hold window on, however little b serves.
    worse = best_schedule({"a": a, "b": np.full(n, 0.5)}, mix, start="b", hold=5)
    assert worse[:5] == ["b"] * 5
    assert worse[5:] == ["a"] * (n - 5)


def test_gated_flips_start_no_sooner_than_the_gap_after_the_last_one() -> None:
    # Off is best in two short stretches 9 windows apart, the speculating setting elsewhere. A change
    # serves the old setting in its own window (mix [0]), so each list entry names where it is moving.
    n = 30
    on = np.ones(n)
    off = np.full(n, 0.8)
    off[5:8] = off[14:17] = 1.3
    values = {"alwaysOnK1": on, "alwaysOff": off}

    def flips(seq: list[str]) -> list[int]:
        return [w for w in range(1, n) if (seq[w] == "alwaysOff") != (seq[w - 1] == "alwaysOff")]

    assert flips(best_schedule(values, [0.0])) == [4, 7, 13, 16]  # off for each stretch, on between
    gated = best_schedule(values, [0.0], flip_gap=10)
    # Turning back on between the stretches would hold the pool on through the second one: it stays
    # off from the first to the end of the second and flips twice, 12 windows apart.
    assert flips(gated) == [4, 16]
    # Changes of K are not flips: a gate does not hold them.
    k3 = np.full(n, 0.9)
    k3[2:4] = 1.5
    assert best_schedule({"alwaysOnK1": on, "alwaysOnK3": k3}, [0.0], flip_gap=100)[1:3] == ["alwaysOnK3"] * 2


def test_the_worst_objective_lifts_the_lowest_window_not_the_sum() -> None:
    # a: better everywhere but one window; b: a little lower, no dip. A change serves the old setting
    # for three windows, so going to b for the dip and back costs more than the dip.
    n = 20
    a = np.full(n, 1.1)
    a[12] = 0.8
    b = np.full(n, 1.0)
    values = {"a": a, "b": b}
    mix = [0.0, 0.0, 0.0]
    assert best_schedule(values, mix) == ["a"] * n
    worst = best_schedule(values, mix, objective="worst")
    # Moving to b three windows before the dip serves b in it; moving back starts in it (the list
    # names where the pool is moving to, and a change serves the old setting for three windows).
    assert worst[9:15] == ["b", "b", "b", "a", "a", "a"]
    assert worst[:9] == ["a"] * 9  # among schedules with that minimum, the larger sum
    # Windows before `skip` do not count for the minimum.
    a[1] = 0.1
    assert best_schedule(values, mix, objective="worst", skip=2)[:2] == ["a", "a"]


def test_a_schedule_pays_for_the_stretch_it_cannot_change() -> None:
    # No change before a rollout is over: with a 4-window rollout, a window where another setting
    # wins alone is not worth switching for, even at three times the score there.
    n = 12
    values = {"a": np.ones(n), "b": np.where(np.arange(n) == 6, 3.0, 0.0)}
    assert best_schedule(values, [0.0, 0.0, 0.0, 0.0]) == ["a"] * n


def test_no_traffic_scores_nothing() -> None:
    values = {"a": np.array([np.nan, 1.0, 1.0]), "b": np.array([np.nan, 0.5, 0.5])}
    assert best_schedule(values, [0.0]) == ["a", "a", "a"]


def test_schedule_of_lists_the_start_and_each_change() -> None:
    choices = {"latency": ["alwaysOnK3", "alwaysOnK3", "alwaysOff", "alwaysOnK1"]}
    assert schedule_of(choices, 30.0) == (
        (0.0, "latency", "On", 3),
        (60.0, "latency", "Off", None),
        (90.0, "latency", "On", 1),
    )


def test_a_scheduled_change_is_a_real_surge_rollout() -> None:
    # The latency pool starts Off and is scheduled On at K3 at 300 s: the simulator rolls it out one
    # surge pod at a time, so it speculates only once the rollout is over.
    load = ClosedLoop(points=((0, 3 * 16), (900, 3 * 16)), sizes=((200, 300),))
    schedule = ((0.0, "latency", "Off", None), (300.0, "latency", "On", 3))
    run = simulate(example(), load, Strategy(NAME, "schedule", schedule=schedule), SimOptions(seed=0))
    assert [(c.time, c.pool, c.to_mode, c.to_k) for c in run.changes] == [(300.0, "latency", "On", 3)]
    modes = [(row["t"], row["latency"]["mode"], row["latency"]["replicas"]) for row in run.timeline]
    assert all(mode == "Off" for t, mode, _ in modes if t <= 300)
    assert all(mode == "On" for t, mode, _ in modes if t > 300)
    # A surge pod while it rolls out, and no canaries at any time.
    assert max(r for t, _, r in modes if 300 < t <= 480) == 4
    assert all(r == 3 for t, _, r in modes if t <= 300 or t > 540)
    off = simulate(example(), load, Strategy("off", "static", "Off"), SimOptions(seed=0))
    on = simulate(example(), load, Strategy("on", "static", "On", 3), SimOptions(seed=0))

    def rate(r: RunResult, lo: int, hi: int) -> float:
        tokens = r.bin_tokens["latency"][lo:hi].sum()
        return float(tokens / r.bin_request_seconds["latency"][lo:hi].sum())

    # Before the change it runs as always-off; long after, as always-on (speculation pays at c=16).
    assert rate(run, 2, 10) == pytest.approx(rate(off, 2, 10), rel=0.05)
    assert rate(run, 20, 30) == pytest.approx(rate(on, 20, 30), rel=0.08)
    assert rate(on, 20, 30) > 1.2 * rate(off, 20, 30)
    # The rollout costs: the windows while it runs fall short of always-on.
    assert rate(run, 10, 16) < 0.95 * rate(on, 10, 16)


def test_the_bound_sits_between_the_best_static_setting_and_the_per_level_oracle() -> None:
    # Far past break-even, then low load: the bound runs without speculation through the high
    # stretch (it may start that way: the static runs start without a rollout too) and turns it on
    # for the low one, paying that rollout.
    load = ClosedLoop(
        points=((0, 12), (60, 12), (120, 900), (1020, 900), (1080, 12), (1800, 12)), sizes=((300, 200),)
    )
    comp = compare(example(), load, SimOptions(seed=0))
    assert NAME in comp.runs
    bound = comp.runs[NAME]
    modes = [row["latency"]["mode"] for row in bound.timeline]
    assert modes[20] == "Off"
    assert modes[-1] == "On"
    assert [c.to_mode for c in bound.changes if c.pool == "latency"][-1] == "On"
    ratio = comp.ratio(NAME)
    best = comp.ratio("bestStatic")
    assert ratio is not None
    assert best is not None
    assert best < ratio <= 1.01
    doc = comp.to_json()["results"][NAME]
    assert doc["flips"] == sum(1 for c in bound.changes if c.kind == "flip")
    assert doc["worstMinuteRatioToPerLevelOracle"] is not None


def test_the_bound_is_deterministic() -> None:
    load = ClosedLoop(points=((0, 12), (300, 600), (600, 12)), sizes=((300, 200),))
    statics = static_runs(load, seed=2)
    a = rollout_paying_oracle(example(), load, statics, SimOptions(seed=2), default_profile())
    b = rollout_paying_oracle(example(), load, statics, SimOptions(seed=2), default_profile())
    assert [(c.time, c.to_mode, c.to_k) for c in a.changes] == [
        (c.time, c.to_mode, c.to_k) for c in b.changes
    ]
    assert list(a.bin_tokens["latency"]) == list(b.bin_tokens["latency"])


def test_the_lagged_schedule_makes_the_same_changes_later() -> None:
    load = ClosedLoop(points=((0, 12), (300, 900), (900, 900), (960, 12), (1500, 12)), sizes=((300, 200),))
    statics = static_runs(load, seed=0)
    bound = rollout_paying_oracle(example(), load, statics, SimOptions(seed=0), default_profile())
    lagged = rollout_paying_oracle(
        example(), load, statics, SimOptions(seed=0), default_profile(), lag_seconds=90
    )
    assert bound.changes
    assert [(c.time + 90, c.to_mode, c.to_k) for c in bound.changes if c.time + 90 < 1500] == [
        (c.time, c.to_mode, c.to_k) for c in lagged.changes
    ]


def test_the_reactive_bound_changes_nothing_before_the_load_moves() -> None:
    load = ClosedLoop(
        points=((0, 12), (300, 12), (600, 900), (900, 900), (960, 12), (1500, 12)), sizes=((300, 200),)
    )
    statics = static_runs(load, seed=0)
    bound = rollout_paying_oracle(example(), load, statics, SimOptions(seed=0), default_profile())
    reactive = rollout_paying_oracle(
        example(), load, statics, SimOptions(seed=0), default_profile(), hold_seconds=300
    )
    assert reactive.strategy.name == REACTIVE
    assert reactive.changes
    assert min(c.time for c in reactive.changes) >= 300
    # Knowing the trace, the bound starts before the load moves; held, the reactive one serves less.
    assert min(c.time for c in bound.changes) < 300
    assert reactive.tokens_per_second <= bound.tokens_per_second * 1.01


def test_the_reaction_bound_holds_until_the_first_setting_falls_behind_plus_the_lag() -> None:
    # The load rises from the start: the reactive bound's hold (the load's first move) is none at all.
    # The first window's best setting (speculating, at 12 running) falls behind during the rise; the
    # reaction bound starts nothing before that plus the lag, then knows the rest.
    load = ClosedLoop(points=((0, 12), (600, 900), (1200, 900), (1260, 12), (1800, 12)), sizes=((300, 200),))
    statics = static_runs(load, seed=0)
    departure = departure_seconds(statics, "latency", 2, 0.01)
    assert departure is not None
    assert 0 < departure < 600
    hold = reaction_hold_seconds(example(), statics, 2, 90.0, 0.01)
    assert hold == departure + 90.0
    runs = reaction_bounds(example(), load, statics, SimOptions(seed=0), default_profile(), 2, 90.0, 0.01)
    assert set(runs) == {REACTION, REACTION_REQUESTS}
    bound = rollout_paying_oracle(example(), load, statics, SimOptions(seed=0), default_profile())
    for run in runs.values():
        assert run.changes
        assert min(c.time for c in run.changes) >= hold
        assert run.tokens_per_second <= bound.tokens_per_second * 1.01


def test_a_setting_best_throughout_gives_the_reaction_bound_no_change() -> None:
    load = ClosedLoop(points=((0, 12), (900, 12)), sizes=((300, 200),))
    statics = static_runs(load, seed=0)
    assert departure_seconds(statics, "latency", 2, 0.01) is None
    assert reaction_hold_seconds(example(), statics, 2, 90.0, 0.01) >= 900
    runs = reaction_bounds(example(), load, statics, SimOptions(seed=0), default_profile(), 2, 90.0, 0.01)
    assert all(not [c for c in run.changes if c.pool == "latency" and c.time > 0] for run in runs.values())


def test_request_scores_rank_settings_by_the_time_their_requests_are_held() -> None:
    load = ClosedLoop(points=((0, 400), (600, 400)), sizes=((300, 200),))
    statics = static_runs(load, seed=0)
    values = request_scores(statics, "latency", 2)
    held = {n: float(np.sum(r.bin_request_seconds["latency"])) for n, r in statics.items()}
    order = sorted(values, key=lambda n: float(np.sum(values[n])))
    assert order == sorted(held, key=lambda n: -held[n])
    assert all(float(np.max(v)) <= 0 for v in values.values())


def test_held_through_takes_the_best_setting_or_mix_on_both_sides_of_a_change() -> None:
    # One setting better on both sides: that one; a mix with a setting that is better after the
    # change only lifts the side that holds it back.
    assert held_through({"a": 0.99, "b": 0.9}, {"a": 0.97, "b": 0.9}) == (0.97, "a")
    assert held_through({"a": 0.99, "b": 0.9}, {"a": 0.97, "b": 1.0}) == (
        pytest.approx(0.975),
        "0.83 x a + 0.17 x b",
    )
    # Off is best before, On after: no setting is, and the best fixed mix is where the two lines cross
    # (2/3 of the replicas speculating): 1 - 2/3 x 0.08 = 0.9467, below a 0.95 target.
    value, how = held_through({"alwaysOff": 1.0, "alwaysOnK1": 0.92}, {"alwaysOff": 0.84, "alwaysOnK1": 1.0})
    assert value == pytest.approx(1 - 0.08 * 2 / 3)
    assert how == "0.33 x alwaysOff + 0.67 x alwaysOnK1"
    # Never below what any single setting holds on both sides.
    pre = {"alwaysOff": 0.95, "alwaysOnK1": 0.97, "alwaysOnK3": 1.0}
    post = {"alwaysOff": 1.0, "alwaysOnK1": 0.96, "alwaysOnK3": 0.7}
    value, _ = held_through(pre, post)
    assert value >= max(min(pre[s], post[s]) for s in pre)


def test_held_through_reads_the_static_runs_around_an_acceptance_shift() -> None:
    # A weak drafter that turns strong at 6 min: before it the statics' minutes average one value
    # each, after it another, and the bound is what the pure function makes of them.
    weak, strong = (0.3, 0.1, 0.03, 0.01, 0.0), (0.9, 0.8, 0.7, 0.6, 0.5)
    load = ClosedLoop(points=((0, 90), (540, 90)), sizes=((300, 200),), acceptance_changes=((360.0, strong),))
    comp = compare(example(), load, SimOptions(seed=0, acceptance=weak))
    value, how, per = comp.held_through(360.0, 90.0)
    assert set(per) == {"alwaysOff", "alwaysOnK1", "alwaysOnK3"}
    assert held_through({n: b for n, (b, _) in per.items()}, {n: a for n, (_, a) in per.items()}) == (
        value,
        how,
    )
    # Off is the oracle's setting before the shift, K3 after it: each loses on the side it does not suit.
    assert per["alwaysOff"][0] > per["alwaysOnK3"][0]
    assert per["alwaysOnK3"][1] > per["alwaysOff"][1]
    assert value < max(b for b, _ in per.values())
