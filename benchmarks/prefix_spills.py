"""How often the load bound moves a conversation off the engine that holds its cache, per request rate.

The router's own choice (`specfleet_runtime.router.affinity.choose`: the conversation's engine under
the conversation limit, else the engine its tenant's system prompt was placed on under its limit, else
the ring), which the
fleet simulator's prefix routing runs (`specfleet.sim.traffic.PrefixRouting`), replayed on
`benchmarks/prefix_routing.py`'s traces through the simulator's engines (its 4 engines, KV cache and
profile slowed by the same time scale), with the bound and slack given. Per rate:
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
from collections.abc import Sequence
from dataclasses import dataclass, field

import prefix_routing as pr

from specfleet.sim import traffic
from specfleet.sim.engine import Replica
from specfleet.sim.options import PREFIX_AFFINITY
from specfleet_runtime.routing_config import DEFAULT_LOAD_BOUND_PERCENT, LOAD_BOUND_SLACK


@dataclass
class Spills:
    """What the router's choice did over one simulated phase."""

    remembered: int = 0
    spilled: int = 0
    # Requests outstanding across the pool when a turn spilled -> how many turns.
    spilled_at: collections.Counter[int] = field(default_factory=collections.Counter)


class CountedRouting(traffic.PrefixRouting):
    """The simulator's prefix routing (the router's own choice), counting the turns it moved off the
    engine their conversation last used."""

    def __init__(self, spills: Spills, slack: int, bound_percent: int) -> None:
        super().__init__(slack)
        self.spills = spills
        self.bound_percent = bound_percent

    def pick(
        self, candidates: list[Replica], prefix: Sequence[tuple[str, int]], least: Replica, bound_percent: int
    ) -> Replica:
        keys = self.keys(prefix)
        names = {str(r.serial) for r in candidates}
        home = None
        if keys is not None:
            home = self.recent.longest(keys.conversation, names, {}, (), 1 << 30)
        chosen = super().pick(candidates, prefix, least, self.bound_percent)
        if home is not None:
            self.spills.remembered += 1
            if str(chosen.serial) != home:
                self.spills.spilled += 1
                self.spills.spilled_at[sum(r.outstanding for r in candidates)] += 1
        return chosen


def measure(rate: float, args: argparse.Namespace) -> str:
    spills = Spills()
    original = traffic.PrefixRouting
    traffic.PrefixRouting = lambda: CountedRouting(spills, args.slack, args.bound_percent)  # type: ignore[assignment,misc]
    try:
        trace = pr.workload(rate, args.seconds, args.warmup, args.seed)
        row = pr.simulate_routing(trace, rate, PREFIX_AFFINITY, args.warmup, args.time_scale)
    finally:
        traffic.PrefixRouting = original  # type: ignore[misc]
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
