"""The Goodput policy's Dynamic SD schedules (specfleet.policy.predict.dynamic_sd): made from the profile and the
measured acceptance, unmixed per position from vLLM's counters, and what they change in decide."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.policy import PolicySpec
from specfleet.api.semantics import engine_schedules
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.policy import PoolObservation, PoolState, decide
from specfleet.policy.decision.record import record
from specfleet.policy.inputs.observation import PoolRolloutState
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.inputs.status import pool_states, schedule_rows
from specfleet.policy.predict.dynamic_sd import (
    IN_ENGINE_K0_PENALTY,
    MAX_BATCH,
    best_schedule,
    k_at,
    observed_under_schedule,
    schedule_speedup,
    unmix,
)
from specfleet.policy.rules.results import PoolDecision
from specfleet_runtime.cost_profile import default_profile, speedup
from support.policy_harness import example_spec

# Who should scrape the pools (named only when Prometheus does not scrape a pool's Ready pods).
SCRAPE = ScrapeSetup("default", "llama", pod_monitor=False, scrape_annotations=True)
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PROFILE = default_profile()
GOODPUT = PolicySpec.model_validate({"mode": "Goodput"})
PUBLISHED = (0.68, 0.39, 0.2)
WEAK = (0.3, 0.1, 0.03)


def observation(load: float, per_position: tuple[float, ...], mean_draft: float = 3.0) -> PoolObservation:
    accepted = sum(per_position)
    return PoolObservation(
        pool="latency",
        at=NOW,
        acceptance_length=1 + accepted,
        per_position=per_position,
        draft_acceptance_rate=accepted / mean_draft,
        acceptance_source="pool",
        running_per_replica=load,
        replicas_reporting=2,
        drafts_in_window=1000,
    )


def test_schedule_drafts_the_best_k_per_batch_size_and_nothing_past_the_k0_penalty():
    schedule = best_schedule(PROFILE, PUBLISHED, 3)
    assert [k for _, _, k in schedule] == [3, 1, 0]
    assert schedule[0][0] == 1
    assert schedule[-1][1] == MAX_BATCH
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(schedule))
    (_, end3, _), (_, end1, _), _ = schedule
    # K 3 up to where K 1 overtakes it; K 1 until it falls below what K 0 costs inside the engine.
    assert speedup(PROFILE, end3, 3, PUBLISHED) >= speedup(PROFILE, end3, 1, PUBLISHED)
    assert speedup(PROFILE, end3 + 1, 1, PUBLISHED) > speedup(PROFILE, end3 + 1, 3, PUBLISHED)
    assert speedup(PROFILE, end1, 1, PUBLISHED) >= 1 - IN_ENGINE_K0_PENALTY
    assert speedup(PROFILE, end1 + 1, 1, PUBLISHED) < 1 - IN_ENGINE_K0_PENALTY
    assert schedule_speedup(PROFILE, 2 * end1, schedule, PUBLISHED) == pytest.approx(1 - IN_ENGINE_K0_PENALTY)
    assert k_at(schedule, 1) == 3
    assert k_at(schedule, 10**6) == 0


def test_a_weak_drafter_schedule_drafts_one_token_then_none():
    schedule = best_schedule(PROFILE, WEAK, 3)
    assert [k for _, _, k in schedule] == [1, 0]


def test_schedule_ignores_the_last_digits_of_a_measurement():
    assert best_schedule(PROFILE, (0.681, 0.392, 0.201), 3) == best_schedule(
        PROFILE, (0.679, 0.388, 0.199), 3
    )


def test_unmix_recovers_per_position_acceptance_from_a_mix_of_two_draft_lengths():
    true = (0.7, 0.4, 0.2)
    short, long = 600.0, 400.0  # drafts of K 1 and of K 3 in the window
    drafts = short + long
    per_draft = (true[0], long * true[1] / drafts, long * true[2] / drafts)  # what vLLM's ratios give
    accepted = short * true[0] + long * sum(true)
    draft_tokens = short * 1 + long * 3
    got = unmix(per_draft, 1 + accepted / drafts, accepted / draft_tokens, drafts, ((1, 40, 3), (41, 99, 1)))
    assert got == pytest.approx(true)


def test_unmix_leaves_deeper_positions_unmeasured_without_enough_long_drafts():
    schedule = ((1, 40, 3), (41, 99, 1), (100, MAX_BATCH, 0))
    # Every draft in the window was a K 1 draft: deeper positions read 0 but were never drafted.
    assert unmix((0.7, 0.0, 0.0), 1.7, 0.7, 5000, schedule) == (0.7,)
    # One K throughout: nothing to unmix.
    assert unmix((0.7, 0.4, 0.2), 2.3, 1.3 / 3, 5000, ((1, MAX_BATCH, 3),)) == (0.7, 0.4, 0.2)


def test_only_a_pool_following_a_schedule_is_unmixed():
    ob = observation(150, (0.7, 0.0, 0.0), mean_draft=1.0)
    schedule = best_schedule(PROFILE, PUBLISHED, 3)
    assert observed_under_schedule(ob, PoolState(mode="On", schedule=schedule), True).per_position == (0.7,)
    assert observed_under_schedule(ob, PoolState(mode="On"), True) is ob
    assert observed_under_schedule(ob, PoolState(mode="On", schedule=schedule), False) is ob


def test_a_pool_following_its_schedule_is_not_retuned_as_load_moves():
    schedule = best_schedule(PROFILE, PUBLISHED, 3)
    state = PoolState(mode="On", k=3, schedule=schedule)
    for load in (2.0, 30.0, 80.0, 160.0):
        d = decide(
            GOODPUT, 3, {"latency": state}, {"latency": observation(load, PUBLISHED)}, NOW, PROFILE, True
        )[0]
        assert not d.changes, (load, d.reason, d.message)
    # The same pool drafting a fixed K 3 (no schedule) is retuned at 80 (a rollout).
    fixed = PoolState(mode="On", k=3)
    d = decide(GOODPUT, 3, {"latency": fixed}, {"latency": observation(80, PUBLISHED)}, NOW, PROFILE)[0]
    assert (d.reason, d.target_k) == ("GoodputRetune", 1)


def test_a_new_acceptance_gives_the_pool_a_new_schedule():
    state = PoolState(mode="On", k=3, schedule=best_schedule(PROFILE, PUBLISHED, 3))
    # At 30 running the published schedule drafts 3; the drafter got weak (all drafts still K 3).
    d = decide(GOODPUT, 3, {"latency": state}, {"latency": observation(30, WEAK)}, NOW, PROFILE, True)[0]
    assert d.reason == "GoodputRetune"
    assert not d.flip
    assert d.target_schedule == best_schedule(PROFILE, WEAK, 3)
    assert d.target_k == 1


def test_a_projected_spike_does_not_turn_off_a_pool_that_follows_a_schedule():
    # Load rising steeply: 140 running per replica measured (K 1 still pays 1.06x there), projected
    # past 220 (where it does not). A fixed-K pool turns off; a scheduled one only drafts less.
    recent = tuple((NOW - timedelta(seconds=30 * (3 - i)), v) for i, v in enumerate((0.0, 10.0, 60.0)))
    ob = observation(140, PUBLISHED)
    fixed = decide(
        GOODPUT, 3, {"latency": PoolState(mode="On", k=1, recent_load=recent)}, {"latency": ob}, NOW, PROFILE
    )
    assert (fixed[0].reason, fixed[0].target) == ("GoodputBelowBreakEven", "Off")
    scheduled = PoolState(mode="On", k=3, recent_load=recent, schedule=best_schedule(PROFILE, PUBLISHED, 3))
    d = decide(GOODPUT, 3, {"latency": scheduled}, {"latency": ob}, NOW, PROFILE, True)[0]
    assert d.target == "On"
    assert not d.changes
    assert "not near break-even" in d.message
    # Measured past break-even, it turns off like any pool.
    far = decide(
        GOODPUT, 3, {"latency": scheduled}, {"latency": observation(260, PUBLISHED)}, NOW, PROFILE, True
    )[0]
    assert far.target == "Off"


def test_turning_on_starts_with_a_schedule_and_turning_off_records_none():
    off = PoolState(mode="Off", k=1)
    ob = observation(5, PUBLISHED)
    d = decide(GOODPUT, 3, {"latency": off}, {"latency": ob}, NOW, PROFILE, True)[0]
    assert d.target == "On"
    assert d.target_k == 3
    assert d.target_schedule == best_schedule(PROFILE, PUBLISHED, 3)


@pytest.mark.parametrize(
    ("image", "goodput", "schedule", "expected"),
    [
        ("vllm/vllm-openai:v0.32.0", {}, None, True),
        ("vllm/vllm-openai:v0.31.0", {}, None, False),
        ("registry.local/my-vllm:latest", {}, None, False),
        ("registry.local/my-vllm:latest", {"engineSchedule": True}, None, True),
        ("vllm/vllm-openai:v0.32.0", {"engineSchedule": False}, None, False),
        # The user's own schedule wins.
        (
            "vllm/vllm-openai:v0.32.0",
            {},
            [{"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 3}],
            False,
        ),
    ],
)
def test_engine_schedules_where_the_engine_has_dynamic_sd(image, goodput, schedule, expected):
    doc = example_spec(mode="Goodput", goodput=goodput)
    doc["engine"] = {**doc.get("engine", {}), "image": image}
    if schedule:
        doc["drafter"]["dynamicSchedule"] = schedule
    assert engine_schedules(SpeculativeDeploymentSpec.model_validate(doc)) is expected
    threshold = {**doc, "policy": {**doc["policy"], "mode": "Threshold"}}
    assert engine_schedules(SpeculativeDeploymentSpec.model_validate(threshold)) is False


def test_a_schedule_change_that_never_settles_is_reverted_to_the_schedule_before():
    before = best_schedule(PROFILE, PUBLISHED, 3)
    after = best_schedule(PROFILE, WEAK, 3)
    started = NOW - timedelta(seconds=GOODPUT.rollout_deadline_seconds + 30)
    state = PoolState(
        mode="On",
        k=1,
        schedule=after,
        settled=False,
        rollout=PoolRolloutState(
            at=started, reason="GoodputRetune", from_mode="On", from_k=3, from_schedule=before
        ),
    )
    d = decide(GOODPUT, 3, {"latency": state}, {"latency": observation(30, WEAK)}, NOW, PROFILE, True)[0]
    assert d.reason == "RolloutFailed"
    assert (d.target_k, d.target_schedule) == (3, before)
    # A pool that had no schedule before gets none back (an empty schedule clears it).
    first = PoolRolloutState(at=started, reason="GoodputRetune", from_mode="On", from_k=3)
    d = decide(
        GOODPUT,
        3,
        {"latency": PoolState(mode="On", k=1, schedule=after, settled=False, rollout=first)},
        {"latency": observation(30, WEAK)},
        NOW,
        PROFILE,
        True,
    )[0]
    assert d.target_schedule == ()


def test_record_keeps_the_schedule_in_status_and_drops_it_when_the_pool_turns_off():
    spec = SpeculativeDeploymentSpec.model_validate(example_spec(mode="Goodput"))
    status = SpeculativeDeploymentStatus()
    schedule = best_schedule(PROFILE, PUBLISHED, 3)
    on = PoolDecision(
        "latency", "On", "On", False, "GoodputRetune", "new schedule", current_k=3, target_schedule=schedule
    )
    ob = observation(80, PUBLISHED)
    status = record(status, [on], {"latency": ob}, 1, NOW, SCRAPE, window_seconds=60).status
    assert schedule_rows(status.pools.latency.dynamic_schedule) == schedule
    assert pool_states(spec, status, NOW)["latency"].schedule == schedule
    off = PoolDecision("latency", "On", "Off", True, "GoodputBelowBreakEven", "far", current_k=3, target_k=1)
    later = NOW + timedelta(minutes=10)
    status = record(
        status, [off], {"latency": replace(ob, at=later)}, 1, later, SCRAPE, window_seconds=60
    ).status
    assert status.pools.latency.dynamic_schedule is None
    assert schedule_rows(status.pools.latency.rollout.from_dynamic_schedule) == schedule
    assert status.history[-1].observations["dynamicSchedule"].endswith("->none")
