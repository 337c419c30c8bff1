"""Whether a setting can serve what arrives (pure): Goodput's prediction compares settings at the same
demand, as if each request in the pool waited for another to finish before the next one came (a closed
loop). Requests that arrive on their own schedule do not wait: a setting that serves fewer tokens per
second than arrive builds a queue that grows for as long as the load lasts, whatever it predicts per
request. So a pool never runs, nor turns to, a speculating setting whose capacity (`PoolModel.capacity`:
tokens per second at the largest batch it runs) is below the arrivals, where the engine without the
drafter serves more by the policy's margin (`GoodputOverloaded`). A speculating pool
is turned off for it only while its engines queue (`queued`): below their capacity in tokens per second
they may still run fewer requests than they could (a large batch at K 3 yields little more than a
medium one), and the closed-loop prediction with its commit path decides there, so a short spike does
not lock the pool off.

The arrivals per replica are the generated tokens per second measured (what the pool served over the
window) plus the growth of its queue: the demand's trend (`policy.predict.demand.demand_trend`), when rising,
times the mean generated tokens of a request. A queue that drains is not counted against the
arrivals: while one drains, the pool serves at its capacity and the arrivals are at most that, so a
setting with less capacity stays ruled out until the queue is gone and what is served is what arrives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specfleet.policy.inputs.observation import PoolObservation
from specfleet.policy.predict.throughput import OFF, PoolModel

# Waiting requests per replica, averaged over the window, from which a pool's engines queue.
MIN_QUEUE_PER_REPLICA = 1.0


@dataclass(frozen=True)
class Arrivals:
    """Generated tokens per second per replica that arrive: served, plus the queue's growth."""

    served: float
    growth: float

    @property
    def tokens_per_second(self) -> float:
        return self.served + self.growth


def queued(obs: PoolObservation) -> bool:
    """The pool's engines queue requests: at least one waiting per replica over the window (they run
    all they can; below that, a request waits only for its turn at the next step)."""
    return (
        obs.replicas_reporting >= 1 and (obs.waiting or 0.0) / obs.replicas_reporting >= MIN_QUEUE_PER_REPLICA
    )


def arrivals(obs: PoolObservation, demand_slope: float | None) -> Arrivals | None:
    """The arrivals per replica (None: the generated tokens are not measured). The demand's growth is
    a queue's only while the engines queue: otherwise it is more requests running (a burst of clients
    that each wait for their answer), which the engines serve."""
    gen = obs.generation_tokens_per_second
    if gen is None or obs.replicas_reporting < 1:
        return None
    growth = max(0.0, demand_slope or 0.0) * (obs.mean_output_tokens or 0.0) if queued(obs) else 0.0
    return Arrivals(max(0.0, gen) / obs.replicas_reporting, growth)


def overloaded(
    model: PoolModel, name: str, per_position: Sequence[float], arriving: Arrivals, margin: float
) -> str | None:
    """Why setting `name` cannot serve the arrivals where the engine without the drafter serves more
    by `margin`, or None."""
    if name == OFF:
        return None
    capacity = model.capacity(name, per_position)
    off = model.capacity(OFF, per_position)
    if off <= capacity * (1 + margin) or arriving.tokens_per_second <= capacity:
        return None
    growth = f" + {arriving.growth:.0f} the queue grows by" if arriving.growth > 0 else ""
    return (
        f"{arriving.tokens_per_second:.0f} tokens/s per replica arrive ({arriving.served:.0f} served{growth}); "
        f"with the drafter ({name}) the engines serve at most {capacity:.0f} at the {model.batch(name, model.max_num_seqs):.0f} "
        f"requests they run, without it {off:.0f}: a queue would grow for as long as the load lasts"
    )


def waiting(servers: int, utilisation: float) -> float:
    """Mean requests waiting at an engine of `servers` batch slots busy `utilisation` of the time, with
    requests arriving at random (Poisson; Erlang C: the chance of waiting times the queue a waiting
    request finds, utilisation / (1 - utilisation)); inf from full utilisation on."""
    if utilisation >= 1:
        return math.inf
    if utilisation <= 0:
        return 0.0
    offered = utilisation * servers
    blocked = 1.0  # Erlang B, by its recurrence over the slots
    for k in range(1, servers + 1):
        blocked = offered * blocked / (k + offered * blocked)
    wait_chance = blocked / (1 - utilisation * (1 - blocked))
    return wait_chance * utilisation / (1 - utilisation)


def in_system(model: PoolModel, name: str, per_position: Sequence[float], rate: float) -> float:
    """Requests per replica in setting `name`'s engines when `rate` generated tokens per second per
    replica arrive at random: the batch that serves them (`PoolModel.requests_for`) and the queue its
    fluctuations build (`waiting`, with the setting's batch slots and its `capacity`)."""
    running = model.requests_for(name, per_position, rate)
    if math.isinf(running):
        return math.inf
    slots = max(1, int(min(model.max_num_seqs, model.settings[name].fits)))
    return running + waiting(slots, rate / model.capacity(name, per_position))


def batching_in_system(model: PoolModel, name: str, per_position: Sequence[float], rate: float) -> float:
    """Mean requests per replica in setting `name`'s engines when `rate` generated tokens per second
    per replica arrive at random (Poisson), the engine a server whose pace depends on how many it
    holds: with n requests in it, it completes them at its tokens per second at a batch of n (at most
    the batch it runs; beyond it the rest wait) over a request's mean output. The number in such a
    queue is a birth-death chain whose stationary probabilities are P(n) ~ prod_{k<=n} rate / T(k)
    (the mean output cancels), and, the engine sharing its steps among the requests it holds, the
    chain holds for any distribution of lengths. Unlike `in_system` (a batch that serves the rate,
    plus Erlang C over the batch slots), it counts the time the engine spends at small batches, where
    a drafter gains most: inf at or beyond the setting's capacity."""
    top = max(1, int(min(model.max_num_seqs, model.settings[name].fits)))
    if rate <= 0:
        return 0.0
    if rate >= model.capacity(name, per_position):
        return math.inf
    weight, total, mean = 1.0, 1.0, 0.0
    n = 0
    while weight > 1e-12 * total and n < 100_000:
        n += 1
        weight *= rate / model.tokens_per_second(name, per_position, float(min(n, top)))
        total += weight
        mean += n * weight
    return mean / total


def serves_with_fewer(
    model: PoolModel, name: str, per_position: Sequence[float], arriving: Arrivals, margin: float
) -> str | None:
    """Why speculating setting `name` serves the arrivals with fewer requests in the engines than the
    engine without the drafter would need, by more than `margin` (None: it does not). While the pool
    queues, its demand counts the waiting requests; comparing settings at that demand asks who
    serves more if that many were always there (a closed loop). Requests that arrive on their own
    schedule are served at their rate by any setting with the capacity: the one that needs fewer of
    them in the engine to keep up serves each sooner (Little's law), and the queue is the arrivals'
    fluctuation, not a demand the setting must hold."""
    if name == OFF:
        return None
    rate = arriving.tokens_per_second
    spec = in_system(model, name, per_position, rate)
    off = in_system(model, OFF, per_position, rate)
    if not spec < off / (1 + margin):
        return None
    without = "more than it runs" if math.isinf(off) else f"{off:.1f}"
    return (
        f"{rate:.0f} tokens/s per replica arrive; with the drafter ({name}) the engines serve them with "
        f"{spec:.1f} requests per replica in the engines, without it they would need {without}: the queue "
        "is the arrivals' fluctuation, not a load the drafter cannot serve"
    )
