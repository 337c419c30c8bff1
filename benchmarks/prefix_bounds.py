"""PrefixAffinity's load bound on shared-prefix workloads the live benchmark does not run (simulator).

`benchmarks/prefix_routing.py` measures one workload rule live (24 tenants, system prompts of 1-4k
tokens). The bound's default, and PrefixAffinity as the default strategy, must hold for others too,
so this runs the same rule (`specfleet.sim.workload.shared_prefix_conversations`) with other tenant
counts, shorter system prompts, one hot tenant and no shared prefix at all, over a longer window, through the fleet simulator's four engines (the
live benchmark's KV cache and profile, slowed by the same time scale; its prefix routing is the
router's own `affinity.Affinity`), for each `loadBoundPercent` given, beside least outstanding. Per
workload and rate: prefix hit rate and TTFT p50/p99 after the warm-up.

First, why new leading texts are placed rather than hashed: the live benchmark's trace at its top rate,
each tenant's prompt tokens summed, and the tenants put on four endpoints by the ring alone (the owner
of each salted system prompt, over many salts: the median and 90th percentile of the busiest engine's
share over the mean) and by `affinity.Placements` in order of first arrival. Then why the router's
workers share their placements: TTFT p99 over many traces with two workers placing on one board or
each on its own.

    python benchmarks/prefix_bounds.py [--bounds 100,125,150,200] [--rates 8,14] [--slack 8] [--seed 7]
        [--traces 20]

The rates are the trace's conversation counts scaled as the live benchmark's are (requests per second
over the window); a workload with more tenants or longer prompts saturates sooner, so its top rate can
be past what four engines serve (TTFT in seconds): compare bounds within a row, not rows.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence
from typing import Any

import prefix_routing as pr

from specfleet.sim import traffic
from specfleet.sim.options import LEAST_OUTSTANDING, PREFIX_AFFINITY
from specfleet.sim.workload import Trace, shared_prefix_conversations
from specfleet_runtime.router.affinity import Affinity, Placements, PrefixKeys, Ring, prefix_key
from specfleet_runtime.routing_config import LOAD_BOUND_SLACK

# name -> the rule's arguments besides the common ones
WORKLOADS: dict[str, dict[str, Any]] = {
    "8 tenants": {"tenants": 8},
    "24 tenants": {"tenants": 24},
    "96 tenants": {"tenants": 96},
    "24 tenants, system prompts 128-1024": {"tenants": 24, "system_tokens": (128, 1024)},
    "24 tenants, one hot (half)": {"tenants": 24, "hot_share": 0.5},
    # What PrefixAffinity, the default, does where nothing is shared: every request its own system
    # prompt of 256-2048 tokens and one turn (each is placed, none is found).
    "no shared prefix, one turn each": {"tenants": 1_000_000, "turns": (1, 1), "system_tokens": (256, 2048)},
}


def trace(rate: float, seconds: float, warmup: float, seed: int, rule: dict[str, Any]) -> Trace:
    """The rule's trace with about `rate` x `seconds` requests arriving after the warm-up."""

    def make(conversations: int) -> Trace:
        return shared_prefix_conversations(
            conversations=conversations,
            duration=warmup + seconds,
            seed=seed,
            output_tokens=pr.OUTPUT_TOKENS,
            think_seconds=pr.THINK_SECONDS,
            **rule,
        )

    conversations = max(1, round(rate * seconds / 3))
    for _ in range(4):
        got = sum(1 for r in make(conversations).requests if r.arrival >= warmup)
        conversations = max(1, round(conversations * rate * seconds / max(got, 1)))
    return make(conversations)


def placement_balance(rate: float, salts: int = 200) -> str:
    """The busiest of four engines' share of the prompt tokens over the mean, tenants hashed vs placed."""
    t = pr.workload(rate, 25.0, 8.0)
    work: dict[str, int] = {}
    first: dict[str, int] = {}  # the prompt tokens of each tenant's first request: what places it
    for r in t.requests:  # in arrival order
        work[r.prefix[0][0]] = work.get(r.prefix[0][0], 0) + r.prompt_tokens
        first.setdefault(r.prefix[0][0], r.prompt_tokens)
    endpoints = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))
    ring = Ring(endpoints)

    def busiest(owner: dict[str, str]) -> float:
        load = dict.fromkeys(endpoints, 0)
        for tenant, tokens in work.items():
            load[owner[tenant]] += tokens
        return max(load.values()) / statistics.mean(load.values())

    hashed = sorted(
        busiest({tenant: ring.owner(prefix_key(f"{salt} {tenant}") or 0) or "" for tenant in work})
        for salt in range(salts)
    )
    placed = []
    for salt in range(salts):
        placements, owner = Placements(), {}
        for tenant in work:
            key = PrefixKeys(prefix_key(f"{salt} {tenant}") or 0, size=first[tenant])
            url = ring.place(key.leading, placements.held, {}, (), 1)
            assert url is not None
            placements.add(key.leading, url, key.size)
            owner[tenant] = url
        placed.append(busiest(owner))
    placed.sort()
    return (
        f"{len(work)} tenants at {rate:g} req/s, busiest engine's prompt tokens / mean over {salts} salts: "
        f"hashed median {hashed[salts // 2]:.2f}, p90 {hashed[salts * 9 // 10]:.2f}; "
        f"placed median {placed[salts // 2]:.2f}, p90 {placed[salts * 9 // 10]:.2f}"
    )


