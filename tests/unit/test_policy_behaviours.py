"""Regressions for the policy behaviours of issue 12, each through the operator's own decide/record.

Every test here failed on the policy before the fix (b4950c4); the scenario tests drive decide and
record over a fluid model of one pool (tests/support/policy_harness.py), with the renderer deciding
what the engines run.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.policy import PolicySpec
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.policy import MeasuredAcceptance, PoolObservation, PoolState, decide, predicted_speedup
from specfleet.policy.decision.record import record
from specfleet.policy.inputs.observation import PoolRolloutState
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.inputs.status import pool_states
from specfleet_runtime.cost_profile import default_profile
from support.policy_harness import PUBLISHED, STRONG, WEAK, example_spec, issue_ramp, ramp, simulate

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
# Who should scrape the pools (named only when Prometheus does not scrape a pool's Ready pods).
SCRAPE = ScrapeSetup("default", "llama", pod_monitor=False, scrape_annotations=True)
PROFILE = default_profile()
GOODPUT = PolicySpec.model_validate({"mode": "Goodput"})


def obs(load: float, per_position: tuple[float, ...] | None, pool: str = "latency", at: datetime = NOW):
    if per_position is None:
        return PoolObservation(pool=pool, at=at, running_per_replica=load, replicas_reporting=2)
    return PoolObservation(
        pool=pool,
        at=at,
        acceptance_length=1 + sum(per_position),
        per_position=per_position,
        acceptance_source="pool",
        running_per_replica=load,
        replicas_reporting=2,
        drafts_in_window=1000,
    )


def one(policy, st, ob, k=3, now=NOW):
    return decide(policy, k, {ob.pool: st}, {ob.pool: ob}, now, PROFILE)[0]


def goodput_spec(**policy):
    """Example 02's pool and gates in Goodput mode (named: the default changed with these fixes)."""
    return example_spec(**{"mode": "Goodput", **policy})


def speclike(**policy) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(goodput_spec(**policy))


def settled(status: SpeculativeDeploymentStatus, pool: str = "latency") -> SpeculativeDeploymentStatus:
    pools = status.pools.model_copy(deep=True)
    setattr(pools, pool, getattr(pools, pool).model_copy(update={"settled": True}))
    return status.model_copy(update={"pools": pools})


def evaluate(spec, status, observation, now, k=3):
    """One evaluation through status: pool_states -> decide -> record (the pool then settles)."""
    states = pool_states(spec, status, now)
    decisions = decide(spec.policy, k, states, {observation.pool: observation}, now, PROFILE)
    recorded = record(status, decisions, {observation.pool: observation}, 1, now, SCRAPE, window_seconds=60)
    return decisions[0], settled(recorded.status)


# ---- 1. K is raised again once lowered -----------------------------------------------------------


def test_k_lowered_at_high_load_is_raised_again_when_load_falls():
    # Published drafter: K=1 pays most at 100 running per replica, K=3 at 2.
    result = simulate(goodput_spec(), ramp([(0, 100), (900, 100), (960, 2), (1800, 2)]), 1800, PUBLISHED)
    ks = [(c.at, c.k) for c in result.changes]
    assert ks[0][1] == 1, result.summary()
    assert result.status.pools.latency.num_speculative_tokens == 3, result.summary()
    # The memory kept the positions K=1 no longer drafted.
    assert result.status.pools.latency.per_position_acceptance.count(",") == 2


def test_a_pool_drafting_k1_keeps_its_remembered_deeper_positions():
    memory = MeasuredAcceptance(2.27, PUBLISHED[:3], NOW - timedelta(minutes=5))
    st = PoolState("On", last_transition=NOW - timedelta(days=1), last_acceptance=memory, k=1)
    d = one(GOODPUT, st, obs(2, (0.68,)))
    assert (d.reason, d.current_k, d.target_k) == ("GoodputRetune", 1, 3)
    assert d.acceptance is not None
    assert d.acceptance.per_position == pytest.approx(PUBLISHED[:3])


