"""Router endpoints: EndpointSlice translation, pool fallback, least-outstanding choice, the informer
loop against a fake API, and config-driven watch management with an injected watch source."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_runtime.router.__main__ import parse_args
from specfleet_runtime.router.app import Router, RouterSettings
from specfleet_runtime.router.endpoints import (
    choose_endpoint,
    endpoints_from_slices,
    map_address,
    parse_address_map,
    resolve_pool,
)
from specfleet_runtime.router.kube import Informer, Object, WatchEvent, WatchExpired
from specfleet_runtime.router.serving import serve_router
from specfleet_runtime.router.sources import ConfigFileSource, SlicePublish
from support.ports import free_port, refused
from support.router_harness import MODEL, emulator_config
from support.waiting import loop_caught_up, wait_until


def endpoint(address: str, ready: bool | None = True, terminating: bool = False) -> dict[str, Any]:
    conditions: dict[str, Any] = {"terminating": terminating}
    if ready is not None:
        conditions["ready"] = ready
    return {"addresses": [address], "conditions": conditions}


def endpoint_slice(
    name: str, endpoints: list[dict[str, Any]], ports: Any = None, address_type: str = "IPv4"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}] if ports is None else ports,
    }


# ---- slices -> endpoints --------------------------------------------------------------------------


def test_ready_conditions() -> None:
    slices = [
        endpoint_slice(
            "a",
            [
                endpoint("10.0.0.1"),
                endpoint("10.0.0.2", ready=False),
                endpoint("10.0.0.3", ready=None),  # unknown readiness counts as ready (API convention)
                endpoint("10.0.0.4", ready=False, terminating=True),
                {"addresses": ["10.0.0.5"]},  # no conditions at all
            ],
        )
    ]
    assert endpoints_from_slices(slices, 8000) == (
        "http://10.0.0.1:8000",
        "http://10.0.0.3:8000",
        "http://10.0.0.5:8000",
    )


def test_ports_are_matched_by_number_else_single_port() -> None:
    two_ports = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}]
    assert endpoints_from_slices([endpoint_slice("a", [endpoint("10.0.0.1")], two_ports)], 8000) == (
        "http://10.0.0.1:8000",
    )
    # A single-port slice is used whatever its number (the Service's targetPort is what pods listen on).
    single = [{"name": "http", "port": 8080}]
    assert endpoints_from_slices([endpoint_slice("a", [endpoint("10.0.0.1")], single)], 8000) == (
        "http://10.0.0.1:8080",
    )
    # Several ports, none the configured one: ambiguous, left out.
    other = [{"port": 1}, {"port": 2}]
    assert endpoints_from_slices([endpoint_slice("a", [endpoint("10.0.0.1")], other)], 8000) == ()
    assert endpoints_from_slices([endpoint_slice("a", [endpoint("10.0.0.1")], [])], 8000) == ()
    assert endpoints_from_slices([endpoint_slice("a", [endpoint("10.0.0.1")], [{"port": None}])], 8000) == ()


def test_ipv6_fqdn_duplicates_and_garbage() -> None:
    slices = [
        endpoint_slice("v6", [endpoint("fd00::1")], address_type="IPv6"),
        endpoint_slice("fqdn", [endpoint("pod.example")], address_type="FQDN"),
        endpoint_slice("a", [endpoint("10.0.0.1")]),
        endpoint_slice("b", [endpoint("10.0.0.1")]),  # the same pod in two slices during a move
        {"metadata": {"name": "empty"}, "endpoints": None, "ports": [{"port": 8000}]},
        endpoint_slice("junk", ["not-a-dict", {"addresses": [None, ""]}]),  # type: ignore[list-item]
    ]
    assert endpoints_from_slices(slices, 8000) == ("http://10.0.0.1:8000", "http://[fd00::1]:8000")


def test_address_map_moves_fake_pod_ips_to_loopback_twins() -> None:
    address_map = (parse_address_map("10.0.0.0/8=127.0.0.0/8"), parse_address_map("fd00::/120=fd01::/120"))
    assert map_address("10.244.0.7", address_map) == "127.244.0.7"
    assert map_address("192.168.1.1", address_map) == "192.168.1.1"
    assert map_address("fd00::5", address_map) == "fd01::5"
    assert map_address("not-an-ip", address_map) == "not-an-ip"
    slices = [endpoint_slice("a", [endpoint("10.244.0.7"), endpoint("10.244.1.9", ready=False)])]
    assert endpoints_from_slices(slices, 8000, address_map) == ("http://127.244.0.7:8000",)


@pytest.mark.parametrize("text", ["10.0.0.0/8", "10.0.0.0/8=127.0.0.0/16", "10.0.0.0/8=fd00::/8", "x=y"])
def test_bad_address_maps_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_address_map(text)


def test_address_map_flag() -> None:
    args = parse_args(["--config-file", "r.json", "--endpoint-address-map", "10.0.0.0/8=127.0.0.0/8"])
    assert args.endpoint_address_map == [parse_address_map("10.0.0.0/8=127.0.0.0/8")]
    with pytest.raises(SystemExit):
        parse_args(["--config-file", "r.json", "--endpoint-address-map", "10.0.0.0/8"])


# ---- choosing -------------------------------------------------------------------------------------


def test_least_outstanding_wins_and_ties_rotate() -> None:
    urls = ["a", "b", "c"]
    assert choose_endpoint(urls, {"a": 3, "b": 1, "c": 2}) == "b"
    assert [choose_endpoint(urls, {}, start=i) for i in range(4)] == ["a", "b", "c", "a"]
    assert choose_endpoint(urls, {"a": 0, "b": 0, "c": 5}, excluded={"a"}) == "b"
    assert choose_endpoint(urls, {}, excluded=set(urls)) is None
    assert choose_endpoint([], {}) is None


@given(
    loads=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 50), min_size=1),
    excluded=st.sets(st.sampled_from("abcdef")),
    start=st.integers(0, 100),
)
def test_choice_is_a_least_loaded_allowed_endpoint(
    loads: dict[str, int], excluded: set[str], start: int
) -> None:
    urls = sorted(loads)
    chosen = choose_endpoint(urls, loads, excluded, start)
    allowed = [u for u in urls if u not in excluded]
    if not allowed:
        assert chosen is None
    else:
        assert chosen in allowed
        assert loads[chosen] == min(loads[u] for u in allowed)


@pytest.mark.parametrize(
    ("wanted", "endpoints", "fallback", "expected"),
    [
        ("latency", {"latency": ["l"], "batch": ["b"]}, "reject", "latency"),
        ("batch", {"latency": ["l"], "batch": []}, "otherPool", "latency"),
        ("batch", {"latency": ["l"]}, "otherPool", "latency"),
        ("batch", {"latency": ["l"], "batch": []}, "reject", None),
        ("latency", {"latency": [], "batch": []}, "otherPool", None),
    ],
)
def test_resolve_pool(
    wanted: Any, endpoints: dict[str, list[str]], fallback: Any, expected: str | None
) -> None:
    assert resolve_pool(wanted, endpoints, fallback) == expected


# ---- the informer loop ----------------------------------------------------------------------------


class FakeApi:
    """Scripted list/watch answers; each `watch_events` call pops the next script (events, then an exception)."""

    def __init__(self, items: list[Object], watches: list[tuple[list[WatchEvent], Exception | None]]) -> None:
        self.items = items
        self.watches = watches
        self.lists = 0

    def list_objects(self) -> tuple[list[Object], str]:
        self.lists += 1
        if self.lists == 2:
            raise ConnectionError("apiserver unreachable")  # one failed relist, then fine again
        return list(self.items), str(self.lists)

    def watch_events(self, resource_version: str, timeout_seconds: int) -> Iterable[WatchEvent]:
        events, error = self.watches.pop(0) if self.watches else ([], None)
        return self._gen(events, error)

    def _gen(self, events: list[WatchEvent], error: Exception | None) -> Iterator[WatchEvent]:
        yield from events
        if error is not None:
            raise error


def test_informer_lists_watches_relists_and_survives_errors(caplog: pytest.LogCaptureFixture) -> None:
    a = endpoint_slice("a", [endpoint("10.0.0.1")])
    a2 = endpoint_slice("a", [endpoint("10.0.0.1"), endpoint("10.0.0.2")])
    b = endpoint_slice("b", [endpoint("10.0.0.9")])
    api = FakeApi(
        [a],
        [
            (
                [("ADDED", b), ("BOOKMARK", {"metadata": {"resourceVersion": "7"}})],
                RuntimeError("stream broke"),
            ),
            ([("MODIFIED", a2), ("DELETED", b)], WatchExpired()),
            ([("ERROR", {"code": 500, "message": "boom"})], None),
        ],
    )
    snapshots: list[tuple[str, ...]] = []
    done = threading.Event()
    informer: Informer

    def publish(objects: list[Object]) -> None:
        snapshots.append(endpoints_from_slices(objects, 8000))
        if len(snapshots) >= 7:
            informer.stop()
            done.set()

    errors: list[BaseException] = []
    informer = Informer(
        "test", api, publish, resync_seconds=1, backoff_initial=0.01, backoff_max=0.02, on_error=errors.append
    )
    informer.start()
    assert done.wait(5), snapshots
    one, two, nine = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.9:8000"
    assert snapshots == [
        (one,),  # first list
        (one, nine),  # ADDED b; the bookmark publishes nothing; then the stream breaks
        (one,),  # a relist fails (backoff), the next one succeeds
        (one, two),  # MODIFIED a
        (one, two),  # DELETED b (already gone after the relist); then 410
        (one,),  # relist at once after 410
        (one,),  # ERROR event -> logged, backoff, relist
    ]
    assert informer.failures == 3
    assert [type(e) for e in errors] == [RuntimeError, ConnectionError, RuntimeError]
    assert "stream broke" in caplog.text
    assert "apiserver unreachable" in caplog.text
    assert "boom" in caplog.text


# ---- config-driven watches with an injected source ------------------------------------------------


class FakeWatches:
    """An injected SliceWatchFactory: records (namespace, service) and keeps the publish callbacks."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.stopped: list[tuple[str, str]] = []
        self.publish: dict[tuple[str, str], SlicePublish] = {}

    def __call__(self, namespace: str, service: str, publish: SlicePublish) -> Any:
        key = (namespace, service)
        self.started.append(key)
        self.publish[key] = publish
        stopped = self.stopped

        class Handle:
            def stop(self) -> None:
                stopped.append(key)

        return Handle()


