"""The cost profile a resource's policy decides with: the default, or the ConfigMap its spec names.

`policy.goodput.costProfileConfigMap` names a ConfigMap in the resource's namespace holding a
step-time profile under `PROFILE_KEY` (what `specfleet profile --config-map NAME` and its Job write).
The operator reads the ConfigMap at the edge (`specfleet.controller.control`); everything here is pure: parsing
it into a `StepTimeProfile` with a message that says what is wrong, the decisions that hold every
pool while it is unusable, and the `CostProfileLoaded` condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import yaml

from specfleet.api import reasons as r
from specfleet.api.conditions import ConditionStatus, get_condition, set_condition
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet_runtime.cost_profile import StepTimeProfile

# Key of the profile in a cost-profile ConfigMap.
PROFILE_KEY = "profile.yaml"


class CostProfileError(ValueError):
    """The named ConfigMap is missing or does not hold a valid profile (the message says which)."""


def profile_from_config_map(
    config_map: Mapping[str, Any] | None, namespace: str, name: str
) -> StepTimeProfile:
    """The profile in the ConfigMap `namespace/name` as read from the API (None: it does not exist)."""
    where = f"ConfigMap {namespace}/{name} (policy.goodput.costProfileConfigMap)"
    if config_map is None:
        raise CostProfileError(
            f"{where} does not exist; create it with `specfleet profile --config-map {name}`"
        )
    data = config_map.get("data") or {}
    if not isinstance(data, Mapping) or PROFILE_KEY not in data:
        keys = ", ".join(sorted(str(k) for k in data)) if isinstance(data, Mapping) and data else "none"
        raise CostProfileError(f"{where} has no key {PROFILE_KEY!r} (keys: {keys})")
    try:
        doc = yaml.safe_load(data[PROFILE_KEY])
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise CostProfileError(f"{where}: {PROFILE_KEY} is not YAML{at}") from None
    if not isinstance(doc, Mapping):
        raise CostProfileError(f"{where}: {PROFILE_KEY} must hold a mapping, not {type(doc).__name__}")
    try:
        return StepTimeProfile.from_dict(doc)
    except (ValueError, TypeError, KeyError) as err:
        raise CostProfileError(f"{where}: invalid profile: {err}") from None


def profile_condition(
    status: SpeculativeDeploymentStatus,
    config_map: str | None,
    problem: str | None,
    generation: int,
    now: datetime,
) -> tuple[SpeculativeDeploymentStatus, list[tuple[str, str, str]]]:
    """`status` with the CostProfileLoaded condition, and the Events to emit (a Warning when it fails).

    Without a ConfigMap in the spec the condition is not added; one left from an earlier spec says
    the default profile is in use again.
    """
    previous = get_condition(status.conditions, r.COST_PROFILE_LOADED)
    events: list[tuple[str, str, str]] = []
    value: ConditionStatus
    if config_map is None:
        if previous is None:
            return status, events
        value, reason, message = (
            "True",
            r.COST_PROFILE_DEFAULT,
            "no costProfileConfigMap: the published profile",
        )
    elif problem is not None:
        value, reason, message = "False", r.COST_PROFILE_UNAVAILABLE, f"{problem} (holding every pool)"
        if previous is None or previous.status != "False" or previous.message != message:
            events.append(("Warning", r.EVENT_COST_PROFILE_UNAVAILABLE, message))
    else:
        value, reason, message = (
            "True",
            r.COST_PROFILE_FROM_CONFIG_MAP,
            f"profile from ConfigMap {config_map}",
        )
    conditions = set_condition(
        status.conditions,
        type_=r.COST_PROFILE_LOADED,
        status=value,
        reason=reason,
        message=message,
        generation=generation,
        now=now,
    )
    return status.model_copy(update={"conditions": conditions}), events
