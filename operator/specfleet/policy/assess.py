"""One pool assessed before the gates (pure): the acceptance estimate (the newest interval's while the
window's is moving), the expected load, Goodput's predictions (one model of the pool,
`policy.throughput`) or Threshold's rule, and the mode they ask for (`assess`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.acceptance import Estimate, acceptance_moving, estimate_for, newest_acceptance
from specfleet.policy.canaries import active_canaries, settling
from specfleet.policy.decision import PoolDecision, Wanted, goodput_margin, pool_k
from specfleet.policy.goodput import GoodputPrediction, candidate_ks, goodput_prediction, goodput_wanted
from specfleet.policy.load import (
    commit_path,
    demand_fit,
    demand_trend,
    expected_load,
    measured_load,
)
from specfleet.policy.memory import DEFAULT_MAX_NUM_SEQS
from specfleet.policy.observations import MeasuredAcceptance, PoolObservation, PoolState
from specfleet.policy.saturation import Arrivals, arrivals, overloaded, queued, serves_with_fewer
from specfleet.policy.schedule import Schedule
from specfleet.policy.startup import RolloutTime, pool_rollout
from specfleet.policy.threshold import threshold_wanted
from specfleet.policy.throughput import OFF, PoolModel, pool_model, setting_name
from specfleet_runtime.cost_profile import StepTimeProfile


@dataclass(frozen=True)
class Assessment:
    """Everything decided about one pool before the gates."""

    pool: str
    state: PoolState
    obs: PoolObservation  # with the expected load
    current_k: int
    est: Estimate | None
    wanted: Wanted
    loads: tuple[float, float]  # (expected, observed)
    # Goodput: (at the expected load, at the observed load); Threshold: None.
    gains: tuple[GoodputPrediction, GoodputPrediction] | None
    numbers: dict[str, str]
    # The policy gives speculating pools Dynamic SD schedules (policy.goodput.engineSchedule).
    schedules: bool = False
    # Goodput: the pool's model and the demand the predictions in `gains[0]` were made at.
    model: PoolModel | None = None
    demand: float | None = None
    # The pool's next rollout: how long a change decided now takes to serve.
    rollout: RolloutTime | None = None

    @property
    def memory(self) -> MeasuredAcceptance | None:
        return self.est.remember if self.est is not None else None

    def decision(
        self,
        reason: str,
        message: str,
        *,
        target: str | None = None,
        target_k: int | None = None,
        canaries: int | None = None,
        schedule: Schedule | None = None,
    ) -> PoolDecision:
        """The pool's decision: hold unless `target` (a flip) or an adjustment is given."""
        mode = self.state.mode
        to = target or mode
        return PoolDecision(
            self.pool,
            mode,
            to,
            to != mode,
            reason,
            message,
            self.numbers,
            self.current_k,
            target_k,
            canaries,
            self.memory,
            schedule,
        )


