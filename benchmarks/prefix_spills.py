"""How often the load bound moves a conversation off the engine that holds its cache, per request rate.

The router's own choice (`specfleet_runtime.router.affinity.choose`: the conversation's engine under
the conversation limit, else the ring on the tenant's system prompt under the ring's limit) replayed on
`benchmarks/prefix_routing.py`'s traces through the fleet simulator's engines (its 4 engines, KV cache
and profile slowed by the same time scale), in place of the simulator's own affinity rule. Per rate:
the turns whose conversation has a remembered engine, those sent elsewhere because that engine was
at its limit (spilled), how many requests the pool held when they spilled, and the hit rate after
the warm-up.

    python benchmarks/prefix_spills.py [--rates 4,8,14] [--bound-percent 125] [--slack 4] [--seed 29]

A measurement aid, not a model of the router's timing: the simulator's engines finish requests on its
clock, so the outstanding counts the choice sees are the simulator's, not a live router's.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import prefix_routing as pr

from specfleet.sim import traffic
from specfleet.sim.engine import Replica
from specfleet.sim.options import PREFIX_AFFINITY
from specfleet_runtime.router.affinity import PrefixKeys, RecentEngines, Ring, choose, prefix_key
from specfleet_runtime.routing_config import DEFAULT_LOAD_BOUND_PERCENT, LOAD_BOUND_SLACK

Affine = Callable[[list[Replica], str, Replica], Replica]


@dataclass
class Spills:
    """What the router's choice did over one simulated phase."""

    remembered: int = 0
    spilled: int = 0
    # Requests outstanding across the pool when a turn spilled -> how many turns.
    spilled_at: collections.Counter[int] = field(default_factory=collections.Counter)


def router_choice(bound_percent: int, slack: int, spills: Spills) -> Affine:
    """The router's prefix-affinity pick in the simulator's `affine` signature, counting into `spills`.
    The simulator's prefix names a request's tenant and conversation (`t<i>/c<n>`); the router's keys
    are hashes of their text, so these names hashed stand in for them."""
    recent = RecentEngines()
    rings: dict[tuple[str, ...], Ring] = {}

    def pick(candidates: list[Replica], key: str, least: Replica) -> Replica:
        by_url = {str(r.serial): r for r in candidates}
        endpoints = tuple(sorted(by_url))
        ring = rings.setdefault(endpoints, Ring(endpoints))
        outstanding = {url: r.outstanding for url, r in by_url.items()}
        keys = PrefixKeys(prefix_key(key.split("/", 1)[0]) or 0, (prefix_key(key) or 0,))
        home = recent.longest(keys.conversation, endpoints, outstanding, (), 1 << 30)
        url = choose(ring, recent, keys, outstanding, (), bound_percent, slack) or str(least.serial)
        if home is not None:
            spills.remembered += 1
            if url != home:
                spills.spilled += 1
                spills.spilled_at[sum(outstanding.values())] += 1
        recent.record(keys.conversation, url)
        return by_url[url]

    return pick


def measure(rate: float, args: argparse.Namespace) -> str:
    spills = Spills()
    original = traffic.affine
    traffic.affine = router_choice(args.bound_percent, args.slack, spills)
    try:
        trace = pr.workload(rate, args.seconds, args.warmup, args.seed)
        row = pr.simulate_routing(trace, rate, PREFIX_AFFINITY, args.warmup, args.time_scale)
    finally:
        traffic.affine = original
    share = spills.spilled / spills.remembered if spills.remembered else 0.0
    at = ", ".join(f"{n}: {c}" for n, c in sorted(spills.spilled_at.items()))
    return (
        f"rate {rate:g}: {spills.remembered} turns with a remembered engine, {spills.spilled} spilled "
        f"({share:.2f}); hit rate {pr.fmt(row.hit_rate, '.2f')}; in flight when spilled: {at or '-'}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rates", default="4,8,14")
    parser.add_argument("--bound-percent", type=int, default=DEFAULT_LOAD_BOUND_PERCENT)
    parser.add_argument(
        "--slack", type=int, default=LOAD_BOUND_SLACK, help="requests past the mean (0: the percentage alone)"
    )
    parser.add_argument("--seed", type=int, default=pr.SEED)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--time-scale", type=float, default=4.0)
    args = parser.parse_args(argv)
    for rate in (float(r) for r in args.rates.split(",")):
        print(measure(rate, args), flush=True)


if __name__ == "__main__":
    main()
