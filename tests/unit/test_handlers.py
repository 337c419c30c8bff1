"""The Kopf registry the CLI builds: settings arrive explicitly, and nothing holds a thread per resource."""

from __future__ import annotations

import inspect

import kopf

from specfleet.handlers import OperatorConfig, build_registry


def test_the_resync_interval_comes_from_the_config():
    registry = build_registry(OperatorConfig(resync_seconds=7))
    timers = registry._spawning.get_all_handlers()
    assert [(h.id, h.interval, h.initial_delay) for h in timers] == [("resync", 7, 7)]


def test_no_daemon_per_resource_and_no_blocking_handler_outside_the_worker_pools():
    registry = build_registry(OperatorConfig())
    spawning = registry._spawning.get_all_handlers()
    # Timers only: a daemon would hold a thread (sync) or a task for each resource's whole life.
    assert all(type(h).__name__ == "TimerHandler" for h in spawning)
    # The event feed and the resync are coroutines: neither takes one of Kopf's sync workers.
    assert all(inspect.iscoroutinefunction(h.fn) for h in registry._watching.get_all_handlers())
    assert all(inspect.iscoroutinefunction(h.fn) for h in spawning)
    assert {h.id for h in registry._changing.get_all_handlers()} == {"on_change"}


def test_each_registry_is_its_own():
    a, b = build_registry(OperatorConfig(resync_seconds=3)), build_registry(OperatorConfig(resync_seconds=9))
    assert a is not kopf.get_default_registry()
    assert [h.interval for h in a._spawning.get_all_handlers()] == [3]
    assert [h.interval for h in b._spawning.get_all_handlers()] == [9]
