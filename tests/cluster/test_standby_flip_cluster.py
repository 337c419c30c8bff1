"""A Standby flip against the real control plane: the operator's flipper relabels real pods, the real
endpoint-slice controller takes each out of its engine's Service and puts it in the other's, and the
pod's two engines (emulators on the pod IP's loopback twin, speaking vLLM's sleep API) switch."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import pytest

from specfleet.controller.kube import KubeCluster, load_kube_config
from specfleet.controller.standby_flips import KubePods, StandbyFlipper
from specfleet.reconcile.standby_flip import FLIPPING, SPECULATIVE_PORT
from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_runtime.names import ENGINE_PORT, LABEL_SPECULATION
from specfleet_runtime.router.endpoints import parse_address_map
from specfleet_runtime.vllm_args import SpeculativeConfig
from specfleet_testbed import Cluster, local_address

pytestmark = pytest.mark.cluster

MODEL = "llama-3.1-8b"
PLAIN = EmulatorConfig(
    served_model_name=MODEL,
    model="meta-llama/Llama-3.1-8B-Instruct",
    enable_sleep_mode=True,
    server_dev_mode=True,
    time_scale=0.0,
)
SPECULATIVE = replace(
    PLAIN, speculative=SpeculativeConfig(method="eagle3", num_speculative_tokens=3, model="d")
)
POOL = {"app": "standby"}


def pool_objects() -> list[dict[str, Any]]:
    def service(name: str, setting: str, port: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "labels": POOL},
            "spec": {
                "selector": {**POOL, LABEL_SPECULATION: setting},
                "ports": [{"name": "http", "port": port, "targetPort": port}],
            },
        }

    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "standby"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": POOL},
            "template": {
                # Every pod starts serving without the drafter.
                "metadata": {"labels": {**POOL, LABEL_SPECULATION: "Off"}},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "engine",
                            "image": "registry.invalid/fake-vllm:0",
                            "ports": [
                                {"name": "http", "containerPort": ENGINE_PORT},
                                {"name": "speculative", "containerPort": SPECULATIVE_PORT},
                            ],
                        }
                    ],
                },
            },
        },
    }
    return [
        service("standby", "Off", ENGINE_PORT),
        service("standby-speculative", "On", SPECULATIVE_PORT),
        deployment,
    ]


def listed(cluster: Cluster, namespace: str, service: str) -> set[str]:
    out = cluster.kubectl(
        "get", "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}", "-o", "json"
    ).stdout
    return {
        ep["targetRef"]["name"]
        for s in json.loads(out)["items"]
        for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready", True)
    }


def ready_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = json.loads(
            cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=standby", "-o", "json").stdout
        )
        ready = [
            p
            for p in pods["items"]
            if p["status"].get("podIP")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        if len(ready) == 2:
            return ready
        time.sleep(0.5)
    raise AssertionError("the pool's two pods did not become Ready")


async def test_a_standby_pool_flips_pod_by_pod_through_its_services(cluster: Cluster, namespace: str) -> None:
    for obj in pool_objects():
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))
    pods = ready_pods(cluster, namespace)
    names = sorted(p["metadata"]["name"] for p in pods)
    kube = KubeCluster(load_kube_config(str(cluster.kubeconfig)))
    flipper = StandbyFlipper(KubePods(kube), address_map=(parse_address_map("10.0.0.0/8=127.0.0.0/8"),))
    async with AsyncExitStack() as stack:
        engines = {}
        for p in pods:
            twin = local_address(p["status"]["podIP"])
            spec = await stack.enter_async_context(serve_emulator(SPECULATIVE, twin, SPECULATIVE_PORT))
            plain = await stack.enter_async_context(serve_emulator(PLAIN, twin, ENGINE_PORT))
            await asyncio.to_thread(_post, spec.url + "/sleep?level=1")
            engines[p["metadata"]["name"]] = {"On": spec, "Off": plain}
        # Ready pods reach the Service's EndpointSlice when the endpoint-slice controller syncs, a moment
        # after they turn Ready (a clean-clone CI run listed one of the two when asked at once).
        deadline = time.monotonic() + 30
        while listed(cluster, namespace, "standby") != set(names) and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert listed(cluster, namespace, "standby") == set(names)

        dropped: list[bool] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            tick = await asyncio.to_thread(flipper.tick, namespace, POOL, "On", MODEL, None)
            for step in tick.steps:
                if step.kind == "Begin":
                    # Labelled Flipping, the pod leaves the Service it served in: no router sends it more.
                    gone = time.monotonic() + 15
                    while step.pod in listed(cluster, namespace, "standby") and time.monotonic() < gone:
                        await asyncio.sleep(0.1)
                    dropped.append(step.pod not in listed(cluster, namespace, "standby"))
            if tick.settled:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the flip did not settle")
        assert dropped == [True, True]
        for name in names:
            assert not engines[name]["On"].sleep_mode.is_sleeping
            assert engines[name]["Off"].sleep_mode.is_sleeping
        labels = {
            p["metadata"]["name"]: p["metadata"]["labels"][LABEL_SPECULATION]
            for p in json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        }
        assert labels == dict.fromkeys(names, "On")
        assert FLIPPING not in labels.values()
        deadline = time.monotonic() + 30
        while listed(cluster, namespace, "standby-speculative") != set(names) and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert listed(cluster, namespace, "standby-speculative") == set(names)
        assert listed(cluster, namespace, "standby") == set()


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
        assert r.status == 200
