"""Condition helper: API conventions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specfleet.api.conditions import get_condition, set_condition

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_new_condition_gets_now():
    out = set_condition([], type_="Ready", status="True", reason="R", message="m", generation=3, now=T0)
    assert out[0].last_transition_time == "2026-01-01T00:00:00Z"
    assert out[0].observed_generation == 3


def test_same_status_keeps_transition_time_but_updates_the_rest():
    first = set_condition([], type_="Ready", status="True", reason="A", message="m", generation=1, now=T0)
    later = set_condition(
        first,
        type_="Ready",
        status="True",
        reason="B",
        message="n",
        generation=2,
        now=T0 + timedelta(hours=1),
    )
    cond = get_condition(later, "Ready")
    assert cond is not None
    assert cond.last_transition_time == "2026-01-01T00:00:00Z"
    assert (cond.reason, cond.message, cond.observed_generation) == ("B", "n", 2)


def test_changed_status_moves_transition_time_and_keeps_order():
    conds = set_condition([], type_="Ready", status="True", reason="A", message="", generation=1, now=T0)
    conds = set_condition(
        conds, type_="Degraded", status="False", reason="A", message="", generation=1, now=T0
    )
    conds = set_condition(
        conds,
        type_="Ready",
        status="False",
        reason="B",
        message="",
        generation=1,
        now=T0 + timedelta(minutes=1),
    )
    assert [c.type for c in conds] == ["Ready", "Degraded"]
    assert conds[0].last_transition_time == "2026-01-01T00:01:00Z"