def test_turning_back_on_picks_the_best_k_not_the_last_one():
    # 100 (K=1) -> 300 (Off) -> 2: speculation comes back at K=3.
    load = ramp([(0, 100), (600, 100), (660, 300), (1800, 300), (1860, 2), (3000, 2)])
    result = simulate(goodput_spec(), load, 3000, PUBLISHED)
    on = [c for c in result.changes if c.kind == "flip" and c.mode == "On"]
    assert on, result.summary()
    assert on[0].k == 3, result.summary()
    assert result.status.pools.latency.num_speculative_tokens == 3


# ---- 2. On -> Off is judged at the best K --------------------------------------------------------


def test_speculation_stays_on_at_a_smaller_k_while_that_k_pays():
    # Weak drafter at 64 running per replica: K=3 predicts 0.82x, K=1 still 1.05x.
    assert predicted_speedup(PROFILE, 64, 3, WEAK) < 0.95
    assert predicted_speedup(PROFILE, 64, 1, WEAK) > 1.0
    d = one(GOODPUT, PoolState("On", last_transition=NOW - timedelta(days=1)), obs(64, WEAK[:3]))
    assert (d.flip, d.target, d.reason, d.target_k) == (False, "On", "GoodputRetune", 1)


def test_weak_drafter_between_24_and_48_retunes_once_instead_of_flipping_twice():
    result = simulate(goodput_spec(), ramp([(0, 24), (600, 48), (1200, 48)]), 1200, WEAK)
    assert result.flips == [], result.summary()
    assert [c.k for c in result.changes] == [1], result.summary()


# ---- 3. A K retune is not a flip -------------------------------------------------------------------


def test_a_retune_spends_neither_dwell_nor_cooldown_nor_flips():
    spec = speclike()
    status = settled(SpeculativeDeploymentStatus())
    # At 100 running per replica K=1 beats K=3: retune.
    d, status = evaluate(spec, status, obs(100, PUBLISHED[:3]), NOW)
    assert d.reason == "GoodputRetune"
    assert status.pools.latency.last_transition_time is None
    # 60 s later the load is far past break-even: the flip is not held by the retune.
    later = NOW + timedelta(seconds=60)
    d, status = evaluate(spec, status, obs(300, PUBLISHED[:1], at=later), later, k=3)
    assert (d.flip, d.target, d.reason) == (True, "Off", "GoodputBelowBreakEven")


# ---- 4. A rollout that never settles is reverted -------------------------------------------------


def test_a_rollout_that_never_settles_is_reverted_with_a_reason():
    load = ramp([(0, 2), (300, 2), (330, 300), (3600, 300)])
    first = {"stuck": True}

    def stuck(_: float) -> bool:
        was, first["stuck"] = first["stuck"], False
        return was

    result = simulate(goodput_spec(), load, 3600, PUBLISHED, stuck=stuck)
    reasons = [c.reason for c in result.changes]
    assert "RolloutFailed" in reasons, result.summary()
    failed = next(c for c in result.changes if c.reason == "RolloutFailed")
    off = result.changes[reasons.index("RolloutFailed") - 1]
    assert failed.at - off.at <= 1200 + 30
    assert failed.mode == "On"
    # Tried again later, the rollout went through: the pool ends off, settled.
    assert result.status.pools.latency.speculation == "Off"
    assert result.status.pools.latency.settled


# ---- 5. Cooldown above an hour and more than 20 flips per hour are enforced -----------------------


def evaluate_both(spec, status, observations, now, k=3):
    """`evaluate` for both pools at once (each settles after its change)."""
    states = pool_states(spec, status, now)
    decisions = decide(spec.policy, k, states, observations, now, PROFILE)
    recorded = record(status, decisions, observations, 1, now, SCRAPE, window_seconds=60)
    return decisions, settled(settled(recorded.status), "batch")


