"""The operator's events, read from its log, for tests that assert something did not change.

Such a test waits until the operator has resynced the resource, or run policy sweeps, N more times:
the events that would have changed something, so the assertion proves the operator looked.
"""

from __future__ import annotations

import json

from specfleet.controller.handlers import RESYNCED_LOG
from specfleet_sandbox.processes import OperatorProcess, wait_for

# Logged (info) by the policy scheduler when a sweep has resources due.
SWEEP_STARTED = "policy sweep started"


def resyncs(operator: OperatorProcess, namespace: str, name: str) -> int:
    """Finished resyncs of one resource so far (the log is appended across restarts: all of them).

    The operator logs them at debug level, which `OperatorProcess` turns on by default (verbose)."""
    # The message as a JSON string, quotes included: "resynced ns/a" is not counted for "ns/a-b".
    return operator.log().count(json.dumps(RESYNCED_LOG % (namespace, name)))


def wait_resyncs(
    operator: OperatorProcess, namespace: str, name: str, count: int, timeout: float | None = None
) -> None:
    """Wait for `count` more resyncs of the resource, each finished with its writes and events."""
    start = resyncs(operator, namespace, name)
    wait_for(
        f"{count} more resyncs of {namespace}/{name}",
        lambda: resyncs(operator, namespace, name) >= start + count,
        timeout=timeout if timeout is not None else 30 + 3 * count * operator.resync_seconds,
        interval=0.2,
    )


def sweeps(operator: OperatorProcess) -> int:
    """Policy sweeps the operator started so far (its log is appended across restarts)."""
    return operator.log().count(SWEEP_STARTED)


def wait_sweeps(operator: OperatorProcess, count: int, timeout: float = 60) -> None:
    """Wait for `count` more policy sweeps: evaluations that would act if anything were due."""
    start = sweeps(operator)
    wait_for(f"{count} more policy sweeps", lambda: sweeps(operator) >= start + count, timeout=timeout)