def worker_split(rate: float, seeds: int, workers: int = 2) -> str:
    """TTFT p99 over `seeds` traces of the 24-tenant rule with `workers` router workers each taking a
    random share of the requests: their placements on one board (`Placements` shared, as the router's
    `conversations.PlacedBoard` shares them; one placer) or each worker's own."""

    class Split(traffic.PrefixRouting):
        def __init__(self, slack: int = LOAD_BOUND_SLACK) -> None:
            super().__init__(slack)
            self.workers = [Affinity(self.recent) for _ in range(workers)]
            self.rng = random.Random(1)

        def pick(self, *args: Any) -> Any:
            self.affinity = self.rng.choice(self.workers)
            return super().pick(*args)

    shared: list[float] = []
    own: list[float] = []
    original = traffic.PrefixRouting
    try:
        for seed in range(1, seeds + 1):
            t = trace(rate, 150.0, 30.0, seed, WORKLOADS["24 tenants"])
            for routing, out in ((original, shared), (Split, own)):
                traffic.PrefixRouting = routing  # type: ignore[misc]
                p99 = pr.simulate_routing(t, rate, PREFIX_AFFINITY, 30.0, 4.0).ttft_p99_ms
                out.append(p99 or 0.0)
    finally:
        traffic.PrefixRouting = original  # type: ignore[misc]
    return (
        f"{workers} workers at {rate:g} req/s, TTFT p99 over {seeds} traces (mean / median): placements "
        f"shared {statistics.mean(shared):.0f} / {statistics.median(shared):.0f} ms, each worker's own "
        f"{statistics.mean(own):.0f} / {statistics.median(own):.0f} ms"
    )


def cell(row: pr.SimRow) -> str:
    return f"{pr.fmt(row.hit_rate, '.2f')} / {pr.fmt(row.ttft_p50_ms)} / {pr.fmt(row.ttft_p99_ms)}"


def table(args: argparse.Namespace) -> str:
    bounds = [int(b) for b in args.bounds.split(",")]
    lines = [
        "| workload | rate req/s | leastOutstanding | "
        + " | ".join(f"PrefixAffinity {b}%" for b in bounds)
        + " |",
        "|---|---:|" + "---:|" * (1 + len(bounds)),
    ]
    for name, rule in WORKLOADS.items():
        for rate in (float(r) for r in args.rates.split(",")):
            t = trace(rate, args.seconds, args.warmup, args.seed, rule)
            run = [pr.simulate_routing(t, rate, LEAST_OUTSTANDING, args.warmup, args.time_scale)]
            run += [
                pr.simulate_routing(t, rate, PREFIX_AFFINITY, args.warmup, args.time_scale, bound)
                for bound in bounds
            ]
            lines.append(f"| {name} | {rate:g} | " + " | ".join(cell(r) for r in run) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bounds", default="100,125,150,200", help="loadBoundPercent values")
    parser.add_argument("--rates", default="8,14")
    parser.add_argument(
        "--slack", type=int, default=LOAD_BOUND_SLACK, help="requests past the mean a cached request stays"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--traces", type=int, default=20, help="traces for the placements-by-worker line")
    parser.add_argument("--seconds", type=float, default=150.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--time-scale", type=float, default=4.0)
    args = parser.parse_args(argv)
    print(placement_balance(float(args.rates.split(",")[-1])))
    for rate in args.rates.split(","):
        print(worker_split(float(rate), args.traces))
    print()
    print(f"cells: prefix hit rate / TTFT p50 ms / TTFT p99 ms (simulator; slack {args.slack})\n")
    original = traffic.PrefixRouting
    traffic.PrefixRouting = lambda: original(args.slack)  # type: ignore[assignment,misc]
    try:
        print(table(args))
    finally:
        traffic.PrefixRouting = original  # type: ignore[misc]


if __name__ == "__main__":
    main()