def test_cooldown_longer_than_an_hour_is_enforced():
    # Two Auto pools: the cooldown spaces flips of different pools, here by two hours.
    spec = SpeculativeDeploymentSpec.model_validate(
        {
            **goodput_spec(
                mode="Threshold",
                cooldownSeconds=7200,
                minDwellSeconds=0,
                reentry={"canaryReplicas": 0, "maxAcceptanceAgeSeconds": 86400},
            ),
            "pools": {
                "latency": {"replicas": 3, "speculation": "Auto"},
                "batch": {"replicas": 2, "speculation": "Auto"},
            },
        }
    )
    status = settled(settled(SpeculativeDeploymentStatus()), "batch")
    high = {"latency": obs(300, PUBLISHED[:3]), "batch": obs(40, PUBLISHED[:3], pool="batch")}
    (latency, batch), status = evaluate_both(spec, status, high, NOW)
    assert latency.flip
    assert not batch.flip
    later = NOW + timedelta(minutes=90)
    both_high = {
        "latency": obs(300, None, at=later),
        "batch": obs(300, PUBLISHED[:3], pool="batch", at=later),
    }
    (latency, batch), status = evaluate_both(spec, status, both_high, later)
    assert (batch.flip, batch.reason) == (False, "Cooldown")
    assert "another pool" in batch.message


def test_a_pools_own_flip_back_waits_for_its_dwell_not_the_cooldown():
    # One Auto pool (example 02's gates: dwell 300 s, cooldown 600 s): the cooldown spaces flips of
    # different pools, so the pool may flip back once its own dwell is over.
    spec = speclike(mode="Threshold", reentry={"canaryReplicas": 0, "maxAcceptanceAgeSeconds": 86400})
    status = settled(SpeculativeDeploymentStatus())
    d, status = evaluate(spec, status, obs(300, PUBLISHED[:3]), NOW)
    assert d.flip
    soon = NOW + timedelta(seconds=200)
    d, status = evaluate(spec, status, obs(2, None, at=soon), soon)
    assert (d.flip, d.reason) == (False, "MinDwell")
    later = NOW + timedelta(seconds=330)
    d, status = evaluate(spec, status, obs(2, None, at=later), later)
    assert d.flip, (d.reason, d.message)


def test_more_than_20_flips_per_hour_are_counted():
    spec = speclike(
        mode="Threshold",
        minDwellSeconds=0,
        cooldownSeconds=0,
        maxFlipsPerHour=30,
        thresholds={"stopAboveConcurrencyPerReplica": 48, "resumeBelowConcurrencyPerReplica": 32},
        reentry={"canaryReplicas": 0},
    )
    status = settled(SpeculativeDeploymentStatus())
    reasons = []
    for i in range(32):
        now = NOW + timedelta(seconds=60 * i)
        high = i % 2 == 0
        d, status = evaluate(
            spec, status, obs(300 if high else 2, PUBLISHED[:3] if high else None, at=now), now
        )
        reasons.append(d.reason if not d.flip else "flip")
    assert reasons[:30] == ["flip"] * 30
    assert reasons[30] == "FlipBudgetExhausted"
    assert len(status.pools.latency.recent_flip_times) == 30


# ---- 6. Canaries stop speculating far past break-even --------------------------------------------


def test_canaries_are_scaled_down_far_past_break_even():
    result = simulate(goodput_spec(), ramp([(0, 300), (3600, 300)]), 3600, PUBLISHED)
    # After the first ten minutes the pool does as well as always-off: no canary drafting at 300.
    tail = slice(600, None)
    assert sum(result.policy_tokens[tail]) >= 0.999 * sum(result.static_tokens["alwaysOff"][tail])
    assert result.status.pools.latency.canary_replicas == 0, result.summary()


def test_canaries_measure_again_when_the_remembered_acceptance_expires():
    # Off at 300 without canaries; after maxAcceptanceAgeSeconds (one hour) they measure again, then
    # go back down (still far past break-even), and the pool never turns on.
    result = simulate(goodput_spec(), ramp([(0, 300), (7200, 300)]), 7200, PUBLISHED)
    assert [c.mode for c in result.flips] == ["Off"], result.summary()
    flip = next(d for _, d in result.decisions if d.flip)
    assert flip.canary_replicas == 0  # decided with the flip: no canary starts
    reasons = [(c.reason, c.at) for c in result.changes]
    up = [t for reason, t in reasons if reason == "CanariesScaledUp"]
    down = [t for reason, t in reasons if reason == "CanariesScaledDown"]
    assert up, result.summary()
    assert up[0] >= 3600
    assert down, result.summary()
    assert down[0] > up[0]
    assert result.status.pools.latency.canary_replicas == 0