def routing_json(latency: dict[str, Any], batch: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"servedModelName": "m", "pools": {"latency": latency, "batch": batch}, **extra})


async def test_router_follows_config_and_slices() -> None:
    watches = FakeWatches()
    router = Router(RouterSettings(namespace="prod"), None, watches)
    assert router.ready() == (False, "no routing config loaded")
    config = routing_json({"service": "m-latency", "port": 8000}, {"staticUrls": ["http://10.9.9.9:8000/"]})
    assert router.apply_config_text(config, "test")
    assert watches.started == [("prod", "m-latency")]
    assert router.pool_endpoints == {"latency": (), "batch": ("http://10.9.9.9:8000",)}
    # A static URL counts once it answers a health check (nothing listens at 10.9.9.9).
    assert router.ready() == (False, "no static endpoint answered its last health check")

    # The watch reports from its own thread; the update lands on the loop.
    slices = [endpoint_slice("s", [endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False)])]
    thread = threading.Thread(target=watches.publish[("prod", "m-latency")], args=(slices,))
    thread.start()
    thread.join()
    await loop_caught_up()
    assert router.pool_endpoints["latency"] == ("http://10.0.0.1:8000",)
    assert router.ready() == (True, "ok")  # the kubelet found that one ready

    # A bad config is rejected and changes nothing.
    assert not router.apply_config_text('{"servedModelName": "m", "pools": {"gpu": {}}}', "test")
    assert not router.apply_config_text("{not json", "test")
    assert router.pool_endpoints["latency"] == ("http://10.0.0.1:8000",)

    # Moving the latency pool to another Service stops the old watch and forgets its endpoints.
    other = routing_json({"service": "other/m2", "port": 8000}, {"staticUrls": ["http://10.9.9.9:8000"]})
    assert router.apply_config_text(other, "test")
    assert watches.stopped == [("prod", "m-latency")]
    assert watches.started[-1] == ("other", "m2")
    assert not router.pool_endpoints["latency"]
    # A late report from the stopped watch is ignored.
    watches.publish[("prod", "m-latency")](slices)
    await loop_caught_up()
    assert not router.pool_endpoints["latency"]


