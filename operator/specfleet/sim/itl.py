"""The bins of the simulated engines' step-time (inter-token latency) histogram (pure): log-spaced, 40 per
decade from 0.1 ms, so a percentile read back from them is within 3% of the step it counts."""

from __future__ import annotations

import math

_ITL_BINS_PER_DECADE = 40


def itl_bin(seconds: float) -> int:
    """The bin a step of `seconds` falls in."""
    return max(0, int(math.log10(max(seconds, 1e-4) / 1e-4) * _ITL_BINS_PER_DECADE))


def itl_bin_seconds(index: int) -> float:
    """The middle of bin `index`, in seconds (log scale)."""
    return float(1e-4 * 10 ** ((index + 0.5) / _ITL_BINS_PER_DECADE))
