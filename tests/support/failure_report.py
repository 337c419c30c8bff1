"""What a cluster test prints when it fails: its operators' logs and its namespace's events by time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from specfleet_sandbox.processes import OperatorProcess, events_by_time

# The printer columns of `kubectl get sd` (crds/), in order.
PRINTER_COLUMNS = [
    "NAME",
    "LATENCY",
    "BATCH",
    "K",
    "BATCH-K",
    "READY",
    "PROGRESSING",
    "ACCEPTANCE",
    "SLO",
    "AGE",
]


def print_if_failed(
    request: pytest.FixtureRequest,
    cluster: Any,
    operators: Mapping[str, OperatorProcess],
    namespace: str | None = None,
    log_chars: int = 20000,
) -> None:
    """After a fixture's test: if the test failed, each operator's log tail and the events of
    `namespace` (default: the test's own `namespace` argument), so the failure explains itself."""
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.failed:
        return
    for name, proc in operators.items():
        label = f"operator {name}".strip()
        print(f"\n===== {label} log (pid {proc.pid}) =====\n{proc.log()[-log_chars:]}")
    namespace = namespace or request.node.funcargs.get("namespace")
    if namespace:
        print(f"\n===== events in {namespace}, by time =====\n{events_by_time(cluster.kubectl, namespace)}")
