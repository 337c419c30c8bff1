"""Faults under load: the closed loop of the e2e tier (real control plane, Prometheus, operator,
compiled router, emulated engines) with one component misbehaving while the official openai client
streams requests through the router; every test counts the clients' failed requests.

Each test deletes its resource at the end, so its engines and router stop weighing on the next one.
"""

from __future__ import annotations

import json
import random
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_sandbox.load import LoadGenerator
from specfleet_sandbox.pods import PodProcess
from specfleet_sandbox.processes import wait_for
from support.e2e_env import (
    Env,
    engine_args,
    fleet,
    history,
    latency,
    print_dump_if_failed,
    running_env,
    wait_metrics,
    wait_mode,
    wait_settled,
)
from support.prometheus_faults import FaultyPrometheus

pytestmark = pytest.mark.e2e
# After SIGTERM the router fails /readyz and serves on this long (its default is 5 s): the test's
# stand-in for the Service (the clients) must see the drop and stop within it on a busy CI machine.
SHUTDOWN_DELAY_SECONDS = 12
OUTAGE_SECONDS = 60
KILLS = 10


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory) -> Iterator[Env]:
    router_args = ["--shutdown-delay-seconds", str(SHUTDOWN_DELAY_SECONDS)]
    with running_env(cluster, tmp_path_factory.mktemp("faults"), router_args=router_args) as e:
        yield e


