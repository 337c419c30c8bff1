"""One pool assessed before the gates (pure): the acceptance estimate (the newest interval's while the
window's is moving), the expected load, Goodput's predictions (one model of the pool,
`policy.predict.throughput`) or Threshold's rule, and the mode they ask for (`assess`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.api.pools import LatencySlo
from specfleet.policy.inputs.observation import (
    MeasuredAcceptance,
    PoolObservation,
    PoolState,
    RealizedRecord,
    Schedule,
)
from specfleet.policy.inputs.settings import goodput_margin, pool_k
from specfleet.policy.predict.acceptance import Estimate, acceptance_moving, estimate_for, newest_acceptance
from specfleet.policy.predict.demand import (
    commit_path,
    demand_band,
    expected_load,
    measured_load,
)
from specfleet.policy.predict.kv_cache import DEFAULT_MAX_NUM_SEQS
from specfleet.policy.predict.rollout_time import RolloutTime, pool_rollout
from specfleet.policy.predict.throughput import OFF, PoolModel, pool_model
from specfleet.policy.rules.canaries import active_canaries, settling
from specfleet.policy.rules.goodput import GoodputPrediction, candidate_ks, goodput_prediction, goodput_wanted
from specfleet.policy.rules.load_guards import LoadCase, against_load
from specfleet.policy.rules.realized_guard import guard_wanted, realized_sample, with_shortfall
from specfleet.policy.rules.results import PoolDecision, Wanted
from specfleet.policy.rules.slo import SettingShares, setting_shares, slo_along_path, slo_wanted
from specfleet.policy.rules.threshold import threshold_wanted
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
    # Goodput: the check of the pool's last prediction against what its engines delivered, when this
    # evaluation took a new sample (None: unchanged).
    realized: RealizedRecord | None = None
    # Goodput with a latency objective: each setting's predicted share within it (`policy.rules.slo`),
    # from which a pool that stays On is retuned by the SLO (None: not steered by one, or not predicted).
    slo_shares: list[SettingShares] | None = None

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
        in_place: bool = False,
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
            self.realized,
            in_place,
        )


def window_loads(policy: PolicySpec, state: PoolState, now: datetime, demand: float) -> tuple[float, float]:
    """The lowest and highest demand measured over the last window (the evaluations' and `demand` now):
    the loads the histograms of the window were recorded at. Each evaluation's demand is itself a mean
    over the window before it, so only those of the last half window, whose windows are mostly this
    one's, count."""
    window = timedelta(seconds=policy.window_seconds / 2)
    loads = [v for t, v in state.recent_load if timedelta(0) < now - t <= window] + [demand]
    return min(loads), max(loads)


def assess(
    policy: PolicySpec,
    k: int,
    pool: str,
    state: PoolState,
    observed: PoolObservation,
    now: datetime,
    profile: StepTimeProfile,
    schedules: bool = False,
    slo: LatencySlo | None = None,
) -> Assessment:
    """What one pool's numbers ask for, and everything the gates, retunes and canaries need to know.
    A pool with a latency objective (`slo`) asks for the setting predicted to meet it most
    (`policy.rules.slo`), throughput breaking ties."""
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
    rollout = pool_rollout(state, observed, profile)
    demand = expected_load(policy, state, observed, now, rollout)
    load = min(demand, float(state.max_num_seqs or DEFAULT_MAX_NUM_SEQS))
    obs = replace(observed, running_per_replica=load)
    gains = None
    model: PoolModel | None = None
    realized: RealizedRecord | None = None
    shares: list[SettingShares] | None = None
    if policy.mode == "Goodput":
        # One model of the pool (policy.predict.throughput): each setting's tokens/s at a demand of running
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
        # An off pool whose last speculating setting fell short of its prediction judges turning on
        # with that shortfall (`policy.rules.realized_guard`).
        g = with_shortfall(state, goodput_prediction(model, [demand], est, k))
        g_observed = with_shortfall(state, goodput_prediction(model, [model.demand], est, k))
        gains = (g, g_observed)
        # A flip is judged over the period it locks the pool (see `commit_path`); a retune (not
        # locked, lighter budget) and the canaries on the projected load (`gains`).
        path = commit_path(policy, rollout, model.demand, demand)
        g_commit = with_shortfall(state, goodput_prediction(model, path, est_flip, k))
        realized = realized_sample(policy, state, observed, model, est, now)
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
        if slo is not None:
            # Over the flip's commit path, as Goodput's gain (the demands `path` projects).
            # At the demand measured, as the histograms were: scaling their tail to a projected demand
            # would compound the projection's error with the tail's.
            # The load's own noise band around it: a gain only the met share's growth shows must hold there.
            band = demand_band(model.demand, observed.replicas_reporting)
            shares = setting_shares(
                slo,
                observed,
                model,
                g_commit.per_position,
                [model.demand],
                k,
                schedules,
                band,
                window_loads(policy, state, now, model.demand),
            )
            if shares is not None:
                goal = slo.percentile / 100
                current = model.current or OFF
                by_slo = slo_wanted(policy, state, current, shares, wanted, goal)
                if by_slo.reason in r.SLO_REASONS and any(d != model.demand for d in path):
                    # Where the load moves, the SLO overrides throughput only if its verdict holds along
                    # the commit path too (`slo_along_path`): TPOT's means over the path, TTFT's at the
                    # demand measured (its spread is the queue's at one load).
                    along = setting_shares(
                        slo,
                        observed,
                        model,
                        g_commit.per_position,
                        path,
                        k,
                        schedules,
                        band,
                        window_loads(policy, state, now, model.demand),
                        ttft_demand=model.demand,
                    )
                    if along is not None:
                        on_path = slo_wanted(policy, state, current, along, wanted, goal)
                        by_slo = slo_along_path(by_slo, on_path, wanted)
                wanted = by_slo
        wanted = guard_wanted(policy, state, realized or state.realized, wanted, g_commit)
        case = LoadCase(policy, state, observed, now, model, g_commit, rollout)
        wanted = against_load(case, wanted)
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
        pool,
        state,
        obs,
        current_k,
        est,
        wanted,
        loads,
        gains,
        numbers,
        schedules,
        model,
        demand,
        rollout,
        realized,
        shares,
    )
