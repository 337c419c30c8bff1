"""The engines behind each pool: where they are, how loaded, which are ejected, and which one to use next.

Endpoints come from a pool's static URLs and from EndpointSlice watches of its Service (started and
stopped as the routing config changes). An endpoint that refused a connection or stalled is ejected
for `eject_seconds`: skipped while another endpoint is available. An EndpointSlice lists only what
the kubelet found ready; a static URL has nobody vouching for it, so it counts towards readiness only
once it answered its last health check (`check_static`, run when /readyz asks).

Each pool picks by its `endpointSelection`: least outstanding, or prefix affinity (router/affinity.py):
the endpoint that last served the request's conversation, else its leading text's place on a ring of the
pool's endpoints (rebuilt when they change); ejected and tried endpoints are skipped alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from specfleet_runtime.names import POOLS, PoolName
from specfleet_runtime.router.affinity import Affinity, Placements, PrefixKeys, Ring
from specfleet_runtime.router.conversations import ConversationTable, PlacedBoard
from specfleet_runtime.router.endpoints import (
    AddressMap,
    choose_endpoint,
    endpoints_from_slices,
    resolve_pool,
)
from specfleet_runtime.router.metrics import Cell, RouterMetrics
from specfleet_runtime.router.sources import EndpointWatch, SliceWatchFactory
from specfleet_runtime.routing_config import RoutingConfig

log = logging.getLogger(__name__)

# (pool, namespace, service, port) of one EndpointSlice watch.
WatchKey = tuple[str, str, str, int]
# Static URLs are health-checked again when asked and their last check is older than this.
STATIC_CHECK_SECONDS = 1.0


class Backends:
    """Pool endpoints, their outstanding requests and ejections; all state changes on the event loop."""

    def __init__(
        self,
        namespace: str,
        eject_seconds: float,
        address_map: AddressMap,
        metrics: RouterMetrics,
        clock: Callable[[], float],
        slice_watch_factory: SliceWatchFactory | None = None,
        conversations: ConversationTable | None = None,
        board: PlacedBoard | None = None,
    ) -> None:
        self.namespace = namespace
        self.eject_seconds = eject_seconds
        self.address_map = address_map
        self.metrics = metrics
        self.clock = clock
        self.slice_watch_factory = slice_watch_factory
        self.config: RoutingConfig | None = None
        # The load bound of each pool that picks by prefix affinity (from the config, read once per
        # change rather than per request).
        self._affinity_bounds: dict[str, int] = {}
        self._watches: dict[WatchKey, EndpointWatch] = {}
        self._discovered: dict[WatchKey, tuple[str, ...]] = {}
        self.pool_endpoints: dict[str, tuple[str, ...]] = dict.fromkeys(POOLS, ())
        # Each pool's prefix-affinity ring, built on first use after its endpoints changed.
        self._rings: dict[str, Ring] = {}
        # The `prefix_choices` counter of each pool and choice, looked up once rather than by its
        # labels on every request.
        self._choice_counters: dict[str, dict[str, Cell]] = {}
        # Which endpoint last served each conversation key and holds each leading text (all pools: a
        # key's endpoint outside the pool asked for is passed over); shared with the other workers where
        # the caller says so; and the leading texts this worker placed (published on the workers'
        # shared board where the caller gives one).
        self.affinity = Affinity(
            conversations if conversations is not None else ConversationTable(), Placements(board=board)
        )
        self.recent = self.affinity.recent
        self.outstanding: dict[str, int] = {}
        self.ejected_until: dict[str, float] = {}
        self._turn = 0
        # Static URLs no EndpointSlice lists, those that answered their last health check, and when.
        self._static: frozenset[str] = frozenset()
        self.static_answering: frozenset[str] = frozenset()
        self._static_checked: tuple[frozenset[str], float] | None = None
        self._static_check: asyncio.Task[None] | None = None
        # Requests waiting for a pool's endpoints to change (`endpoints_change`).
        self._waiters: list[asyncio.Future[None]] = []

    # ---- where the endpoints are -------------------------------------------------------------------

    def apply_config(self, config: RoutingConfig) -> None:
        """Start and stop watches for the pools' Services and recompute every pool's endpoints."""
        self.config = config
        self._affinity_bounds = {
            name: selection.bound_percent
            for name in POOLS
            if (selection := config.endpoint_selection.of(name)).strategy == "PrefixAffinity"
        }
        wanted: set[WatchKey] = set()
        for pool, backend in config.pools.items():
            for listed in backend.services():  # a pool's endpoints: the union of its Services' ones
                namespace, _, service = listed.service.rpartition("/")
                wanted.add((pool, namespace or self.namespace, service, listed.port))
        for key in set(self._watches) - wanted:
            self._watches.pop(key).stop()
            self._discovered.pop(key, None)
        for key in sorted(wanted - set(self._watches)):
            self._start_watch(key)
        self._recompute()

    def unlisted(self) -> list[str]:
        """The Services (namespace/name) watched whose EndpointSlices have not been listed yet."""
        return sorted({f"{key[1]}/{key[2]}" for key in self._watches if key not in self._discovered})

    def _start_watch(self, key: WatchKey) -> None:
        pool, namespace, service, _ = key
        if self.slice_watch_factory is None:
            log.error(
                "pool %s names service %s/%s but the router has no Kubernetes access; "
                "using its static URLs only",
                pool,
                namespace,
                service,
            )
            return
        try:
            self._watches[key] = self.slice_watch_factory(namespace, service, self._slice_publisher(key))
        except Exception:
            log.exception("cannot watch EndpointSlices of %s/%s for pool %s", namespace, service, pool)
        else:
            log.info("watching EndpointSlices of %s/%s for pool %s", namespace, service, pool)

    def _slice_publisher(self, key: WatchKey) -> Callable[[list[dict[str, Any]]], None]:
        loop = asyncio.get_running_loop()

        def publish(slices: list[dict[str, Any]]) -> None:
            # Called from the watch thread: hop onto the loop, the only place state changes.
            loop.call_soon_threadsafe(self.apply_slices, key, slices)

        return publish

    def apply_slices(self, key: WatchKey, slices: list[dict[str, Any]]) -> None:
        if key not in self._watches:
            return  # a late report from a watch the last config change stopped
        urls = endpoints_from_slices(slices, key[3], self.address_map)
        if self._discovered.get(key) != urls:
            log.info("pool %s: %d ready endpoint(s) from %s/%s", key[0], len(urls), key[1], key[2])
        self._discovered[key] = urls
        self._recompute()

    def _recompute(self) -> None:
        config = self.config
        static: set[str] = set()
        changed = False
        for pool in POOLS:
            urls: set[str] = set()
            backend = config.pools.get(pool) if config else None
            if backend is not None:
                static.update(u.rstrip("/") for u in backend.static_urls)
                urls.update(u.rstrip("/") for u in backend.static_urls)
                for key, found in self._discovered.items():
                    if key[0] == pool:
                        urls.update(found)
            if self.pool_endpoints[pool] and not urls:
                # Operationally loud: every request for this pool now gets a 503 (or its fallback).
                log.warning("pool %s: no ready endpoint left; its requests get 503 until one is ready", pool)
            endpoints = tuple(sorted(urls))
            if endpoints != self.pool_endpoints[pool]:
                self._rings.pop(pool, None)
                changed = True
            self.pool_endpoints[pool] = endpoints
            self.metrics.endpoints.labels(pool).set(len(urls))
        for found in self._discovered.values():
            static.difference_update(found)
        self._static = frozenset(static)
        if changed:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def endpoints_change(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for any pool's endpoints to change; whether they did."""
        if timeout <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        return bool(done)

    # ---- whether an endpoint serves -----------------------------------------------------------------

    def has_serving_endpoint(self) -> bool:
        """Whether a pool has an endpoint known to serve: listed ready in an EndpointSlice, or a static
        URL that answered its last health check."""
        unverified = self._static - self.static_answering
        return any(url not in unverified for urls in self.pool_endpoints.values() for url in urls)

    async def check_static(self, probe: Callable[[str], Awaitable[bool]]) -> None:
        """Health-check the static URLs, unless the same ones were checked in the last
        STATIC_CHECK_SECONDS; callers meanwhile share one check (so /readyz cannot be made to flood
        the engines)."""
        static = self._static
        if not static:
            return
        checked = self._static_checked
        if checked is not None and checked[0] == static and self.clock() - checked[1] < STATIC_CHECK_SECONDS:
            return
        task = self._static_check
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._probe_static(static, probe))
            self._static_check = task
        await asyncio.shield(task)

    async def _probe_static(self, urls: frozenset[str], probe: Callable[[str], Awaitable[bool]]) -> None:
        ordered = sorted(urls)
        results = await asyncio.gather(*(probe(url) for url in ordered), return_exceptions=True)
        self.static_answering = frozenset(url for url, ok in zip(ordered, results, strict=True) if ok is True)
        self._static_checked = (urls, self.clock())

    def stop(self) -> None:
        for watch in self._watches.values():
            watch.stop()
        self._watches.clear()
        if self._static_check is not None:
            self._static_check.cancel()
            self._static_check = None

    # ---- which endpoint serves a request -----------------------------------------------------------

    def _healthy(self, pool: PoolName, now: float) -> tuple[str, ...]:
        ejected = self.ejected_until
        endpoints = self.pool_endpoints[pool]
        if not ejected:
            return endpoints
        return tuple(u for u in endpoints if ejected.get(u, 0.0) <= now)

    def resolve(self, wanted: PoolName, config: RoutingConfig) -> PoolName | None:
        """Prefer a pool whose endpoints are not ejected; if none has one, any pool with endpoints."""
        if not self.ejected_until and self.pool_endpoints[wanted]:
            return wanted  # the common case, without building the healthy view
        now = self.clock()
        healthy: dict[str, tuple[str, ...]] = {pool: self._healthy(pool, now) for pool in POOLS}
        return resolve_pool(wanted, healthy, config.fallback) or resolve_pool(
            wanted, self.pool_endpoints, config.fallback
        )

    def pick(self, pool: PoolName, tried: set[str], prefix: PrefixKeys | None = None) -> str | None:
        """The endpoint of `pool` for a request not yet tried there, avoiding ejected ones while possible:
        by the pool's strategy, the least loaded one or, for a request with `prefix` keys, its
        conversation's or its prefix's endpoint under the load bound."""
        endpoints = self.pool_endpoints.get(pool, ())
        if prefix is not None:
            bound_percent = self._affinity_bounds.get(pool)
            if bound_percent is not None:
                return self._pick_by_prefix(pool, endpoints, tried, prefix, bound_percent)
        self._turn += 1
        if self.ejected_until:
            now = self.clock()
            ejected = {u for u in endpoints if self.ejected_until.get(u, 0.0) > now}
            url = choose_endpoint(endpoints, self.outstanding, tried | ejected, self._turn)
            if url is not None:
                return url
        # Every untried endpoint is ejected: better to try one than to fail without trying.
        return choose_endpoint(endpoints, self.outstanding, tried, self._turn)

    def _pick_by_prefix(
        self, pool: str, endpoints: tuple[str, ...], tried: set[str], prefix: PrefixKeys, bound_percent: int
    ) -> str | None:
        ring = self._rings.get(pool)
        # The pool's tuple is the same object from one request to the next: compared only when not.
        if ring is None or (ring.endpoints is not endpoints and ring.endpoints != endpoints):
            ring = Ring(endpoints)
            self._rings[pool] = ring
        choice = None
        if self.ejected_until:
            now = self.clock()
            ejected = {u for u in endpoints if self.ejected_until.get(u, 0.0) > now}
            choice = self.affinity.pick(ring, prefix, self.outstanding, tried | ejected, bound_percent)
        if choice is None:
            choice = self.affinity.pick(ring, prefix, self.outstanding, tried, bound_percent)
        if choice is None:
            return None
        counters = self._choice_counters.get(pool)
        if counters is None:
            counters = self._choice_counters[pool] = {}
        counter = counters.get(choice.how)
        if counter is None:
            counter = counters[choice.how] = self.metrics.value(self.metrics.prefix_choices, pool, choice.how)
        counter.inc()
        return choice.url

    def acquire(self, url: str) -> None:
        self.outstanding[url] = self.outstanding.get(url, 0) + 1

    def release(self, url: str) -> None:
        left = self.outstanding[url] - 1
        if left:
            self.outstanding[url] = left
        else:
            del self.outstanding[url]

    def eject(self, pool: PoolName, url: str, kind: str, retried: bool = True) -> None:
        """Skip `url` for `eject_seconds`; `kind` says why (connect, connect_timeout, stall); `retried`:
        whether its request is tried again elsewhere."""
        self.ejected_until[url] = self.clock() + self.eject_seconds
        self.metrics.upstream_errors.labels(pool, kind).inc()
        if retried:
            self.metrics.retries.labels(pool).inc()
        log.warning("pool %s: %s failed (%s); ejected for %gs", pool, url, kind, self.eject_seconds)

    def expire_ejections(self, now: float) -> None:
        for url in [u for u, until in self.ejected_until.items() if until <= now]:
            del self.ejected_until[url]
