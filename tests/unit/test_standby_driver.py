"""The Standby driver: which resources it ticks, how often, and what it asks the flipper for each pool."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.api.constants import LABEL_POOL, LABEL_TRACK
from specfleet.controller.standby_driver import StandbyDriver, baseline_length
from specfleet.controller.standby_flips import Tick
from specfleet.reconcile.standby_flip import Step

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"


def resource(latency_flip: str = "Standby", mode: str = "Off", baseline: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"].update(namespace="ns", uid="u1")
    rollout = body["spec"]["pools"]["latency"].setdefault("rollout", {})
    rollout["flip"] = latency_flip
    if latency_flip == "Standby":
        rollout["standbyHostMemory"] = "20Gi"
    body["spec"]["pools"]["latency"]["speculation"] = "Auto"
    body["status"] = {"pools": {"latency": {"speculation": mode, "acceptanceBaseline": baseline}}}
    return body


class Flipper:
    """Records each tick and answers what the test says."""

    def __init__(self, settled: bool = True) -> None:
        self.calls: list[tuple[str, Mapping[str, str], str, str, float | None]] = []
        self.settled = settled

    def tick(
        self, namespace: str, selector: Mapping[str, str], desired: str, model: str, baseline: float | None
    ) -> Tick:
        self.calls.append((namespace, dict(selector), desired, model, baseline))
        steps = [] if self.settled else [Step("Wait", "pod-a", "Off")]  # type: ignore[arg-type]
        return Tick(steps=steps, settled=self.settled)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def driver(flipper: Flipper, clock: Clock, seen: list[Any]) -> StandbyDriver:
    return StandbyDriver(
        flipper,  # type: ignore[arg-type]
        lambda sd, pool, tick: seen.append((sd.name, pool, tick)),
        busy_seconds=1.0,
        idle_seconds=30.0,
        clock=clock,
    )


def test_only_resources_with_a_standby_pool_are_ticked_for_the_decided_mode() -> None:
    flipper, clock, seen = Flipper(), Clock(), []
    d = driver(flipper, clock, seen)
    d.track(resource(latency_flip="Restart"))
    assert d.run_once() == 30.0
    assert flipper.calls == []
    d.track(resource(mode="On", baseline="0.7,0.4,0.2,0.1"))
    d.run_once()
    ((namespace, selector, desired, model, baseline),) = flipper.calls
    assert (namespace, desired) == ("ns", "On")
    assert selector[LABEL_POOL] == "latency"
    assert selector[LABEL_TRACK] == "stable"
    assert model == resource()["spec"]["model"].get("servedModelName", resource()["metadata"]["name"])
    # The baseline at the drafter's K (3 in the example): 1 + 0.7 + 0.4 + 0.2.
    assert baseline == pytest.approx(1 + 0.7 + 0.4 + 0.2)
    assert seen == []  # a settled pool with nothing done is not reported


def test_a_pool_mid_flip_is_ticked_at_the_busy_pace_then_the_idle_one() -> None:
    flipper, clock, seen = Flipper(settled=False), Clock(), []
    d = driver(flipper, clock, seen)
    d.track(resource())
    assert d.run_once() == 1.0
    assert len(seen) == 1
    clock.t += 0.5
    d.run_once()
    assert len(flipper.calls) == 1  # not due yet
    clock.t += 0.5
    flipper.settled = True
    assert d.run_once() == 30.0
    assert len(flipper.calls) == 2
    # A watch event (a decision written to status) makes it due at once.
    d.track(resource(mode="On"))
    d.run_once()
    assert len(flipper.calls) == 3
    d.forget("ns", resource()["metadata"]["name"])
    clock.t += 60
    d.run_once()
    assert len(flipper.calls) == 3


def test_a_flipper_error_is_logged_and_retried_at_the_busy_pace() -> None:
    class Broken(Flipper):
        def tick(self, *args: Any) -> Tick:
            raise OSError("apiserver unreachable")

    d = driver(Broken(), Clock(), [])
    d.track(resource())
    assert d.run_once() == 1.0


def test_the_baseline_length_needs_a_baseline() -> None:
    from specfleet.api.status import PoolStatus

    assert baseline_length(PoolStatus(), 3) is None
    assert baseline_length(PoolStatus(acceptance_baseline="0.5,0.25"), 3) == 1.75
