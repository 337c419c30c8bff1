"""The policy benchmark's "policy minus best fixed setting" (`specfleet.sim.compare`): per measure the
best of the settings a user could launch with, the policy's difference to it, and the count of cells
behind it by more than the margin."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from specfleet.sim.compare import (
    ALL_REQUESTS,
    TIME_WEIGHTED,
    Comparison,
    Shortfall,
    count_behind,
    shortfall,
)
from support.benchmarks import load_benchmark
from support.comparisons import latency_comparison


def test_shortfall_is_the_policy_minus_the_best_known_fixed_setting() -> None:
    cell = shortfall(0.93, {"alwaysOff": 1.004, "alwaysOnK1": 0.96, "engineDynamicSD": None})
    assert cell is not None
    assert cell.best == "alwaysOff"
    assert round(cell.gap, 3) == -0.074


def test_shortfall_is_unknown_without_the_policy_or_any_fixed_setting() -> None:
    assert shortfall(None, {"alwaysOff": 1.0}) is None
    assert shortfall(0.9, {"alwaysOff": None}) is None
    assert shortfall(0.9, {}) is None


def test_only_cells_more_than_the_margin_behind_are_counted() -> None:
    cells = [
        Shortfall(-0.074, "alwaysOff"),
        Shortfall(-0.01, "alwaysOff"),  # at the margin: not behind
        Shortfall(-0.0101, "alwaysOnK1"),
        Shortfall(0.02, "alwaysOnK3"),
        None,  # a measure with no value
    ]
    assert count_behind(cells) == 2
    assert count_behind(cells, margin=0.05) == 1


def _run(
    kind: str, tokens: list[float], reqsec: list[float], ready: list[int] | None = None
) -> SimpleNamespace:
    """A run as `Comparison` reads it: its kind, the latency pool's per-window sums and its ready
    engines at each window's end (3, the declared count, unless given)."""
    return SimpleNamespace(
        strategy=SimpleNamespace(kind=kind),
        bin_tokens={"latency": np.array(tokens)},
        bin_request_seconds={"latency": np.array(reqsec)},
        timeline=[{"latency": {"readyReplicas": n}} for n in (ready or [3] * len(tokens))],
    )


def test_each_measure_picks_its_own_best_fixed_setting_and_ignores_other_runs() -> None:
    # Two windows, the second busy (ten times the request-seconds): the oracle is 1.0 token per
    # request-second in both. alwaysOff is best in the calm window, alwaysOnK1 in the busy one.
    runs = {
        "policy": _run("policy", [1.0, 8.0], [1.0, 10.0]),  # 1.0, 0.8
        "alwaysOff": _run("static", [1.0, 7.0], [1.0, 10.0]),  # 1.0, 0.7
        "alwaysOnK1": _run("static", [0.5, 9.0], [1.0, 10.0]),  # 0.5, 0.9
        "engineDynamicSD": _run("engineDynamicSD", [0.6, 8.5], [1.0, 10.0]),  # 0.6, 0.85
        # Not a setting a user launches with: never the best fixed one, however high.
        "policyThreshold": _run("policy", [1.0, 10.0], [1.0, 10.0]),
    }
    comp = latency_comparison(runs, [1.0, 10.0], 15.0)
    assert comp.fixed_settings() == ["alwaysOff", "alwaysOnK1", "engineDynamicSD"]
    # Time-weighted (mean of window ratios): policy 0.90, alwaysOff 0.85, K1 0.70, Dynamic SD 0.725.
    tw = comp.behind_best_fixed(TIME_WEIGHTED)
    assert tw is not None
    assert tw.best == "alwaysOff"
    assert round(tw.gap, 3) == 0.05
    # Over all requests (tokens over the 11 request-seconds every run spent, the oracle's 11 tokens):
    # K1 9.5, Dynamic SD 9.1, policy 9.0, alwaysOff 8.0.
    every = comp.behind_best_fixed(ALL_REQUESTS)
    assert every is not None
    assert every.best == "alwaysOnK1"
    assert round(every.gap, 4) == round((9.0 - 9.5) / 11, 4)
    assert count_behind([tw, every]) == 1


