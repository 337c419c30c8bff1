"""benchmarks/surge.py: which windows count as ones with extra engines, and the modes over the rest."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np

from specfleet.sim.compare import Comparison


def load_bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "surge.py"
    spec = importlib.util.spec_from_file_location("surge_bench", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["surge_bench"] = module
    spec.loader.exec_module(module)
    return module


surge = load_bench()


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
    oracle = {"latency": np.ones(6)}
    comp = Comparison(
        runs=runs,  # type: ignore[arg-type]
        oracle_tokens=oracle,
        oracle_reqsec=oracle,
        oracle_choice={"latency": ["alwaysOff"] * 6},
        best_static="alwaysOff",
        always_on="alwaysOff",
        first_reaction=0.0,
        bin_seconds=30.0,
        duration=180.0,
        schedule=(),
    )
    r = surge.row(comp, 3)
    assert round(r["threshold"] - r["goodput"], 3) == round((0.9 * 4 + 2.6) / 6 - 1.0, 3) > 0
    assert (r["extraGoodput"], r["extraThreshold"], r["plainWindows"]) == (0, 2, 4)
    assert round(r["thresholdPlain"], 3) == 0.9
    assert r["goodputPlain"] == 1.0
