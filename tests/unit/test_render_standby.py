"""Standby pools (rollout.flip Standby): the rendered pod, its Services and memory, the router's view of
both Services, and the fallback to a Restart pool when the engines cannot sleep (pure: no cluster)."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specfleet.api import reasons
from specfleet.api.status import StandbyStatus
from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan, reconcile
from specfleet.reconcile.pod_failures import pool_failure
from specfleet.render import PoolPlan, RenderOptions, render_children
from specfleet.render.engine import render_pool_deployment
from specfleet.render.router import routing_config
from specfleet.render.standby import add_quantities, standby_memory
from specfleet_runtime.names import LABEL_FLIP, LABEL_SPECULATION
from specfleet_runtime.router.backends import Backends
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.routing_config import RoutingConfig, ServicePort
from specfleet_runtime.standby import CANNOT_SLEEP, CANNOT_SLEEP_EXIT_CODE, READY_FILE, parse_standby_args
from specfleet_runtime.vllm_args import parse_vllm_args
from support.fake_cluster import FakeCluster
from support.manifests import ROOT, load_yaml

EXAMPLE = ROOT / "examples" / "10-standby-flips.yaml"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _body() -> dict[str, Any]:
    body = load_yaml(EXAMPLE)
    body["metadata"].update(uid="uid-1", generation=1)
    return body


def _sd(**latency: Any) -> Any:
    body = _body()
    body["spec"]["pools"]["latency"].update(latency)
    return parse_resource(body)


def _by_kind_name(children: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def _engine(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_a_standby_pods_template_does_not_depend_on_the_pools_mode() -> None:
    sd = _sd(speculation="Auto")
    on, off = (render_pool_deployment(sd, "latency", mode, standby=True) for mode in ("On", "Off"))
    assert on == off
    labels = on["spec"]["template"]["metadata"]["labels"]
    assert labels[LABEL_SPECULATION] == "Off"  # the plain engine is the one awake at start
    assert labels[LABEL_FLIP] == "Standby"
    # The whole render too, for a resource whose decided mode is On or Off.
    plans = [
        {p: PoolPlan(mode, standby=p == "latency") for p in ("latency", "batch")} for mode in ("On", "Off")
    ]
    first, second = (_by_kind_name(render_children(sd, plan)) for plan in plans)
    assert first[("Deployment", "big-model-latency")] == second[("Deployment", "big-model-latency")]


def test_the_supervisor_starts_the_speculative_engine_on_its_port_and_the_plain_one_on_the_engine_port() -> (
    None
):
    container = _engine(render_pool_deployment(_sd(), "latency", "On", standby=True))
    assert container["command"] == ["python3", "/specfleet-standby/standby.py"]
    args = parse_standby_args(container["args"])
    speculative, _ = parse_vllm_args(args.speculative)
    plain, _ = parse_vllm_args(args.plain)
    assert (speculative.port, plain.port) == (8001, 8000)
    assert speculative.speculative is not None
    assert speculative.speculative.method == "eagle3"
    assert plain.speculative is None
    assert speculative.enable_sleep_mode
    assert plain.enable_sleep_mode
    assert args.startup_timeout_seconds == 1800
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]
    assert [p["containerPort"] for p in container["ports"]] == [8000, 8001]
    # Started once the supervisor parked the speculative engine and the plain one serves; Ready and
    # alive on the plain engine's port (vLLM answers /health asleep too).
    assert container["startupProbe"]["exec"] == {"command": ["test", "-f", READY_FILE]}
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert container["livenessProbe"]["httpGet"]["port"] == "http"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    pod = render_pool_deployment(_sd(), "latency", "On", standby=True)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["standby-supervisor", "drafter-preflight"]
    assert pod["initContainers"][0]["command"][-2:] == ["--install-to", "/specfleet-standby/standby.py"]


def test_memory_covers_the_parked_weights() -> None:
    container = _engine(render_pool_deployment(_sd(), "latency", "Off", standby=True))
    assert container["resources"]["requests"]["memory"] == "144Gi"
    assert container["resources"]["limits"]["memory"] == "144Gi"
    # No pool memory: the pod requests the parked weights and gets no limit.
    assert standby_memory(None, "80Gi") == ("80Gi", None)
    assert add_quantities("64Gi", "80Gi") == "144Gi"
    assert add_quantities("512Mi", "1Gi") == "1536Mi"
    assert add_quantities("1G", "1Gi") == str(10**9 + 2**30)
    # A Restart pool keeps its memory.
    assert _engine(render_pool_deployment(_sd(), "batch", "Off"))["resources"]["requests"]["memory"] == "64Gi"


def test_two_services_select_the_awake_engine_and_the_router_takes_the_union() -> None:
    sd = _sd()
    children = _by_kind_name(render_children(sd, decided_plan(sd)))
    plain = children[("Service", "big-model-latency")]["spec"]
    speculative = children[("Service", "big-model-latency-spec")]["spec"]
    assert plain["selector"][LABEL_SPECULATION] == "Off"
    assert plain["ports"][0]["port"] == 8000
    assert speculative["selector"][LABEL_SPECULATION] == "On"
    assert speculative["selector"][LABEL_FLIP] == "Standby"
    assert speculative["ports"][0]["port"] == 8001
    assert speculative["ports"][0]["targetPort"] == "speculative"
    # The restart pool keeps one Service selecting every pod.
    assert LABEL_SPECULATION not in children[("Service", "big-model-batch")]["spec"]["selector"]
    assert ("Service", "big-model-batch-spec") not in children
    config = RoutingConfig.from_json(routing_config(sd).to_json())
    assert config.pools["latency"].services() == (
        ServicePort("big-model-latency", 8000),
        ServicePort("big-model-latency-spec", 8001),
    )
    assert config.pools["batch"].extra_services == ()


def _slices(port: int, *ips: str) -> list[dict[str, Any]]:
    return [
        {"addressType": "IPv4", "ports": [{"port": port}], "endpoints": [{"addresses": [ip]} for ip in ips]}
    ]


def test_the_routers_pool_endpoints_are_both_services_ready_endpoints_each_at_its_port() -> None:
    config = RoutingConfig.from_json(routing_config(_sd()).to_json())
    watched: list[tuple[str, str]] = []

    class Watch:
        def stop(self) -> None:
            pass

    def factory(namespace: str, service: str, publish: Any) -> Watch:
        watched.append((namespace, service))
        return Watch()

    async def run() -> tuple[str, ...]:
        b = Backends("default", 10.0, (), RouterMetrics(), lambda: 0.0, factory)
        b.apply_config(config)
        b.apply_slices(("latency", "default", "big-model-latency", 8000), _slices(8000, "10.0.0.1"))
        b.apply_slices(("latency", "default", "big-model-latency-spec", 8001), _slices(8001, "10.0.0.2"))
        return b.pool_endpoints["latency"]

    assert asyncio.run(run()) == ("http://10.0.0.1:8000", "http://10.0.0.2:8001")
    assert ("default", "big-model-latency-spec") in watched


def test_the_network_policy_admits_the_speculative_port() -> None:
    body = _body()
    body["spec"]["networkPolicy"] = {"enabled": True, "metricsNamespaces": ["monitoring"]}
    sd = parse_resource(body)
    policy = next(c for c in render_children(sd, decided_plan(sd)) if c["kind"] == "NetworkPolicy")
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [8000, 8001]
    # The operator switches the engines during a flip: its namespace is admitted (where it is known).
    options = RenderOptions(operator_namespace="specfleet-system")
    policy = next(c for c in render_children(sd, decided_plan(sd), options) if c["kind"] == "NetworkPolicy")
    namespaces = [
        p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for p in policy["spec"]["ingress"][0]["from"]
        if "namespaceSelector" in p
    ]
    assert namespaces == ["monitoring", "specfleet-system"]


def test_a_standby_pool_has_no_canaries() -> None:
    body = _body()
    body["spec"]["pools"]["latency"]["speculation"] = "Auto"
    body["spec"]["policy"] = {"reentry": {"canaryReplicas": 1}}
    sd = parse_resource(body)
    names = {c["metadata"]["name"] for c in render_children(sd, decided_plan(sd))}
    assert "big-model-latency-canary" not in names


# A Standby pod whose supervisor found the engine cannot sleep, as the kubelet reports it after a
# restart: the last termination carries the supervisor's one line and its exit code.
CANNOT_SLEEP_LINE = f"{CANNOT_SLEEP}: POST /sleep?level=1 answered 404"


def _standby_pod(
    exit_code: int = CANNOT_SLEEP_EXIT_CODE, message: str = CANNOT_SLEEP_LINE + "\n"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "big-model-latency-7f9c",
            "namespace": "default",
            "labels": {
                "app.kubernetes.io/instance": "big-model",
                "app.kubernetes.io/managed-by": "specfleet-operator",
                "specfleet.io/pool": "latency",
            },
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": False,
                    "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
                    "lastState": {
                        "terminated": {"exitCode": exit_code, "reason": "Error", "message": message}
                    },
                }
            ]
        },
    }


def test_the_cannot_sleep_termination_message_is_standby_unavailable() -> None:
    failure = pool_failure([_standby_pod()], [])
    assert failure is not None
    assert failure.reason == reasons.STANDBY_UNAVAILABLE
    assert failure.message == f"pod big-model-latency-7f9c: {CANNOT_SLEEP_LINE}"
    # Another exit code, or the same code without the line, is an ordinary crash loop.
    for pod in (
        _standby_pod(exit_code=1),
        _standby_pod(message="standby: the plain engine exited with code 1"),
    ):
        other = pool_failure([pod], [])
        assert other is not None
        assert other.reason == reasons.CRASH_LOOP


def test_a_pool_whose_engines_cannot_sleep_is_degraded_and_rendered_as_a_restart_pool() -> None:
    cluster = FakeCluster()
    body = _body()
    first = reconcile(body, cluster, NOW)
    deployment = cluster.objects[("Deployment", "default", "big-model-latency")]
    assert _engine(deployment)["command"][-1] == "/specfleet-standby/standby.py"
    cluster.objects[("Pod", "default", "big-model-latency-7f9c")] = _standby_pod()
    second = reconcile({**body, "status": first.status}, cluster, NOW + timedelta(seconds=30))
    conditions = {c["type"]: c for c in second.status["conditions"]}
    assert conditions["Degraded"]["status"] == "True"
    assert conditions["Degraded"]["reason"] == "StandbyUnavailable"
    assert "pool latency runs as a Restart pool" in conditions["Degraded"]["message"]
    assert CANNOT_SLEEP_LINE in conditions["Degraded"]["message"]
    assert second.status["pools"]["latency"]["standby"] == {
        "available": False,
        "message": f"pod big-model-latency-7f9c: {CANNOT_SLEEP_LINE}",
        "observedGeneration": 1,
    }
    assert "Degraded" in [e.reason for e in second.events if e.type == "Warning"]
    # The next reconcile renders the pool as a Restart pool: one vLLM engine, today's pod.
    third = reconcile({**body, "status": second.status}, cluster, NOW + timedelta(seconds=60))
    container = _engine(cluster.objects[("Deployment", "default", "big-model-latency")])
    assert container["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    labels = cluster.objects[("Deployment", "default", "big-model-latency")]["spec"]["template"]["metadata"][
        "labels"
    ]
    assert LABEL_FLIP not in labels
    assert (
        LABEL_SPECULATION
        not in cluster.objects[("Service", "default", "big-model-latency")]["spec"]["selector"]
    )
    assert {c["type"]: c for c in third.status["conditions"]}["Degraded"]["reason"] == "StandbyUnavailable"
    assert [e.reason for e in third.events if e.reason == "Degraded"] == [], "warned once"
    # A spec change (a new generation) tries Standby again.
    changed = copy.deepcopy(body)
    changed["metadata"]["generation"] = 2
    del cluster.objects[("Pod", "default", "big-model-latency-7f9c")]
    fourth = reconcile({**changed, "status": third.status}, cluster, NOW + timedelta(seconds=90))
    assert _engine(cluster.objects[("Deployment", "default", "big-model-latency")])["command"][-1].endswith(
        "standby.py"
    )
    assert "standby" not in fourth.status["pools"]["latency"]
    assert {c["type"]: c for c in fourth.status["conditions"]}["Degraded"]["status"] == "False"


@pytest.mark.parametrize("pool", ["latency", "batch"])
def test_plan_is_standby_only_where_the_spec_asks_and_no_failure_holds(pool: str) -> None:
    sd = _sd()
    plan = decided_plan(sd)
    assert plan[pool].standby == (pool == "latency")
    status = sd.status.model_copy(deep=True)
    status.pools.latency.standby = StandbyStatus(available=False, message="m", observed_generation=1)
    assert not decided_plan(sd, status)[pool].standby  # seen at this generation: a Restart pool
    status.pools.latency.standby = StandbyStatus(available=False, message="m", observed_generation=0)
    assert decided_plan(sd, status)[pool].standby == (pool == "latency")  # an older generation: retried