def test_a_cell_behind_where_the_reacting_bound_is_behind_too_is_reported_as_a_bound() -> None:
    # One window, the oracle 1.0 token per request-second: alwaysOff 0.99, the policy 0.90. With a
    # reactive bound of 0.95 the cell is a bound (no reacting policy reaches 0.99); at 0.985 it is not.
    # A row without one but with the reaction bound reads the better of its two schedules.
    bench = load_benchmark("policy")

    def comparison(reactive: float | None, reaction: tuple[float, float] | None = None) -> Comparison:
        runs = {
            "policy": _run("policy", [0.90], [1.0]),
            "alwaysOff": _run("static", [0.99], [1.0]),
            "alwaysOnK1": _run("static", [0.50], [1.0]),
        }
        if reactive is not None:
            runs[bench.REACTIVE] = _run("bound", [reactive], [1.0])
        if reaction is not None:
            runs[bench.REACTION] = _run("bound", [reaction[0]], [1.0])
            runs[bench.REACTION_REQUESTS] = _run("bound", [reaction[1]], [1.0])
        return latency_comparison(runs, [1.0], 15.0)

    rows = [
        ("bounded", comparison(0.95)),
        ("reachable", comparison(0.985)),
        ("no bound", comparison(None)),
        ("reaction", comparison(None, (0.93, 0.96))),
    ]
    summary = bench.behind_summary(rows)
    assert "8 of 8 cells below -0.01" in summary
    assert "in 4 of them the bound a reacting policy can reach is below it" in summary
    table = "\n".join(bench.behind_section(rows))
    assert (
        "| bounded | time-weighted | 0.900 | alwaysOff 0.990 | -0.0900 | 0.950 (reactive; below the best fixed: "
        "a bound) |" in table
    )
    assert "| reachable | time-weighted | 0.900 | alwaysOff 0.990 | -0.0900 | 0.985 (reactive) |" in table
    assert "| no bound | time-weighted | 0.900 | alwaysOff 0.990 | -0.0900 | - |" in table
    assert (
        "| reaction | over all requests | 0.900 | alwaysOff 0.990 | -0.0900 | 0.960 (reaction; below the best "
        "fixed: a bound) |" in table
    )


def test_windows_where_the_policy_ran_extra_engines_are_left_out_of_the_plain_measure() -> None:
    # Four windows, the oracle 1.0 token per request-second. The policy's change ran a fourth engine
    # (a surge pod) at the end of window 2: windows 2 and 3 (its start) served with more engines than
    # the fixed settings have, and there the policy looks 1.3x. Over every window it is ahead of
    # alwaysOff (0.99); over the other two it is behind (0.90).
    bench = load_benchmark("policy")
    runs = {
        "policy": _run("policy", [0.9, 0.9, 1.3, 1.3], [1.0] * 4, ready=[3, 3, 4, 3]),
        "alwaysOff": _run("static", [0.99] * 4, [1.0] * 4),
        "alwaysOnK1": _run("static", [0.5] * 4, [1.0] * 4),
    }
    comp = latency_comparison(runs, [1.0] * 4, 15.0)
    comp.declared = {"latency": 3}
    assert comp.plain_windows().tolist() == [True, True, False, False]
    every = comp.behind_best_fixed(TIME_WEIGHTED)
    plain = comp.behind_best_fixed(TIME_WEIGHTED, comp.plain_windows())
    assert every is not None
    assert plain is not None
    assert round(every.gap, 3) == 0.11
    assert round(plain.gap, 3) == -0.09
    assert round(comp.request_ratio("policy", comp.plain_windows()) or 0, 3) == 0.9
    # The benchmark counts and lists the cell behind over the plain windows though not over every one.
    summary = bench.behind_summary([("surge", comp)])
    assert "0 of 2 cells below -0.01" in summary
    assert "(2 of 4 windows had some): 2 cells below -0.01" in summary
    table = "\n".join(bench.behind_section([("surge", comp)]))
    assert (
        "| surge | time-weighted | 1.100 | alwaysOff 0.990 | +0.1100 | - | -0.0900 (alwaysOff) (2) |" in table
    )
