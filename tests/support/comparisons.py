"""A `specfleet.sim.compare.Comparison` over stand-in runs of the latency pool, for tests of the measures
and of the benchmarks' tables built on them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specfleet.sim.compare import Comparison


def latency_comparison(
    runs: Mapping[str, Any],
    oracle: list[float],
    bin_seconds: float,
    best_static: str = "alwaysOff",
    always_on: str = "alwaysOnK1",
) -> Comparison:
    """`runs` against a per-level oracle that served `oracle` tokens in as many request-seconds per
    window (1.0 token per request-second), the latency pool only."""
    per_window = {"latency": np.array(oracle)}
    return Comparison(
        runs=dict(runs),
        oracle_tokens=per_window,
        oracle_reqsec=per_window,
        oracle_choice={"latency": [best_static] * len(oracle)},
        best_static=best_static,
        always_on=always_on,
        first_reaction=0.0,
        bin_seconds=bin_seconds,
        duration=bin_seconds * len(oracle),
        schedule=(),
    )