def test_near_break_even_canaries_stay_and_see_a_drafter_that_got_better():
    # The weak drafter at 90 running per replica: K 1 predicts 0.94x, so the pool turns off, but not
    # far past break-even (above 1 - 2 x margin): its canary keeps measuring. When the drafter gets
    # better (the published acceptance from 20 min on) the canary measures that, and the pool turns
    # back on long before its remembered acceptance (one hour) would have expired.
    result = simulate(
        goodput_spec(),
        ramp([(0, 90), (3000, 90)]),
        3000,
        lambda t: WEAK if t < 1200 else PUBLISHED,
    )
    assert [c.mode for c in result.flips] == ["Off", "On"], result.summary()
    off = next(d for _, d in result.decisions if d.flip)
    assert off.canary_replicas == 1
    assert 1200 < result.flips[1].at < 1200 + 300, result.summary()


def racing(*loads: float) -> tuple[tuple[datetime, float], ...]:
    """The running-per-replica of the evaluations before NOW, 30 s apart, oldest first."""
    return tuple((NOW - timedelta(seconds=30 * (len(loads) - i)), v) for i, v in enumerate(loads))


CANARY = PolicySpec.model_validate({"mode": "Goodput", "reentry": {"canaryReplicas": 1}})


def test_a_pool_turning_off_on_a_load_racing_far_past_break_even_keeps_no_canary():
    # Weak drafter, 90 running per replica measured (K 1 predicts 0.94x: near break-even) and rising
    # by one per second: the flip is decided on the projection (far past, about 0.8x), and so is the
    # canary, which would only cost by the time the rollout is over.
    state = PoolState("On", k=1, last_transition=NOW - timedelta(days=1), recent_load=racing(0, 30, 60))
    d = one(CANARY, state, obs(90, WEAK[:1]))
    assert (d.flip, d.target) == (True, "Off")
    assert d.canary_replicas == 0, d.message
    assert "far past break-even" in d.message
    # The same load measured, standing still: near break-even, the canary stays to measure.
    still = replace(state, recent_load=racing(90, 90, 90))
    d = one(CANARY, still, obs(90, WEAK[:1]))
    assert (d.flip, d.target, d.canary_replicas) == (True, "Off", 1)


def off_remembering_weak(**fields) -> PoolState:
    """An Off pool at K 1 that flipped two hours ago and remembers the weak drafter's acceptance."""
    memory = MeasuredAcceptance(1 + sum(WEAK), WEAK, NOW - timedelta(minutes=5))
    return PoolState("Off", k=1, last_transition=NOW - timedelta(hours=2), last_acceptance=memory, **fields)


def test_canaries_go_down_where_what_they_cost_the_pool_is_over_half_the_margin():
    # Weak drafter remembered, 100 running per replica: K 1 predicts 0.91x, within two margins of
    # break-even (0.90), so a canary's own shortfall keeps it. One canary of three replicas serves a
    # third of the pool's requests 9% slower: 3% of the pool, more than half the 5% margin, so it goes
    # down. One canary of ten costs 0.9%: it stays.
    state = off_remembering_weak(canary_replicas=1, recent_load=racing(100, 100, 100), replicas=3)
    d = one(CANARY, state, obs(100, WEAK[:1]))
    assert (d.reason, d.canary_replicas) == ("CanariesScaledDown", 0), d.message
    assert "costing it 3.1%, more than 2.5%" in d.message
    d = one(CANARY, replace(state, replicas=10), obs(100, WEAK[:1]))
    assert d.canary_replicas is None, d.message
    # Canaries that came up a minute ago (their rollout settled 30 s ago) measure a whole window before
    # what they cost is weighed: a memory-bound pool's prediction swings with its load meanwhile.
    came_up = PoolRolloutState(
        at=NOW - timedelta(minutes=1), reason="CanariesScaledUp", settled_at=NOW - timedelta(seconds=30)
    )
    d = one(CANARY, replace(state, rollout=came_up), obs(100, WEAK[:1]))
    assert d.canary_replicas is None, d.message
    measured = replace(came_up, settled_at=NOW - timedelta(seconds=CANARY.window_seconds + 1))
    d = one(CANARY, replace(state, rollout=measured), obs(100, WEAK[:1]))
    assert (d.reason, d.canary_replicas) == ("CanariesScaledDown", 0), d.message
    # Down, a canary comes back within one margin of break-even where it would cost the pool a quarter
    # of the margin or less: at 85 (0.96x) one of three would cost 1.5%, one of ten 0.45%.
    down = replace(state, canary_replicas=0, recent_load=racing(85, 85, 85))
    d = one(CANARY, down, obs(85, WEAK[:1]))
    assert d.canary_replicas is None, d.message
    d = one(CANARY, replace(down, replicas=10), obs(85, WEAK[:1]))
    assert (d.reason, d.canary_replicas) == ("CanariesScaledUp", 1), d.message


