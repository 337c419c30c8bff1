"""A Standby pool end to end (issue 46): each engine pod runs the supervisor with two emulated engines
(the pod agent plays it from the pod's own command line), Prometheus scrapes both and the policy's
queries count the awake one, and a flip of the pool under load through the router (the official
openai client) switches every pod's engine over vLLM's sleep API: no request fails, no pod restarts.

Starts from examples/10-standby-flips.yaml with two latency replicas, small memory, and small weights
for the emulators (`--weight-bytes`: a sleep or wake copies 1 GB over the emulated host link instead of
Llama-3.1-8B's 16 GB, at the tier's 10x time scale).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from specfleet.api.constants import LABEL_DEPLOYMENT, LABEL_POOL
from specfleet.observe.prometheus import fleet_queries
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import LABEL_SPECULATION
from specfleet_sandbox.load import LoadGenerator
from specfleet_sandbox.pods import PodProcess
from specfleet_sandbox.processes import wait_for
from support.e2e_env import Env, print_dump_if_failed, running_env
from support.manifests import ROOT, load_yaml, merge

pytestmark = pytest.mark.e2e

REPLICAS = 2
# Generous bounds for a noisy 2-core machine; the measured figures are printed.
FLIP_BOUND_SECONDS = 60.0
STARTUP_SECONDS = 180.0


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory) -> Iterator[Env]:
    with running_env(cluster, tmp_path_factory.mktemp("e2e")) as e:
        yield e


@pytest.fixture(autouse=True)
def dump_on_failure(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_dump_if_failed(env, request)


@pytest.fixture(scope="module")
def standby(env: Env) -> str:
    """The Standby resource, its latency pool pinned Off (every pod starts serving without the drafter);
    Ready once both pods' supervisors have parked the speculative engine and serve the plain one."""
    assert env.prometheus is not None
    name = "standby"
    doc = merge(
        load_yaml(ROOT / "examples" / "10-standby-flips.yaml"),
        {
            "metadata": {"name": name, "namespace": env.namespace},
            "spec": {
                "model": {"servedModelName": "llama"},
                "engine": {
                    "maxNumSeqs": 64,
                    "resources": {"memory": "16Gi"},
                    "extraArgs": ["--weight-bytes", "1000000000"],
                },
                "pools": {
                    "latency": {
                        "replicas": REPLICAS,
                        "speculation": "Off",
                        "rollout": {"flip": "Standby", "standbyHostMemory": "16Gi"},
                    },
                    "batch": {"replicas": 0, "speculation": "Off"},
                },
                "routing": {"autoSegmentation": {"enabled": False}, "router": {"replicas": 1}},
                "policy": {
                    "mode": "Threshold",
                    "prometheus": {"url": env.prometheus.url, "timeoutSeconds": 2},
                    "evaluationIntervalSeconds": 2,
                    "windowSeconds": 6,
                },
            },
        },
    )
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    wait_for(
        f"{name} Ready",
        lambda: env.conditions(name).get("Ready", {}).get("status") == "True",
        timeout=STARTUP_SECONDS,
    )
    return name


def _pods(env: Env, name: str) -> list[dict[str, Any]]:
    selector = f"{LABEL_DEPLOYMENT}={name},{LABEL_POOL}=latency"
    out = env.kubectl("get", "pods", "-n", env.namespace, "-l", selector, "-o", "json").stdout
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return pods


def _engines(env: Env, name: str) -> list[PodProcess]:
    assert env.runner is not None
    return [p for p in env.runner.processes("engine") if p.name.startswith(f"{name}-latency-")]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _finished_requests(engine_url: str) -> float:
    """vllm:request_success_total of one engine, summed over finish reasons."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(vm.REQUEST_SUCCESS + "{")
    )


def _speculative(env: Env, pp: PodProcess) -> str:
    assert env.runner is not None
    url = env.runner.speculative_url(pp)
    assert url is not None, f"{pp.name} is not a Standby pod"
    return url


def _sleeping(env: Env, pp: PodProcess) -> tuple[bool, bool]:
    """(plain engine asleep, speculative engine asleep)."""
    assert env.runner is not None
    return (
        bool(_get(f"{env.runner.url(pp)}/is_sleeping")["is_sleeping"]),
        bool(_get(f"{_speculative(env, pp)}/is_sleeping")["is_sleeping"]),
    )


def _answer(env: Env, promql: str) -> dict[str, float]:
    """Prometheus' answer per pool of this namespace."""
    assert env.prometheus is not None
    return {s["metric"]["specfleet_io_pool"]: float(s["value"][1]) for s in env.prometheus.query(promql)}


