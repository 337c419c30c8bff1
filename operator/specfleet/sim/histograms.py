"""The simulated engines' latency histograms (pure): the step-time (inter-token latency) histogram's bins,
log-spaced, 40 per decade from 0.1 ms, so a percentile read back from them is within 3% of the step it
counts; and each engine's TTFT and TPOT histograms at vLLM's own bucket bounds, as it exports them."""

from __future__ import annotations

import bisect
import itertools
import math

from specfleet_runtime import vllm_metrics as vm

_ITL_BINS_PER_DECADE = 40


def itl_bin(seconds: float) -> int:
    """The bin a step of `seconds` falls in."""
    return max(0, int(math.log10(max(seconds, 1e-4) / 1e-4) * _ITL_BINS_PER_DECADE))


def itl_bin_seconds(index: int) -> float:
    """The middle of bin `index`, in seconds (log scale)."""
    return float(1e-4 * 10 ** ((index + 0.5) / _ITL_BINS_PER_DECADE))


class LatencyCounts:
    """One engine's vllm:time_to_first_token_seconds and vllm:request_time_per_output_token_seconds:
    the requests it finished per bucket of vLLM's bounds (the last bucket +Inf)."""

    __slots__ = ("tpot", "ttft")

    def __init__(self) -> None:
        self.ttft = [0] * (len(vm.TIME_TO_FIRST_TOKEN_BUCKETS) + 1)
        self.tpot = [0] * (len(vm.TOKEN_LATENCY_BUCKETS) + 1)

    def observe(self, ttft: float, tpot: float | None) -> None:
        """One finished request (a request of one output token has no TPOT)."""
        self.ttft[bisect.bisect_left(vm.TIME_TO_FIRST_TOKEN_BUCKETS, ttft)] += 1
        if tpot is not None:
            self.tpot[bisect.bisect_left(vm.TOKEN_LATENCY_BUCKETS, tpot)] += 1

    @staticmethod
    def cumulative(counts: list[int]) -> tuple[float, ...]:
        """Prometheus' `_bucket` series: the requests at or below each bound."""
        return tuple(float(c) for c in itertools.accumulate(counts))
