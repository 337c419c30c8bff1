"""benchmarks/surge.py: which windows count as ones with extra engines, and the modes over the rest."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from support.benchmarks import load_benchmark
from support.comparisons import latency_comparison

surge = load_benchmark("surge")


def _run(kind: str, tokens: list[float], ready: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        strategy=SimpleNamespace(kind=kind),
        bin_tokens={"latency": np.array(tokens)},
        bin_request_seconds={"latency": np.ones(len(tokens))},
        timeline=[{"t": 30.0 * (i + 1), "latency": {"readyReplicas": r}} for i, r in enumerate(ready)],
    )


def test_a_window_counts_as_extra_where_more_engines_were_ready_at_its_start_or_end() -> None:
    run = _run("policy", [1.0] * 5, [3, 4, 3, 3, 5])
    assert surge.extra_engines(run, 3, 5).tolist() == [False, True, True, False, True]


def test_the_plain_windows_leave_out_either_modes_extra_engines() -> None:
    # Goodput holds the oracle's 1.0; Threshold reaches 1.3 only in its surge windows (2 and 3) and
    # serves 0.9 elsewhere: ahead over every window, behind over the plain ones.
    runs = {
        "policy": _run("policy", [1.0] * 6, [3] * 6),
        surge.THRESHOLD: _run("policy", [0.9, 1.3, 1.3, 0.9, 0.9, 0.9], [3, 4, 3, 3, 3, 3]),
        "alwaysOff": _run("static", [1.0] * 6, [3] * 6),
    }
    comp = latency_comparison(runs, [1.0] * 6, 30.0, always_on="alwaysOff")
    r = surge.row(comp, 3)
    assert round(r["threshold"] - r["goodput"], 3) == round((0.9 * 4 + 2.6) / 6 - 1.0, 3) > 0
    assert (r["extraGoodput"], r["extraThreshold"], r["plainWindows"]) == (0, 2, 4)
    assert round(r["thresholdPlain"], 3) == 0.9
    assert r["goodputPlain"] == 1.0
