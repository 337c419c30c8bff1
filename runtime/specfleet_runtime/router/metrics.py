"""The router's Prometheus metrics (prefix `specfleet_router_`), in a registry of their own.

A registry per router instance lets tests run several routers in one process. Labels: `class` is
the pool a request was classified into, `pool` the pool that served it (they differ on fallback).
Requests refused before classification carry `class="none", pool="none"`.

With several worker processes (`--workers`, see `workers`) prometheus_client runs in multiprocess mode
(PROMETHEUS_MULTIPROC_DIR set by the supervisor): counters and histograms add up over the workers,
gauges of things held now (requests, connections, bytes) are summed over live workers, the endpoint
count is the largest any worker sees.
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

from specfleet_runtime.names import ROUTER_REQUESTS
from specfleet_runtime.router.build import router_build

# A value and its timestamp (0: none) as prometheus_client's multiprocess files hold them, written in place.
_PACK_TWO_DOUBLES_INTO = struct.Struct("dd").pack_into

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class RouterMetrics:
    """Every metric the router exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._cells: dict[tuple[int, tuple[str, ...]], Cell | FastHistogram] = {}
        r = self.registry
        self.requests = Counter(
            ROUTER_REQUESTS,
            "Requests answered, by class, serving pool, status code sent and error (none, or why the "
            "request failed: mid_stream when an engine broke a response already under way, "
            "client_closed, upstream_timeout, upstream_unavailable, refused, ...).",
            ["class", "pool", "code", "error"],
            registry=r,
        )
        self.protocol_errors = Counter(
            "specfleet_router_protocol_errors",
            "Connections or requests refused before a request existed (bad request line, oversized "
            "headers, bad Content-Length, connection cap, slow client) or dropped because the client read "
            "nothing for --write-timeout (write_timeout), by reason.",
            ["reason"],
            registry=r,
        )
        self.bytes_in_flight = Gauge(
            "specfleet_router_request_bytes_in_flight",
            "Request body bytes held by the router now (capped by --max-bytes-in-flight).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.open_connections = Gauge(
            "specfleet_router_open_connections",
            "Client connections open now (capped by --max-connections).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.classifications = Counter(
            "specfleet_router_classifications",
            "Requests classified, by class and the rule that decided.",
            ["class", "reason"],
            registry=r,
        )
        self.duration = Histogram(
            "specfleet_router_request_duration_seconds",
            "Time from request received to response finished.",
            ["class", "pool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.time_to_first_byte = Histogram(
            "specfleet_router_time_to_first_byte_seconds",
            "Time from request received to the first response body byte sent to the client.",
            ["class", "pool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "specfleet_router_in_flight_requests",
            "Requests being proxied now.",
            ["class", "pool"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.reclassifications = Counter(
            "specfleet_router_reclassifications",
            "Requests that auto-segmentation moved away from the default pool.",
            ["from_pool", "to_pool"],
            registry=r,
        )
        self.segment_transitions = Counter(
            "specfleet_router_segment_transitions",
            "Clients entering (to_batch) or leaving (from_batch) auto-segmentation.",
            ["direction"],
            registry=r,
        )
        self.segmented_clients = Gauge(
            "specfleet_router_segmented_clients",
            "Clients currently auto-segmented as batch (each worker segments the clients it sees).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.fallbacks = Counter(
            "specfleet_router_fallbacks",
            "Requests served by the other pool because theirs had no endpoint.",
            ["from_pool", "to_pool"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "specfleet_router_upstream_errors",
            "Failures talking to engines, by pool and kind (connect, connect_timeout, disconnect, stall, "
            "timeout, mid_stream, other).",
            ["pool", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "specfleet_router_retries",
            "Requests re-sent to another endpoint after a connection failure.",
            ["pool"],
            registry=r,
        )
        self.prefix_choices = Counter(
            "specfleet_router_prefix_affinity_choices",
            "Requests of PrefixAffinity pools by where they went: conversation (back to the engine that "
            "last served their conversation), moved (that engine was at the load bound or gone), home (the "
            "engine their leading text was placed on), placed (a leading text seen for the first time), "
            "spilled (past the leading text's engine, at the bound: the next on the ring).",
            ["pool", "choice"],
            registry=r,
        )
        self.endpoints = Gauge(
            "specfleet_router_endpoints",
            "Ready endpoints known per pool.",
            ["pool"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.watch_errors = Counter(
            "specfleet_router_watch_errors",
            "Kubernetes list/watch failures (each one logged; the watch restarts with backoff), by kind.",
            ["kind"],
            registry=r,
        )
        self.build_info = Gauge(
            "specfleet_router_build_info",
            "1, labelled with the build of the request path this router runs: compiled (mypyc C "
            "extensions, as the image ships it) or source.",
            ["build"],
            registry=r,
            multiprocess_mode="max",
        )
        self.build_info.labels(router_build()).set(1)
        self.config_reloads = Counter(
            "specfleet_router_config_reloads",
            "Routing config documents seen, by result (applied, rejected).",
            ["result"],
            registry=r,
        )

    def value(self, metric: Counter | Gauge, *labels: str) -> Cell:
        """The hot-path handle of a counter or gauge (a labelled child, or the metric itself)."""
        key = (id(metric), labels)
        found = self._cells.get(key)
        if found is None:
            child = metric.labels(*labels) if labels else metric
            found = self._cells[key] = _adopt(child, "_value")
        assert isinstance(found, Cell)
        return found

    def histogram(self, metric: Histogram, *labels: str) -> FastHistogram:
        """The hot-path handle of a labelled histogram child."""
        key = (id(metric), labels)
        found = self._cells.get(key)
        if found is None:
            found = self._cells[key] = FastHistogram(metric.labels(*labels))
        assert isinstance(found, FastHistogram)
        return found

    def scrape_registry(self) -> CollectorRegistry:
        """What /metrics exports: this registry, or every worker's samples in multiprocess mode."""
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not path:
            return self.registry
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path)  # type: ignore[no-untyped-call]
        return registry


class Cell:
    """One metric value, updated without prometheus_client's per-call layers and lock.

    It takes the place of the value object inside a prometheus_client metric (`_adopt`), so
    exposition is unchanged: in one process the metric reads `get()`; in multiprocess mode each update
    is also written to this worker's mmap file at the value's offset, looked up once, so any worker's
    /metrics still adds up exact pod totals. The router updates metrics from its event loop thread
    only, which is what makes dropping the lock safe.
    """

    __slots__ = ("_file", "_pos", "value")

    def __init__(self, original: Any) -> None:
        self.value: float = original.get()
        self._file: Any = None
        self._pos = 0
        file = getattr(original, "_file", None)
        if file is not None:  # prometheus_client's MmapedValue (multiprocess mode)
            key = original._key
            file.read_value(key)  # makes sure the value has its slot
            self._file = file
            self._pos = file._positions[key]

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount
        if self._file is not None:
            _PACK_TWO_DOUBLES_INTO(self._file._m, self._pos, self.value, 0.0)

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)

    # The rest of prometheus_client's value interface.

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.inc(value - self.value)

    def get(self) -> float:
        return self.value

    def set_exemplar(self, exemplar: Any) -> None:
        pass

    def get_exemplar(self) -> None:
        return None


def _adopt(owner: Any, attribute: str) -> Cell:
    cell = Cell(getattr(owner, attribute))
    setattr(owner, attribute, cell)
    return cell


class FastHistogram:
    """A labelled histogram child's observe() on `Cell`s (prometheus_client's buckets: first bound >= value)."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._bounds: list[float] = list(child._upper_bounds)
        self._sum = _adopt(child, "_sum")
        buckets = [Cell(bucket) for bucket in child._buckets]
        child._buckets = buckets
        self._buckets = buckets

    def observe(self, amount: float) -> None:
        self._sum.inc(amount)
        self._buckets[bisect.bisect_left(self._bounds, amount)].inc()