def assess(
    policy: PolicySpec,
    k: int,
    pool: str,
    state: PoolState,
    observed: PoolObservation,
    now: datetime,
    profile: StepTimeProfile,
    schedules: bool = False,
) -> Assessment:
    """What one pool's numbers ask for, and everything the gates, retunes and canaries need to know."""
    current_k = pool_k(policy, state, k)
    schedule = state.schedule if schedules and state.mode == "On" else None
    est = estimate_for(policy, state, observed, now, k)
    # A flip is judged on the newest interval's acceptance while the window's is moving.
    est_flip = est
    moving = acceptance_moving(policy, state, observed, now) if policy.mode == "Goodput" else None
    if moving is not None and est is not None:
        newest = newest_acceptance(policy, state, observed)
        fresh = estimate_for(
            policy, state, replace(observed, per_position=newest, acceptance_length=1 + sum(newest)), now, k
        )
        if fresh is not None:
            est_flip = replace(fresh, source="newestInterval", remember=est.remember)
    measured = measured_load(observed)
    # The demand a change is decided for (running + waiting, projected), and the running count it
    # asks for, never past what an engine runs (--max-num-seqs).
    rollout = pool_rollout(state, observed.replicas_reporting, profile)
    demand = expected_load(policy, state, observed, now, rollout)
    load = min(demand, float(state.max_num_seqs or DEFAULT_MAX_NUM_SEQS))
    obs = replace(observed, running_per_replica=load)
    gains = None
    model: PoolModel | None = None
    if policy.mode == "Goodput":
        # One model of the pool (policy.throughput): each setting's tokens/s at a demand of running
        # plus waiting requests per replica; the waiting ones ride on every projected load.
        model = pool_model(
            profile,
            observed,
            candidate_ks(profile, k),
            mode=state.mode,
            current_k=current_k,
            schedule=schedule,
            max_num_seqs=state.max_num_seqs,
            gpu_memory_utilization=state.gpu_memory_utilization,
            tensor_parallel_size=state.tensor_parallel_size,
        )
        g = goodput_prediction(model, [demand], est, k)
        g_observed = goodput_prediction(model, [model.demand], est, k)
        gains = (g, g_observed)
        # A flip is judged over the period it locks the pool (see `commit_path`); a retune (not
        # locked, lighter budget) and the canaries on the projected load (`gains`).
        path = commit_path(policy, rollout, model.demand, demand)
        g_commit = goodput_prediction(model, path, est_flip, k)
        wanted = goodput_wanted(policy, state, obs, g_commit, est_flip)
        if schedule and wanted.mode == "Off" and g_observed.gain_best > 1 + goodput_margin(policy):
            # A pool following a schedule already drafts less (or nothing) as batches grow, so turning
            # it off gains at most the in-engine K 0 cost while the load stays up, and locks it off
            # when the load falls again: it turns off once the load measured is near break-even too
            # (within the margin), not on a projected peak alone.
            wanted = Wanted(
                "On",
                r.GOODPUT_WITHIN_MARGIN,
                f"{measured:.1f} running per replica measured is not near "
                f"break-even yet ({g_observed.gain_best:.2f}x at K {g_observed.best}); the schedule "
                "drafts less as batches grow",
                wanted.numbers,
            )
        if model.memory_known and model.bound():
            # Where memory, not compute, bounds the batch, the decision says so and shows it.
            why = model.why(g_commit.best, g_commit.per_position) + "; " if wanted.mode == "Off" else ""
            shown = {**wanted.numbers, **model.numbers(g_commit.per_position)}
            reason = r.GOODPUT_MEMORY_BOUND if why else wanted.reason
            wanted = replace(wanted, reason=reason, message=why + wanted.message, numbers=shown)
        wanted = _transient_queue(policy, state, observed, now, model, g_commit, wanted)
        wanted = _saturation(policy, state, observed, now, model, g_commit, wanted)
        wanted = _overload_ahead(policy, state, observed, now, model, g_commit, wanted, rollout)
    else:
        wanted = threshold_wanted(policy, k, state, obs, est, profile)
    numbers = {**observed.as_text(), **wanted.numbers}
    if moving is not None:
        numbers["acceptanceMoving"] = moving
    if load != measured:
        numbers["expectedRunningPerReplica"] = f"{load:.3g}"
    if policy.mode == "Goodput" and demand != load:
        numbers["expectedDemandPerReplica"] = f"{demand:.3g}"
    if (
        est is None
        and state.mode == "Off"
        and wanted.mode == "On"
        and policy.reentry.canary_replicas
        and (active_canaries(policy, state) < policy.reentry.canary_replicas or settling(policy, state, now))
    ):
        # Acceptance unknown: canaries measure it (brought back up if they are down) before the pool
        # turns on to probe; the probe stays for when they cannot (no traffic in a whole window).
        wanted = Wanted(
            "Off", r.PROBE_ACCEPTANCE, "acceptance is unknown: the canaries measure it first", wanted.numbers
        )
    loads = (load, measured)
    return Assessment(
        pool, state, obs, current_k, est, wanted, loads, gains, numbers, schedules, model, demand, rollout
    )


def _arrivals(
    policy: PolicySpec, state: PoolState, observed: PoolObservation, now: datetime
) -> Arrivals | None:
    """The arrivals per replica (`policy.saturation.arrivals`) with the demand's trend measured."""
    trend = demand_trend(policy, state, observed, now)
    return arrivals(observed, trend[0] if trend else None)


def _transient_queue(
    policy: PolicySpec,
    state: PoolState,
    observed: PoolObservation,
    now: datetime,
    model: PoolModel,
    g: GoodputPrediction,
    wanted: Wanted,
) -> Wanted:
    """`wanted`, or On where a speculating pool whose KV cache holds fewer requests than it is asked
    for (memory-bound), and so queues, would turn off although it serves the arrivals with fewer
    requests in its engines than the engine without the drafter would need
    (`policy.saturation.serves_with_fewer`). Only there: a queue of another cause (prompts waiting for
    their prefill as a crowd arrives) says nothing of the rate that arrives."""
    if not (state.mode == "On" and wanted.mode == "Off" and queued(observed) and model.current):
        return wanted
    if not (model.memory_known and model.bound()):
        return wanted
    arriving = _arrivals(policy, state, observed, now)
    if arriving is None:
        return wanted
    why = serves_with_fewer(model, model.current, g.per_position, arriving, goodput_margin(policy))
    if why is None:
        return wanted
    numbers = {**wanted.numbers, "arrivingTokensPerSecond": f"{arriving.tokens_per_second:.4g}"}
    return Wanted("On", r.GOODPUT_WITHIN_MARGIN, f"stays on: {why}", numbers)


