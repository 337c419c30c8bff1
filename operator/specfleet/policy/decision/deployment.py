"""The speculation policy's entry point (pure and deterministic): observations in, one decision per
Auto pool out. Each pool is reverted if its last rollout missed the deadline, else assessed
(`policy.decision.pool`), then flipped, adjusted (a retune or a canary scaling) or held, as the gates allow;
at most one pool of a deployment changes per evaluation. The rules are explained in docs/policy.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.api.pools import LatencySlo
from specfleet.policy.decision.pool import Assessment, assess
from specfleet.policy.decision.realized import CHANGE_GAIN
from specfleet.policy.inputs.observation import PoolObservation, PoolState, Schedule
from specfleet.policy.predict.dynamic_sd import best_schedule, observed_under_schedule
from specfleet.policy.predict.kv_cache import DEFAULT_MAX_NUM_SEQS
from specfleet.policy.predict.rollout_time import STANDBY, RolloutTime, restart_rollout
from specfleet.policy.predict.throughput import OFF, SCHEDULE, setting_name
from specfleet.policy.rules.canaries import active_canaries, canary_share, canary_target, far_past_break_even
from specfleet.policy.rules.dip import flip_dip, replace_gate
from specfleet.policy.rules.gates import adjust_gate, flip_gate
from specfleet.policy.rules.realized_guard import awaiting_reference
from specfleet.policy.rules.results import PoolDecision
from specfleet.policy.rules.retune import retune_k, retune_schedule
from specfleet.policy.rules.revert import revert_missed_rollout
from specfleet.policy.rules.slo import slo_allows, slo_retune
from specfleet_runtime.cost_profile import StepTimeProfile


def _flip(
    policy: PolicySpec,
    k: int,
    p: Assessment,
    now: datetime,
    last_flip_other: datetime | None,
    other_busy: bool,
    profile: StepTimeProfile,
) -> PoolDecision:
    """Flip a pool whose rule asks for the other mode, or hold it while a flip gate is closed."""
    wanted = p.wanted
    gate = flip_gate(policy, p.state, now, last_flip_other, other_busy)
    if gate is not None:
        reason, why = gate
        held = f"wants {wanted.mode} ({wanted.reason}: {wanted.message}) but holds: {why}"
        spec = policy.reentry.canary_replicas
        # Meanwhile the canaries speculate as the pool would: their share of it is served at the
        # better setting until the gate opens (an adjustment: its own gate and budget).
        canaries_up = wanted.mode == "On" and spec and active_canaries(policy, p.state) < spec
        if canaries_up and adjust_gate(policy, p.state, now, other_busy) is None:
            return p.decision(
                r.CANARIES_SCALED_UP, f"canaries -> {spec} while {reason}: {held}", canaries=spec
            )
        return p.decision(reason, held)
    dip_hold = _dip_hold(policy, p)
    if dip_hold is not None:
        reason, why = dip_hold
        return p.decision(reason, f"wants {wanted.mode} ({wanted.reason}: {wanted.message}) but holds: {why}")
    message = wanted.message
    canaries = None
    if wanted.mode == "Off" and policy.reentry.canary_replicas:
        # Near break-even a change of acceptance decides whether the pool should speculate again, so
        # its canaries keep measuring it (they come out of the same rollout). Far past it, measured
        # or where the load this flip is decided for is heading, they would only cost; they start
        # when the remembered acceptance expires or the load comes back near.
        share = canary_share(policy, p.state)
        far = far_past_break_even(policy, k, p.loads, p.gains, profile, share=share) or far_past_break_even(
            policy, k, p.loads, p.gains, profile, at=0, share=share
        )
        by_slo = wanted.reason in r.SLO_REASONS
        by_guard = wanted.reason == r.REALIZED_BELOW_PREDICTION
        canaries = 0 if far or by_slo or by_guard else policy.reentry.canary_replicas
        if by_slo:
            # Canaries would serve part of the pool's requests with the drafter the SLO turned off.
            message += "; no canaries: the SLO turned the drafter off"
        elif by_guard:
            # The engine without the drafter is measured alone first (`policy.rules.realized_guard`).
            message += "; no canaries until the engine without the drafter is measured"
        else:
            message += (
                "; canaries stay to measure acceptance"
                if not far
                else "; no canaries: far past break-even"
                if far.endswith("far past break-even")
                else f"; no canaries: {far}"
            )
    if p.state.flip == STANDBY:
        # The pods switch to the engine they hold parked, as it was started: a K or a schedule of the
        # flip's own would change that engine's arguments, a new template that restarts every pod (the
        # restart the Standby flip is there to avoid). A better K after the flip is a retune.
        return _with_change_gain(p, _flip_gain(p)).decision(
            wanted.reason, message, target=wanted.mode, canaries=canaries, in_place=True
        )
    target_k = wanted.k if policy.mode == "Goodput" else None
    schedule = None
    if wanted.mode == "On" and p.schedules and p.gains is not None:
        # K follows the batch size inside the engine, from the acceptance the pool turned on with.
        schedule = best_schedule(profile, p.gains[0].per_position, k)
        top = max(kk for _, _, kk in schedule)
        if top > 0:
            target_k = top
            message += f"; K up to {top} by batch size (Dynamic SD schedule)"
        else:
            schedule = None
    return _with_change_gain(p, _flip_gain(p)).decision(
        wanted.reason, message, target=wanted.mode, target_k=target_k, canaries=canaries, schedule=schedule
    )


def _with_change_gain(p: Assessment, gain: float | None) -> Assessment:
    """`p` with the change's predicted throughput over the current setting among its numbers."""
    if gain is None or not math.isfinite(gain) or gain <= 0:
        return p
    return replace(p, numbers={**p.numbers, CHANGE_GAIN: f"{gain:.3f}"})


