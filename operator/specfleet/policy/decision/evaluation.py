"""One policy evaluation of one resource, shared by the operator and the fleet simulator (pure).

From the parsed resource, its previous status (with the measurements kept in memory applied), one round
of fleet answers, the cost profile (or why it is unavailable) and the time: observe each Auto pool,
decide, record, set the cost-profile condition, track acceptance drift and keep recent measurement
times. The caller does the I/O: the operator starts the retrain Jobs, rolls out a flip and writes
status; the simulator renders its Deployments from the new status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from specfleet.api import reasons as r
from specfleet.api.constants import POOLS, PoolName
from specfleet.api.pools import LatencySlo
from specfleet.api.semantics import engine_schedules
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.decision.deployment import decide
from specfleet.policy.decision.record import record
from specfleet.policy.inputs.fleet_answers import FleetAnswers, PoolSelector, pool_observation
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.profile_source import profile_condition
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.inputs.slo_attainment import SloAttainment, measure_attainment
from specfleet.policy.inputs.status import auto_pools, parse_time, pool_states
from specfleet.policy.predict.dynamic_sd import observed_under_schedule
from specfleet.policy.rules.drift import RetrainTrigger, track_drift
from specfleet.policy.rules.results import PoolDecision
from specfleet_runtime.cost_profile import StepTimeProfile

# The same acceptance measured again rewrites its timestamp in status at most this often: otherwise
# every evaluation of every speculating pool is a status write (and a watch event for every replica
# of the operator and every GitOps tool). The older timestamp only makes its age conservative.
ACCEPTANCE_REFRESH_SECONDS = 300.0


@dataclass(frozen=True)
class Evaluation:
    """Everything one evaluation produces.

    `status` sets lastRetrainTime for every trigger in `retrain`: a caller that fails to start one
    puts the previous time back, so it is asked for again.
    """

    status: SpeculativeDeploymentStatus
    decisions: list[PoolDecision]
    flipped: list[PoolDecision]
    events: list[tuple[str, str, str]]  # (type, reason, message)
    retrain: list[RetrainTrigger]
    observations: dict[str, PoolObservation]


def expected_reporting(status: SpeculativeDeploymentStatus, pool: PoolName) -> int | None:
    """Engines that should report metrics: the ready ones of a settled pool (None while it rolls)."""
    ps = getattr(status.pools, pool)
    return ps.ready_replicas if ps.settled and ps.ready_replicas > 0 else None


def hold_every_pool(states: Mapping[str, PoolState], message: str) -> list[PoolDecision]:
    """Decisions that keep every pool as it is because the profile to decide with is unusable."""
    return [
        PoolDecision(pool, state.mode, state.mode, False, r.COST_PROFILE_UNAVAILABLE, f"{message}: holding")
        for pool, state in states.items()
    ]


def evaluate_policy(
    sd: SpeculativeDeployment,
    previous: SpeculativeDeploymentStatus,
    answers: FleetAnswers,
    profile: StepTimeProfile | None,
    profile_problem: str | None,
    now: datetime,
    monitoring_labels: Iterable[tuple[str, str]] = (),
) -> Evaluation:
    """Evaluate the policy of `sd` once; `previous` is its status with the remembered measurements.

    `profile` None (with `profile_problem` saying why) holds every pool. `monitoring_labels` are the
    installation's PodMonitor labels (the chart's monitoring.labels), named when Prometheus does not
    scrape a pool.
    """
    spec = sd.spec
    window = spec.policy.window_seconds
    states = pool_states(spec, previous, now)
    observations: dict[str, PoolObservation] = {
        pool: pool_observation(
            answers,
            PoolSelector(sd.namespace, sd.name, pool),
            window,
            now,
            pool_mode=states[pool].mode,
            expected_replicas=expected_reporting(previous, pool),
            ready_replicas=getattr(previous.pools, pool).ready_replicas,
        )
        for pool in auto_pools(spec)
    }
    schedules = engine_schedules(spec)
    if profile is None:
        decisions = hold_every_pool({p: states[p] for p in observations}, profile_problem or "")
    else:
        decisions = decide(
            spec.policy,
            spec.drafter.num_speculative_tokens,
            states,
            observations,
            now,
            profile,
            engine_schedule=schedules,
            slos=steering_slos(sd),
        )
    scrape = ScrapeSetup.of(sd, monitoring_labels)
    recorded = record(
        previous,
        decisions,
        observations,
        sd.generation,
        now,
        scrape,
        attainment=slo_attainment(sd, answers),
        window_seconds=window,
    )
    status, profile_events = profile_condition(
        recorded.status, spec.policy.goodput.cost_profile_config_map, profile_problem, sd.generation, now
    )
    # Drift compares per-position acceptance: unmixed where a pool follows a schedule.
    measured = {p: observed_under_schedule(o, states[p], schedules) for p, o in observations.items()}
    drift = track_drift(spec, status, states, measured, sd.generation, now)
    return Evaluation(
        status=_keep_recent_measurement_times(previous, drift.status, now),
        decisions=decisions,
        flipped=recorded.flipped,
        events=[*recorded.events, *profile_events, *drift.events],
        retrain=drift.retrain,
        observations=observations,
    )


def steering_slos(sd: SpeculativeDeployment) -> dict[str, LatencySlo]:
    """The pools whose speculation the policy steers by their SLO: the latency pool's, where it has one.
    The batch pool serves for throughput, so an SLO there is measured, never steered by."""
    slo = sd.spec.pools.latency.slo
    return {} if slo is None else {"latency": slo}


def slo_attainment(sd: SpeculativeDeployment, answers: FleetAnswers) -> dict[str, SloAttainment]:
    """Each pool with an SLO (whatever its speculation setting): the share of its requests within it
    over the window, from its engines' TTFT and TPOT histograms (None shares where not measured)."""
    out: dict[str, SloAttainment] = {}
    for pool in POOLS:
        slo = getattr(sd.spec.pools, pool).slo
        if slo is not None:
            key = PoolSelector(sd.namespace, sd.name, pool).key
            ttft, tpot = answers.histogram("ttft_buckets", key), answers.histogram("tpot_buckets", key)
            out[pool] = measure_attainment(slo, ttft, tpot)
    return out


def _keep_recent_measurement_times(
    previous: SpeculativeDeploymentStatus, recorded: SpeculativeDeploymentStatus, now: datetime
) -> SpeculativeDeploymentStatus:
    """`recorded` with each pool's acceptanceMeasuredAt (and per-position times) kept from `previous`
    where the measured numbers did not change and the previous time is younger than
    ACCEPTANCE_REFRESH_SECONDS: the same measurement again writes no status."""
    pools = recorded.pools.model_copy()
    kept = False
    for pool in POOLS:
        old, new = getattr(previous.pools, pool), getattr(recorded.pools, pool)
        measured = parse_time(old.acceptance_measured_at)
        if (
            measured is not None
            and new.acceptance_measured_at != old.acceptance_measured_at
            and (new.acceptance_length, new.per_position_acceptance)
            == (old.acceptance_length, old.per_position_acceptance)
            and (now - measured).total_seconds() < ACCEPTANCE_REFRESH_SECONDS
        ):
            keep = {
                "acceptance_measured_at": old.acceptance_measured_at,
                "per_position_measured_at": old.per_position_measured_at,
            }
            setattr(pools, pool, new.model_copy(update=keep))
            kept = True
    return recorded.model_copy(update={"pools": pools}) if kept else recorded
