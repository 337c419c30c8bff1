"""The Goodput ask checked against the load that arrives (pure): Goodput's prediction compares
settings at one demand, as if each request waited for another to finish (a closed loop); requests
arrive on their own schedule, so five guards look at the queue (`against_load`, in this order):

- a memory-bound speculating pool whose queue it serves with fewer requests in its engines than the
  engine without the drafter would need stays on (`_transient_queue`);
- a speculating setting that cannot serve the tokens arriving is not kept or turned to (`_saturation`);
- a pool that is off does not turn to a speculating setting that would serve the arrivals with more
  requests in its engines than the engine without the drafter (`_holds_more_on`);
- a speculating pool whose engines queue below its capacity, or whose served tokens rise toward it,
  turns off where random arrivals would wait longer with the drafter, whose share of the KV cache
  costs its batch a request (`_queues_more_on`);
- a speculating pool turns off before its demand or the tokens it serves, rising along their
  trends, would pass the batch it can run or what it can serve within a rollout (`_overload_ahead`).

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
from specfleet.policy.predict.demand import demand_band, demand_fit, demand_trend, served_fit
from specfleet.policy.predict.queueing import (
    Arrivals,
    arrivals,
    batching_in_system,
    in_system,
    overloaded,
    queued,
    serves_with_fewer,
)
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
    """`wanted` after the four load guards."""
    wanted = _transient_queue(case, wanted)
    wanted = _saturation(case, wanted)
    wanted = _holds_more_on(case, wanted)
    wanted = _queues_more_on(case, wanted)
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
    """`wanted`, or Off where a speculating pool would be overloaded before a rollout to the engine
    without the drafter, which runs more and serves more by the margin, could finish: the queue
    would build during the rollout that relieves it. Two projections over half a window (the
    measurements' lag) plus the rollout, each along its trend: the demand past the batch the setting
    can run (min(maxNumSeqs, what its KV cache holds)), or the served tokens past what the setting
    can serve (its capacity). The second sees a ramp sooner: the tokens served rise with the
    arrivals, while the requests in the engines stay few until the arrivals near the capacity and
    then curve up (a queue). Reason GoodputMemoryBound where the KV cache is the limit,
    GoodputOverloaded where maxNumSeqs is."""
    policy, state, observed, model, g = case.policy, case.state, case.observed, case.model, case.prediction
    if not (state.mode == "On" and wanted.mode == "On" and model.current):
        return wanted
    margin = goodput_margin(policy)
    name = model.current
    top = min(model.max_num_seqs, model.settings[name].fits)
    top_off = min(model.max_num_seqs, model.settings[OFF].fits)
    cap, off = model.capacity(name, g.per_position), model.capacity(OFF, g.per_position)
    if top_off <= top * (1 + margin) or off <= cap * (1 + margin):
        return wanted
    # A flip decided at the next evaluation serves after its interval and the rollout.
    horizon = policy.window_seconds / 2 + policy.evaluation_interval_seconds + case.rollout.seconds
    ahead = _demand_ahead(case, horizon, top) or _served_ahead(case, _served_horizon(case))
    if ahead is None:
        return wanted
    what, numbers = ahead
    why = (
        f"at the {what} by the time a rollout ({case.rollout.seconds:.0f} s) serves; with the drafter ({name}) "
        f"the engines run {top:.0f} at once and serve at most {cap:.0f} tokens/s, without it {top_off:.0f} "
        f"and {off:.0f}"
    )
    numbers = {**wanted.numbers, **numbers}
    # Overloaded, the engines serve at their capacity: the flip's gain is the capacities' ratio.
    gain = off / cap if cap > 0 else None
    if model.memory_known and model.settings[name].fits < model.max_num_seqs:
        # The KV cache, not maxNumSeqs, is what the load would overflow: said as memory-bound.
        demand = float(numbers.get("projectedDemandPerReplica", observed.demand_per_replica or 0.0))
        numbers = {**numbers, **model.numbers(g.per_position, demand)}
        return Wanted(
            "Off", r.GOODPUT_MEMORY_BOUND, f"memory-bound ahead: {why}", numbers, k=g.best, gain=gain
        )
    return Wanted("Off", r.GOODPUT_OVERLOADED, why, numbers, k=g.best, gain=gain)


def _served_horizon(case: LoadCase) -> float:
    """Seconds the served tokens' trend is projected: half a window (the measurements' lag), then to
    when a flip decided at the next evaluation serves, at most a window (as far as it was fitted)."""
    policy = case.policy
    return policy.window_seconds / 2 + min(
        float(policy.window_seconds), policy.evaluation_interval_seconds + case.rollout.seconds
    )


def _demand_ahead(case: LoadCase, horizon: float, top: float) -> tuple[str, dict[str, str]] | None:
    """The demand projected `horizon` seconds along its trend, where it passes `top` requests per
    replica (what and the numbers to show; None: it does not)."""
    fit = demand_fit(case.policy, case.state, case.observed, case.now)
    # Projected over a whole rollout, a slope not told apart from noise would turn pools off on every
    # fluctuation.
    if fit is None or not fit.significant(case.policy):
        return None
    band = demand_band(fit.fitted, case.observed.replicas_reporting)
    ahead = (case.observed.demand_per_replica or 0.0) + max(0.0, fit.slope * horizon - band)
    if ahead <= top:
        return None
    return f"demand's trend {ahead:.1f} requests per replica arrive", {
        "projectedDemandPerReplica": f"{ahead:.3g}"
    }


def _served_ahead(case: LoadCase, horizon: float) -> tuple[str, dict[str, str]] | None:
    """The generated tokens per second per replica served, projected `horizon` seconds along their
    trend (the slope taken one standard error low: a rise only as steep as its noise allows), where
    the speculating setting would serve them with more requests in its engines than the engine
    without the drafter by the margin (`policy.predict.queueing.in_system`: near its capacity a
    setting's queue grows without bound). None: it would not."""
    model, g, name = case.model, case.prediction, case.model.current
    fit = served_fit(case.policy, case.state, case.observed, case.now)
    if name is None or fit is None or not fit.significant(case.policy):
        return None
    ahead = fit.ahead(case.policy, horizon)
    spec = in_system(model, name, g.per_position, ahead)
    off = in_system(model, OFF, g.per_position, ahead)
    if not spec > off * (1 + goodput_margin(case.policy)):
        return None
    held = "more than they can run" if math.isinf(spec) else f"{spec:.1f} requests per replica"
    return (
        f"served tokens' trend {ahead:.0f} tokens/s per replica arrive, which the engines serve with {held} "
        f"in them (without the drafter {off:.1f})",
        {"projectedTokensPerSecond": f"{ahead:.4g}"},
    )


def _holds_more_on(case: LoadCase, wanted: Wanted) -> Wanted:
    """`wanted`, or Off where a pool that is off would turn to a speculating setting that serves the
    arrivals with more requests in its engines than the engine without the drafter, which serves more
    at its largest batch by the margin (`policy.predict.queueing.in_system`): near its capacity a
    setting's queue grows without bound, so a pool that turns on there as the load falls queues at
    the setting it just turned to. The mirror of `_transient_queue` (which keeps a speculating pool
    on where it holds fewer), and of the served tokens' overload ahead (which turns it off where it
    would hold more): a pool turns on only where it holds no more, with the margin between."""
    state, model, g = case.state, case.model, case.prediction
    if not (state.mode == "Off" and wanted.mode == "On"):
        return wanted
    name = setting_name(wanted.k or g.best)
    if name not in model.settings:
        return wanted
    margin = goodput_margin(case.policy)
    if model.capacity(OFF, g.per_position) <= model.capacity(name, g.per_position) * (1 + margin):
        return wanted
    arriving = _arrivals(case)
    if arriving is None:
        return wanted
    rate = arriving.tokens_per_second
    # Falling, the arrivals are projected to when the flip serves (a windowed rate trails a fall).
    fit = served_fit(case.policy, state, case.observed, case.now)
    if fit is not None and fit.falling(case.policy):
        rate = min(rate, fit.ahead(case.policy, _served_horizon(case)))
    spec, off = in_system(model, name, g.per_position, rate), in_system(model, OFF, g.per_position, rate)
    if spec <= off:
        return wanted
    held = "more than they can run" if math.isinf(spec) else f"{spec:.1f}"
    why = (
        f"stays off: {rate:.0f} tokens/s per replica arrive; with the drafter ({name}) the engines would "
        f"serve them with {held} requests per replica in them, without it {off:.1f}"
    )
    numbers = {**wanted.numbers, "arrivingTokensPerSecond": f"{rate:.4g}"}
    # Memory-bound where the drafter's KV cache, not maxNumSeqs, limits its batch.
    memory = model.memory_known and model.settings[name].fits < model.max_num_seqs
    reason = r.GOODPUT_MEMORY_BOUND if memory else r.GOODPUT_OVERLOADED
    return Wanted("Off", reason, why, numbers)


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
        cap = model.capacity(name, g.per_position) if name is not None else 0.0
        gain = model.capacity(OFF, g.per_position) / cap if cap > 0 else None
        return Wanted("Off", r.GOODPUT_OVERLOADED, why, numbers, k=g.best, gain=gain)
    return Wanted("Off", r.GOODPUT_OVERLOADED, f"stays off: {why}", numbers)


def _queues_more_on(case: LoadCase, wanted: Wanted) -> Wanted:
    """`wanted`, or Off where a speculating pool would serve the arrivals with more requests in its
    engines than the engine without the drafter, by the margin
    (`policy.predict.queueing.batching_in_system`: the time each engine spends at every batch size as
    random arrivals fill and empty it). Asked at two rates: the arrivals now, where the engines queue
    (random arrivals; a closed loop holds its demand and is the throughput prediction's), and where
    the tokens served rise, the arrivals projected along their trend to when a flip decided at the
    next evaluation would serve (as `_served_ahead` projects them: a flip decided at the first queue
    serves a rollout later, into the queue built meanwhile). Two more conditions say the comparison
    holds: the drafter's share of the KV cache costs the batch a whole request or more (where the
    settings' batches, so their paces near capacity, differ; at the same batch the two capacities are
    a prefill share apart, closer than the arrivals measured can tell), and the rate asked at is below
    the setting's capacity by the margin (closer, it cannot tell two capacities a percent apart: the
    overload guards decide there, with their margin)."""
    state, observed, model, g = case.state, case.observed, case.model, case.prediction
    if not (state.mode == "On" and wanted.mode == "On" and model.current):
        return wanted
    name = model.current
    drafter, off_setting = model.settings[name], model.settings[OFF]
    if not (model.memory_known and drafter.fits < min(model.max_num_seqs, off_setting.fits)):
        return wanted
    arriving = _arrivals(case)
    if arriving is None:
        return wanted
    rates: list[tuple[float, str]] = []
    if queued(observed):
        rates.append((arriving.tokens_per_second, "arrive and the engines queue"))
    fit = served_fit(case.policy, state, observed, case.now)
    if fit is not None and fit.significant(case.policy):
        ahead = fit.ahead(case.policy, _served_horizon(case))
        rates.append((ahead, "arrive by the time a flip serves, along the served tokens' trend"))
    margin = goodput_margin(case.policy)
    capacity = model.capacity(name, g.per_position)
    for rate, when in rates:
        if rate * (1 + margin) > capacity:
            continue
        spec = batching_in_system(model, name, g.per_position, rate)
        off = batching_in_system(model, OFF, g.per_position, rate)
        if not spec > off * (1 + margin):
            continue
        why = (
            f"{rate:.0f} tokens/s per replica {when}; arriving at random, they would hold {spec:.1f} requests "
            f"per replica with the drafter ({name}), whose KV cache holds {drafter.fits:.0f}, and {off:.1f} "
            "without it"
        )
        numbers = {**wanted.numbers, "arrivingTokensPerSecond": f"{rate:.4g}"}
        # A request's time is the requests in the engines over the arrivals (Little's law): the gain.
        return Wanted("Off", r.GOODPUT_MEMORY_BOUND, why, numbers, k=g.best, gain=spec / off)
    return wanted
