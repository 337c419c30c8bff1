"""The real endpoint picker (the Gateway API Inference Extension's EPP, built from its Go module by
scripts/build-epp.sh) run with the arguments specfleet renders for a pool's picker Deployment, as the
ServiceAccount specfleet renders, against the real apiserver holding the rendered InferencePool and
RBAC and the pools' engine pods (kwok: Running, Ready, fake 10.244.x IPs).

The picker scrapes every pod it picks from, so it runs in a network namespace of the test's own
(specfleet_testbed.netns): its loopback holds the pods' IPs, each served by an engine emulator with the
rendered engine arguments (vLLM's metric names), and nothing else is routable. It reaches the apiserver
through a bridge (TLS end to end) and the test reads its Prometheus metrics through another.
`inference_pool_ready_pods` counts the pods it selected, watches and scrapes fresh metrics from: it must
equal the pool's Ready engine pods, not the other pool's too.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_sandbox.processes import wait_for
from specfleet_testbed import ensure_epp
from specfleet_testbed.netns import Bridge, NetworkNamespace, Spawned
from support.manifests import ROOT, load_yaml, merge

pytestmark = pytest.mark.cluster
EXAMPLE = ROOT / "examples" / "09-gateway.yaml"
POOL = "latency"  # the pool whose picker runs; the batch pool's engines run too, and must not count
READY_PODS = "inference_pool_ready_pods"


@dataclass
class Fleet:
    namespace: str
    rendered: list[dict[str, Any]]
    netns: NetworkNamespace
    bridge: Bridge
    metrics_port: int  # on the host's 127.0.0.1, reaching the picker's metrics port in the namespace
    pool_ips: dict[str, list[str]]  # engine pod IPs per pool, as the apiserver lists them Ready


def _rendered(namespace: str) -> list[dict[str, Any]]:
    sd = parse_resource(merge(load_yaml(EXAMPLE), {"metadata": {"namespace": namespace}}))
    return render_children(sd, decided_plan(sd))


def _one(rendered: list[dict[str, Any]], kind: str, pool: str) -> dict[str, Any]:
    return next(
        c for c in rendered if c["kind"] == kind and c["metadata"]["labels"].get("specfleet.io/pool") == pool
    )


def _picker(rendered: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(c for c in rendered if c["kind"] == kind and c["metadata"]["name"].endswith(f"-{POOL}-epp"))


def _apply(cluster: Any, namespace: str, manifests: list[dict[str, Any]]) -> None:
    bodies = []
    for manifest in manifests:
        meta = {k: v for k, v in manifest["metadata"].items() if k != "ownerReferences"}  # no owner here
        bodies.append({**manifest, "metadata": meta})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(bodies))


def _ready_ips(cluster: Any, namespace: str, selector: dict[str, str]) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in selector.items())
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", labels, "-o", "json").stdout)
    return sorted(
        p["status"]["podIP"]
        for p in pods["items"]
        if p["status"].get("podIP")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    )


@pytest.fixture(scope="module")
def fleet(gateway_crds: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    cluster = gateway_crds
    namespace = f"test-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(namespace)
    logs = tmp_path_factory.mktemp("epp")
    rendered = _rendered(namespace)
    wanted = {"InferencePool", "InferenceObjective", "ServiceAccount", "Role", "RoleBinding"}
    picker_objects = [c for c in rendered if c["kind"] in wanted and c["metadata"]["name"].endswith("-epp")]
    engines = [
        c for c in rendered if c["kind"] == "Deployment" and not c["metadata"]["name"].endswith("-epp")
    ]
    pools = [c for c in rendered if c["kind"] in ("InferencePool", "InferenceObjective")]
    _apply(cluster, namespace, [*pools, *picker_objects, *engines])
    pool_ips: dict[str, list[str]] = {}
    for name in ("latency", "batch"):
        pool = _one(rendered, "InferencePool", name)
        replicas = _one(rendered, "Deployment", name)["spec"]["replicas"]
        selector = pool["spec"]["selector"]["matchLabels"]
        pool_ips[name] = wait_for(
            f"{replicas} Ready {name} engine pods",
            lambda s=selector, r=replicas: (
                ips if len(ips := _ready_ips(cluster, namespace, s)) == r else None
            ),
            timeout=120,
        )
    netns = NetworkNamespace("sf-epp").create()
    bridge = Bridge(netns)
    engines_running: list[Spawned] = []
    try:
        for name, ips in pool_ips.items():
            container = _one(rendered, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
            for ip in ips:
                netns.add_address(ip)
                argv = [sys.executable, "-m", "specfleet_runtime.emulator", *container["args"], "--host", ip]
                engines_running.append(netns.spawn(f"engine {ip}", argv, logs / f"engine-{ip}.log"))
        bridge.inward(int(cluster.server.rsplit(":", 1)[1]))
        picker = _picker(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        metrics = next(p["containerPort"] for p in picker["ports"] if p["name"] == "metrics")
        yield Fleet(namespace, rendered, netns, bridge, bridge.outward(metrics), pool_ips)
    finally:
        for spawned in engines_running:
            spawned.stop()
        bridge.close()
        netns.delete()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _service_account_kubeconfig(cluster: Any, namespace: str, account: str, path: Path) -> Path:
    """The test bed's kubeconfig with the user replaced by a token of `account`: the picker then has
    exactly the rendered RBAC, as in its pod."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    config = json.loads(Path(cluster.kubeconfig).read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(json.dumps(config))
    return path