def _flip_gain(p: Assessment) -> float | None:
    """A flip's predicted throughput over the current setting's (None: not predicted, Threshold mode):
    the rule's own where it priced the flip (an overload: the capacities' ratio), else the best K over
    no drafter when turning on, no drafter over the current setting when turning off."""
    if p.wanted.gain is not None:
        return p.wanted.gain
    if p.gains is None:
        return None
    g = p.gains[0]
    return g.gain_best if p.wanted.mode == "On" else 1.0 / (g.gain_now or g.gain_best)


def _dip_hold(
    policy: PolicySpec, p: Assessment, rollout: RolloutTime | None = None, gain: float | None = None
) -> tuple[str, str] | None:
    """Why a change that takes capacity out may not start now (`policy.rules.dip`), or None: a flip of a
    pool that rolls out by Replace or flips Standby engines (`rollout` None: the pool's next flip), or a
    retune, which restarts the engines (`rollout`: that restart; `gain`: its throughput over now's)."""
    change = "flip" if rollout is None else "retune"
    rollout = rollout or p.rollout
    if rollout is None:
        return None
    dip = flip_dip(p.state, p.obs, rollout)
    if dip is None:
        return None
    per_engine = float(p.state.max_num_seqs or DEFAULT_MAX_NUM_SEQS)
    if p.model is not None:
        demand = max(p.model.demand, p.demand or 0.0)
        if p.model.memory_known:
            per_engine = min(per_engine, p.model.settings[p.model.current or OFF].fits)
    else:
        waiting = (p.obs.waiting or 0.0) / max(1, p.obs.replicas_reporting)
        demand = max(p.loads) + waiting
    if change == "flip":
        gain = _flip_gain(p)
    return replace_gate(policy, dip, demand, per_engine, gain, change)