@pytest.fixture(autouse=True)
def dump_on_failure(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_dump_if_failed(env, request)


def _delete(env: Env, name: str) -> None:
    env.kubectl("delete", "sd", name, "-n", env.namespace, "--wait=false")


def _router(env: Env, name: str) -> PodProcess:
    assert env.runner is not None
    env.router_url(name)  # ready
    (router,) = [p for p in env.runner.processes("router") if p.name.startswith(f"{name}-router-")]
    return router


def _readiness(url: str) -> tuple[int, str] | None:
    """The router's /readyz on a new connection, as a readiness probe asks it; None if refused."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
            return int(response.status), str(json.loads(response.read())["reason"])
    except urllib.error.HTTPError as err:
        return int(err.code), str(json.loads(err.read())["reason"])
    except OSError:
        return None


def test_router_sigterm_under_load_drops_readiness_first_and_fails_no_request(env):
    name = fleet(env, "term")
    router = _router(env, name)
    url = env.router_url(name)
    clients = 8
    load = LoadGenerator(url, "llama", max_tokens=48).start(concurrency=clients)
    try:
        wait_for("load flowing", lambda: load.snapshot().ok >= clients, timeout=60)
        router.proc.send_signal(signal.SIGTERM)
        # Readiness drops first: the probe's new connection is answered "draining", not refused.
        wait_for(
            "router /readyz 503 draining", lambda: _readiness(url) == (503, "draining"), 30, interval=0.05
        )
        at_drop = load.snapshot().ok
        # Still serving: more answers than requests that were in flight at the drop, so requests sent
        # after it (each on a new connection: every answer now closes its own) were served too.
        wait_for("requests served after the drop", lambda: load.snapshot().ok > at_drop + clients, 60)
        assert router.proc.poll() is None
        # The Service has taken the router out: no new request reaches it; those in flight finish.
        load.set_concurrency(0)
        wait_for("clients done", lambda: load.clients == 0, timeout=60)
        assert router.proc.poll() is None, "the router stopped before its shutdown delay ended"
        assert router.proc.wait(SHUTDOWN_DELAY_SECONDS + 30) == 0
    finally:
        stats = load.stop()
        _delete(env, name)
    assert stats.failed == 0, stats.errors
    assert stats.ok > at_drop + clients


def test_prometheus_answering_garbage_empty_and_slow_holds_then_recovers(env):
    assert env.prometheus is not None
    # Slow answers come after the resource's 2 s timeout.
    faulty = FaultyPrometheus(env.prometheus.url, slow_seconds=4).start()
    name = fleet(env, "badprom", {"spec": {"policy": {"prometheus": {"url": faulty.url}}}})
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    phases = [
        ("garbage", "Prometheus query failed"),
        ("empty", "no engine samples for pool latency"),
        ("slow", "did not answer in time"),
    ]
    try:
        wait_metrics(env, name)
        for n, (mode, says) in enumerate(phases):
            faulty.mode = mode
            cond = wait_for(
                f"MetricsAvailable=False saying {says!r}",
                lambda says=says: (
                    (c := env.conditions(name).get("MetricsAvailable", {})).get("status") == "False"
                    and says in c.get("message", "")
                    and c
                ),
                timeout=30,
            )
            assert "holding every pool in its current mode" in cond["message"]
            if n == 0:
                load.set_concurrency(28)  # enough to turn speculation off, were the numbers believed
            rounds = faulty.rounds(mode)
            wait_for(
                f"3 more evaluations against the {mode} Prometheus",
                lambda mode=mode, rounds=rounds: faulty.rounds(mode) >= rounds + 3,
                timeout=60,
            )
            assert history(env, name) == [], mode
            assert latency(env, name)["speculation"] == "On", mode
        assert env.operator is not None
        assert env.operator.alive()
        faulty.mode = "pass"
        wait_metrics(env, name)
        # Healthy again, the policy acts on the numbers: the load it held against turns speculation off.
        off = wait_mode(env, name, "Off", timeout=60)
        assert off["reason"] == "ConcurrencyAboveThreshold"
        assert history(env, name) == [("On", "Off")]
    finally:
        stats = load.stop()
        faulty.stop()
        _delete(env, name)
    assert stats.failed == 0, stats.errors


def test_kube_apiserver_stopped_for_a_minute_during_a_flip(env):
    name = fleet(env, "apiserver")
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    assert env.operator is not None
    try:
        wait_metrics(env, name)
        load.set_concurrency(28)
        wait_for(
            "flip recorded", lambda: latency(env, name)["speculation"] == "Off", timeout=90, interval=0.1
        )
        settled = env.conditions(name).get("SpeculationSettled", {}).get("status")
        log_before = len(env.operator.log())
        stopped = time.monotonic()
        # Its graceful stop waits for every watch to end: cut after 5 s, as an outage would.
        env.cluster.stop_component("kube-apiserver", timeout=5)
        try:
            served = load.snapshot().ok
            # The router serves from its EndpointSlice cache meanwhile.
            wait_for(
                "requests served without the apiserver",
                lambda: load.snapshot().ok >= served + 50,
                timeout=OUTAGE_SECONDS - 5,
            )
            time.sleep(max(0.0, stopped + OUTAGE_SECONDS - time.monotonic()))  # the outage itself
        finally:
            env.cluster.start_component("kube-apiserver")
        wait_settled(env, name, timeout=180)
        env.wait_sweeps(3)
        flips, args = history(env, name), engine_args(env, name)
    finally:
        stats = load.stop()
        _delete(env, name)
    assert settled == "False", "the rollout had ended before the outage; the test proved less"
    assert flips == [("On", "Off")]
    assert "--speculative-config" not in args
    assert env.operator.alive()
    # The operator met the outage, and retried rather than stopping.
    retried = f"policy evaluation of {env.namespace}/{name} failed, retrying"
    assert retried in env.operator.log()[log_before:]
    assert stats.failed == 0, stats.errors


def _deployments(env: Env, name: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/managed-by=specfleet-operator"
    out = env.kubectl("get", "deployments", "-n", env.namespace, "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_operator_killed_at_random_points_of_a_flip_records_it_once(env):
    assert env.operator is not None
    operator = env.operator
    rng = random.Random(25)
    name = fleet(env, "sigkill")
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    kill_points: list[float] = []
    try:
        wait_metrics(env, name)
        load.set_concurrency(28)
        for _ in range(KILLS):
            # A point within or after a sweep: its queries, the decision, the Deployment applied, the
            # status written, then the rollout's reconciles.
            env.wait_sweeps(1)
            kill_points.append(rng.uniform(0.0, 3.0))
            time.sleep(kill_points[-1])
            operator.kill()
            operator.start()
        wait_mode(env, name, "Off", timeout=90)
        wait_settled(env, name, timeout=120)
        env.wait_sweeps(3)
        sd = env.sd(name)
        flips, args, live = history(env, name), engine_args(env, name), _deployments(env, name)
    finally:
        stats = load.stop()
        _delete(env, name)
    assert flips == [("On", "Off")], kill_points
    assert "--speculative-config" not in args
    # No orphan: the live Deployments are exactly those the resource renders, each owned by it.
    parsed = parse_resource(sd)
    rendered = render_children(parsed, decided_plan(parsed))
    assert {d["metadata"]["name"] for d in live} == {
        m["metadata"]["name"] for m in rendered if m["kind"] == "Deployment"
    }
    for deployment in live:
        owners = [
            (o["kind"], o["uid"], o.get("controller")) for o in deployment["metadata"]["ownerReferences"]
        ]
        assert owners == [("SpeculativeDeployment", sd["metadata"]["uid"], True)]
    assert stats.failed == 0, stats.errors


def _router_counter(env: Env, name: str, metric: str, **labels: str) -> float:
    """A counter from the fleet's router's own /metrics (every worker's share)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{env.router_url(name)}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_flip_under_overload_with_an_engine_killed_loses_no_whole_answer(env):
    """Two engines of four sequences each, 24 clients waiting for whole answers: most requests queue in
    the engines. Mid-flip one old engine is SIGKILLed; the other is stopped by the rollout and killed when
    its 3 s grace period ends, its queue still full. The router sends every request they held again."""
    assert env.runner is not None
    runner = env.runner
    patch = {
        "spec": {
            "engine": {"maxNumSeqs": 4, "terminationGracePeriodSeconds": 3},
            "pools": {"latency": {"replicas": 2}},
            "policy": {
                "thresholds": {"stopAboveConcurrencyPerReplica": 3, "resumeBelowConcurrencyPerReplica": 1}
            },
        }
    }
    name = fleet(env, "overload", patch)
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48, stream=False).start(concurrency=2)
    try:
        wait_metrics(env, name)
        old = [p for p in runner.processes("engine") if p.name.startswith(f"{name}-latency-")]
        assert len(old) == 2
        retried = _router_counter(env, name, "specfleet_router_retries_total", pool="latency")
        load.set_concurrency(24)
        wait_for(
            "flip recorded", lambda: latency(env, name)["speculation"] == "Off", timeout=90, interval=0.1
        )
        old[0].proc.kill()  # an engine lost mid-flip, its requests with it
        wait_settled(env, name, timeout=120)
        # The other one's grace period ends: killed, as the kubelet would, with its queue still full.
        wait_for("the old engines gone", lambda: all(p.proc.poll() is not None for p in old), timeout=60)
        flips = history(env, name)
        resent = _router_counter(env, name, "specfleet_router_retries_total", pool="latency") - retried
    finally:
        stats = load.stop()
        _delete(env, name)
    assert flips == [("On", "Off")]
    assert resent > 0, "no request was sent again: the fault hit nothing"
    assert stats.failed == 0, stats.errors