def _start_picker(fleet: Fleet, cluster: Any, log: Path) -> Spawned:
    """The rendered container's args, unchanged, and its env; only what a pod would have had mapped: the
    kubeconfig (its ServiceAccount's token) and the downward-API values. Ports stay the rendered
    defaults: the namespace has its own."""
    pod = _picker(fleet.rendered, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    downward = {"metadata.namespace": fleet.namespace, "metadata.name": f"{pod['serviceAccountName']}-0"}
    env = {e["name"]: downward[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"]}
    kubeconfig = _service_account_kubeconfig(
        cluster, fleet.namespace, pod["serviceAccountName"], log.with_suffix(".kubeconfig")
    )
    env |= {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(log.parent)}
    return fleet.netns.spawn("epp", [str(ensure_epp()), *container["args"]], log, env=env)


def _ready_pods(fleet: Fleet) -> float | None:
    """The picker's inference_pool_ready_pods for its pool, or None while it does not report it."""
    pool = _one(fleet.rendered, "InferencePool", POOL)["metadata"]["name"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == READY_PODS and sample.labels.get("name") == pool:
                return sample.value
    return None


def _stop(picker: Spawned, request: pytest.FixtureRequest) -> None:
    picker.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- endpoint picker log ---\n{picker.output()[-6000:]}")


def test_the_real_picker_sees_exactly_its_pools_ready_engines(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        expected = len(fleet.pool_ips[POOL])
        assert expected != len(fleet.pool_ips[POOL]) + len(fleet.pool_ips["batch"])
        seen = wait_for(
            f"the picker reporting {expected} ready pods",
            lambda: v if (v := _ready_pods(fleet)) == expected else None,
            timeout=120,
        )
        assert seen == expected
        # It stays so: the batch pool's engines (answering the same scrape) never join.
        time.sleep(3)
        assert _ready_pods(fleet) == expected
        assert picker.alive(), picker.output()[-3000:]
        assert "forbidden" not in picker.output().lower()
    finally:
        _stop(picker, request)


def test_without_the_rendered_role_the_picker_sees_no_pods_until_it_is_restored(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The check above can fail: a Role without the pods rule leaves the real picker blind."""
    role = _picker(fleet.rendered, "Role")
    broken = {**role, "rules": [r for r in role["rules"] if "pods" not in r["resources"]]}
    _apply(gateway_crds, fleet.namespace, [broken])
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        wait_for(
            "the picker refused the pods", lambda: "forbidden" in picker.output().lower() or None, timeout=60
        )
        time.sleep(5)
        assert _ready_pods(fleet) in (None, 0.0)
        _apply(gateway_crds, fleet.namespace, [role])
        expected = len(fleet.pool_ips[POOL])
        wait_for(
            f"the picker reporting {expected} ready pods once the Role is restored",
            lambda: _ready_pods(fleet) == expected or None,
            timeout=120,
        )
    finally:
        _apply(gateway_crds, fleet.namespace, [role])
        _stop(picker, request)


def test_a_selector_without_the_pool_label_would_take_the_other_pools_engines(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What the first test's count rules out: the real picker follows the InferencePool's selector, so
    one without the pool label picks the batch pool's engines too."""
    pool = _one(fleet.rendered, "InferencePool", POOL)
    labels = {k: v for k, v in pool["spec"]["selector"]["matchLabels"].items() if k != "specfleet.io/pool"}
    wide = merge(pool, {"spec": {"selector": {"matchLabels": None}}})
    wide["spec"]["selector"]["matchLabels"] = labels
    _apply(gateway_crds, fleet.namespace, [wide])
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        both = len(fleet.pool_ips[POOL]) + len(fleet.pool_ips["batch"])
        wait_for(
            f"the picker reporting {both} ready pods", lambda: _ready_pods(fleet) == both or None, timeout=120
        )
    finally:
        _apply(gateway_crds, fleet.namespace, [pool])
        _stop(picker, request)
