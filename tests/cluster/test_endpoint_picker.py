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

The gateway is played by the test bed's ext_proc client (testbed/extproc-client, built by
scripts/build-extproc-client.sh), run inside the same namespace: per request it opens the picker's
ext_proc stream as Envoy would, sends the headers and an OpenAI body, reads the picked endpoint (or an
immediate response's status) and, with -forward, sends the request to that engine and relays its response
to the picker. Every pick must be one of the pool's Ready engines; a pool without any gets a 503.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.constants import LABEL_TRACK
from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_runtime.vllm_args import parse_vllm_args
from specfleet_sandbox.processes import wait_for
from specfleet_testbed import ensure_epp, ensure_extproc_client
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
    logs: Path
    engines: dict[str, Spawned]  # the emulator playing the pod at each IP, stopped with the namespace
    addresses: set[str] = field(default_factory=set)  # on the namespace's loopback (they stay there)

    def serve(self, ip: str, args: list[str]) -> None:
        """Play the pod at `ip`: the namespace's loopback holds it, an engine emulator answers on it. An IP
        the apiserver gave a new pod (kwok reuses freed IPs) gets a new emulator with the new pod's args."""
        if ip in self.engines:
            self.engines.pop(ip).stop()
        if ip not in self.addresses:
            self.netns.add_address(ip)
            self.addresses.add(ip)
        argv = [sys.executable, "-m", "specfleet_runtime.emulator", *args, "--host", ip]
        self.engines[ip] = self.netns.spawn(f"engine {ip}", argv, self.logs / f"engine-{ip}.log")

    def answers(self, endpoint: str) -> bool:
        """Something accepts connections at `endpoint` (IP:port) inside the namespace."""
        host, port = endpoint.rsplit(":", 1)
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
        argv = self.netns.command([sys.executable, "-c", probe])
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0

    def unserve(self, ip: str) -> None:
        """The pod at `ip` is gone: nothing answers there any more (the address stays, unanswered)."""
        if ip in self.engines:
            self.engines.pop(ip).stop()

    def endpoints(self, pool: str) -> set[str]:
        """The pool's engines as the picker names a pick: pod IP and the InferencePool's target port."""
        port = _one(self.rendered, "InferencePool", pool)["spec"]["targetPorts"][0]["number"]
        return {f"{ip}:{port}" for ip in self.pool_ips[pool]}


def _rendered(
    namespace: str, modes: dict[str, str] | None = None, spec: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """What the operator renders for the example; `modes` overrides pools' speculation (a flip), `spec`
    is merged into the resource's spec."""
    sd = parse_resource(merge(load_yaml(EXAMPLE), {"metadata": {"namespace": namespace}, "spec": spec or {}}))
    plan = decided_plan(sd)
    for pool, mode in (modes or {}).items():
        plan[pool] = replace(plan[pool], mode=mode)
    return render_children(sd, plan)


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


def _pods(cluster: Any, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
    labels = ",".join(f"{k}={v}" for k, v in selector.items())
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", labels, "-o", "json").stdout)
    return [p for p in pods["items"] if p["status"].get("podIP")]


def _ready_ips(cluster: Any, namespace: str, selector: dict[str, str]) -> list[str]:
    return sorted(
        p["status"]["podIP"]
        for p in _pods(cluster, namespace, selector)
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
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
    engines: dict[str, Spawned] = {}
    try:
        bridge.inward(int(cluster.server.rsplit(":", 1)[1]))
        picker = _picker(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        metrics = next(p["containerPort"] for p in picker["ports"] if p["name"] == "metrics")
        fleet = Fleet(namespace, rendered, netns, bridge, bridge.outward(metrics), pool_ips, logs, engines)
        for name, ips in pool_ips.items():
            container = _one(rendered, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
            for ip in ips:
                fleet.serve(ip, container["args"])
        yield fleet
    finally:
        for spawned in engines.values():
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


def _play_gateway(fleet: Fleet, requests: int, forward: bool = True) -> list[dict[str, Any]]:
    """`requests` requests through the picker by the ext_proc client, inside the namespace (where the
    picker's gRPC port and the engines are); one dict per request, as the client prints them."""
    picker = _picker(fleet.rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    grpc = next(p["containerPort"] for p in picker["ports"] if p["name"] == "grpc")
    engine = _one(fleet.rendered, "Deployment", POOL)["spec"]["template"]["spec"]["containers"][0]
    model = parse_vllm_args(engine["args"])[0].served_model_name
    argv = [str(ensure_extproc_client()), "-addr", f"127.0.0.1:{grpc}", "-model", model]
    argv += ["-requests", str(requests), *(["-forward"] if forward else [])]
    done = subprocess.run(fleet.netns.command(argv), capture_output=True, text=True, timeout=120, check=False)
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == requests, f"exit code {done.returncode}: {done.stderr[-2000:]}"
    return results


def _picker_serves(fleet: Fleet) -> bool:
    """The picker answers an ext_proc stream at all (its gRPC server starts after its pool syncs)."""
    return "error" not in _play_gateway(fleet, 1, forward=False)[0]


def _assert_every_pick_in(results: list[dict[str, Any]], allowed: set[str]) -> None:
    picks = [r.get("endpoint") for r in results]
    assert all(r.get("metadataEndpoint") == r.get("endpoint") for r in results), results
    outside = [r for r in results if r.get("endpoint") not in allowed]
    assert not outside, (
        f"{len(outside)} of {len(picks)} requests not picked from {sorted(allowed)}: {outside[:3]}"
    )


def _play_new_pods(
    fleet: Fleet,
    cluster: Any,
    selector: dict[str, str],
    playing: dict[str, str],
    args: dict[str, list[str]],
) -> list[dict[str, Any]]:
    """Serve every pod of `selector` not yet played (a fresh IP, or an IP kwok gave a new pod: `playing`
    maps IP to the UID served there) with the engine args of its track; the pods listed."""
    pods = _pods(cluster, fleet.namespace, selector)
    for pod in pods:
        ip, uid = pod["status"]["podIP"], pod["metadata"]["uid"]
        if playing.get(ip) != uid:
            fleet.serve(ip, args[pod["metadata"]["labels"][LABEL_TRACK]])
            playing[ip] = uid
    return pods


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


def test_every_pick_through_the_picker_is_a_ready_engine_of_its_pool(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The gateway's view: 30 requests through the real picker's ext_proc stream, each sent on to the
    engine it picked; every pick is one of the latency pool's three Ready engines (never a batch engine,
    though those answer too), named alike in the header and in Envoy's load-balancer metadata."""
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        expected = len(fleet.pool_ips[POOL])
        wait_for(f"{expected} ready pods", lambda: _ready_pods(fleet) == expected or None, timeout=120)
        wait_for("the picker serving ext_proc", lambda: _picker_serves(fleet) or None, timeout=60)
        results = _play_gateway(fleet, 30)
        _assert_every_pick_in(results, fleet.endpoints(POOL))
        assert not fleet.endpoints(POOL) & fleet.endpoints("batch")
        assert all(r.get("upstreamStatus") == 200 for r in results), results  # the picked engine served it
        assert picker.alive(), picker.output()[-3000:]
    finally:
        _stop(picker, request)


def test_a_pool_without_ready_engines_gets_the_protocols_503(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An InferencePool whose selector matches no Ready pod: the picker answers each request with an
    immediate response of 503 (the gateway returns it to the client) rather than a pick."""
    pool = _one(fleet.rendered, "InferencePool", POOL)
    empty = merge(pool, {"spec": {"selector": {"matchLabels": {"specfleet.io/pool": "no-such-pool"}}}})
    _apply(gateway_crds, fleet.namespace, [empty])
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        wait_for("the picker reporting 0 ready pods", lambda: _ready_pods(fleet) == 0 or None, timeout=120)
        results = wait_for(
            "the picker answering",
            lambda: r if "error" not in (r := _play_gateway(fleet, 5, forward=False))[0] else None,
            timeout=60,
        )
        assert [r.get("immediateStatus") for r in results] == [503] * 5, results
        assert not any(r.get("endpoint") for r in results)
    finally:
        _apply(gateway_crds, fleet.namespace, [pool])
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
        # ...and the picks check above fails: with five equal engines some of 40 picks land on a batch
        # engine (all on the three latency engines by chance: (3/5)^40, about 1e-9).
        wait_for("the picker serving ext_proc", lambda: _picker_serves(fleet) or None, timeout=60)
        results = _play_gateway(fleet, 40)
        _assert_every_pick_in(results, fleet.endpoints(POOL) | fleet.endpoints("batch"))
        with pytest.raises(AssertionError, match="not picked from"):
            _assert_every_pick_in(results, fleet.endpoints(POOL))
    finally:
        _apply(gateway_crds, fleet.namespace, [pool])
        _stop(picker, request)


def test_a_speculation_flip_moves_the_picks_to_the_new_engines_and_never_back(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What a flip does to the picker: the operator re-renders the pool's Deployment (speculation Off:
    new args, a new speculation label outside the InferencePool's selector), the rollout surges new pods
    and removes the old ones. Picks during the rollout go only to the pool's pods, old or new; once the
    old pods have left the apiserver and the picker has seen it, every pick is a new pod, and stays so.
    It replaces the latency pool's pods (the fixture's IPs follow): only the canary test runs after it."""
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        old = fleet.endpoints(POOL)
        wait_for(f"{len(old)} ready pods", lambda: _ready_pods(fleet) == len(old) or None, timeout=120)
        wait_for("the picker serving ext_proc", lambda: _picker_serves(fleet) or None, timeout=60)
        _assert_every_pick_in(_play_gateway(fleet, 10), old)

        flipped = _one(_rendered(fleet.namespace, {POOL: "Off"}), "Deployment", POOL)
        args = flipped["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--speculative-config" not in args
        selector = _one(fleet.rendered, "InferencePool", POOL)["spec"]["selector"]["matchLabels"]
        # Pods by UID, not IP: kwok gives a freed IP to the next pod, as a real CNI may.
        old_pods = {p["metadata"]["uid"] for p in _pods(gateway_crds, fleet.namespace, selector)}
        playing = {
            p["status"]["podIP"]: p["metadata"]["uid"] for p in _pods(gateway_crds, fleet.namespace, selector)
        }
        _apply(gateway_crds, fleet.namespace, [flipped])
        during: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while True:
            pods = _play_new_pods(fleet, gateway_crds, selector, playing, {"stable": args})
            ready = _ready_ips(gateway_crds, fleet.namespace, selector)
            if len(ready) == len(old) and not old_pods & {p["metadata"]["uid"] for p in pods}:
                break
            assert time.monotonic() < deadline, f"the rollout did not finish: {[p['metadata'] for p in pods]}"
            during += _play_gateway(fleet, 3, forward=False)  # a new engine may not listen yet
        port = next(iter(old)).rsplit(":", 1)[1]
        new = {f"{ip}:{port}" for ip in ready}
        removed = old - new  # the first surge pod took a fresh IP, so at least one old IP is free
        assert removed, (old, new)
        for endpoint in removed:
            fleet.unserve(endpoint.rsplit(":", 1)[0])
        _assert_every_pick_in(during, old | new)

        # The old pods are gone from the apiserver; the picker's pod watch has to deliver that.
        gone = time.monotonic()
        wait_for(
            "every pick on a new engine",
            lambda: not {r.get("endpoint") for r in _play_gateway(fleet, 10, forward=False)} - new or None,
            timeout=30,
        )
        print(f"picks left the removed pods {time.monotonic() - gone:.1f} s after they left the apiserver")
        fleet.pool_ips[POOL] = ready
        for endpoint in new:  # an emulator restarted for a reused IP takes a moment to listen
            wait_for(
                f"an engine answering at {endpoint}", lambda e=endpoint: fleet.answers(e) or None, timeout=60
            )
        after = _play_gateway(fleet, 30)
        _assert_every_pick_in(after, new)
        assert not {r.get("endpoint") for r in after} & removed
        assert all(r.get("upstreamStatus") == 200 for r in after), after
        print(
            f"{len(during)} picks during the rollout, {len(after)} after; removed {sorted(removed)}, "
            f"picked after: {sorted({str(r.get('endpoint')) for r in after})}"
        )
    finally:
        _stop(picker, request)


def test_a_canary_is_picked_in_its_share_of_the_pools_ready_engines(
    fleet: Fleet, gateway_crds: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The off pool with `policy.reentry.canaryReplicas: 1`, as the operator renders it: the stable
    Deployment (no drafter) scaled to two, and a canary Deployment of one speculating pod whose labels
    keep it inside the InferencePool's selector. The picker counts the canary among its three Ready pods
    and, the engines idle and alike to its scorers, picks it for about a third of the requests, as the
    specfleet router's least-outstanding choice would: 90 picks, the canary's count within 4 standard
    deviations of 30 (12-48; a canary left out, or picked always, fails). After the flip test (the pool
    is off)."""
    rendered = _rendered(fleet.namespace, {POOL: "Off"}, {"policy": {"reentry": {"canaryReplicas": 1}}})
    stable = _one(rendered, "Deployment", POOL)
    canary = next(
        c
        for c in rendered
        if c["kind"] == "Deployment"
        and c["metadata"]["labels"].get(LABEL_TRACK) == "canary"
        and c["metadata"]["labels"].get("specfleet.io/pool") == POOL
    )
    args = {
        d["metadata"]["labels"][LABEL_TRACK]: d["spec"]["template"]["spec"]["containers"][0]["args"]
        for d in (stable, canary)
    }
    assert "--speculative-config" in args["canary"]
    assert "--speculative-config" not in args["stable"]
    assert (stable["spec"]["replicas"], canary["spec"]["replicas"]) == (2, 1)
    selector = _one(fleet.rendered, "InferencePool", POOL)["spec"]["selector"]["matchLabels"]
    playing = {
        p["status"]["podIP"]: p["metadata"]["uid"] for p in _pods(gateway_crds, fleet.namespace, selector)
    }
    _apply(gateway_crds, fleet.namespace, [stable, canary])

    def settled() -> list[dict[str, Any]] | None:
        pods = _play_new_pods(fleet, gateway_crds, selector, playing, args)
        ready = set(_ready_ips(gateway_crds, fleet.namespace, selector))
        tracks = sorted(p["metadata"]["labels"][LABEL_TRACK] for p in pods)
        return (
            pods
            if tracks == ["canary", "stable", "stable"] and ready == {p["status"]["podIP"] for p in pods}
            else None
        )

    pods = wait_for("two stable pods and one canary, Ready", settled, timeout=120)
    for ip in set(playing) - {p["status"]["podIP"] for p in pods}:
        fleet.unserve(ip)  # the stable pod scaled away
    port = next(iter(fleet.endpoints(POOL))).rsplit(":", 1)[1]
    endpoints = {f"{p['status']['podIP']}:{port}" for p in pods}
    (canary_endpoint,) = (
        f"{p['status']['podIP']}:{port}" for p in pods if p["metadata"]["labels"][LABEL_TRACK] == "canary"
    )
    picker = _start_picker(fleet, gateway_crds, tmp_path / "epp.log")
    try:
        wait_for("3 ready pods", lambda: _ready_pods(fleet) == 3 or None, timeout=120)
        wait_for("the picker serving ext_proc", lambda: _picker_serves(fleet) or None, timeout=60)
        picks = _play_gateway(fleet, 90, forward=False)
        _assert_every_pick_in(picks, endpoints)
        shares = {e: sum(r.get("endpoint") == e for r in picks) for e in sorted(endpoints)}
        print(f"picks per engine (canary {canary_endpoint}): {shares}")
        assert 12 <= shares[canary_endpoint] <= 48, shares
        # ...and it serves what it is picked for, with its drafter.
        wait_for(
            f"the canary answering at {canary_endpoint}",
            lambda: fleet.answers(canary_endpoint) or None,
            timeout=60,
        )
        served = [r for r in _play_gateway(fleet, 30) if r.get("endpoint") == canary_endpoint]
        assert served, "no pick of the canary in 30"
        assert all(r.get("upstreamStatus") == 200 for r in served), served
    finally:
        _stop(picker, request)
