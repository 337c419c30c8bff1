"""The operator's two loops over resources, serialised per object, with I/O behind seams.

`reconcile_object` (create/update/resume/timer) re-reads one object, reconciles it and writes status
under that object's lock. The policy works in two steps so that no lock is held while Prometheus is
asked: `observe_target` runs one round of fleet queries for every resource that shares a Prometheus
target (no lock), then `decide_policy` re-reads one object, evaluates it on those answers (the pure
`specfleet.policy.decision.evaluation`, which the simulator calls too), starts retrain Jobs, rolls out a flip and
writes status under the object's lock, so a policy flip and a resync can never interleave and undo
each other. The evaluation sweeper (evaluation_sweeper.py) drives the policy for all resources;
Kopf handlers drive reconcile; tests call both with the in-memory cluster and a scripted Prometheus.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from specfleet.api import reasons
from specfleet.api.constants import API_VERSION, KIND, POOLS, PoolName
from specfleet.api.status import SpeculativeDeploymentStatus, StandbyStatus
from specfleet.api.validation import InvalidResourceError, SpeculativeDeployment, parse_resource, parse_status
from specfleet.controller.standby_flips import Tick
from specfleet.observe.prometheus import FleetAnswers, QueryFn, query_fleet
from specfleet.policy.decision.evaluation import Evaluation, evaluate_policy
from specfleet.policy.decision.status_writes import (
    Measurements,
    measurements,
    with_measurements,
    worth_writing,
)
from specfleet.policy.inputs.profile_source import CostProfileError, profile_from_config_map
from specfleet.policy.rules.results import PoolDecision
from specfleet.reconcile import ApplyRejectedError, Cluster, Event, reconcile, status_patch
from specfleet.reconcile.desired import decided_plan, spec_problems
from specfleet.render import RenderOptions
from specfleet.render.retrain import render_retrain_job
from specfleet.render.standby import standby_pool
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile

# How long to wait before re-evaluating a resource that cannot be evaluated (invalid, degraded, gone).
IDLE_RETRY_SECONDS = 30.0


class ResourceCluster(Cluster, Protocol):
    """The Cluster seam plus what the loops need for the resource itself."""

    def patch_status(self, manifest: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
        """Merge-patch the resource's status subresource."""


@dataclass
class Outcome:
    """What one loop iteration did, for handlers to log and count."""

    events: list[Event] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    decisions: list[PoolDecision] = field(default_factory=list)
    status_written: bool = False
    next_seconds: float = IDLE_RETRY_SECONDS


@dataclass(frozen=True)
class _Measured:
    """A resource's latest policy measurements, kept between status writes (policy/decision/status_writes.py)."""

    uid: str | None
    values: Measurements
    written_at: datetime | None  # when measurements were last written to status (None: not by us)


@dataclass(frozen=True)
class PrometheusTarget:
    """What one round of fleet queries needs: resources sharing it share the round."""

    url: str
    timeout_seconds: int
    window_seconds: int
    # The resources have Standby pools: their queries count awake engines only (fleet_queries), so
    # they share a round with each other, not with resources whose queries stay the plain ones.
    standby: bool = False


@dataclass(frozen=True)
class PolicySchedule:
    """When and against what a resource's policy runs (None target: nothing to evaluate now)."""

    interval_seconds: float
    target: PrometheusTarget | None


