"""One evaluation sweeper for every resource: no thread, task or lock held per resource between runs.

The handlers tell it which resources exist (`track` on every watch event, `forget` on deletion). One
thread runs sweeps: each sweep takes the resources that are due (each keeps its own
`policy.evaluationIntervalSeconds`), groups them by Prometheus target, asks each target its fleet
queries once (targets in parallel, no per-object lock held), then decides and writes each resource
under its own lock only for that short step. Due times fall on multiples of each resource's interval
(on the monotonic clock), so every resource with the same interval is due in the same sweep and
shares its round of queries, however their creations were spread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specfleet.controller.control import (
    IDLE_RETRY_SECONDS,
    Controller,
    Outcome,
    PolicySchedule,
    PrometheusTarget,
    policy_schedule,
)
from specfleet.observe.prometheus import FleetAnswers

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)
# Called with the resource's body and what its evaluation did (events, counters, log lines).
EmitFn = Callable[[Mapping[str, Any], Outcome], None]

# A new resource is first evaluated this long after it is seen (its first reconcile goes first).
INITIAL_DELAY_SECONDS = 5.0
# The loop wakes at least this often to pick up new resources and stop requests.
TICK_SECONDS = 1.0
# Prometheus targets (distinct url, timeout, window) asked at the same time within one sweep, so one
# hung Prometheus delays only the resources that use it.
QUERY_WORKERS = 4
# Resources decided at the same time: each decision is mostly waiting on the apiserver (read, maybe a
# status write and events), so a few overlap those waits; the per-object locks keep each one serial.
DECIDE_WORKERS = 4


@dataclass
class _Tracked:
    body: Mapping[str, Any]
    schedule: PolicySchedule
    due: float


@dataclass
class SweepReport:
    """What one sweep did (logged, exported as metrics, read by tests and the benchmark)."""

    evaluated: int = 0
    targets: int = 0
    failed: int = 0
    seconds: float = 0.0
    outcomes: dict[Key, Outcome] = field(default_factory=dict)


def _on_grid(earliest: float, period: float) -> float:
    """The first multiple of `period` at or after `earliest`: resources sharing a period share sweeps."""
    return math.ceil(earliest / period) * period if period > 0 else earliest


class EvaluationSweeper:
    """Evaluates every tracked resource's policy when it is due, all of them in shared sweeps."""

    def __init__(
        self,
        controller: Controller,
        emit: EmitFn,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        initial_delay_seconds: float = INITIAL_DELAY_SECONDS,
        query_workers: int = QUERY_WORKERS,
        decide_workers: int = DECIDE_WORKERS,
    ) -> None:
        self.controller = controller
        self.emit = emit
        self.monotonic = monotonic
        self.initial_delay_seconds = initial_delay_seconds
        self._tracked: dict[Key, _Tracked] = {}
        self._guard = threading.Lock()
        self._queries = ThreadPoolExecutor(max_workers=query_workers, thread_name_prefix="prometheus")
        self._decisions = ThreadPoolExecutor(max_workers=decide_workers, thread_name_prefix="policy")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # --- what the handlers call -------------------------------------------------------------------

    def track(self, body: Mapping[str, Any]) -> None:
        """Remember (or refresh) a resource from a watch event; new ones are due after the delay."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta["name"])
        schedule = policy_schedule(body)
        with self._guard:
            tracked = self._tracked.get(key)
            if tracked is None:
                due = _on_grid(self.monotonic() + self.initial_delay_seconds, schedule.interval_seconds)
                self._tracked[key] = _Tracked(body, schedule, due)
            else:
                tracked.body, tracked.schedule = body, schedule

    def forget(self, namespace: str, name: str) -> None:
        with self._guard:
            self._tracked.pop((namespace, name), None)
        self.controller.forget(namespace, name)

    def tracked(self) -> int:
        with self._guard:
            return len(self._tracked)

    # --- the loop ---------------------------------------------------------------------------------

    def _due(self, now: float) -> dict[Key, _Tracked]:
        with self._guard:
            return {key: t for key, t in self._tracked.items() if t.due <= now}

    def _reschedule(self, key: Key, seconds: float, since: float | None = None) -> None:
        """Due again about `seconds` (at least half of it) after `since` (default now), on the grid of
        that period; 0: now. Counting from the sweep's start keeps everything one sweep evaluated on
        the same next instant, however long the sweep took."""
        now = self.monotonic() if since is None else since
        due = now if seconds <= 0 else _on_grid(now + seconds / 2, seconds)
        with self._guard:
            tracked = self._tracked.get(key)
            if tracked is not None:
                tracked.due = due

    def sweep(self) -> SweepReport:
        """Evaluate every resource that is due now, one round of queries per Prometheus target."""
        started = self.monotonic()
        report = SweepReport()
        due = self._due(started)
        if due:
            logger.info("policy sweep started: %d resources due", len(due))
        groups: dict[PrometheusTarget, list[tuple[Key, Mapping[str, Any]]]] = {}
        for key, tracked in due.items():
            target = tracked.schedule.target
            if target is None:
                self._reschedule(key, tracked.schedule.interval_seconds, started)
                continue
            groups.setdefault(target, []).append((key, tracked.body))
        report.targets = len(groups)
        now = self.controller.clock()
        futures: dict[Future[FleetAnswers], PrometheusTarget] = {
            # Each round asks only about the namespaces of the resources it serves.
            self._queries.submit(
                self.controller.observe_target, target, {key[0] for key, _ in members}
            ): target
            for target, members in groups.items()
        }
        for future in as_completed(futures):
            target = futures[future]
            try:
                answers = future.result()
            except Exception as err:  # a bug in building answers must not stop every other target
                logger.exception("fleet queries against %s failed", target.url)
                answers = FleetAnswers(error=f"{type(err).__name__}: {err}")
            decisions = {
                self._decisions.submit(self._decide, key, body, target, answers, now, started): key
                for key, body in groups[target]
            }
            for decided in as_completed(decisions):
                report.evaluated += 1
                outcome = decided.result()
                if outcome is None:
                    report.failed += 1
                else:
                    report.outcomes[decisions[decided]] = outcome
        report.seconds = self.monotonic() - started
        return report

    def _decide(
        self,
        key: Key,
        body: Mapping[str, Any],
        target: PrometheusTarget,
        answers: FleetAnswers,
        now: datetime,
        sweep_started: float,
    ) -> Outcome | None:
        """One resource's decision, rescheduled and emitted; None when it failed (retried soon)."""
        try:
            outcome = self.controller.decide_policy(key[0], key[1], target, answers, now)
        except Exception as err:  # an API error on one resource: retry it, go on with the rest
            logger.warning("policy evaluation of %s/%s failed, retrying: %s", *key, err)
            self._reschedule(key, min(IDLE_RETRY_SECONDS, self._interval(key)), sweep_started)
            return None
        self._reschedule(key, outcome.next_seconds, sweep_started)
        self.emit(body, outcome)
        return outcome

    def _interval(self, key: Key) -> float:
        with self._guard:
            tracked = self._tracked.get(key)
            return tracked.schedule.interval_seconds if tracked is not None else IDLE_RETRY_SECONDS

    def _next_wake(self) -> float:
        with self._guard:
            earliest = min((t.due for t in self._tracked.values()), default=None)
        if earliest is None:
            return TICK_SECONDS
        return max(0.0, min(TICK_SECONDS, earliest - self.monotonic()))

    def run(self, on_sweep: Callable[[SweepReport], None] | None = None) -> None:
        """Sweep until `stop()`; one failing sweep is logged and the loop goes on."""
        while not self._stop.is_set():
            try:
                report = self.sweep()
                if report.evaluated and on_sweep is not None:
                    on_sweep(report)
            except Exception:
                logger.exception("policy sweep failed")
                self._stop.wait(TICK_SECONDS)
            self._stop.wait(self._next_wake())

    def start(self, on_sweep: Callable[[SweepReport], None] | None = None) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run, args=(on_sweep,), name="policy-scheduler", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._queries.shutdown(wait=False, cancel_futures=True)
        self._decisions.shutdown(wait=False, cancel_futures=True)