async def test_a_pool_losing_its_last_ready_endpoint_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    watches = FakeWatches()
    router = Router(RouterSettings(namespace="prod"), None, watches)
    config = routing_json({"service": "m-latency", "port": 8000}, {"staticUrls": ["http://10.9.9.9:8000/"]})
    assert router.apply_config_text(config, "test")
    publish = watches.publish[("prod", "m-latency")]
    publish([endpoint_slice("s", [endpoint("10.0.0.1")])])
    await loop_caught_up()
    assert router.pool_endpoints["latency"] == ("http://10.0.0.1:8000",)
    assert "no ready endpoint left" not in caplog.text
    publish([endpoint_slice("s", [endpoint("10.0.0.1", ready=False)])])
    await loop_caught_up()
    assert router.pool_endpoints["latency"] == ()
    warnings = [
        r for r in caplog.records if r.levelname == "WARNING" and "no ready endpoint left" in r.message
    ]
    assert [r.getMessage() for r in warnings] == [
        "pool latency: no ready endpoint left; its requests get 503 until one is ready"
    ]
    # Staying empty says nothing more.
    publish([])
    await loop_caught_up()
    assert len([r for r in caplog.records if "no ready endpoint left" in r.getMessage()]) == 1


async def test_service_without_kubernetes_access_uses_static_urls(caplog: pytest.LogCaptureFixture) -> None:
    router = Router(RouterSettings(), None, None)
    config = routing_json({"service": "svc", "staticUrls": ["http://s:1"]}, {"staticUrls": ["http://b:1"]})
    assert router.apply_config_text(config, "test")
    assert router.pool_endpoints["latency"] == ("http://s:1",)
    assert "no Kubernetes access" in caplog.text


