"""What `specfleet status` shows of a SpeculativeDeployment: pure, from the object the API returns.

Per pool: its mode and K, replicas ready/desired, the last measured acceptance length, running
requests per replica, generated tokens per second, and the last decision with its reason and the
numbers behind it; then the recent flips and retunes, each with the speedup it predicted and the one
measured after it (status.history's `realized`); then the resource's conditions. `fleet_view` builds
the rows (no I/O, no terminal); `plain_lines` prints them for logs and CI, and the CLI draws the same
rows as a table when attached to a terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specfleet.api.constants import POOLS
from specfleet.policy.decision.realized import predicted_change

# The numbers a decision carries that a person reading a status line wants first.
_DECISION_NUMBERS = (
    "acceptanceLength",
    "runningPerReplica",
    "predictedSpeedup",
    "numSpeculativeTokens",
    "acceptanceSource",
)
# Flips and retunes listed with their predicted and realized speedups.
RECENT_CHANGES = 5
CHANGES_HEADING = "recent changes (speedup predicted, realized over a window after the rollout):"


@dataclass(frozen=True)
class PoolRow:
    """One pool of one resource, as text ready to print."""

    pool: str
    setting: str  # spec: On, Off or Auto
    mode: str  # what it runs now
    k: str
    replicas: str  # ready/desired
    acceptance: str
    running_per_replica: str
    tokens_per_second: str
    decision: str  # the last decision: time, change, reason, numbers


@dataclass(frozen=True)
class FleetView:
    """One resource."""

    namespace: str
    name: str
    generation: int
    observed_generation: int | None
    pools: tuple[PoolRow, ...]
    conditions: tuple[str, ...]  # "Type=Status (Reason): message"
    flips: int
    # The last flips and retunes, oldest first: time, pool, change, reason, predicted vs realized.
    changes: tuple[str, ...] = ()


def _text(value: Any, default: str = "-") -> str:
    return default if value is None or value == "" else str(value)


def _wanted(pool_spec: Mapping[str, Any], pool_status: Mapping[str, Any]) -> str:
    """Replicas asked for: the spec's, or an autoscaled pool's current count (with its range)."""
    scaling = pool_spec.get("autoscaling")
    if isinstance(scaling, Mapping):
        low, high = scaling.get("minReplicas", 1), scaling.get("maxReplicas", "?")
        return f"{pool_status.get('desiredReplicas', '?')} ({low}-{high})"
    return str(pool_spec.get("replicas", 1))


def _change(entry: Mapping[str, Any]) -> str:
    """`On->Off`, or `K 3->1` / `schedule` for a retune."""
    numbers = entry.get("observations") or {}
    if entry.get("from") != entry.get("to"):
        return f"{entry.get('from')}->{entry.get('to')}"
    if "numSpeculativeTokens" in numbers:
        return f"K {numbers['numSpeculativeTokens']}"
    return "schedule" if "dynamicSchedule" in numbers else ""


def _predicted_vs_realized(entry: Mapping[str, Any]) -> str:
    """The speedup a change predicted beside the one measured after it, with the throughput and the
    load of both windows (the load may have moved: a before/after ratio, not a controlled one). The
    prediction is the change's own (its throughput over the setting it left: `predictedChangeSpeedup`),
    where the decision recorded one, else speculation's over no drafter (`predictedSpeedup`, which for a
    flip off is the inverse of what the realized ratio measures)."""
    numbers = entry.get("observations") or {}
    predicted = _text(predicted_change(numbers))
    realized = entry.get("realized")
    if not isinstance(realized, Mapping):
        return f"predicted {predicted}, realized -"
    return (
        f"predicted {predicted}, realized {_text(realized.get('realizedSpeedup'))} "
        f"(tok/s per replica {_text(realized.get('tokensPerSecondPerReplicaBefore'))} -> "
        f"{_text(realized.get('tokensPerSecondPerReplicaAfter'))}, running per replica "
        f"{_text(realized.get('runningPerReplicaBefore'))} -> {_text(realized.get('runningPerReplicaAfter'))})"
    )


def _recent_changes(history: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    changes = [e for e in history if _change(e)][-RECENT_CHANGES:]
    return tuple(
        f"{e.get('time', '?')} {e.get('pool')} {_change(e)} {e.get('reason', '')}: {_predicted_vs_realized(e)}"
        for e in changes
    )


def _last_decision(history: Sequence[Mapping[str, Any]], pool: str, status: Mapping[str, Any]) -> str:
    for entry in reversed(history):
        if entry.get("pool") != pool:
            continue
        numbers = entry.get("observations") or {}
        shown_numbers = [f"{k}={numbers[k]}" for k in _DECISION_NUMBERS if k in numbers]
        realized = entry.get("realized")
        if isinstance(realized, Mapping) and realized.get("realizedSpeedup"):
            shown_numbers.append(f"realizedSpeedup={realized['realizedSpeedup']}")
        shown = ", ".join(shown_numbers)
        change = _change(entry) or f"{entry.get('from')}->{entry.get('to')}"
        return f"{entry.get('time', '?')} {change} {entry.get('reason', '')}" + (
            f" [{shown}]" if shown else ""
        )
    if status.get("reason"):
        return f"{status.get('reason')}: {status.get('message') or ''}".strip()
    return "-"


def fleet_view(obj: Mapping[str, Any]) -> FleetView:
    """The rows for one SpeculativeDeployment as the API returns it (defaults applied by the schema)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    drafter_k = (spec.get("drafter") or {}).get("numSpeculativeTokens")
    history = status.get("history") or []
    rows = []
    for pool in POOLS:
        pool_spec = (spec.get("pools") or {}).get(pool) or {}
        pool_status = (status.get("pools") or {}).get(pool) or {}
        setting = _text(pool_spec.get("speculation"), "Auto")
        mode = setting if setting in {"On", "Off"} else _text(pool_status.get("speculation"), "On")
        k = _text(pool_status.get("numSpeculativeTokens") or drafter_k) if mode == "On" else "-"
        rows.append(
            PoolRow(
                pool=pool,
                setting=setting,
                mode=mode,
                k=k,
                replicas=f"{pool_status.get('readyReplicas', 0)}/{_wanted(pool_spec, pool_status)}",
                acceptance=_text(pool_status.get("acceptanceLength")),
                running_per_replica=_text(pool_status.get("runningPerReplica")),
                tokens_per_second=_text(pool_status.get("generationTokensPerSecond")),
                decision=_last_decision(history, pool, pool_status),
            )
        )
    conditions = tuple(
        f"{c.get('type')}={c.get('status')} ({c.get('reason', '')})"
        + (f": {c['message']}" if c.get("message") else "")
        for c in status.get("conditions") or []
    )
    return FleetView(
        namespace=_text(meta.get("namespace"), "default"),
        name=_text(meta.get("name"), "?"),
        generation=int(meta.get("generation") or 0),
        observed_generation=status.get("observedGeneration"),
        pools=tuple(rows),
        conditions=conditions,
        flips=sum(1 for h in history if h.get("from") != h.get("to")),
        changes=_recent_changes(history),
    )


POOL_COLUMNS = ("POOL", "SPEC", "MODE", "K", "READY", "ACCEPT", "RUN/REPLICA", "TOK/S", "LAST DECISION")


def pool_cells(row: PoolRow) -> tuple[str, ...]:
    """A pool row's cells, in POOL_COLUMNS order."""
    return (
        row.pool,
        row.setting,
        row.mode,
        row.k,
        row.replicas,
        row.acceptance,
        row.running_per_replica,
        row.tokens_per_second,
        row.decision,
    )


def plain_lines(view: FleetView) -> list[str]:
    """The view as aligned plain text: a header line, one line per pool, one per condition."""
    cells = [POOL_COLUMNS, *(pool_cells(r) for r in view.pools)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(POOL_COLUMNS) - 1)]
    lines = [
        f"{view.namespace}/{view.name} (generation {view.generation}, observed "
        f"{_text(view.observed_generation)}, flips {view.flips})"
    ]
    for row in cells:
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        )
    if view.changes:
        lines.append(f"  {CHANGES_HEADING}")
        lines.extend(f"    {c}" for c in view.changes)
    lines.extend(f"  {c}" for c in view.conditions)
    return lines
