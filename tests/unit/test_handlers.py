"""The Kopf registry the CLI builds: settings arrive explicitly, nothing holds a thread per resource,
and nothing puts a finalizer on resources (deleting one must never wait for the operator)."""

from __future__ import annotations

import inspect
import logging
import threading
from typing import Any

import kopf

from specfleet.controller.handlers import OperatorConfig, build_registry
from specfleet.controller.resync import ResyncScheduler


def test_no_daemon_no_timer_and_no_handler_that_needs_a_finalizer():
    registry = build_registry(OperatorConfig())
    # Daemons hold a task for each resource's life; timers and daemons both require Kopf's finalizer.
    assert registry._spawning.get_all_handlers() == []
    assert not any(h.requires_finalizer for h in registry._changing.get_all_handlers())
    # The event feed is a coroutine: it never takes one of Kopf's sync workers.
    assert all(inspect.iscoroutinefunction(h.fn) for h in registry._watching.get_all_handlers())
    assert {h.id for h in registry._changing.get_all_handlers()} == {"on_change"}


def test_each_registry_is_its_own():
    a = build_registry(OperatorConfig(resync_seconds=3))
    assert a is not kopf.get_default_registry()
    assert a is not build_registry(OperatorConfig(resync_seconds=9))


def _body(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}}


def test_resyncs_are_due_one_interval_after_tracking_and_never_queued_twice():
    now = [100.0]
    started, release = [], threading.Event()

    def reconcile(body: Any) -> None:
        started.append(body["metadata"]["name"])
        release.wait(5)

    resyncs = ResyncScheduler(30, reconcile, workers=2, clock=lambda: now[0])
    try:
        resyncs.track(_body("a"))
        assert resyncs.submit_due() == 0
        now[0] += 30
        resyncs.track(_body("b"))  # tracked later: due later
        assert resyncs.submit_due() == 1
        now[0] += 30
        # "a" is still running (blocked): it is not queued again; "b" is due now.
        assert resyncs.submit_due() == 1
        release.set()
        resyncs.forget("ns", "a")
        now[0] += 60
        for _ in range(500):  # wait (bounded) until the released runs have finished
            if not resyncs._running:
                break
            threading.Event().wait(0.01)
        assert resyncs.submit_due() == 1  # only "b" is left
        assert resyncs.tracked() == 1
    finally:
        release.set()
        resyncs.stop()
    assert started[:2] == ["a", "b"]


def test_each_finished_resync_logs_one_line_that_tests_count_for_that_resource_only(tmp_path):
    """The cluster tier waits for N resyncs of one resource by counting this line in the operator log."""
    from specfleet.controller.control import Outcome
    from specfleet.controller.handlers import _resync
    from specfleet.controller.logs import JsonFormatter
    from specfleet_sandbox.processes import OperatorProcess
    from support.operator_log import resyncs

    class Controller:
        def reconcile_object(self, namespace: str, name: str) -> Outcome:
            return Outcome()

    memo = kopf.Memo(controller=Controller(), emit=lambda body, outcome: None)
    log_path = tmp_path / "operator.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(JsonFormatter())
    handlers_logger = logging.getLogger("specfleet.controller.handlers")
    handlers_logger.addHandler(handler)
    level = handlers_logger.level
    handlers_logger.setLevel(logging.DEBUG)
    try:
        for name in ("a", "a-b", "a"):
            _resync(memo, _body(name))
    finally:
        handlers_logger.removeHandler(handler)
        handlers_logger.setLevel(level)
        handler.close()
    operator = OperatorProcess(tmp_path / "kubeconfig", log_path)
    assert resyncs(operator, "ns", "a") == 2
    assert resyncs(operator, "ns", "a-b") == 1
    assert resyncs(operator, "other", "a") == 0
