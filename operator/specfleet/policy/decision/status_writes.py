"""Which parts of status are the policy's running measurements, and when they are worth a write (pure).

Every evaluation measures each Auto pool again (its load, tokens/s, acceptance) and keeps a load sample
for the trend. Writing all of that at every evaluation makes every resource under evaluation a status
write per interval: 500 resources at 30 s are 17 writes a second, each a watch event for every operator
replica and GitOps tool. So the operator keeps the latest measurements in memory and writes them only
when a number status shows has moved beyond noise and the last such write is a few evaluations old; anything else
the policy records (a flip, a retune, a condition, the history) is written at once, carrying the
measurements along. A restarted operator starts from the last written measurements: the trend
samples it lacks only make its first projections flatter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specfleet.api.constants import POOLS
from specfleet.api.status import SpeculativeDeploymentStatus

# What the policy measures at every evaluation (PoolStatus attributes).
MEASUREMENT_FIELDS = (
    "running_per_replica",
    "generation_tokens_per_second",
    "recent_load",
    "recent_tokens_per_second",
    "acceptance_length",
    "per_position_acceptance",
    "acceptance_measured_at",
    "per_position_measured_at",
    # Derived from the acceptance measured now (policy/rules/drift.py): they move with it.
    "acceptance_drift_percent",
    "acceptance_compared_length",
    # The windows the acceptance baseline is being taken from (one per window until it is set; the
    # baseline itself is written when set). A restart starts collecting again.
    "acceptance_baseline_samples",
    # The policy's check on its prediction (policy/rules/realized_guard.py): one sample per window; the
    # flip it asks for is written at once and carries it. A restart starts its streak again.
    "realized_check",
    # Pools with an SLO: the share of requests within it over the window.
    "slo_attainment_percent",
    "ttft_attainment_percent",
    "tpot_attainment_percent",
)
# The measured numbers themselves: a change in one of these is worth showing in status (eventually).
# Times and the trend samples change at every evaluation and are kept in memory between writes.
SHOWN_FIELDS = (
    "running_per_replica",
    "generation_tokens_per_second",
    "acceptance_length",
    "per_position_acceptance",
    "slo_attainment_percent",
    "ttft_attainment_percent",
    "tpot_attainment_percent",
)
# Percents of requests within an SLO move by points, not by a fraction of themselves: 95 against 99.5
# is whether the objective holds.
PERCENT_FIELDS = ("slo_attainment_percent", "ttft_attainment_percent", "tpot_attainment_percent")
CHANGE_POINTS = 0.5
# Measurements alone are written at most once per this many evaluation intervals.
MEASUREMENT_WRITE_EVALUATIONS = 4
# A shown number has moved when it changed by more than this fraction of itself (and this much at
# least): rates computed over a window jitter in their last digits from one evaluation to the next.
CHANGE_FRACTION = 0.05
CHANGE_FLOOR = 0.01

Measurements = Mapping[str, Mapping[str, Any]]  # pool -> {PoolStatus attribute: value}


def measurements(status: SpeculativeDeploymentStatus) -> dict[str, dict[str, Any]]:
    """Each pool's measurement fields as they are in `status`."""
    return {
        pool: {name: getattr(getattr(status.pools, pool), name) for name in MEASUREMENT_FIELDS}
        for pool in POOLS
    }


def with_measurements(
    status: SpeculativeDeploymentStatus, measured: Measurements
) -> SpeculativeDeploymentStatus:
    """`status` with each pool's measurement fields replaced by `measured` (newer, from memory)."""
    pools = status.pools.model_copy()
    for pool, values in measured.items():
        setattr(pools, pool, getattr(pools, pool).model_copy(update=dict(values)))
    return status.model_copy(update={"pools": pools})


def _without(status: SpeculativeDeploymentStatus, names: tuple[str, ...]) -> dict[str, Any]:
    blank: dict[str, dict[str, Any]] = {pool: dict.fromkeys(names) for pool in POOLS}
    return with_measurements(status, blank).to_wire()


def only_measurements_differ(old: SpeculativeDeploymentStatus, new: SpeculativeDeploymentStatus) -> bool:
    """True when `new` differs from `old` in nothing but measurement fields (or not at all)."""
    return _without(old, MEASUREMENT_FIELDS) == _without(new, MEASUREMENT_FIELDS)


def _numbers(text: Any) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(part) for part in str(text).split(",")]
    except ValueError:
        return None


def _moved(old: Any, new: Any, *, percent: bool = False) -> bool:
    """A shown value (a number, or comma-separated numbers, as text) moved by more than noise
    (`percent`: by more than CHANGE_POINTS)."""
    a, b = _numbers(old), _numbers(new)
    if a is None or b is None or len(a) != len(b):
        return bool(old != new)
    return any(
        abs(x - y) > (CHANGE_POINTS if percent else max(CHANGE_FRACTION * max(abs(x), abs(y)), CHANGE_FLOOR))
        for x, y in zip(a, b, strict=True)
    )


def shown_numbers_differ(old: SpeculativeDeploymentStatus, new: SpeculativeDeploymentStatus) -> bool:
    """True when a measured number status shows has moved by more than noise (not only a time or a
    trend sample, not a jitter in the last digit of a rate)."""
    return any(
        _moved(
            getattr(getattr(old.pools, pool), name),
            getattr(getattr(new.pools, pool), name),
            percent=name in PERCENT_FIELDS,
        )
        for pool in POOLS
        for name in SHOWN_FIELDS
    )


def worth_writing(
    written: SpeculativeDeploymentStatus,
    new: SpeculativeDeploymentStatus,
    seconds_since_measurements_written: float | None,
    evaluation_interval_seconds: float,
) -> bool:
    """Should `new` be written over `written` (what the apiserver has)?

    Yes for any change beyond measurements; for measurements alone, only when a shown number changed
    and the last write of measurements (None: unknown, e.g. after a restart) is at least
    MEASUREMENT_WRITE_EVALUATIONS evaluation intervals old.
    """
    if not only_measurements_differ(written, new):
        return True
    if not shown_numbers_differ(written, new):
        return False
    if seconds_since_measurements_written is None:
        return True
    return seconds_since_measurements_written >= MEASUREMENT_WRITE_EVALUATIONS * evaluation_interval_seconds