def test_canaries_do_not_come_back_while_the_load_races_away_from_break_even():
    # An Off pool without canaries, 80 running per replica measured (within one margin of break-even,
    # where canaries come back), but rising steeply: they would be scaled down again once the load
    # gets there. Only a load that stays near brings them back.
    state = off_remembering_weak(canary_replicas=0, recent_load=racing(20, 50, 65))
    d = one(CANARY, state, obs(80, None))
    assert d.canary_replicas is None, d.message
    d = one(CANARY, replace(state, recent_load=racing(80, 80, 80)), obs(80, None))
    assert (d.reason, d.canary_replicas) == ("CanariesScaledUp", 1)


def test_canaries_speculate_while_a_gate_holds_a_pool_that_wants_to_turn_on():
    # Off for 200 s (dwell 300 s, cooldown 600 s) and the load fell to 10 running per replica, where
    # the remembered published acceptance pays: the flip is held, but the canary (an adjustment, with
    # its own gate) comes up meanwhile and serves its share at the setting the pool wants.
    memory = MeasuredAcceptance(1 + sum(PUBLISHED), PUBLISHED, NOW - timedelta(minutes=5))
    state = PoolState(
        "Off", k=1, last_transition=NOW - timedelta(seconds=200), canary_replicas=0, last_acceptance=memory
    )
    d = one(CANARY, state, obs(10, None))
    assert (d.flip, d.target, d.reason, d.canary_replicas) == (False, "Off", "CanariesScaledUp", 1), d.message
    assert "MinDwell" in d.message
    # Its own gate closed (adjusted 60 s ago, minRetuneIntervalSeconds 120): only the hold.
    d = one(CANARY, replace(state, last_retune=NOW - timedelta(seconds=60)), obs(10, None))
    assert (d.reason, d.canary_replicas) == ("MinDwell", None)
    # Canaries already up: nothing more to do than wait.
    d = one(CANARY, replace(state, canary_replicas=1), obs(10, None))
    assert (d.reason, d.canary_replicas) == ("MinDwell", None)


# ---- 7. Threshold mode takes its defaults from the break-even point ------------------------------


def test_threshold_defaults_come_from_the_break_even_point():
    from specfleet.policy.rules.threshold import threshold_values

    policy = PolicySpec.model_validate({"mode": "Threshold"})
    for k in (1, 3, 5):
        v = threshold_values(policy, k, PROFILE)
        assert predicted_speedup(PROFILE, v.stop_concurrency, k, PUBLISHED) == pytest.approx(0.95, abs=0.005)
        assert predicted_speedup(PROFILE, v.resume_concurrency, k, PUBLISHED) == pytest.approx(
            1.05, abs=0.005
        )
        break_even = PROFILE.step_time_ms(1, k) / PROFILE.step_time_ms(1, 0)
        assert v.stop_acceptance == pytest.approx(0.95 * break_even)
        assert v.resume_acceptance == pytest.approx(1.05 * break_even)
    # K matters: drafting more tokens breaks even at a lower load.
    assert (
        threshold_values(policy, 1, PROFILE).stop_concurrency
        > threshold_values(policy, 3, PROFILE).stop_concurrency
    )


