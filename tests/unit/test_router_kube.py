"""The router's Kubernetes path through the official client, against a small fake apiserver.

The fake serves list and watch for ConfigMaps and EndpointSlices (JSON lines, as the apiserver does),
so `--configmap` mode, the EndpointSlice informer and the 410/relist path run for real without a
cluster. The cluster tier repeats this against a real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_runtime.router.__main__ import build_router, parse_args
from specfleet_runtime.router.kube import Informer, Object, endpoint_slice_client, load_api_client
from specfleet_runtime.router.serving import serve_router
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

NS = "inference"


@dataclass
class FakeApiserver:
    """Objects by collection ("configmaps", "endpointslices") and the watches open on each."""

    objects: dict[str, dict[str, Object]] = field(
        default_factory=lambda: {"configmaps": {}, "endpointslices": {}}
    )
    watchers: dict[str, list[asyncio.Queue[dict[str, Any] | None]]] = field(
        default_factory=lambda: {"configmaps": [], "endpointslices": []}
    )
    resource_version: int = 100
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    # The next watch on a collection answers with an ERROR 410 event (a compacted resourceVersion).
    expire_next_watch: set[str] = field(default_factory=set)

    def put(self, collection: str, obj: Object, event: str | None = None) -> None:
        self.resource_version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        name = obj["metadata"]["name"]
        kind = event or ("MODIFIED" if name in self.objects[collection] else "ADDED")
        self.objects[collection][name] = obj
        for queue in self.watchers[collection]:
            queue.put_nowait({"type": kind, "object": obj})

    def matches(self, obj: Object, query: dict[str, str]) -> bool:
        if "fieldSelector" in query:
            key, _, value = query["fieldSelector"].partition("=")
            if key != "metadata.name" or obj["metadata"]["name"] != value:
                return False
        if "labelSelector" in query:
            key, _, value = query["labelSelector"].partition("=")
            if obj["metadata"].get("labels", {}).get(key) != value:
                return False
        return True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        collection = request.match_info["collection"]
        query = dict(request.query)
        self.requests.append((collection, query))
        if query.get("watch") != "true":
            items = [o for o in self.objects[collection].values() if self.matches(o, query)]
            return web.json_response(
                {"metadata": {"resourceVersion": str(self.resource_version)}, "items": items}
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if collection in self.expire_next_watch:
            self.expire_next_watch.discard(collection)
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.watchers[collection].append(queue)
        deadline = time.monotonic() + float(query.get("timeoutSeconds", "30"))
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event is None:
                    break
                if self.matches(event["object"], query):
                    await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self.watchers[collection].remove(queue)
        return response


@asynccontextmanager
async def fake_apiserver(tmp_path: Path) -> AsyncIterator[tuple[FakeApiserver, Path]]:
    """Serve the fake on 127.0.0.1 and write a kubeconfig pointing at it."""
    fake = FakeApiserver()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/{collection:configmaps}", fake.handle)
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/{collection:endpointslices}", fake.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "router", "user": {"token": "test"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "router"}}],
                "current-context": "fake",
            }
        )
    )
    try:
        yield fake, kubeconfig
    finally:
        for queues in fake.watchers.values():
            for queue in queues:
                queue.put_nowait(None)
        await runner.cleanup()


def slice_for(service: str, name: str, addresses: list[tuple[str, bool]], port: int) -> Object:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a, ready in addresses],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }


def config_map(doc: dict[str, Any] | str) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "tiny-routing", "namespace": NS},
        "data": {"routing.json": doc if isinstance(doc, str) else json.dumps(doc)},
    }


async def test_endpoint_slice_informer_through_the_official_client(tmp_path: Path) -> None:
    async with fake_apiserver(tmp_path) as (fake, kubeconfig):
        fake.put("endpointslices", slice_for("svc", "svc-a", [("10.0.0.1", True)], 8000))
        fake.put("endpointslices", slice_for("other", "other-a", [("10.9.9.9", True)], 8000))
        fake.expire_next_watch.add("endpointslices")
        seen: list[list[str]] = []
        loop = asyncio.get_running_loop()

        def publish(objects: list[Object]) -> None:
            names = sorted(o["metadata"]["name"] for o in objects)
            loop.call_soon_threadsafe(seen.append, names)

        client = await asyncio.to_thread(load_api_client, str(kubeconfig))
        informer = Informer(
            "test", endpoint_slice_client(client, NS, "svc"), publish, resync_seconds=30
        ).start()
        try:
            # The first watch gets 410: the informer relists (a second snapshot) and watches again.
            await wait_until(lambda: len(seen) >= 2 and bool(fake.watchers["endpointslices"]))
            fake.put("endpointslices", slice_for("svc", "svc-b", [("10.0.0.2", True)], 8000))
            fake.put("endpointslices", slice_for("other", "other-b", [("10.9.9.8", True)], 8000))
            await wait_until(lambda: seen[-1] == ["svc-a", "svc-b"])
            fake.put("endpointslices", fake.objects["endpointslices"]["svc-a"], event="DELETED")
            await wait_until(lambda: seen[-1] == ["svc-b"])
        finally:
            informer.stop()
        assert seen[:2] == [["svc-a"], ["svc-a"]]
        lists = [q for c, q in fake.requests if c == "endpointslices" and q.get("watch") != "true"]
        watches = [q for c, q in fake.requests if c == "endpointslices" and q.get("watch") == "true"]
        assert len(lists) == 2
        assert lists[0]["labelSelector"] == "kubernetes.io/service-name=svc"
        assert watches[0]["timeoutSeconds"] == "30"
        assert watches[0]["allowWatchBookmarks"] == "true"
        assert watches[1]["resourceVersion"] == "102"


async def test_configmap_mode_end_to_end(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = EmulatorConfig(served_model_name="tiny", model="m", time_scale=0.1)
    async with fake_apiserver(tmp_path) as (fake, kubeconfig), serve_emulator(engine) as emu:
        port = int(emu.url.rsplit(":", 1)[1])
        routing = {
            "servedModelName": "tiny",
            "pools": {
                "latency": {"service": "tiny-latency", "port": port},
                "batch": {"service": "tiny-batch", "port": port},
            },
            "fallback": "reject",
        }
        fake.put("configmaps", config_map(routing))
        fake.put("endpointslices", slice_for("tiny-latency", "lat-1", [("127.0.0.1", True)], port))
        fake.put("endpointslices", slice_for("tiny-batch", "bat-1", [("127.0.0.1", False)], port))

        args = parse_args(
            ["--configmap", f"{NS}/tiny-routing", "--kubeconfig", str(kubeconfig), "--port", "0"]
        )
        router = await asyncio.to_thread(build_router, args)
        assert router.settings.namespace == NS
        async with serve_router(router, "127.0.0.1", 0) as runner:
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            await wait_until(lambda: router.pool_endpoints["latency"] == (f"http://127.0.0.1:{port}",))
            assert router.pool_endpoints["batch"] == ()  # its only endpoint is not ready
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            assert (await client.completions.create(model="tiny", prompt="x", max_tokens=3)).choices
            with pytest.raises(openai.APIStatusError) as refused:
                await client.completions.create(
                    model="tiny", prompt="x", max_tokens=3, extra_headers={"x-specfleet-pool": "batch"}
                )
            assert refused.value.status_code == 503

            # The batch pod turns ready: the watch brings it in.
            fake.put("endpointslices", slice_for("tiny-batch", "bat-1", [("127.0.0.1", True)], port))
            await wait_until(lambda: bool(router.pool_endpoints["batch"]))
            raw = await client.completions.with_raw_response.create(
                model="tiny", prompt="x", max_tokens=3, extra_headers={"x-specfleet-pool": "batch"}
            )
            assert raw.headers["x-specfleet-served-pool"] == "batch"

            # An edit of the ConfigMap reloads without a restart; a broken edit is rejected.
            fake.put("configmaps", config_map({**routing, "defaultPool": "batch"}))
            await wait_until(lambda: router.config is not None and router.config.default_pool == "batch")
            fake.put("configmaps", config_map("{broken"))
            await wait_until(lambda: "rejected routing config from configmap" in caplog.text)
            assert router.config is not None
            assert router.config.default_pool == "batch"
            raw = await client.completions.with_raw_response.create(model="tiny", prompt="x", max_tokens=3)
            assert raw.headers["x-specfleet-served-pool"] == "batch"
            await client.close()
