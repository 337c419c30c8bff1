"""A pure, seeded fleet simulator: trace in, per-pool tokens/s, latency, GPU-seconds and flips out.

It replays a workload through the router's own classification, per-replica continuous batching on the
cost profile, the rendered Deployments' surge rollouts, and the operator's real policy (`decide` +
`record`) fed with observations computed the way the policy's PromQL computes them. It never touches
a cluster, the network or the clock; the same seed gives the same result.
"""

from specfleet.sim.accounts import RunResult
from specfleet.sim.compare import Comparison, compare
from specfleet.sim.fleet import simulate
from specfleet.sim.options import SimOptions
from specfleet.sim.workload import ACCEPTANCE_PROFILES, ClosedLoop, Trace, parse_acceptance, read_trace

__all__ = [
    "ACCEPTANCE_PROFILES",
    "ClosedLoop",
    "Comparison",
    "RunResult",
    "SimOptions",
    "Trace",
    "compare",
    "parse_acceptance",
    "read_trace",
    "simulate",
]