def _adjust(
    policy: PolicySpec, k: int, p: Assessment, now: datetime, other_busy: bool, profile: StepTimeProfile
) -> PoolDecision | None:
    """A retune or a canary scaling for a pool that keeps its mode; None when neither is wanted."""
    g = p.gains[0] if p.gains else None
    schedule: Schedule | None = None
    retune = None if p.schedules else retune_k(policy, p.state, p.current_k, p.wanted, g)
    by_schedule = retune_schedule(policy, p.state, k, p.wanted, g, p.model, p.demand) if p.schedules else None
    # A pool with a latency objective is retuned to the setting predicted to meet it most, before
    # throughput's retunes, which may not cost it more than a tie (`policy.rules.slo`).
    by_slo = None
    if p.slo_shares:
        current = (p.model.current if p.model else None) or OFF
        by_slo = slo_retune(policy, p.state, current, p.slo_shares, p.wanted)
        if retune is not None and not slo_allows(p.slo_shares, current, setting_name(retune[0])):
            retune = None
        if by_schedule is not None and not slo_allows(p.slo_shares, current, SCHEDULE):
            by_schedule = None
    gain: float | None = None
    if by_slo is not None:
        best, reason, message, gain = by_slo
        canaries = None
        schedule = best.schedule
        target_k = best.k if best.k != p.current_k else None
        what = "Dynamic SD schedule" if schedule else f"K {p.current_k} -> {best.k}"
    elif by_schedule is not None:
        top, schedule, message, gain = by_schedule
        target_k = top if top != p.current_k else None
        what, reason = "new Dynamic SD schedule", r.GOODPUT_RETUNE
        canaries = None
    elif retune is not None:
        target_k, why, gain = retune
        what, reason, message = f"K {p.current_k} -> {target_k}", r.GOODPUT_RETUNE, why
        canaries = None
    else:
        canary = canary_target(
            policy, k, p.state, p.wanted, p.loads, p.gains, profile, now, known=p.est is not None
        )
        if canary is None or (awaiting_reference(p.state) and canary[0] > active_canaries(policy, p.state)):
            return None
        target_k = None
        canaries, reason, message = canary
        what = f"canaries -> {canaries}"
    gate = adjust_gate(policy, p.state, now, other_busy)
    if gate is None and gain is not None:
        # A retune restarts the pool's engines (a Standby pool's too: both of each pod's).
        gate = _dip_hold(policy, p, restart_rollout(p.state, p.obs, profile), gain)
    if gate is not None:
        held, why_held = gate
        return p.decision(held, f"wants {what} ({reason}: {message}) but holds: {why_held}")
    return _with_change_gain(p, gain).decision(
        reason, f"{what}: {message}", target_k=target_k, canaries=canaries, schedule=schedule
    )


def decide(
    policy: PolicySpec,
    k: int,
    states: Mapping[str, PoolState],
    observations: Mapping[str, PoolObservation],
    now: datetime,
    profile: StepTimeProfile,
    engine_schedule: bool = False,
    slos: Mapping[str, LatencySlo] | None = None,
) -> list[PoolDecision]:
    """Decisions for the given (Auto) pools, in order; at most one of them changes its pool.

    `k` is the drafter's K (spec.drafter.numSpeculativeTokens), the most a pool may draft;
    `engine_schedule` lets Goodput give speculating pools Dynamic SD schedules
    (`specfleet.api.semantics.engine_schedules`; see `specfleet.policy.predict.dynamic_sd`);
    `slos`: the pools whose latency objective the policy steers by (`policy.rules.slo`).
    """
    schedules = engine_schedule and policy.mode == "Goodput"
    busy = any(not s.settled for s in states.values())
    changed = False
    out: list[PoolDecision] = []
    for pool, state in states.items():
        obs = observations[pool]
        revert = revert_missed_rollout(policy, pool, state, now, k, obs.as_text() if obs.usable else {})
        if revert is not None:
            changed = True
            out.append(revert)
            continue
        problem = obs.decision_problem
        if problem is not None:
            out.append(PoolDecision(pool, state.mode, state.mode, False, r.METRICS_UNAVAILABLE, problem))
            continue
        p = assess(
            policy,
            k,
            pool,
            state,
            observed_under_schedule(obs, state, schedules),
            now,
            profile,
            schedules,
            (slos or {}).get(pool),
        )
        other_busy = changed or (busy and state.settled)
        if p.wanted.mode != state.mode:
            # The cooldown spaces flips of different pools; a pool's own flips are spaced by its dwell.
            last_flip_other = max(
                (s.last_transition for o, s in states.items() if o != pool and s.last_transition),
                default=None,
            )
            decision = _flip(policy, k, p, now, last_flip_other, other_busy, profile)
        else:
            adjusted = _adjust(policy, k, p, now, other_busy, profile)
            decision = adjusted or p.decision(p.wanted.reason, p.wanted.message)
        changed = changed or decision.changes
        out.append(decision)
    return out
