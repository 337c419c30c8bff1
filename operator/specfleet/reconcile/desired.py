"""The first, pure step: parse and check a resource, decide each pool's plan and render its children
(or, when it cannot run, its final Degraded status)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from specfleet.api import reasons
from specfleet.api.conditions import set_condition
from specfleet.api.constants import PoolName
from specfleet.api.fields import SpeculationMode
from specfleet.api.semantics import engine_schedules, find_problems
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import Condition, SpeculativeDeploymentStatus, StandbyStatus
from specfleet.api.validation import InvalidResourceError, SpeculativeDeployment, parse_resource, parse_status
from specfleet.policy.predict.known_models import known_architecture
from specfleet.policy.predict.kv_cache import ArchitectureOf
from specfleet.policy.predict.startup_memory import engines_that_cannot_start
from specfleet.reconcile.result import Event, ReconcileResult
from specfleet.render import POOLS, Manifest, PoolPlan, RenderOptions, render_children


def decided_plan(
    sd: SpeculativeDeployment, status: SpeculativeDeploymentStatus | None = None
) -> dict[PoolName, PoolPlan]:
    """Each pool's plan: mode pinned by spec (On/Off) or, for Auto, the policy's last decision in
    `status` (default: the resource's own); K where the Goodput policy chose one (None: the drafter's);
    Standby where the spec asks for it, unless status says its engines could not sleep at this
    generation (then it runs as a Restart pool until the spec changes)."""
    status = status if status is not None else sd.status
    limit = sd.spec.drafter.num_speculative_tokens
    plan: dict[PoolName, PoolPlan] = {}
    for pool in POOLS:
        setting = getattr(sd.spec.pools, pool).speculation
        decided = getattr(status.pools, pool)
        # Status is where runtime decisions live; a fresh resource starts speculating.
        mode: SpeculationMode = decided.speculation if setting == "Auto" else setting
        k = decided.num_speculative_tokens
        goodput = setting == "Auto" and sd.spec.policy.mode == "Goodput"
        plan[pool] = PoolPlan(
            mode,
            k if goodput and k is not None and 1 <= k <= limit else None,
            # Canaries of an Auto pool while off, where the policy scaled them (None: the spec's).
            decided.canary_replicas if setting == "Auto" else None,
            # The policy's Dynamic SD schedule, where policy.goodput.engineSchedule lets it choose one.
            tuple(decided.dynamic_schedule)
            if goodput and decided.dynamic_schedule and engine_schedules(sd.spec)
            else None,
            standby=getattr(sd.spec.pools, pool).rollout.flip == "Standby"
            and not standby_unavailable(decided.standby, sd.generation),
        )
    return plan


class SpecProblems(NamedTuple):
    """Why a spec can never run: the Degraded reason and one sentence per problem."""

    reason: str
    problems: list[str]


def spec_problems(
    spec: SpeculativeDeploymentSpec, architecture_of: ArchitectureOf = known_architecture
) -> SpecProblems | None:
    """Why this spec can never run (None: it can): settings the engine image or the operator refuses,
    else engines that vLLM would refuse to start for lack of GPU memory (the models' architectures
    from `architecture_of`: the shipped table, where the operator runs; the CLI also reads local files)."""
    problems = find_problems(spec)
    if problems:
        return SpecProblems(reasons.UNSUPPORTED_CONFIGURATION, problems)
    problems = engines_that_cannot_start(spec, architecture_of)
    if problems:
        return SpecProblems(reasons.INSUFFICIENT_GPU_MEMORY, problems)
    return None


def standby_unavailable(standby: StandbyStatus | None, generation: int) -> bool:
    """Whether a Standby pool's engines were found unable to sleep at this generation."""
    return standby is not None and not standby.available and standby.observed_generation == generation


def _degraded_status(
    previous: SpeculativeDeploymentStatus,
    generation: int,
    reason: str,
    message: str,
    now: datetime,
) -> SpeculativeDeploymentStatus:
    conditions: list[Condition] = list(previous.conditions)
    for type_, status, why in (
        (reasons.DEGRADED, "True", reason),
        (reasons.READY, "False", reason),
        (reasons.PROGRESSING, "False", reason),
    ):
        conditions = set_condition(
            conditions,
            type_=type_,
            status=status,  # type: ignore[arg-type]
            reason=why,
            message=message,
            generation=generation,
            now=now,
        )
    return previous.model_copy(update={"conditions": conditions, "observed_generation": generation})


def was_degraded(status: SpeculativeDeploymentStatus) -> bool:
    return any(c.type == reasons.DEGRADED and c.status == "True" for c in status.conditions)


@dataclass(frozen=True)
class DesiredState:
    """What one resource should have: its plan and children, or (`stopped`) why nothing can run."""

    generation: int
    previous: SpeculativeDeploymentStatus
    sd: SpeculativeDeployment | None = None
    plan: Mapping[PoolName, PoolPlan] = field(default_factory=dict)
    children: list[Manifest] = field(default_factory=list)
    # The final result when the resource cannot run (invalid or unsupported): nothing to apply.
    stopped: ReconcileResult | None = None


def desired_state(
    body: Mapping[str, Any] | SpeculativeDeployment,
    now: datetime,
    options: RenderOptions | None = None,
    status: SpeculativeDeploymentStatus | None = None,
) -> DesiredState:
    """Parse (unless given parsed), check, plan and render one resource (pure).

    `status` replaces the resource's own status as the starting point, e.g. the policy's just-recorded
    decision, which is then rendered without a round trip through the serialized status.
    """
    if isinstance(body, SpeculativeDeployment):
        sd = body
        generation, previous = sd.generation, status if status is not None else sd.status
    else:
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        previous = status if status is not None else parse_status(body.get("status"))
        try:
            sd = parse_resource(body)
        except InvalidResourceError as err:
            # The apiserver's schema normally stops this first; an older CRD or a bypass can still get here.
            message = reasons.with_link(str(err), reasons.INVALID_SPEC)
            degraded = _degraded_status(previous, generation, reasons.INVALID_SPEC, message, now)
            events = [] if was_degraded(previous) else [Event("Warning", reasons.EVENT_DEGRADED, message)]
            return DesiredState(generation, previous, stopped=ReconcileResult(degraded.to_wire(), events))
    unrunnable = spec_problems(sd.spec)
    if unrunnable is not None:
        message = reasons.with_link("; ".join(unrunnable.problems), unrunnable.reason)
        degraded = _degraded_status(previous, generation, unrunnable.reason, message, now)
        same = any(c.type == reasons.DEGRADED and c.message == message for c in previous.conditions)
        events = [] if same else [Event("Warning", reasons.EVENT_DEGRADED, message)]
        return DesiredState(generation, previous, sd, stopped=ReconcileResult(degraded.to_wire(), events))
    plan = decided_plan(sd, previous)
    return DesiredState(generation, previous, sd, plan, render_children(sd, plan, options))
