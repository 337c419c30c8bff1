"""The router's hot-path metric handles (`RouterMetrics.value` / `.histogram`) export exactly what
prometheus_client's own inc/dec/observe would (multiprocess mode: tests/unit/test_router_workers.py)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from specfleet_runtime.router.metrics import LATENCY_BUCKETS, RouterMetrics

VALUES = [0.0, 0.001, 0.0011, 0.0025, 0.3, 1.0, 299.9, 300.0, 1000.0]


def test_histogram_handle_matches_prometheus_client() -> None:
    metrics = RouterMetrics()
    fast = metrics.histogram(metrics.duration, "latency", "batch")
    plain_registry = CollectorRegistry()
    plain = Histogram(
        "specfleet_router_request_duration_seconds",
        "same",
        ["class", "pool"],
        buckets=LATENCY_BUCKETS,
        registry=plain_registry,
    ).labels("latency", "batch")
    for value in VALUES:
        fast.observe(value)
        plain.observe(value)
    for bound in [*LATENCY_BUCKETS, float("inf")]:
        le = "+Inf" if bound == float("inf") else repr(bound)
        labels = {"class": "latency", "pool": "batch", "le": le}
        name = "specfleet_router_request_duration_seconds_bucket"
        assert metrics.registry.get_sample_value(name, labels) == plain_registry.get_sample_value(
            name, labels
        )
    for suffix in ("_count", "_sum"):
        name = "specfleet_router_request_duration_seconds" + suffix
        labels = {"class": "latency", "pool": "batch"}
        assert metrics.registry.get_sample_value(name, labels) == plain_registry.get_sample_value(
            name, labels
        )


def test_counter_and_gauge_handles_share_the_exported_value() -> None:
    metrics = RouterMetrics()
    handle = metrics.value(metrics.requests, "latency", "latency", "200", "none")
    assert metrics.value(metrics.requests, "latency", "latency", "200", "none") is handle
    handle.inc()
    metrics.requests.labels("latency", "latency", "200", "none").inc()  # the library's own path
    labels = {"class": "latency", "pool": "latency", "code": "200", "error": "none"}
    assert metrics.registry.get_sample_value("specfleet_router_requests_total", labels) == 2
    gauge = metrics.value(metrics.bytes_in_flight)
    gauge.inc(100)
    gauge.dec(40)
    assert metrics.registry.get_sample_value("specfleet_router_request_bytes_in_flight") == 60
    assert b"specfleet_router_request_bytes_in_flight 60.0" in generate_latest(metrics.registry)


def test_build_info_names_the_build_this_process_imported() -> None:
    """`make test-router-native` runs this file against the compiled build (SPECFLEET_ROUTER_NATIVE=1),
    the plain run against the source: the exported label must say which one serves."""
    expected = "compiled" if os.environ.get("SPECFLEET_ROUTER_NATIVE") == "1" else "source"
    metrics = RouterMetrics()
    assert metrics.registry.get_sample_value("specfleet_router_build_info", {"build": expected}) == 1
    other = "source" if expected == "compiled" else "compiled"
    assert metrics.registry.get_sample_value("specfleet_router_build_info", {"build": other}) is None