def test_threshold_mode_keeps_a_paying_drafter_on_past_the_old_fixed_cut_off():
    # The published drafter at K=3 still predicts 1.1x at 100 running per replica; the old default stopped at 48.
    policy = PolicySpec.model_validate({"mode": "Threshold"})
    d = one(policy, PoolState("On", last_transition=NOW - timedelta(days=1)), obs(100, PUBLISHED[:3]))
    assert (d.flip, d.target) == (False, "On")
    d = one(policy, PoolState("On", last_transition=NOW - timedelta(days=1)), obs(160, PUBLISHED[:3]))
    assert (d.flip, d.target, d.reason) == (True, "Off", "ConcurrencyAboveThreshold")


# ---- the default mode, measured --------------------------------------------------------------------


def test_goodput_is_the_default_mode():
    assert PolicySpec().mode == "Goodput"


@pytest.mark.parametrize(
    ("name", "acceptance"), [("published", PUBLISHED), ("weak", WEAK), ("strong", STRONG)]
)
def test_default_policy_on_the_issue_ramp(name, acceptance):
    """2 -> 200 -> 2 running per replica over 40 minutes, example 02's gates, 60 s rollouts."""
    load, duration = issue_ramp()
    result = simulate(example_spec(mode=PolicySpec().mode), load, duration, acceptance)
    assert result.ratio >= 0.98, result.summary()
    assert result.worst_minute() >= 0.92, result.summary()
    for static in result.static_tokens:
        assert result.ratio >= result.static_ratio(static) - 0.005, result.summary()


def test_the_renderer_scales_canaries_from_the_decided_status():
    from specfleet.api.validation import SpeculativeDeployment, parse_status
    from specfleet.reconcile import decided_plan
    from specfleet.render import render_children

    status = parse_status({"pools": {"latency": {"speculation": "Off", "numSpeculativeTokens": 1}}})

    def replicas(st: SpeculativeDeploymentStatus) -> dict[str, tuple[int, str]]:
        sd = SpeculativeDeployment("a", "ns", "u", 1, speclike(), st)
        out = {}
        for child in render_children(sd, decided_plan(sd)):
            if child["kind"] == "Deployment" and child["metadata"]["name"].startswith("a-latency"):
                args = child["spec"]["template"]["spec"]["containers"][0]["args"]
                spec = args[args.index("--speculative-config") + 1] if "--speculative-config" in args else ""
                out[child["metadata"]["name"]] = (child["spec"]["replicas"], spec)
        return out

    running = replicas(status)
    assert running["a-latency"][0] == 2
    assert running["a-latency-canary"][0] == 1
    assert '"num_speculative_tokens":1' in running["a-latency-canary"][1].replace(" ", "")
    pools = status.pools.model_copy(deep=True)
    pools.latency = pools.latency.model_copy(update={"canary_replicas": 0})
    scaled = replicas(status.model_copy(update={"pools": pools}))
    assert scaled["a-latency"][0] == 3
    assert scaled["a-latency-canary"][0] == 0


# ---- a flip is judged over the period it locks the pool --------------------------------------------

# The fleet simulator's surge rollouts take about two minutes (a pod's start-up, then a drain): the
# projection's horizon is half a window plus that, so a steep trend is projected three minutes ahead.
ROLLOUT = 120.0
SPIKE_RISE = 120.0


def _weak_break_even() -> float:
    from specfleet_runtime.cost_profile import break_even_concurrency

    return break_even_concurrency(PROFILE, WEAK, [1], 1.0)


def test_a_short_steep_spike_below_break_even_does_not_flip_the_pool_off():
    """A spike that rises steeply (5 -> 0.8 x break-even in two minutes) and falls back as fast: its
    trend projects past the weak drafter's break-even, but speculation pays all along, and a flip
    would lock the pool off for its rollout and dwell after the spike is over."""
    peak = 0.8 * _weak_break_even()
    load = ramp([(0, 5), (600, 5), (600 + SPIKE_RISE, peak), (600 + 2 * SPIKE_RISE, 5), (1800, 5)])
    result = simulate(goodput_spec(), load, 1800, WEAK, rollout_delay=ROLLOUT)
    assert not result.flips, result.summary()