def test_standby_pods_run_both_engines_and_prometheus_counts_only_the_awake_ones(env, standby):
    pods = _pods(env, standby)
    assert len(pods) == REPLICAS
    assert {p["metadata"]["labels"][LABEL_SPECULATION] for p in pods} == {"Off"}
    engines = wait_for("both Standby pods played", lambda: len(_engines(env, standby)) == REPLICAS and 1)
    assert engines
    for pp in _engines(env, standby):
        assert pp.ready_marked
        assert pp.ready_file is not None
        assert pp.ready_file.exists()
        assert _sleeping(env, pp) == (False, True)  # the plain engine serves, the speculative one sleeps
    # Both engines of each pod are scraped; the plain queries would count four replicas, a Standby
    # round's count two.
    standby_round = fleet_queries(6, [env.namespace], standby=True)
    plain_round = fleet_queries(6, [env.namespace])
    counted = wait_for(
        "both engines of both pods scraped",
        lambda: (a := _answer(env, plain_round["replicas"])).get("latency") == 2 * REPLICAS and a,
        timeout=60,
    )
    assert counted["latency"] == 2 * REPLICAS
    assert _answer(env, standby_round["replicas"]) == {"latency": REPLICAS}
    # Every series, the asleep engines' too, soon covers the whole window (6 s of 1 s scrapes); only
    # its first seconds read as part of one (rates over them count part of the window).
    covered = wait_for(
        "the window covered",
        lambda: (a := _answer(env, standby_round["window_coverage"])).get("latency", 0.0) >= 0.85 and a,
        timeout=60,
    )
    assert 0.85 <= covered["latency"] <= 1.5
    asleep = env.prometheus.query(
        f'{vm.ENGINE_SLEEP_STATE}{{namespace="{env.namespace}",sleep_state="awake"}} == 0'
    )
    assert sorted(s["metric"]["instance"].rsplit(":", 1)[1] for s in asleep) == ["8001"] * REPLICAS


def test_a_flip_on_under_load_switches_every_pod_to_its_speculative_engine_without_a_failed_request(
    env, standby
):
    assert env.runner is not None
    runner = env.runner
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(env, standby)}
    engines = _engines(env, standby)
    assert len(engines) == REPLICAS
    started_before = runner.started_total
    served_before = {pp.name: _finished_requests(_speculative(env, pp)) for pp in engines}

    load = LoadGenerator(env.router_url(standby), "llama", max_tokens=32).start(concurrency=6)
    try:
        wait_for("load flowing", lambda: load.snapshot().ok >= 10, timeout=60)
        flip_started = time.monotonic()
        env.kubectl(
            "patch",
            "sd",
            standby,
            "-n",
            env.namespace,
            "--type",
            "merge",
            "-p",
            json.dumps({"spec": {"pools": {"latency": {"speculation": "On"}}}}),
        )
        wait_for(
            "every latency pod relabelled On",
            lambda: all(p["metadata"]["labels"].get(LABEL_SPECULATION) == "On" for p in _pods(env, standby)),
            timeout=2 * FLIP_BOUND_SECONDS,
            interval=0.2,
        )
        flip_seconds = time.monotonic() - flip_started
        at_flip = load.snapshot().ok
        # Traffic now reaches the speculative engines through the `-spec` Service.
        wait_for(
            "every speculative engine serving",
            lambda: all(_finished_requests(_speculative(env, pp)) > served_before[pp.name] for pp in engines),
            timeout=60,
        )
        wait_for("load after the flip", lambda: load.snapshot().ok >= at_flip + 10, timeout=60)
    finally:
        stats = load.stop()

    flipped = [
        e["message"]
        for e in json.loads(env.kubectl("get", "events", "-n", env.namespace, "-o", "json").stdout)["items"]
        if e.get("reason") == "StandbyFlipped"
    ]
    print(
        f"\nStandby flip of {REPLICAS} replicas under load: {flip_seconds:.1f} s from the spec patch to every "
        f"pod labelled On; {stats.ok} requests, {stats.failed} failed; operator: {flipped}"
    )
    assert stats.failed == 0, stats.errors
    assert stats.ok > 20
    assert flip_seconds < FLIP_BOUND_SECONDS
    # No pod restarted: same pods, same processes; each now serves with its speculative engine.
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(env, standby)}
    assert after == before
    assert runner.started_total == started_before
    for pp in _engines(env, standby):
        assert pp.proc.poll() is None
        assert _sleeping(env, pp) == (True, False)
    wait_for(
        f"{standby} settled",
        lambda: env.conditions(standby).get("SpeculationSettled", {}).get("status") == "True",
        timeout=60,
    )
