"""One thread that carries every Standby pool's flip through (`standby_flips.StandbyFlipper`).

A flip of a Standby pool changes no template, so no rollout carries it: the driver does, pod by pod.
The handlers tell it which resources exist (`track` on every watch event, so a decision's status write
wakes it at once); it ticks a resource every `busy_seconds` (half a second: each tick lists the pool's
pods and endpoint slices) while one of its Standby pools does not serve the decided mode, else every
`idle_seconds` (a pod added or restarted since starts serving without the drafter, and is flipped then). What each tick did goes to `on_tick` (status, events).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from specfleet.api.constants import LABEL_POOL, LABEL_TRACK, POOLS, PoolName
from specfleet.api.status import PoolStatus
from specfleet.api.validation import InvalidResourceError, SpeculativeDeployment, parse_resource
from specfleet.controller.standby_flips import StandbyFlipper, Tick
from specfleet.policy.rules.drift import acceptance_length, parse_vector
from specfleet.reconcile.desired import decided_plan
from specfleet.render.common import selector_labels
from specfleet.render.engine import ENGINE_COMPONENT

logger = logging.getLogger(__name__)

OnTick = Callable[[SpeculativeDeployment, PoolName, Tick], None]


def baseline_length(status: PoolStatus, k: int) -> float | None:
    """The pool's baseline acceptance length at K drafts (None: no baseline yet)."""
    per_position = parse_vector(status.acceptance_baseline)
    return acceptance_length(per_position, k) if per_position else None


def standby_pools(sd: SpeculativeDeployment) -> list[PoolName]:
    """The pools whose flips go by Standby."""
    return [p for p in POOLS if getattr(sd.spec.pools, p).rollout.flip == "Standby"]


@dataclass
class _Due:
    body: Mapping[str, Any]
    at: float


class StandbyDriver:
    """Ticks the Standby pools of every tracked resource (see the module docstring)."""

    def __init__(
        self,
        flipper: StandbyFlipper,
        on_tick: OnTick,
        busy_seconds: float = 0.5,
        idle_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flipper = flipper
        self.on_tick = on_tick
        self.busy_seconds, self.idle_seconds = busy_seconds, idle_seconds
        self.clock = clock
        self._due: dict[tuple[str, str], _Due] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def track(self, body: Mapping[str, Any]) -> None:
        """A resource as a watch event shows it: due now if it has Standby pools, else forgotten."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name", ""))
        flips = [((body.get("spec") or {}).get("pools") or {}).get(p) or {} for p in POOLS]
        with self._wake:
            if any((p.get("rollout") or {}).get("flip") == "Standby" for p in flips):
                self._due[key] = _Due(body, self.clock())
                self._wake.notify()
            else:
                self._due.pop(key, None)

    def forget(self, namespace: str, name: str) -> None:
        with self._wake:
            self._due.pop((namespace, name), None)

    def tick(self, body: Mapping[str, Any]) -> bool:
        """Tick each Standby pool of one resource once; whether every one serves its decided mode."""
        try:
            sd = parse_resource(body)
        except InvalidResourceError:
            return True
        plan = decided_plan(sd)
        done = True
        for pool in standby_pools(sd):
            if not plan[pool].standby:  # its engines could not sleep: it flips by restart
                continue
            selector = {
                **selector_labels(sd, ENGINE_COMPONENT, pool),
                LABEL_TRACK: "stable",
                LABEL_POOL: pool,
            }
            baseline = baseline_length(getattr(sd.status.pools, pool), sd.spec.drafter.num_speculative_tokens)
            tick = self.flipper.tick(sd.namespace, selector, plan[pool].mode, sd.served_model_name, baseline)
            if tick.steps or tick.finished or tick.reverted:
                self.on_tick(sd, pool, tick)
            done = done and tick.settled
        return done

    def run_once(self) -> float:
        """Tick every resource that is due; seconds until the next one is."""
        now = self.clock()
        with self._wake:
            due = [(k, d) for k, d in self._due.items() if d.at <= now]
        for key, entry in due:
            try:
                done = self.tick(entry.body)
            except Exception:  # an API or engine error: log it, try again at the busy pace
                logger.exception("standby flip of %s/%s failed; trying again", *key)
                done = False
            with self._wake:
                current = self._due.get(key)
                if current is entry:  # not replaced by a newer watch event meanwhile
                    entry.at = self.clock() + (self.idle_seconds if done else self.busy_seconds)
        with self._wake:
            nxt = min((d.at for d in self._due.values()), default=now + self.idle_seconds)
        return max(0.0, nxt - self.clock())

    def start(self) -> None:
        def loop() -> None:
            while True:
                wait = self.run_once()
                with self._wake:
                    if self._stopped:
                        return
                    self._wake.wait(timeout=wait)
                    if self._stopped:
                        return

        self._thread = threading.Thread(target=loop, name="standby-flips", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
