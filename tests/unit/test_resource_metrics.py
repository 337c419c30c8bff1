"""The operator's per-resource gauges: a pure function of the resource, exported without stale series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from specfleet.observe.gauges import ResourceGauges
from specfleet.observe.resource_metrics import (
    CONDITION,
    POOL_ACCEPTANCE,
    POOL_CHANGE_PREDICTED,
    POOL_CHANGE_REALIZED,
    POOL_K,
    POOL_REPLICAS,
    POOL_SLO_BUCKET,
    POOL_SPECULATING,
    resource_samples,
)


def _body(**status):
    return {
        "metadata": {"namespace": "inference", "name": "assistant"},
        "spec": {"drafter": {"numSpeculativeTokens": 4}, "pools": {"latency": {"replicas": 3}}},
        "status": status,
    }


READY = {
    "type": "Ready",
    "status": "True",
    "reason": "AllPoolsReady",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def test_samples_from_status():
    body = _body(
        conditions=[READY],
        pools={
            "latency": {"speculation": "On", "readyReplicas": 3, "acceptanceLength": "2.41"},
            "batch": {"speculation": "Off", "numSpeculativeTokens": 2},
        },
    )
    got = {(s.name, s.labels): s.value for s in resource_samples(body)}
    assert got[(CONDITION, ("inference", "assistant", "Ready", "True"))] == 1.0
    assert got[(CONDITION, ("inference", "assistant", "Ready", "False"))] == 0.0
    assert got[(POOL_SPECULATING, ("inference", "assistant", "latency"))] == 1.0
    assert got[(POOL_SPECULATING, ("inference", "assistant", "batch"))] == 0.0
    assert got[(POOL_K, ("inference", "assistant", "latency"))] == 4.0
    assert got[(POOL_K, ("inference", "assistant", "batch"))] == 2.0
    assert got[(POOL_ACCEPTANCE, ("inference", "assistant", "latency"))] == 2.41
    assert (POOL_ACCEPTANCE, ("inference", "assistant", "batch")) not in got


def test_damaged_status_gives_pool_gauges_and_no_crash():
    body = _body(conditions="garbage", pools={"latency": {"acceptanceLength": "n/a"}})
    names = {s.name for s in resource_samples(body)}
    assert CONDITION not in names
    assert POOL_ACCEPTANCE not in names
    assert POOL_SPECULATING in names


def test_exporter_drops_series_that_disappeared():
    registry = CollectorRegistry()
    gauges = ResourceGauges(registry)
    gauges.publish(_body(conditions=[READY], pools={"latency": {"acceptanceLength": "2.0"}}))
    text = generate_latest(registry).decode()
    assert (
        'specfleet_pool_acceptance_length{name="assistant",namespace="inference",pool="latency"} 2.0' in text
    )
    gauges.publish(_body(conditions=[], pools={}))
    text = generate_latest(registry).decode()
    assert "specfleet_pool_acceptance_length{" not in text
    assert "specfleet_condition{" not in text
    gauges.forget("inference", "assistant")
    assert "specfleet_pool_speculating{" not in generate_latest(registry).decode()


def test_an_autoscaled_pool_reports_the_count_its_autoscaler_set():
    # The alert "fewer ready engines than replicas" compares against this gauge: for an autoscaled pool
    # the spec's replicas mean nothing, the Deployments' current count does.
    body = _body(pools={"latency": {"readyReplicas": 5, "desiredReplicas": 6}})
    body["spec"]["pools"]["latency"]["autoscaling"] = {"maxReplicas": 8, "target": 16}
    got = {(s.name, s.labels): s.value for s in resource_samples(body)}
    assert got[(POOL_REPLICAS, ("inference", "assistant", "latency"))] == 6.0
    assert got[(POOL_REPLICAS, ("inference", "assistant", "batch"))] == 1.0


def test_each_slo_target_names_the_bucket_it_is_counted_at():
    # The dashboard's SLO panel joins the engines' buckets on this `le` (as Prometheus 3 stores it).
    body = _body()
    body["spec"]["pools"] = {
        "latency": {"slo": {"timeToFirstTokenMilliseconds": 1000, "timePerOutputTokenMilliseconds": 60}},
        "batch": {"slo": {"percentile": 90}},  # no target: invalid, so no series rather than a crash
    }
    got = {s.labels for s in resource_samples(body) if s.name == POOL_SLO_BUCKET}
    assert got == {
        ("inference", "assistant", "latency", "ttft", "1"),
        ("inference", "assistant", "latency", "tpot", "0.05"),
    }


def _change(pool, reason, predicted, realized=None, **extra):
    entry = {
        "time": "2026-01-01T00:00:00Z",
        "pool": pool,
        "from": "On",
        "to": "Off",
        "reason": reason,
        "observations": {"predictedChangeSpeedup": predicted, **extra},
    }
    if realized is not None:
        entry["realized"] = {
            "time": "2026-01-01T00:01:00Z",
            "tokensPerSecondPerReplicaBefore": "100",
            "tokensPerSecondPerReplicaAfter": "120",
            "realizedSpeedup": realized,
        }
    return entry


def test_each_pool_exports_its_newest_measured_change_beside_its_prediction():
    body = _body(
        history=[
            _change("batch", "GoodputBelowBreakEven", "1.150", "1.200"),
            _change("batch", "GoodputMemoryBound", "1.196", "1.441"),
            _change("batch", "GoodputAboveBreakEven", "1.302"),  # not measured yet: the one before stays
            _change("latency", "GoodputRetune", "n/a", "0.950"),  # no number predicted: realized alone
        ]
    )
    got = {(s.name, s.labels): s.value for s in resource_samples(body)}
    batch = ("inference", "assistant", "batch", "GoodputMemoryBound")
    assert got[(POOL_CHANGE_PREDICTED, batch)] == 1.196
    assert got[(POOL_CHANGE_REALIZED, batch)] == 1.441
    latency = ("inference", "assistant", "latency", "GoodputRetune")
    assert (POOL_CHANGE_PREDICTED, latency) not in got
    assert got[(POOL_CHANGE_REALIZED, latency)] == 0.95
    assert sum(1 for name, _ in got if name in (POOL_CHANGE_PREDICTED, POOL_CHANGE_REALIZED)) == 3


def test_a_newer_measured_change_replaces_the_exported_one():
    registry = CollectorRegistry()
    gauges = ResourceGauges(registry)
    gauges.publish(_body(history=[_change("batch", "GoodputBelowBreakEven", "1.150", "1.200")]))
    first = generate_latest(registry).decode()
    assert 'reason="GoodputBelowBreakEven"' in first
    gauges.publish(
        _body(
            history=[
                _change("batch", "GoodputBelowBreakEven", "1.150", "1.200"),
                _change("batch", "GoodputAboveBreakEven", "1.100", "1.050"),
            ]
        )
    )
    second = generate_latest(registry).decode()
    assert 'reason="GoodputBelowBreakEven"' not in second
    assert (
        f'{POOL_CHANGE_REALIZED}{{name="assistant",namespace="inference",pool="batch",reason="GoodputAboveBreakEven"}} 1.05'
        in second
    )
