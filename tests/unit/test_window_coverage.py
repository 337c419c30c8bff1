"""How much of the window a pool's engine series cover (the fleet query `window_coverage`), and what
the policy does with a window an engine started in: a counter's rate over it counts only the part the
series covers, so the served tokens read low and then rise over the next windows with no rise in what
arrives. The query is evaluated by the real promtool on input series, the simulator's stand-in answers
the same, and the served tokens' trend leaves such windows out."""

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
# Per pool, the first scrape (seconds) of each engine series: "latency" scraped from the start; in
# "batch" one pod first scraped 80 s before the evaluation (6 of a window's 8 scrapes: 0.75); in
# "canary" one 50 s before (4 scrapes, all in the window's second half: 0.5, as any younger series).
ENGINES = [
    ("latency", "a", 0),
    ("latency", "b", 0),
    ("batch", "a", 0),
    ("batch", "b", 165),
    ("canary", "a", 195),
]
EXPECTED = {"latency": 1.0, "batch": 0.75, "canary": 0.5}


def _labels(pool: str, pod: str) -> str:
    return f'namespace="{NS}",specfleet_io_deployment="{NAME}",specfleet_io_pool="{pool}",pod="{pod}"'


def test_the_query_reads_the_youngest_series_share_of_the_window(tmp_path: Path) -> None:
    series = [
        {
            "series": f"{vm.REQUESTS_RUNNING}{{{_labels(pool, pod)}}}",
            "values": " ".join(["_"] * (first // SCRAPE) + ["1"] * (20 - first // SCRAPE)),
        }
        for pool, pod, first in ENGINES
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
                        "expr": fleet_queries(WINDOW, [NS])["window_coverage"],
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
                            for pool, value in EXPECTED.items()
                        ],
                    }
                ],
            }
        ],
    }
    assert_rule_tests_pass(tmp_path, doc)


def test_the_simulated_prometheus_answers_the_same() -> None:
    for pool, expected in EXPECTED.items():
        engines = []
        for p, _pod, first in ENGINES:
            if p != pool:
                continue
            s = sim_prom.Series(pool=pool)
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
                for t in range(first, 20 * SCRAPE, SCRAPE)
            ]
            engines.append(s)
        out = sim_prom.answers(engines, float(EVAL), float(WINDOW))
        assert float(out["window_coverage"][0]["value"][1]) == pytest.approx(expected), pool


NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
POLICY = PolicySpec.model_validate({})


def _obs(served_per_replica: float, coverage: float | None) -> PoolObservation:
    return PoolObservation(
        pool="latency",
        at=NOW,
        running_per_replica=2.0,
        replicas_reporting=3,
        generation_tokens_per_second=3 * served_per_replica,
        window_coverage=coverage,
    )


def test_a_window_an_engine_started_in_gives_no_served_trend_and_is_not_recorded() -> None:
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
