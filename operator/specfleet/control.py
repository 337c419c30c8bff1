"""The operator's two loops over one resource, serialised per object, with I/O behind seams.

`reconcile_object` (create/update/resume/timer) and `evaluate_policy` (the per-resource policy
daemon) both re-read the object, compute, and write status themselves under one per-object lock, so a
policy flip and a resync can never interleave and undo each other. Kopf handlers call these; tests
call them with the in-memory cluster and a scripted Prometheus.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from specfleet.api.constants import API_VERSION, KIND
from specfleet.api.models import PoolName
from specfleet.api.semantics import find_problems
from specfleet.api.validation import InvalidResourceError, SpeculativeDeployment, parse_resource
from specfleet.metrics.prometheus import PoolSelector, QueryFn, observe_pool
from specfleet.policy.decide import PoolDecision, decide
from specfleet.policy.observations import PoolObservation
from specfleet.policy.record import auto_pools, pool_states, record
from specfleet.reconcile import Cluster, Event, reconcile, status_patch
from specfleet.render import RenderOptions
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


def resource_ref(namespace: str, name: str) -> dict[str, Any]:
    """A stub manifest naming the SpeculativeDeployment, for Cluster.get/patch_status."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"namespace": namespace, "name": name}}


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
        self.profile = profile or default_profile()
        self.clock = clock
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop the lock of a deleted resource."""
        with self._guard:
            self._locks.pop((namespace, name), None)

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
            if body is None or body.get("metadata", {}).get("deletionTimestamp"):
                return outcome
            result = reconcile(body, self.cluster, self.clock(), self.options)
            self._write_status(body, result.status, outcome)
            outcome.events, outcome.applied = result.events, result.applied
        return outcome

    def evaluate_policy(self, namespace: str, name: str) -> Outcome:
        """Observe every Auto pool, decide, record, and roll out a flip at once if one is decided."""
        outcome = Outcome()
        with self._lock(namespace, name):
            body = self.cluster.get(resource_ref(namespace, name))
            if body is None or body.get("metadata", {}).get("deletionTimestamp"):
                return outcome
            try:
                sd = parse_resource(body)
            except InvalidResourceError:
                return outcome
            outcome.next_seconds = float(sd.spec.policy.evaluation_interval_seconds)
            if find_problems(sd.spec):
                return outcome  # Degraded: nothing runs, nothing to decide.
            now = self.clock()
            pools = auto_pools(sd.spec)
            states = pool_states(sd.spec, sd.status, now)
            query = self.querier_for(sd.spec.policy.prometheus.url, sd.spec.policy.prometheus.timeout_seconds)
            observations: dict[str, PoolObservation] = {
                pool: observe_pool(
                    query,
                    PoolSelector(sd.namespace, sd.name, pool),
                    sd.spec.policy.window_seconds,
                    now,
                    pool_mode=states[pool].mode,
                    expected_replicas=_expected_reporting(sd, pool),
                )
                for pool in pools
            }
            decisions = decide(
                sd.spec.policy,
                sd.spec.drafter.num_speculative_tokens,
                states,
                observations,
                now,
                self.profile,
            )
            outcome.decisions = decisions
            recorded = record(sd.status, decisions, observations, sd.generation, now)
            new_status = recorded.status.to_wire()
            outcome.events = [Event(t, r, m) for t, r, m in recorded.events]  # type: ignore[arg-type]
            if recorded.flipped:
                # Render and roll out the flip now, from the status that records it.
                flipped_body = {**body, "status": new_status}
                result = reconcile(flipped_body, self.cluster, now, self.options)
                new_status = result.status
                outcome.events += result.events
                outcome.applied = result.applied
            self._write_status(body, new_status, outcome)
        return outcome


def _expected_reporting(sd: SpeculativeDeployment, pool: PoolName) -> int | None:
    """Engines that should report metrics: the ready ones of a settled pool (None while it rolls)."""
    status = getattr(sd.status.pools, pool)
    return status.ready_replicas if status.settled and status.ready_replicas > 0 else None