# ---- a worker beside others on one port joins it warm ---------------------------------------------


async def test_a_worker_on_a_shared_port_listens_once_it_knows_config_and_endpoints(tmp_path: Any) -> None:
    # What the e2e tier caught: of a router pod's two workers the readiness probe reached the warm one,
    # and the load's first requests the other, which had its config but not yet its Service's
    # endpoints: 503 "no ready endpoint for pool latency" from a pod marked Ready.
    watches = FakeWatches()
    async with serve_emulator(emulator_config()) as emu:
        emu_port = int(emu.url.rsplit(":", 1)[1])
        ports = [{"name": "http", "port": emu_port, "protocol": "TCP"}]
        path = tmp_path / "routing.json"
        latency, batch = {"service": "m-latency", "port": emu_port}, {"service": "m-batch", "port": emu_port}
        path.write_text(routing_json(latency, batch, servedModelName=MODEL, fallback="reject"))
        router = Router(RouterSettings(namespace="prod"), ConfigFileSource(path, poll_seconds=0.05), watches)
        port = free_port()
        listening, done = asyncio.Event(), asyncio.Event()

        async def serve() -> None:
            async with serve_router(router, "127.0.0.1", port, reuse_port=True):
                listening.set()
                await done.wait()

        # Count the server's warm checks: it must look again after the latency endpoints and stay shut.
        checks: list[tuple[bool, str]] = []
        warm = router.warm

        def counted_warm() -> tuple[bool, str]:
            checks.append(warm())
            return checks[-1]

        try:
            router.warm = counted_warm  # type: ignore[method-assign]
            counting = True
        except AttributeError:  # the mypyc-compiled Router's methods cannot be replaced
            counting = False
        task = asyncio.create_task(serve())
        try:
            await wait_until(lambda: len(watches.publish) == 2)  # the config is in, both watches started
            watches.publish[("prod", "m-latency")]([endpoint_slice("l", [endpoint("127.0.0.1")], ports)])
            await wait_until(lambda: router.pool_endpoints["latency"] != ())
            if counting:
                looked = len(checks)
                await wait_until(lambda: len(checks) >= looked + 3, what="three more warm checks")
            else:
                await asyncio.sleep(0.1)  # compiled build: ten of wait_warm's 10 ms polls
            # Ready by its own /readyz (a pool has an endpoint), but the batch Service has not listed yet.
            assert router.ready() == (True, "ok")
            assert router.warm() == (False, "no EndpointSlice list yet for prod/m-batch")
            assert not listening.is_set()
            assert refused(port)
            watches.publish[("prod", "m-batch")]([])  # no ready endpoint there: known as well
            await asyncio.wait_for(listening.wait(), 5)
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
            assert (await client.completions.create(model=MODEL, prompt="x", max_tokens=2)).choices
            await client.close()
        finally:
            done.set()
            await task


async def test_a_worker_that_stays_cold_listens_after_its_timeout_and_says_why(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    watches = FakeWatches()
    path = tmp_path / "routing.json"
    path.write_text(
        routing_json({"service": "m-latency", "port": 8000}, {"staticUrls": ["http://10.9.9.9:8000"]})
    )
    settings = RouterSettings(namespace="prod", warm_timeout=0.3)
    router = Router(settings, ConfigFileSource(path, poll_seconds=0.05), watches)
    port = free_port()
    with caplog.at_level(logging.WARNING, logger="specfleet_runtime.router.app"):
        async with serve_router(router, "127.0.0.1", port, reuse_port=True):
            # The Service never lists (an apiserver that denies it): /healthz must still answer.
            assert not refused(port)
            assert router.warm() == (False, "no EndpointSlice list yet for prod/m-latency")
            # (The static batch URL does not answer: not ready by /readyz either.)
            assert router.ready() == (False, "no static endpoint answered its last health check")
    assert (
        "not warm after 0.3s (no EndpointSlice list yet for prod/m-latency); listening anyway" in caplog.text
    )


async def test_a_lone_process_listens_at_once() -> None:
    router = Router(RouterSettings(), None, None)
    port = free_port()
    async with serve_router(router, "127.0.0.1", port):
        assert not refused(port)
        assert router.ready() == (False, "no routing config loaded")
        assert router.warm() == (False, "no routing config loaded")
