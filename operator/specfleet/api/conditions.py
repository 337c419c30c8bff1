"""Pure helpers for status conditions (Kubernetes API conventions).

`lastTransitionTime` changes only when a condition's status changes, so a resync that finds nothing
new writes nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

from specfleet.api.status import Condition

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
    previous = get_condition(conditions, type_)
    unchanged = previous is not None and previous.status == status
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=previous.last_transition_time if previous and unchanged else rfc3339(now),
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of that type, if present."""
    return next((c for c in conditions if c.type == type_), None)