def test_a_sustained_ramp_at_the_spikes_slope_still_flips_within_two_intervals():
    """The same steep rise, sustained through break-even to 200: the pool turns off within two
    evaluation intervals of the crossing."""
    be = _weak_break_even()
    slope = (0.8 * be - 5) / SPIKE_RISE
    start, top = 600.0, 200.0
    load = ramp([(0, 5), (start, 5), (start + (top - 5) / slope, top), (2400, top)])
    result = simulate(goodput_spec(), load, 2400, WEAK, rollout_delay=ROLLOUT)
    crossing = start + (be - 5) / slope
    offs = [c.at for c in result.flips if c.mode == "Off"]
    assert offs, result.summary()
    interval = goodput_spec()["policy"]["evaluationIntervalSeconds"]
    assert abs(offs[0] - crossing) <= 2 * interval, (crossing, result.summary())


# ---- a window whose acceptance is still moving is judged on its newest interval --------------------

EVERY = 30  # example 02's evaluation interval over its 120 s window: each window shares 3/4 with the last


def _mixed(before: tuple[float, ...], after: tuple[float, ...], fraction: float) -> tuple[float, ...]:
    return tuple(round((1 - fraction) * a + fraction * b, 4) for a, b in zip(before, after, strict=True))


def _moving_state(memory: tuple[float, ...]) -> PoolState:
    return PoolState(
        mode="On",
        last_acceptance=MeasuredAcceptance(
            acceptance_length=1 + sum(memory), per_position=memory, at=NOW - timedelta(seconds=EVERY)
        ),
    )


def _spec_policy() -> PolicySpec:
    return speclike().policy


def test_a_shift_inside_the_window_is_judged_on_the_newest_interval_not_the_mix():
    """The strong drafter's acceptance drops to the weak one's at 96 running per replica: the first
    window after the shift holds a quarter of weak drafts. Judged on that mix, K=3 still looks fine and
    the pool is retuned to K=1 one evaluation later and turned off after (two rollouts, measured on
    the acceptance-shift benchmark); judged on the newest interval it turns off at once."""
    strong, weak = STRONG[:3], WEAK[:3]
    state = _moving_state(strong)
    ob = replace(obs(96, _mixed(strong, weak, 0.25)), drafts_in_window=200_000)
    d = one(_spec_policy(), state, ob)
    assert (d.flip, d.target) == (True, "Off"), d
    assert "acceptanceMoving" in d.observations
    # What it remembers is the window's own measurement, not the extrapolation.
    assert d.acceptance is not None
    assert d.acceptance.per_position[0] == pytest.approx(ob.per_position[0])
    # Over the window's own (mixed) acceptance the same pool holds its K=3.
    steady = PoolState(mode="On")
    held = one(_spec_policy(), steady, ob)
    assert (held.changes, held.reason) == (False, "GoodputWithinMargin"), held


def test_sampling_noise_and_small_drifts_are_not_a_moving_window():
    # A window that moved within sampling noise (few drafts) or by less than twice the margin of its
    # value (many drafts): the pool is judged on the window as before.
    published = PUBLISHED[:3]
    state = _moving_state(published)
    noisy = replace(obs(96, (0.60, 0.33, 0.16)), drafts_in_window=200)
    assert "acceptanceMoving" not in one(_spec_policy(), state, noisy).observations
    drift = replace(obs(96, (0.665, 0.38, 0.195)), drafts_in_window=200_000)
    assert "acceptanceMoving" not in one(_spec_policy(), state, drift).observations
    # A memory older than the last evaluation is no baseline for a move.
    stale = PoolState(
        mode="On",
        last_acceptance=MeasuredAcceptance(
            acceptance_length=1 + sum(STRONG[:3]), per_position=STRONG[:3], at=NOW - timedelta(seconds=600)
        ),
    )
    moved = replace(obs(96, _mixed(STRONG[:3], WEAK[:3], 0.25)), drafts_in_window=200_000)
    assert "acceptanceMoving" not in one(_spec_policy(), stale, moved).observations
