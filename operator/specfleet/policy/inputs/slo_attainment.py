"""How many of a pool's requests met its latency objective, read from the engines' histograms (pure).

vLLM records each request's time to first token and time per output token in Prometheus histograms.
The fleet queries ask for the rate of every cumulative bucket over the policy window, summed over the
pool's engines: (upper bound `le` in seconds, requests per second at or under it), the `+Inf` bucket
being all of them. The share at or under a target is interpolated linearly within the bucket the target
falls in, the inverse of what Prometheus' `histogram_quantile` does.

The two histograms are marginal: they say how many requests met each target, not how many met both.
The share meeting both is at most the smaller of the two, which is what `attainment` reports.

The alerts and the dashboard count in PromQL, where interpolating is awkward: `target_buckets` gives
each target's bucket for them, the largest bound at or under the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specfleet.api.pools import LatencySlo
from specfleet.policy.inputs.observation import Histogram
from specfleet_runtime import vllm_metrics as vm

MILLISECONDS = 1000.0


def share_within(histogram: Histogram, target_seconds: float) -> float | None:
    """The share (0..1) of the requests counted in `histogram` whose value is at or under `target_seconds`.

    `histogram`: cumulative (upper bound, count or rate) pairs sorted by bound, ending with the +Inf
    bucket (the total). Within a bucket requests are taken as spread evenly, the first bucket starting at
    0; past the last finite bound nothing is known, so those requests count as missing the target.
    None: no request counted (an empty window is not a met objective), or no +Inf bucket to count them.
    """
    if not histogram or not math.isinf(histogram[-1][0]):
        return None
    # Rates of the cumulative buckets, each extrapolated on its own, can dip below a lower bucket's:
    # keep them non-decreasing, as histogram_quantile does.
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in histogram:
        bounds.append(bound)
        counts.append(max(count, counts[-1] if counts else 0.0))
    total = counts[-1]
    if total <= 0:
        return None
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(bounds[:-1], counts[:-1], strict=True):
        if target_seconds <= bound:
            inside = (target_seconds - lower_bound) / (bound - lower_bound) if bound > lower_bound else 1.0
            return (lower_count + (count - lower_count) * inside) / total
        lower_bound, lower_count = bound, count
    # Past the last finite bound: only the requests under it are known to meet the target.
    return lower_count / total


@dataclass(frozen=True)
class SloAttainment:
    """The share (0..1) of a pool's requests within each target of its SLO over the window.

    None: the SLO has no such target, or no request was counted for it in the window.
    """

    ttft: float | None = None
    tpot: float | None = None
    # The smaller share of the targets set (the share meeting all of them is at most this); None unless
    # every target set was measured.
    attainment: float | None = None


def measure_attainment(slo: LatencySlo, ttft: Histogram, tpot: Histogram) -> SloAttainment:
    """Each target's share of the requests, from the pool's TTFT and TPOT histograms over the window."""
    shares = {
        target: share_within(histogram, ms / MILLISECONDS)
        for target, ms, histogram in (
            ("ttft", slo.time_to_first_token_milliseconds, ttft),
            ("tpot", slo.time_per_output_token_milliseconds, tpot),
        )
        if ms is not None
    }
    measured = [s for s in shares.values() if s is not None]
    return SloAttainment(
        ttft=shares.get("ttft"),
        tpot=shares.get("tpot"),
        attainment=min(measured) if measured and len(measured) == len(shares) else None,
    )


@dataclass(frozen=True)
class TargetBucket:
    """One target of an SLO as PromQL counts it: a request meets it when it falls in bucket `le`."""

    target: str  # "ttft" or "tpot", as in the status fields and the alerts' names
    histogram: str  # the vLLM histogram, without `_bucket`
    milliseconds: int  # the target as the spec states it
    le: float  # seconds: the largest bucket bound at or under the target


def target_buckets(slo: LatencySlo) -> list[TargetBucket]:
    """Each target the SLO sets, with the histogram bucket the alerts and the dashboard count it at.

    Conservative: requests between that bound and the target count as missing it (a target on a bound
    is exact). A target under the histogram's first bound (a TPOT under 10 ms) has no such bucket and
    is left out: only the interpolated attainment in status measures it.
    """
    found = []
    for target, histogram, bounds, ms in (
        (
            "ttft",
            vm.TIME_TO_FIRST_TOKEN,
            vm.TIME_TO_FIRST_TOKEN_BUCKETS,
            slo.time_to_first_token_milliseconds,
        ),
        ("tpot", vm.TIME_PER_OUTPUT_TOKEN, vm.TOKEN_LATENCY_BUCKETS, slo.time_per_output_token_milliseconds),
    ):
        if ms is None:
            continue
        # ms / 1000 rounds to the same double as the bound's literal when they are equal (50 -> 0.05).
        under = [bound for bound in bounds if bound <= ms / MILLISECONDS]
        if under:
            found.append(TargetBucket(target, histogram, ms, under[-1]))
    return found