def resource_ref(namespace: str, name: str) -> dict[str, Any]:
    """A stub manifest naming the SpeculativeDeployment, for Cluster.get/patch_status."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"namespace": namespace, "name": name}}


def _target(sd: SpeculativeDeployment) -> PrometheusTarget:
    prometheus = sd.spec.policy.prometheus
    standby = any(standby_pool(sd, pool) for pool in POOLS)
    return PrometheusTarget(
        prometheus.url, prometheus.timeout_seconds, sd.spec.policy.window_seconds, standby=standby
    )


def policy_schedule(body: Mapping[str, Any]) -> PolicySchedule:
    """The resource's evaluation interval and Prometheus target, read from its spec (pure).

    Invalid resources are retried after IDLE_RETRY_SECONDS; degraded ones (nothing runs) have no target
    but keep their interval, so a fix is picked up on the next evaluation.
    """
    try:
        sd = parse_resource(body)
    except InvalidResourceError:
        return PolicySchedule(IDLE_RETRY_SECONDS, None)
    interval = float(sd.spec.policy.evaluation_interval_seconds)
    if spec_problems(sd.spec) is not None:
        return PolicySchedule(interval, None)
    return PolicySchedule(interval, _target(sd))


def _gone(body: Mapping[str, Any] | None) -> bool:
    return body is None or bool(body.get("metadata", {}).get("deletionTimestamp"))


class Controller:
    """Runs reconcile and policy for resources, one object at a time."""

    def __init__(
        self,
        cluster: ResourceCluster,
        options: RenderOptions,
        querier_for: Callable[[str, int], QueryFn],
        profile: StepTimeProfile | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cluster = cluster
        self.options = options
        self.querier_for = querier_for
        # None: each resource decides on the default profile of its drafter's method (`_cost_profile`).
        self.profile = profile
        self.clock = clock
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._measured: dict[tuple[str, str], _Measured] = {}
        self._guard = threading.Lock()

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop the lock and the unwritten measurements of a deleted resource."""
        with self._guard:
            self._locks.pop((namespace, name), None)
            self._measured.pop((namespace, name), None)

    def _write_status(self, body: Mapping[str, Any], new_status: Mapping[str, Any], outcome: Outcome) -> None:
        changed = status_patch(body.get("status"), new_status)
        if changed:
            ref = resource_ref(body["metadata"]["namespace"], body["metadata"]["name"])
            self.cluster.patch_status(ref, changed)
            outcome.status_written = True

    def reconcile_object(self, namespace: str, name: str) -> Outcome:
        """One idempotent reconcile of the current object; status written only where it changed."""
        outcome = Outcome()
        with self._lock(namespace, name):
            body = self.cluster.get(resource_ref(namespace, name))
            if _gone(body):
                return outcome
            assert body is not None
            result = reconcile(body, self.cluster, self.clock(), self.options)
            self._write_status(body, result.status, outcome)
            outcome.events, outcome.applied = result.events, result.applied
        return outcome

    def observe_target(self, target: PrometheusTarget, namespaces: Collection[str]) -> FleetAnswers:
        """One round of fleet queries against one Prometheus over the engines of `namespaces` (those of
        the resources it serves; no lock held; may take the timeout).

        `querier_for` is called for each round, so a querier may pin the round to one instant."""
        now = self.clock().timestamp()
        query = self.querier_for(target.url, target.timeout_seconds)
        return query_fleet(query, target.window_seconds, namespaces, now, standby=target.standby)

    def decide_policy(
        self, namespace: str, name: str, target: PrometheusTarget, answers: FleetAnswers, now: datetime
    ) -> Outcome:
        """Evaluate one resource on the fleet's answers; start retrain Jobs, roll out a flip, write status.

        Re-reads the object under its lock: if its Prometheus target changed since the answers were
        asked for, nothing is decided and it is due again at once.
        """
        outcome = Outcome()
        with self._lock(namespace, name):
            body = self.cluster.get(resource_ref(namespace, name))
            if _gone(body):
                return outcome
            assert body is not None
            try:
                sd = parse_resource(body)
            except InvalidResourceError:
                return outcome
            outcome.next_seconds = float(sd.spec.policy.evaluation_interval_seconds)
            if spec_problems(sd.spec) is not None:
                return outcome  # Degraded: nothing runs, nothing to decide.
            if _target(sd) != target:
                outcome.next_seconds = 0.0
                return outcome
            # The newest measurements are in memory when the last evaluations did not write them.
            uid = body.get("metadata", {}).get("uid")
            memory = self._measured.get((namespace, name))
            if memory is not None and memory.uid != uid:
                memory = None  # a new object under the same name
            previous = sd.status if memory is None else with_measurements(sd.status, memory.values)
            profile, problem = self._cost_profile(sd)
            evaluation = evaluate_policy(
                sd, previous, answers, profile, problem, now, self.options.monitoring_labels
            )
            events = list(evaluation.events)
            status = self._start_retrain_jobs(sd, evaluation, events)
            outcome.decisions = evaluation.decisions
            outcome.events = [Event(t, r, m) for t, r, m in events]  # type: ignore[arg-type]
            new_status = status.to_wire()
            if evaluation.flipped:
                # Render and roll out the flip now, from the status that records it (typed, as decided).
                result = reconcile(sd, self.cluster, now, self.options, status=status)
                new_status = result.status
                outcome.events += result.events
                outcome.applied = result.applied
            written_at = None if memory is None else memory.written_at
            since = None if written_at is None else (now - written_at).total_seconds()
            interval = float(sd.spec.policy.evaluation_interval_seconds)
            if evaluation.flipped or worth_writing(sd.status, status, since, interval):
                self._write_status(body, new_status, outcome)
                written_at = now
            self._measured[(namespace, name)] = _Measured(uid, measurements(status), written_at)
        return outcome

    def record_standby(self, sd: SpeculativeDeployment, pool: PoolName, tick: Tick) -> Outcome:
        """What one tick of a Standby pool's flip did, into Events and status. A pod whose switch failed
        (and was put back) makes the pool unavailable for Standby at this generation: from the next
        reconcile it renders one engine per pod and flips by restart. A pod that finished, or a pool
        that settled, refreshes status at once (its `settled`, which the policy's gates wait for)."""
        outcome = Outcome()
        update: dict[str, Any] = {}
        for pod, seconds in tick.finished:
            message = (
                f"{pool}: pod {pod} serves speculation {decided_plan(sd)[pool].mode} after {seconds:.1f} s"
            )
            outcome.events.append(Event("Normal", reasons.EVENT_STANDBY_FLIPPED, message))
        if tick.switched:
            # The pool's switch measured: the newest replica's sleep, wake and check (its drain is
            # the load's, predicted at each flip).
            update["standby_flip_seconds"] = max(1, round(tick.switched[-1]))
        if tick.reverted:
            pod, why = tick.reverted[0]
            message = (
                f"{pool}: pod {pod} could not switch engines and serves as before ({why}); the pool flips "
                "by restart until the spec changes"
            )
            outcome.events.append(Event("Warning", reasons.STANDBY_UNAVAILABLE, message))
            update["standby"] = StandbyStatus(
                available=False, message=message, observed_generation=sd.generation
            )
        if update:
            with self._lock(sd.namespace, sd.name):
                body = self.cluster.get(resource_ref(sd.namespace, sd.name))
                if not _gone(body) and body is not None:
                    status = parse_status(body.get("status"))
                    for field_name, value in update.items():
                        setattr(getattr(status.pools, pool), field_name, value)
                    self._write_status(body, status.to_wire(), outcome)
        if tick.reverted or tick.finished or tick.settled:
            refreshed = self.reconcile_object(sd.namespace, sd.name)
            outcome.events += refreshed.events
            outcome.applied = refreshed.applied
            outcome.status_written = outcome.status_written or refreshed.status_written
        return outcome

    def _start_retrain_jobs(
        self, sd: SpeculativeDeployment, evaluation: Evaluation, events: list[tuple[str, str, str]]
    ) -> SpeculativeDeploymentStatus:
        """Create the retrain Job of each trigger; the status keeps lastRetrainTime only for those created
        (a refused Job is asked for again at the next evaluation)."""
        status = evaluation.status
        for trigger in evaluation.retrain:
            job = render_retrain_job(sd, trigger)
            ps = getattr(status.pools, trigger.pool)
            try:
                self.cluster.apply(job)
            except ApplyRejectedError as err:
                events.append(("Warning", reasons.EVENT_RETRAIN_FAILED, f"pool {trigger.pool}: {err}"))
                before = getattr(sd.status.pools, trigger.pool).last_retrain_time
                ps = ps.model_copy(update={"last_retrain_time": before})
            else:
                name = job["metadata"]["name"]
                events.append(
                    (
                        "Normal",
                        reasons.EVENT_RETRAIN_CREATED,
                        f"pool {trigger.pool}: created Job {name}: acceptance length "
                        f"{trigger.current_length:.2f} is {trigger.drift_percent:.1f}% below its baseline "
                        f"{trigger.baseline_length:.2f}",
                    )
                )
                ps = ps.model_copy(update={"last_retrain_job": name})
            pools = status.pools.model_copy(update={trigger.pool: ps})
            status = status.model_copy(update={"pools": pools})
        return status

    def _cost_profile(self, sd: SpeculativeDeployment) -> tuple[StepTimeProfile | None, str | None]:
        """The profile to decide with: the ConfigMap the spec names (read now), else the controller's
        own, else the published default for the spec's drafter method (EAGLE-3's longer step for eagle3).

        (None, why) when the named ConfigMap is missing or malformed: the pools hold.
        """
        name = sd.spec.policy.goodput.cost_profile_config_map
        if not name:
            return self.profile or default_profile(sd.spec.drafter.method), None
        ref = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": sd.namespace, "name": name}}
        try:
            return profile_from_config_map(self.cluster.get(ref), sd.namespace, name), None
        except CostProfileError as err:
            return None, str(err)

    def evaluate_policy(self, namespace: str, name: str) -> Outcome:
        """Observe, decide and write for one resource (the scheduler does the same for many at once)."""
        body = self.cluster.get(resource_ref(namespace, name))
        if _gone(body):
            return Outcome()
        assert body is not None
        schedule = policy_schedule(body)
        if schedule.target is None:
            return Outcome(next_seconds=schedule.interval_seconds)
        now = self.clock()
        answers = self.observe_target(schedule.target, [namespace])
        return self.decide_policy(namespace, name, schedule.target, answers, now)
