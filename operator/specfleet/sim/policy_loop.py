"""The simulated operator: status, the shared policy evaluation (or a fixed schedule), and the renders.

Every `policy.evaluationIntervalSeconds` the operator's own evaluation (`specfleet.policy.decision.evaluation`)
runs on what the simulated Prometheus answers and gives the new status; the pools are then rendered
from it and rolled out (`specfleet.sim.rollout`). A `schedule` strategy writes its changes into status
as the policy's decisions are written, with no canaries.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from specfleet.api.status import PoolStatus, SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.decision.evaluation import evaluate_policy
from specfleet.policy.inputs.status import auto_pools
from specfleet.policy.rules.drift import RetrainTrigger
from specfleet.sim.accounts import Change
from specfleet.sim.options import EPOCH, POOLS, Strategy
from specfleet.sim.prom import Prometheus
from specfleet.sim.rollout import Rollouts
from specfleet_runtime.cost_profile import StepTimeProfile


class PolicyLoop:
    """The resource's status under `strategy`, and the changes and retrain Jobs it made."""

    def __init__(
        self,
        sd: SpeculativeDeployment,
        strategy: Strategy,
        profile: StepTimeProfile,
        rollouts: Rollouts,
        prometheus: Prometheus,
    ) -> None:
        self.sd = sd
        self.spec = sd.spec
        self.policy = sd.spec.policy
        self.strategy = strategy
        self.profile = profile
        self.rollouts = rollouts
        self.prometheus = prometheus
        self.status = SpeculativeDeploymentStatus()
        # Per pool, the basis of the last decision, shown in the timeline.
        self.last_decisions: dict[str, dict[str, Any]] = {}
        self.changes: list[Change] = []
        self.retrains: list[RetrainTrigger] = []

    def current_sd(self) -> SpeculativeDeployment:
        return dataclasses.replace(self.sd, spec=self.spec, status=self.status)

    def render(self, now: float, initial: bool = False) -> None:
        self.rollouts.render(self.current_sd(), now, initial)

    def update_status(self, now: float) -> None:
        self.status = self.rollouts.observed_status(self.status, now)

    def start(self) -> None:
        """Status at t=0 (every pool On and settled, or a schedule's first settings) and its first render."""
        self.status = self.status.model_copy(
            update={
                "pools": self.status.pools.model_copy(
                    update={p: PoolStatus(speculation="On", settled=True) for p in POOLS}
                )
            }
        )
        if self.strategy.kind == "schedule":
            for at, pool, mode, k in self.strategy.schedule:
                if at <= 0 and pool in auto_pools(self.spec):
                    self.set_pool(pool, mode, k)
        self.render(0.0, initial=True)
        self.update_status(0.0)

    def set_pool(self, pool: str, mode: str, k: int | None) -> None:
        """Write a pool's mode and K into status, as `record` writes the policy's decisions (no canaries)."""
        pools = self.status.pools.model_copy()
        ps: PoolStatus = getattr(pools, pool)
        setattr(
            pools,
            pool,
            ps.model_copy(
                update={
                    "speculation": mode,
                    "num_speculative_tokens": k if mode == "On" else ps.num_speculative_tokens,
                    "canary_replicas": 0,
                }
            ),
        )
        self.status = self.status.model_copy(update={"pools": pools})

    def apply_schedule(self, now: float) -> None:
        """A `schedule` strategy's changes due at `now`, rolled out like the policy's."""
        changed = False
        for at, pool, mode, k in self.strategy.schedule:
            if abs(at - now) > 1e-6 or pool not in auto_pools(self.spec):
                continue
            ps: PoolStatus = getattr(self.status.pools, pool)
            limit = self.spec.drafter.num_speculative_tokens
            from_k = ps.num_speculative_tokens or limit
            to_k = k or limit
            if ps.speculation == mode and (mode == "Off" or from_k == to_k):
                continue
            self.changes.append(Change(now, pool, ps.speculation, mode, from_k, to_k, "Scheduled"))
            self.set_pool(pool, mode, k)
            changed = True
        if changed:
            self.render(now)
            self.update_status(now)

    def evaluate(self, now: float) -> None:
        """One evaluation at `now`: the policy's, or the schedule's changes due then."""
        if self.strategy.kind == "schedule":
            self.apply_schedule(now)
            return
        self.update_status(now)
        when = EPOCH + timedelta(seconds=now)
        sd = self.current_sd()
        answers = self.prometheus.fleet_answers(
            sd.namespace, sd.name, auto_pools(self.spec), now, float(self.policy.window_seconds)
        )
        # The operator's own evaluation; a retrain it asks for is only recorded (no Job here).
        evaluation = evaluate_policy(sd, self.status, answers, self.profile, None, when)
        self.status = evaluation.status
        self.retrains += evaluation.retrain
        decisions, observations = evaluation.decisions, evaluation.observations
        for d in decisions:
            obs = observations[d.pool]
            expected = d.observations.get("expectedRunningPerReplica")
            self.last_decisions[d.pool] = {
                "reason": d.reason,
                "observedRunningPerReplica": obs.running_per_replica,
                # The load the policy decided with (the observed one projected along its trend).
                "expectedRunningPerReplica": float(expected) if expected else obs.running_per_replica,
                "predictedSpeedup": d.observations.get("predictedSpeedup"),
                # The pool's measured prefix-cache hit rate the prediction priced the prefill with.
                "prefixCacheHitRate": obs.prefix_hit_rate,
            }
        for d in evaluation.flipped:
            to_k = d.target_k if d.target_k is not None else d.current_k
            canaries = getattr(d, "canary_replicas", None)
            basis = self.last_decisions.get(d.pool, {})
            self.changes.append(
                Change(
                    now,
                    d.pool,
                    d.current,
                    d.target,
                    d.current_k,
                    to_k,
                    d.reason,
                    canaries,
                    basis.get("observedRunningPerReplica"),
                    basis.get("expectedRunningPerReplica"),
                    schedule=bool(d.target_schedule) and d.current == d.target,
                )
            )
        # Rendered at every evaluation, as the operator's resync reconciles (a held canary hand-over
        # is let go once the growing Deployment is ready), and at once after a change.
        self.render(now)
        self.update_status(now)
