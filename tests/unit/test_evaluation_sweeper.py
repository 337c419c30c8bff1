"""The policy scheduler over the in-memory cluster: one round of queries per Prometheus per sweep for
every resource, each resource at its own interval, no per-object lock held while Prometheus is asked,
and one failing resource never stops the others."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from specfleet.controller.control import Controller, Outcome
from specfleet.controller.evaluation_sweeper import EvaluationSweeper
from specfleet.observe.prometheus import fleet_queries
from specfleet.render import RenderOptions
from support.fake_cluster import FakeCluster
from support.fake_prometheus import FakePrometheus
from support.manifests import ROOT, load_yaml, merge

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
WINDOW = 30
ROUND = len(fleet_queries(WINDOW, ["any"]))


class Monotonic:
    def __init__(self) -> None:
        # A multiple of every interval used here: the first sweep finds everything due.
        self.now = 1200.0

    def __call__(self) -> float:
        return self.now


def _resource(ns: str, name: str, *, interval: int = 5, url: str = "http://prom-a:9090") -> dict[str, Any]:
    return merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {
            "metadata": {"namespace": ns, "name": name, "uid": f"uid-{ns}-{name}", "generation": 1},
            "spec": {
                "pools": {"latency": {"replicas": 2}, "batch": {"replicas": 1, "speculation": "Off"}},
                "policy": {
                    "evaluationIntervalSeconds": interval,
                    "windowSeconds": WINDOW,
                    "prometheus": {"url": url},
                },
            },
        },
    )


class World:
    def __init__(self) -> None:
        self.cluster = FakeCluster()
        self.proms: dict[str, FakePrometheus] = {}
        self.asked: list[str] = []
        self.emitted: list[tuple[str, Outcome]] = []
        self.controller = Controller(self.cluster, RenderOptions(), self._querier, clock=lambda: T0)
        self.clock = Monotonic()
        self.scheduler = EvaluationSweeper(
            self.controller, self._emit, monotonic=self.clock, initial_delay_seconds=0.0
        )

    def _querier(self, url: str, timeout: int) -> FakePrometheus:
        self.asked.append(url)
        return self.proms.setdefault(url, FakePrometheus("", "", WINDOW))

    def _emit(self, body: Mapping[str, Any], outcome: Outcome) -> None:
        self.emitted.append((body["metadata"]["name"], outcome))

    def add(self, ns: str, name: str, **kw: Any) -> dict[str, Any]:
        doc = _resource(ns, name, **kw)
        self.cluster.objects[("SpeculativeDeployment", ns, name)] = doc
        self.controller.reconcile_object(ns, name)
        self.scheduler.track(doc)
        return doc

    def prom(self, url: str = "http://prom-a:9090") -> FakePrometheus:
        return self.proms.setdefault(url, FakePrometheus("", "", WINDOW))

    def status(self, ns: str, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.cluster.objects[("SpeculativeDeployment", ns, name)]["status"]
        return status


@pytest.fixture
def world() -> World:
    return World()


def _metrics_available(world: World, ns: str, name: str) -> str:
    return next(c["status"] for c in world.status(ns, name)["conditions"] if c["type"] == "MetricsAvailable")


def test_one_round_of_queries_per_prometheus_serves_every_resource(world):
    names = [(f"ns-{i % 3}", f"fleet-{i}") for i in range(30)]
    for ns, name in names:
        world.add(ns, name)
        # Load far past any break-even point on every latency pool: each one should flip Off.
        world.prom().set_pool("latency", namespace=ns, deployment=name, running=400.0)
    world.cluster.roll_out()
    for ns, name in names:
        world.controller.reconcile_object(ns, name)

    report = world.scheduler.sweep()

    assert (report.evaluated, report.targets, report.failed) == (30, 1, 0)
    assert len(world.prom().queries) == ROUND
    for ns, name in names:
        assert world.status(ns, name)["pools"]["latency"]["speculation"] == "Off", name
    assert sorted(n for n, _ in world.emitted) == sorted(n for _, n in names)


def test_a_malformed_sample_is_skipped_and_every_other_resource_is_decided(world):
    for ns, name in (("a", "one"), ("a", "two"), ("b", "three")):
        world.add(ns, name)
        world.prom().set_pool("latency", namespace=ns, deployment=name, running=400.0)
    world.cluster.roll_out()
    for ns, name in (("a", "one"), ("a", "two"), ("b", "three")):
        world.controller.reconcile_object(ns, name)
    labels = {"namespace": "a", "specfleet_io_deployment": "one", "specfleet_io_pool": "latency"}
    world.prom().extra = {
        "accepted_per_pos": [{"metric": {**labels, "position": "x"}, "value": [0, "3"]}],
        "running_per_replica": [{"metric": {**labels, "specfleet_io_deployment": "two"}}],  # no value
    }
    before = {
        reason: REGISTRY.get_sample_value(
            "specfleet_prometheus_samples_rejected_total", {"query": query, "reason": reason}
        )
        or 0.0
        for query, reason in (("accepted_per_pos", "bad_position"), ("running_per_replica", "malformed"))
    }

    report = world.scheduler.sweep()

    assert (report.evaluated, report.failed) == (3, 0)
    for ns, name in (("a", "one"), ("a", "two"), ("b", "three")):
        assert _metrics_available(world, ns, name) == "True", name
        assert world.status(ns, name)["pools"]["latency"]["speculation"] == "Off", name
    for (query, reason), was in zip(
        (("accepted_per_pos", "bad_position"), ("running_per_replica", "malformed")),
        before.values(),
        strict=True,
    ):
        now = REGISTRY.get_sample_value(
            "specfleet_prometheus_samples_rejected_total", {"query": query, "reason": reason}
        )
        assert now == was + 1, (query, reason)
    # The round asked only about the namespaces of the resources it served.
    assert all('namespace=~"a|b",' in q for q in world.prom().queries)


def test_resources_on_different_prometheus_servers_get_one_round_each(world):
    world.add("a", "one", url="http://prom-a:9090")
    world.add("a", "two", url="http://prom-a:9090")
    world.add("b", "three", url="http://prom-b:9090")
    world.prom("http://prom-a:9090").set_pool("latency", namespace="a", deployment="one")
    world.prom("http://prom-a:9090").set_pool("latency", namespace="a", deployment="two")
    # prom-b has no samples for "three": its own problem only.

    report = world.scheduler.sweep()

    assert report.targets == 2
    assert len(world.prom("http://prom-a:9090").queries) == ROUND
    assert len(world.prom("http://prom-b:9090").queries) == ROUND
    assert _metrics_available(world, "a", "one") == "True"
    assert _metrics_available(world, "a", "two") == "True"
    assert _metrics_available(world, "b", "three") == "False"


def test_each_resource_runs_at_its_own_interval(world):
    world.add("ns", "fast", interval=5)
    world.add("ns", "slow", interval=60)
    assert world.scheduler.sweep().evaluated == 2

    world.clock.now += 5
    report = world.scheduler.sweep()
    assert set(report.outcomes) == {("ns", "fast")}

    world.clock.now += 5
    assert set(world.scheduler.sweep().outcomes) == {("ns", "fast")}
    # Nothing is due 1 s later: no sweep, no query.
    queries = len(world.prom().queries)
    world.clock.now += 1
    assert world.scheduler.sweep().evaluated == 0
    assert len(world.prom().queries) == queries

    # 60 s after the first sweep both are due again, in one sweep with one round of queries.
    world.clock.now += 49
    queries = len(world.prom().queries)
    assert set(world.scheduler.sweep().outcomes) == {("ns", "fast"), ("ns", "slow")}
    assert len(world.prom().queries) == queries + ROUND


def test_resources_created_at_different_times_fall_into_one_sweep(world):
    world.scheduler.initial_delay_seconds = 5.0
    for i in range(10):
        world.add("ns", f"fleet-{i}", interval=30)
        world.clock.now += 7  # creations spread over 70 s
    evaluated: set[tuple[str, str]] = set()
    for _ in range(120):
        evaluated |= set(world.scheduler.sweep().outcomes)
        world.clock.now += 1
    assert len(evaluated) == 10
    # From then on every resource is due at the same instants: one sweep covers all ten.
    sizes = []
    for _ in range(60):
        report = world.scheduler.sweep()
        if report.evaluated:
            sizes.append(report.evaluated)
        world.clock.now += 1
    assert sizes == [10, 10]


def test_no_object_lock_is_held_while_prometheus_is_asked(world):
    world.add("ns", "llama")
    prom = world.prom()
    lock = world.controller._lock("ns", "llama")
    held_during_query: list[bool] = []

    def query(promql: str) -> list[dict[str, Any]]:
        free = lock.acquire(blocking=False)
        held_during_query.append(not free)
        if free:
            lock.release()
        return prom(promql)

    world.proms["http://prom-a:9090"] = query  # type: ignore[assignment]
    world.scheduler.sweep()
    assert held_during_query == [False] * ROUND


def test_reconcile_runs_while_a_sweep_waits_on_a_hung_prometheus(world):
    world.add("ns", "llama")
    asked = threading.Event()
    release = threading.Event()

    def hung(promql: str) -> list[dict[str, Any]]:
        asked.set()
        release.wait(30)
        return []

    world.proms["http://prom-a:9090"] = hung  # type: ignore[assignment]
    sweep = threading.Thread(target=world.scheduler.sweep)
    sweep.start()
    try:
        assert asked.wait(10)
        # The sweep is inside the query; the same resource reconciles without waiting for it.
        world.cluster.objects[("SpeculativeDeployment", "ns", "llama")]["metadata"]["generation"] = 2
        world.controller.reconcile_object("ns", "llama")
        assert world.status("ns", "llama")["observedGeneration"] == 2
        assert sweep.is_alive()
    finally:
        release.set()
        sweep.join(10)


def test_a_failing_resource_does_not_stop_the_sweep(world):
    world.add("ns", "good")
    world.add("ns", "bad")
    get = world.cluster.get

    def flaky_get(manifest: dict[str, Any]) -> dict[str, Any] | None:
        if manifest["metadata"]["name"] == "bad":
            raise OSError("connection reset")
        return get(manifest)

    world.cluster.get = flaky_get  # type: ignore[method-assign]
    report = world.scheduler.sweep()
    assert (report.evaluated, report.failed) == (2, 1)
    assert set(report.outcomes) == {("ns", "good")}
    # The failed one is retried (due again within its interval), the good one waits its interval.
    world.cluster.get = get  # type: ignore[method-assign]
    world.clock.now += 5
    assert ("ns", "bad") in world.scheduler.sweep().outcomes


def test_degraded_and_forgotten_resources_are_not_queried(world):
    doc = world.add("ns", "old")
    doc["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.6.0"}
    world.scheduler.track(doc)
    world.add("ns", "gone")
    world.scheduler.forget("ns", "gone")
    report = world.scheduler.sweep()
    assert (report.evaluated, report.targets) == (0, 0)
    assert world.asked == []


def test_a_target_changed_since_the_query_is_decided_next_sweep(world):
    doc = world.add("ns", "llama")
    # The live object moved to another Prometheus after the scheduler saw it.
    world.cluster.objects[("SpeculativeDeployment", "ns", "llama")]["spec"]["policy"]["prometheus"]["url"] = (
        "http://prom-b:9090"
    )
    first = world.scheduler.sweep()
    assert first.outcomes[("ns", "llama")].decisions == []
    doc["spec"]["policy"]["prometheus"]["url"] = "http://prom-b:9090"
    world.scheduler.track(doc)
    second = world.scheduler.sweep()  # due again at once
    assert [d.pool for d in second.outcomes[("ns", "llama")].decisions] == ["latency"]
    assert len(world.prom("http://prom-b:9090").queries) == ROUND