def _overload_ahead(
    policy: PolicySpec,
    state: PoolState,
    observed: PoolObservation,
    now: datetime,
    model: PoolModel,
    g: GoodputPrediction,
    wanted: Wanted,
    rollout: RolloutTime,
) -> Wanted:
    """`wanted`, or Off where a speculating pool's demand, rising along its trend, would pass the batch
    its setting can run (min(maxNumSeqs, what its KV cache holds)) before a rollout to the engine
    without the drafter, which runs more and serves more by the margin, could finish: the queue
    would build during the rollout that relieves it. Reason GoodputMemoryBound where the KV cache
    is the limit, GoodputOverloaded where maxNumSeqs is."""
    if not (state.mode == "On" and wanted.mode == "On" and model.current):
        return wanted
    fit = demand_fit(policy, state, observed, now)
    # Projected over a whole rollout, a slope not told apart from noise would turn pools off on every
    # fluctuation.
    if fit is None or not fit.significant(policy):
        return wanted
    slope, fitted = fit.slope, fit.fitted
    margin = goodput_margin(policy)
    name = model.current
    top = min(model.max_num_seqs, model.settings[name].fits)
    top_off = min(model.max_num_seqs, model.settings[OFF].fits)
    cap, off = model.capacity(name, g.per_position), model.capacity(OFF, g.per_position)
    if top_off <= top * (1 + margin) or off <= cap * (1 + margin):
        return wanted
    band = math.sqrt(max(fitted, 1.0) / max(1, observed.replicas_reporting))
    rise = max(0.0, slope * (policy.window_seconds / 2 + rollout.seconds) - band)
    ahead = (observed.demand_per_replica or 0.0) + rise
    if ahead <= top:
        return wanted
    why = (
        f"at the demand's trend {ahead:.1f} requests per replica arrive by the time a rollout "
        f"({rollout.seconds:.0f} s) serves; with the drafter ({name}) the engines run {top:.0f} at once "
        f"and serve at most {cap:.0f} tokens/s, without it {top_off:.0f} and {off:.0f}"
    )
    numbers = {**wanted.numbers, "projectedDemandPerReplica": f"{ahead:.3g}"}
    if model.memory_known and model.settings[name].fits < model.max_num_seqs:
        # The KV cache, not maxNumSeqs, is what the demand would overflow: said as memory-bound.
        numbers = {**numbers, **model.numbers(g.per_position, ahead)}
        return Wanted("Off", r.GOODPUT_MEMORY_BOUND, f"memory-bound ahead: {why}", numbers, k=g.best)
    return Wanted("Off", r.GOODPUT_OVERLOADED, why, numbers, k=g.best)


def _saturation(
    policy: PolicySpec,
    state: PoolState,
    observed: PoolObservation,
    now: datetime,
    model: PoolModel,
    g: GoodputPrediction,
    wanted: Wanted,
) -> Wanted:
    """`wanted`, or Off where the speculating setting it keeps or turns to cannot serve the arrivals
    (`policy.saturation`)."""
    if wanted.mode != "On" or (state.mode == "On" and not queued(observed)):
        return wanted
    arriving = _arrivals(policy, state, observed, now)
    if arriving is None:
        return wanted
    name = model.current if state.mode == "On" else setting_name(wanted.k or g.best)
    why = None if name is None else overloaded(model, name, g.per_position, arriving, goodput_margin(policy))
    if why is None:
        return wanted
    numbers = {
        **wanted.numbers,
        "arrivingTokensPerSecond": f"{arriving.tokens_per_second:.4g}",
        "capacityTokensPerSecond": ",".join(
            f"{n}={model.capacity(n, g.per_position):.0f}" for n in model.settings
        ),
    }
    if state.mode == "On":
        return Wanted("Off", r.GOODPUT_OVERLOADED, why, numbers, k=g.best)
    return Wanted("Off", r.GOODPUT_OVERLOADED, f"stays off: {why}", numbers)
