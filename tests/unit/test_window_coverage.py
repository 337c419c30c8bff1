"""How much of the window a pool's engine series cover (the fleet queries `window_coverage` and
`engine_windows`), and what the policy does with a window an engine started or left in: a counter's
rate over it counts only the part the series covers, so the tokens served per engine are the pool's
rate over the engine-windows its series cover, measured against an engine that covers the whole window;
where none does (the pool's first window) the served tokens' trend leaves the window out. The queries
are evaluated by the real promtool on input series, and the simulator's stand-in answers the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from specfleet.api.policy import PolicySpec
from specfleet.api.status import PoolStatus
from specfleet.observe.prometheus import fleet_queries
from specfleet.policy.decision.record import _with_measurements
from specfleet.policy.inputs.observation import WHOLE_WINDOW, PoolObservation, PoolState
from specfleet.policy.predict.demand import served_fit
from specfleet.sim import prom as sim_prom
from specfleet_runtime import vllm_metrics as vm
from support.promtool import assert_rule_tests_pass

NS, NAME = "ns", "sd"
SCRAPE = 15
WINDOW = 120
# Evaluated between scrapes (Prometheus 2 and 3 differ only in whether a range's left edge is in it).
EVAL = 245
# Per pool, each engine series' first scrape and the scrape it went stale at (None: scraped on): the
# window (125 s, 245 s] holds a whole series' 8 scrapes. "latency" scraped from the start; in "batch"
# one pod first scraped 80 s before the evaluation (6 scrapes); in "canary" only one pod, first scraped
# 50 s before (4 scrapes, all in the window's second half: 0.5, as any younger series); in "rollout" an
# old pod deleted at 225 s (its 6 scrapes stay in range selectors) beside its successor of 80 s.
ENGINES = [
    ("latency", "a", 0, None),
    ("latency", "b", 0, None),
    ("batch", "a", 0, None),
    ("batch", "b", 165, None),
    ("canary", "a", 195, None),
    ("rollout", "a", 0, None),
    ("rollout", "old", 0, 225),
    ("rollout", "new", 165, None),
]
# The longest series scraped now (a deleted pod's would read 6 / 2 / 2 = 1.5), and the engine-windows.
COVERAGE = {"latency": 1.0, "batch": 1.0, "canary": 0.5, "rollout": 1.0}
ENGINE_WINDOWS = {"latency": 2.0, "batch": 1.75, "canary": 1.0, "rollout": 2.5}


def _labels(pool: str, pod: str) -> str:
    return f'namespace="{NS}",specfleet_io_deployment="{NAME}",specfleet_io_pool="{pool}",pod="{pod}"'


def _values(first: int, stale: int | None) -> str:
    scraped = (stale if stale is not None else 20 * SCRAPE) // SCRAPE - first // SCRAPE
    after = ["stale"] + ["_"] * (20 - (stale or 0) // SCRAPE - 1) if stale is not None else []
    return " ".join(["_"] * (first // SCRAPE) + ["1"] * scraped + after)


@pytest.mark.parametrize(
    ("query", "expected"), [("window_coverage", COVERAGE), ("engine_windows", ENGINE_WINDOWS)]
)
def test_the_queries_read_the_longest_series_share_and_the_engine_windows(
    query: str, expected: dict[str, float], tmp_path: Path
) -> None:
    series = [
        {"series": f"{vm.REQUESTS_RUNNING}{{{_labels(pool, pod)}}}", "values": _values(first, stale)}
        for pool, pod, first, stale in ENGINES
    ]
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    pools = {"specfleet_io_deployment": NAME, "namespace": NS}
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": f"{SCRAPE}s",
        "tests": [
            {
                "interval": f"{SCRAPE}s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": fleet_queries(WINDOW, [NS])[query],
                        "eval_time": f"{EVAL}s",
                        "exp_samples": [
                            {
                                "labels": "{"
                                + ",".join(
                                    f'{k}="{v}"'
                                    for k, v in sorted({**pools, "specfleet_io_pool": pool}.items())
                                )
                                + "}",
                                "value": value,
                            }
                            for pool, value in expected.items()
                        ],
                    }
                ],
            }
        ],
    }
    assert_rule_tests_pass(tmp_path, doc)


def test_the_simulated_prometheus_answers_the_same() -> None:
    # But for the deleted pod's samples, which the simulator leaves out of every answer at once (its
    # rates too: the tokens per engine-window agree; `sim.prom.answers`).
    without_deleted = {**ENGINE_WINDOWS, "rollout": 1.75}
    for pool, coverage in COVERAGE.items():
        engines = []
        for p, _pod, first, stale in ENGINES:
            if p != pool:
                continue
            s = sim_prom.Series(pool=pool, deleted_at=None if stale is None else float(stale))
            s.samples = [
                sim_prom.Sample(
                    t=float(t),
                    drafts=0,
                    draft_tokens=0,
                    accepted=0,
                    accepted_pos=(),
                    generation_tokens=10.0 * t,
                    running=1,
                    waiting=0,
                )
                for t in range(first, stale if stale is not None else 20 * SCRAPE, SCRAPE)
            ]
            engines.append(s)
        out = sim_prom.answers(engines, float(EVAL), float(WINDOW))
        assert float(out["window_coverage"][0]["value"][1]) == pytest.approx(coverage), pool
        assert float(out["engine_windows"][0]["value"][1]) == pytest.approx(without_deleted[pool]), pool


NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
POLICY = PolicySpec.model_validate({})


def _obs(served: float, coverage: float | None, engine_windows: float | None = None) -> PoolObservation:
    """Three engines reporting now that served `served` tokens/s each over the engine-windows."""
    return PoolObservation(
        pool="latency",
        at=NOW,
        running_per_replica=2.0,
        replicas_reporting=3,
        generation_tokens_per_second=(engine_windows or 3) * served,
        window_coverage=coverage,
        engine_windows=engine_windows,
    )


def test_the_pools_first_window_gives_no_served_trend_and_is_not_recorded() -> None:
    # The run's first windows: the rate over a window the series began in rises as the series fills it
    # (36.7, 64.4, 86.6 tokens/s per replica at a quarter, half, three quarters), at a flat load.
    recent = tuple((NOW - timedelta(seconds=30 * (4 - i)), v) for i, v in enumerate((36.7, 64.4, 86.6)))
    state = PoolState(mode="On", recent_tokens_per_second=recent)
    assert served_fit(POLICY, state, _obs(107.0, 1.0), NOW) is not None
    assert served_fit(POLICY, state, _obs(107.0, None), NOW) is not None  # not measured: as before
    assert served_fit(POLICY, state, _obs(86.6, 0.75), NOW) is None
    assert _obs(1.0, WHOLE_WINDOW).whole_window
    assert not _obs(1.0, WHOLE_WINDOW - 0.01).whole_window
    # Recorded only where the window is whole: the trend of later evaluations starts from there.
    status = PoolStatus()
    partial = _with_measurements(status, _obs(86.6, 0.75), NOW)
    assert not partial.recent_tokens_per_second
    assert partial.generation_tokens_per_second == "259.8"  # the pool's number is still reported
    whole = _with_measurements(status, _obs(107.0, 1.0), NOW)
    assert whole.recent_tokens_per_second
    assert whole.recent_tokens_per_second[-1].endswith("=107")


def test_a_rollout_window_counts_each_engine_for_the_part_it_served() -> None:
    # A rollout's new pod served the last quarter of the window, its predecessor the rest before it
    # left: 2.25 engine-windows beside the two that cover it (the pool's 240 tokens/s are 106.7 per
    # engine, not 80 over the three reporting now). The window counts: one engine covers all of it.
    obs = _obs(240 / 2.25, 1.0, engine_windows=2.25)
    assert obs.served_per_replica == pytest.approx(106.67, abs=0.01)
    assert obs.whole_window
    whole = _with_measurements(PoolStatus(), obs, NOW)
    assert whole.recent_tokens_per_second[-1].endswith("=106.7")
    state = PoolState(
        mode="On",
        recent_tokens_per_second=tuple((NOW - timedelta(seconds=30 * (4 - i)), 106.7) for i in range(3)),
    )
    fit = served_fit(POLICY, state, obs, NOW)
    assert fit is not None
    assert fit.fitted == pytest.approx(106.7, abs=0.1)
    assert fit.slope == pytest.approx(0.0, abs=1e-3)
    # Without the engine-windows measured, the engines reporting now (the rollout's under-read).
    assert _obs(80.0, 1.0).served_per_replica == pytest.approx(80.0)
