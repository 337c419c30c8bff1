"""Pure helpers for status conditions (Kubernetes API conventions).

`lastTransitionTime` changes only when a condition's status changes, so a resync that finds nothing
new writes nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

from specfleet.api.models import Condition

ConditionStatus = Literal["True", "False", "Unknown"]


def rfc3339(moment: datetime) -> str:
    """Kubernetes' time format: UTC, second precision, trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Condition],
    *,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
) -> list[Condition]:
    """A new list with `type_` set; other conditions kept in order; the transition time kept if unchanged."""
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        transition = cond.last_transition_time if cond.status == status else rfc3339(now)
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                observed_generation=generation,
                last_transition_time=transition,
            )
        )
    if not found:
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                observed_generation=generation,
                last_transition_time=rfc3339(now),
            )
        )
    return out


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of that type, if present."""
    return next((c for c in conditions if c.type == type_), None)
