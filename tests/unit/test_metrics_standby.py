"""Metrics of a Standby pool's two engines per pod: both scraped (the PodMonitor's second endpoint, the
sandbox's second job), and the policy's fleet queries counting only awake engines, evaluated by the
real promtool on input series, and the simulator's stand-in answering the same.

The plain queries (resources without Standby pools) are pinned byte for byte: every user's queries.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from specfleet.api.validation import parse_resource
from specfleet.controller.control import policy_schedule
from specfleet.observe.prometheus import fleet_queries
from specfleet.render.common import RenderOptions
from specfleet.render.monitoring import RECORD_RUNNING, alert_groups, render_pod_monitor
from specfleet.sim import prom as sim_prom
from specfleet_runtime import vllm_metrics as vm
from specfleet_sandbox.prometheus import scrape_config
from support.manifests import ROOT, load_yaml, merge
from support.promtool import assert_rule_tests_pass

NS, NAME = "ns", "sd"
POOL = {"namespace": NS, "specfleet_io_deployment": NAME}
# sha256 of json.dumps([fleet_queries(60, ["ns"]), fleet_queries(6, ["a", "b.c"])]) as they were before
# Standby pools: the queries of every resource without one must not change by a byte (the hash moves
# only with a new query for every resource, as the SLO histograms ttft_buckets/tpot_buckets and
# window_coverage did).
PLAIN_QUERIES_SHA256 = "e35ad6ea64f2628040837ffab5ec842cf21578b43194d3ac2056609bffd3bf5e"
STANDBY_QUERIES = {"replicas", "running_per_replica", "kv_usage", "kv_capacity"}


def test_the_plain_queries_are_unchanged_and_a_standby_round_filters_only_the_per_replica_ones():
    plain = [fleet_queries(60, ["ns"]), fleet_queries(6, ["a", "b.c"])]
    assert hashlib.sha256(json.dumps(plain).encode()).hexdigest() == PLAIN_QUERIES_SHA256
    assert fleet_queries(60, ["ns"], standby=False) == plain[0]
    standby = fleet_queries(60, ["ns"], standby=True)
    assert {name for name, q in standby.items() if q != plain[0][name]} == STANDBY_QUERIES
    for name in STANDBY_QUERIES:
        assert f'{vm.ENGINE_SLEEP_STATE}{{namespace="ns",' in standby[name]
        assert 'sleep_state="awake"} == 0' in standby[name]


def _doc(path: str = "10-standby-flips.yaml", **spec: Any) -> dict[str, Any]:
    return merge(
        load_yaml(ROOT / "examples" / path), {"metadata": {"name": NAME, "namespace": NS}, "spec": spec}
    )


def _resource(path: str = "10-standby-flips.yaml", **spec: Any) -> Any:
    return parse_resource(_doc(path, **spec))


def test_a_resource_with_a_standby_pool_gets_its_own_round_of_standby_queries():
    prometheus = {"prometheus": {"url": "http://127.0.0.1:9090"}}
    standby = policy_schedule(_doc(policy=prometheus)).target
    plain = policy_schedule(_doc("01-minimal-eagle3.yaml", policy=prometheus)).target
    assert standby is not None
    assert plain is not None
    assert (standby.standby, plain.standby) == (True, False)
    assert standby != plain  # resources sharing one Prometheus are asked in two rounds


def test_the_pod_monitor_scrapes_the_speculative_port_of_standby_pools_only():
    options = RenderOptions()
    endpoints = render_pod_monitor(_resource(), options)["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "speculative"]
    plain = render_pod_monitor(_resource("01-minimal-eagle3.yaml"), options)["spec"]["podMetricsEndpoints"]
    assert plain == [{"port": "http", "path": "/metrics", "interval": "15s"}]


def test_the_sandbox_scrapes_the_speculative_container_port_in_a_second_job():
    config = scrape_config(discovery_url="http://127.0.0.1:1/targets", interval_seconds=1)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    standby = jobs["kubernetes-pods-standby"]["relabel_configs"]
    assert {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "speculative",
        "action": "keep",
    } in standby
    address = next(r for r in standby if r.get("target_label") == "__address__")
    assert address["source_labels"][1] == "__meta_kubernetes_pod_container_port_number"


# ---- the queries evaluated by promtool ----------------------------------------------------------------

# Two Standby pods, each its plain engine awake on :8000 and its speculative one asleep on :8001 (pod
# label Off), and a pool of two engines that cannot sleep (no gauge: vLLM before 0.32).
ENGINES = [
    # pool, pod, port, awake (None: no gauge), running, KV usage, num_gpu_blocks
    ("latency", "p0", 8000, True, 6, 0.5, 1000),
    ("latency", "p0", 8001, False, 0, 0, 900),
    ("latency", "p1", 8000, True, 4, 0.25, 1000),
    ("latency", "p1", 8001, False, 0, 0, 900),
    ("batch", "b0", 8000, None, 2, 0.25, 1000),
    ("batch", "b1", 8000, None, 4, 0.75, 1000),
]
# What each query answers per pool: the Standby round, and the plain one that miscounts asleep engines.
EXPECTED = {
    "replicas": ({"latency": 2, "batch": 2}, {"latency": 4, "batch": 2}),
    "running_per_replica": ({"latency": 5, "batch": 3}, {"latency": 2.5, "batch": 3}),
    "kv_usage": ({"latency": 0.375, "batch": 0.5}, {"latency": 0.1875, "batch": 0.5}),
}


def _input_series() -> list[dict[str, str]]:
    out = []
    for pool, pod, port, awake, running, kv, blocks in ENGINES:
        labels = (
            f'namespace="{NS}",specfleet_io_deployment="{NAME}",specfleet_io_pool="{pool}",'
            f'specfleet_io_speculation="Off",pod="{pod}",instance="10.0.0.{pod[1]}:{port}"'
        )
        out += [
            {"series": f"{vm.REQUESTS_RUNNING}{{{labels}}}", "values": f"{running}x10"},
            {"series": f"{vm.KV_CACHE_USAGE}{{{labels}}}", "values": f"{kv}x10"},
            {
                "series": f'{vm.CACHE_CONFIG_INFO}{{{labels},num_gpu_blocks="{blocks}",block_size="16"}}',
                "values": "1x10",
            },
        ]
        if awake is not None:
            state = f'{vm.ENGINE_SLEEP_STATE}{{{labels},sleep_state="awake"}}'
            out.append({"series": state, "values": f"{int(awake)}x10"})
    return out


def _labels(pool: str, **extra: str) -> str:
    labels = {**POOL, "specfleet_io_pool": pool, **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _promtool_eval(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": _input_series(), "promql_expr_test": tests}],
    }
    assert_rule_tests_pass(tmp_path, doc)


@pytest.mark.parametrize("standby", [True, False], ids=["standby-round", "plain-round"])
def test_a_standby_round_counts_awake_engines_only_and_the_plain_pool_answers_the_same(standby, tmp_path):
    queries = fleet_queries(60, [NS], standby=standby)
    column = 0 if standby else 1
    tests = [
        {
            "expr": queries[name],
            "eval_time": "2m",
            "exp_samples": [
                {"labels": _labels(pool), "value": value} for pool, value in EXPECTED[name][column].items()
            ],
        }
        for name in EXPECTED
    ]
    # The cache config the policy reads as the KV cache of the setting a pool runs: the awake engines'.
    blocks = ["1000"] if standby else ["1000", "900"]
    tests.append(
        {
            "expr": queries["kv_capacity"],
            "eval_time": "2m",
            "exp_samples": [
                {
                    "labels": _labels(
                        pool, specfleet_io_speculation="Off", num_gpu_blocks=b, block_size="16"
                    ),
                    "value": 1,
                }
                for pool in ("latency", "batch")
                for b in (blocks if pool == "latency" else ["1000"])
            ],
        }
    )
    _promtool_eval(tmp_path, tests)


def test_the_recording_rules_of_a_standby_resource_count_awake_engines_only(tmp_path):
    sd = _resource(monitoring={"prometheusRule": True})
    (recording,) = [g for g in alert_groups(sd) if g["name"].endswith(".recording")]
    (running,) = [r["expr"] for r in recording["rules"] if r["record"] == RECORD_RUNNING]
    assert "unless on (namespace, pod, instance)" in running
    plain = _resource("01-minimal-eagle3.yaml", monitoring={"prometheusRule": True})
    (recording,) = [g for g in alert_groups(plain) if g["name"].endswith(".recording")]
    assert "unless" not in json.dumps(recording)


# ---- the simulator's stand-in ---------------------------------------------------------------------------


def test_the_simulated_prometheus_answers_the_standby_queries_the_same():
    series: dict[str, list[sim_prom.Series]] = {"latency": [], "batch": []}
    for pool, _pod, _port, awake, running, kv, blocks in ENGINES:
        s = sim_prom.Series(pool=pool, num_gpu_blocks=blocks, block_size=16)
        s.samples = [
            sim_prom.Sample(
                t=15.0 * i,
                drafts=0,
                draft_tokens=0,
                accepted=0,
                accepted_pos=(),
                generation_tokens=0,
                running=running,
                waiting=0,
                kv_usage=kv,
                awake=awake is not False,
            )
            for i in range(9)
        ]
        series[pool].append(s)
    for pool in ("latency", "batch"):
        out = sim_prom.answers(series[pool], 120.0, 60.0)
        for name, (expected, _plain) in EXPECTED.items():
            assert float(out[name][0]["value"][1]) == pytest.approx(expected[pool]), (pool, name)
        assert [s["metric"][vm.LABEL_NUM_GPU_BLOCKS] for s in out["kv_capacity"]] == ["1000"]
