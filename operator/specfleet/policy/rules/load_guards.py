"""The Goodput ask checked against the load that arrives (pure): Goodput's prediction compares
settings at one demand, as if each request waited for another to finish (a closed loop); requests
arrive on their own schedule, so three guards look at the queue (`against_load`, in this order):

- a memory-bound speculating pool whose queue it serves with fewer requests in its engines than the
  engine without the drafter would need stays on (`_transient_queue`);
- a speculating setting that cannot serve the tokens arriving is not kept or turned to (`_saturation`);
- a speculating pool turns off before its demand, rising along its trend, would pass the batch it can
  run within a rollout (`_overload_ahead`).

The queueing physics is in `policy.predict.queueing`; the rules and their reasons in docs/policy.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.predict.demand import demand_fit, demand_trend
from specfleet.policy.predict.queueing import Arrivals, arrivals, overloaded, queued, serves_with_fewer
from specfleet.policy.predict.rollout_time import RolloutTime
from specfleet.policy.predict.throughput import OFF, PoolModel, setting_name
from specfleet.policy.rules.goodput import GoodputPrediction
from specfleet.policy.rules.results import Wanted


@dataclass(frozen=True)
class LoadCase:
    """What the load guards read about one pool: its state, what was observed (at the measured
    load), the pool's model and Goodput's prediction over the flip's commit path."""

    policy: PolicySpec
    state: PoolState
    observed: PoolObservation
    now: datetime
    model: PoolModel
    prediction: GoodputPrediction
    rollout: RolloutTime


def against_load(case: LoadCase, wanted: Wanted) -> Wanted:
    """`wanted` after the three load guards."""
    wanted = _transient_queue(case, wanted)
    wanted = _saturation(case, wanted)
    return _overload_ahead(case, wanted)


def _arrivals(case: LoadCase) -> Arrivals | None:
    """The arrivals per replica (`policy.predict.queueing.arrivals`) with the demand's trend measured."""
    trend = demand_trend(case.policy, case.state, case.observed, case.now)
    return arrivals(case.observed, trend[0] if trend else None)


def _transient_queue(case: LoadCase, wanted: Wanted) -> Wanted:
    """`wanted`, or On where a speculating pool whose KV cache holds fewer requests than it is asked
    for (memory-bound), and so queues, would turn off although it serves the arrivals with fewer
    requests in its engines than the engine without the drafter would need
    (`policy.predict.queueing.serves_with_fewer`). Only there: a queue of another cause (prompts waiting for
    their prefill as a crowd arrives) says nothing of the rate that arrives."""
    state, observed, model, g = case.state, case.observed, case.model, case.prediction
    if not (state.mode == "On" and wanted.mode == "Off" and queued(observed) and model.current):
        return wanted
    if not (model.memory_known and model.bound()):
        return wanted
    arriving = _arrivals(case)
    if arriving is None:
        return wanted
    why = serves_with_fewer(model, model.current, g.per_position, arriving, goodput_margin(case.policy))
    if why is None:
        return wanted
    numbers = {**wanted.numbers, "arrivingTokensPerSecond": f"{arriving.tokens_per_second:.4g}"}
    return Wanted("On", r.GOODPUT_WITHIN_MARGIN, f"stays on: {why}", numbers)


def _overload_ahead(case: LoadCase, wanted: Wanted) -> Wanted:
    """`wanted`, or Off where a speculating pool's demand, rising along its trend, would pass the batch
    its setting can run (min(maxNumSeqs, what its KV cache holds)) before a rollout to the engine
    without the drafter, which runs more and serves more by the margin, could finish: the queue
    would build during the rollout that relieves it. Reason GoodputMemoryBound where the KV cache
    is the limit, GoodputOverloaded where maxNumSeqs is."""
    policy, state, observed, model, g = case.policy, case.state, case.observed, case.model, case.prediction
    if not (state.mode == "On" and wanted.mode == "On" and model.current):
        return wanted
    fit = demand_fit(policy, state, observed, case.now)
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
    rise = max(0.0, slope * (policy.window_seconds / 2 + case.rollout.seconds) - band)
    ahead = (observed.demand_per_replica or 0.0) + rise
    if ahead <= top:
        return wanted
    why = (
        f"at the demand's trend {ahead:.1f} requests per replica arrive by the time a rollout "
        f"({case.rollout.seconds:.0f} s) serves; with the drafter ({name}) the engines run {top:.0f} at once "
        f"and serve at most {cap:.0f} tokens/s, without it {top_off:.0f} and {off:.0f}"
    )
    numbers = {**wanted.numbers, "projectedDemandPerReplica": f"{ahead:.3g}"}
    if model.memory_known and model.settings[name].fits < model.max_num_seqs:
        # The KV cache, not maxNumSeqs, is what the demand would overflow: said as memory-bound.
        numbers = {**numbers, **model.numbers(g.per_position, ahead)}
        return Wanted("Off", r.GOODPUT_MEMORY_BOUND, f"memory-bound ahead: {why}", numbers, k=g.best)
    return Wanted("Off", r.GOODPUT_OVERLOADED, why, numbers, k=g.best)


def _saturation(case: LoadCase, wanted: Wanted) -> Wanted:
    """`wanted`, or Off where the speculating setting it keeps or turns to cannot serve the arrivals
    (`policy.predict.queueing`)."""
    state, observed, model, g = case.state, case.observed, case.model, case.prediction
    if wanted.mode != "On" or (state.mode == "On" and not queued(observed)):
        return wanted
    arriving = _arrivals(case)
    if arriving is None:
        return wanted
    name = model.current if state.mode == "On" else setting_name(wanted.k or g.best)
    why = (
        None
        if name is None
        else overloaded(model, name, g.per_position, arriving, goodput_margin(case.policy))
    )
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
