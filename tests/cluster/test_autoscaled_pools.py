"""Autoscaled pools against the real control plane (apiserver, controller-manager with its HPA
controller, scheduler, kwok nodes) with the operator running as `specfleet run`.

What an autoscaler does is done as it does it: a write of the Deployment's scale subresource
(`kubectl scale` PATCHes deployments/scale, like the HPA controller and KEDA's HPA). The real HPA
controller also acts on its own: it raises a Deployment below `minReplicas` through the same
subresource (it needs no metric for that), so its writes must survive the operator too. KEDA's
ScaledObject is applied by the operator and checked with strict field validation against KEDA's CRD,
generated from its Go module (scripts/setup-keda-crds.sh).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_sandbox.processes import wait_for, wait_for_event
from specfleet_testbed import ensure_keda_crds
from support.manifests import ROOT, apply_crds, load_yaml, merge
from support.operator_log import wait_resyncs
from support.strict_apply import strict_dry_run

pytestmark = pytest.mark.cluster
FIELD_MANAGER = "specfleet-operator"
HANDOVER_MANAGER = "specfleet-replicas-handover"
NO_PROMETHEUS = "http://127.0.0.1:9"
HPA = {"minReplicas": 2, "maxReplicas": 5, "metric": "RunningRequests", "target": 16}
KEDA = {"kind": "ScaledObject", "minReplicas": 1, "maxReplicas": 3, "metric": "WaitingRequests", "target": 4}


@pytest.fixture(scope="module")
def crd(crd) -> Iterator[object]:
    """The cluster tier's `crd`, and KEDA's ScaledObject CRD for this module only."""
    apply_crds(crd, ensure_keda_crds() / "keda.sh_scaledobjects.yaml")
    yield crd
    # Other cluster tests run without KEDA.
    crd.kubectl("delete", "crd", "scaledobjects.keda.sh", "--wait=true", "--timeout=60s", check=False)


def _manifest(ns: str, latency: dict | None = None, batch: dict | None = None, patch=None) -> dict[str, Any]:
    doc = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    doc = merge(
        doc,
        {
            "metadata": {"namespace": ns},
            "spec": {
                "monitoring": {"podMonitor": False},
                "pools": {
                    "latency": {"replicas": 2, "autoscaling": latency},
                    "batch": {"replicas": 2, "autoscaling": batch},
                },
                "engine": {"nodeSelector": None, "modelCache": {"persistentVolumeClaimName": None}},
                "policy": {"prometheus": {"url": NO_PROMETHEUS}},
            },
        },
    )
    return merge(doc, patch or {})


def _apply(cluster, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))


def _get(cluster, kind: str, name: str, ns: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", "--show-managed-fields", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _replica_managers(deploy: dict[str, Any]) -> set[str]:
    """Managers holding spec.replicas (with the subresource they wrote through, if any)."""
    out = set()
    for entry in deploy["metadata"].get("managedFields") or []:
        if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            sub = entry.get("subresource")
            out.add(f"{entry['manager']}/{sub}" if sub else entry["manager"])
    return out


def _replicas(cluster, ns: str, name: str = "assistant-latency") -> int:
    deploy = _get(cluster, "deployment", name, ns)
    assert deploy is not None
    return int(deploy["spec"]["replicas"])


def _pool_status(cluster, ns: str, pool: str = "latency") -> dict[str, Any]:
    sd = _get(cluster, "sd", "assistant", ns) or {}
    return ((sd.get("status") or {}).get("pools") or {}).get(pool) or {}


def _ready(cluster, ns: str) -> dict[str, Any]:
    def probe():
        obj = _get(cluster, "sd", "assistant", ns)
        conds = {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions", [])}
        ok = (
            conds.get("Ready", {}).get("status") == "True"
            and conds["Ready"].get("observedGeneration") == obj["metadata"]["generation"]
        )
        return obj if ok else None

    return wait_for("assistant Ready=True", probe, timeout=120)


def _scale(cluster, ns: str, replicas: int, name: str = "assistant-latency") -> None:
    # As an autoscaler does it: through the scale subresource, under its own field manager.
    cluster.kubectl("scale", f"deployment/{name}", "-n", ns, f"--replicas={replicas}")


def test_a_scale_by_the_autoscaler_survives_resyncs_and_a_flip(crd, operator, namespace):
    _apply(crd, _manifest(namespace, latency=HPA, batch=KEDA))
    hpa = wait_for("the HPA", lambda: _get(crd, "hpa", "assistant-latency", namespace), timeout=60)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "assistant-latency",
    }
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_running"
    so = wait_for(
        "the ScaledObject", lambda: _get(crd, "scaledobject", "assistant-batch", namespace), timeout=60
    )
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == NO_PROMETHEUS
    # The Deployment is created without replicas (the default 1); the real HPA controller raises it to
    # minReplicas through the scale subresource, with no metric needed for that.
    wait_for("the HPA controller's minReplicas", lambda: _replicas(crd, namespace) == 2, timeout=90)
    deploy = _get(crd, "deployment", "assistant-latency", namespace)
    assert FIELD_MANAGER not in _replica_managers(deploy)
    _ready(crd, namespace)

    # No metrics adapter in the test bed: the real HPA controller says it cannot read its metric, and
    # the resource says so too (the usual mistake: an HPA without prometheus-adapter's rule).
    def autoscaling_condition():
        obj = _get(crd, "sd", "assistant", namespace) or {}
        conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
        c = conds.get("AutoscalingActive", {})
        return c if c.get("status") == "False" else None

    inactive = wait_for("AutoscalingActive=False from the HPA", autoscaling_condition, timeout=90)
    assert "latency: HorizontalPodAutoscaler ScalingActive=False" in inactive["message"]
    assert "vllm_num_requests_running" in inactive["message"]

    _scale(crd, namespace, 4)
    wait_for(
        "status reads the scaled count",
        lambda: _pool_status(crd, namespace).get("desiredReplicas") == 4,
        timeout=60,
    )
    wait_resyncs(operator, namespace, "assistant", 3)
    assert _replicas(crd, namespace) == 4
    assert autoscaling_condition() == inactive  # the HPA's message is stable: no status churn
    _ready(crd, namespace)
    pool = _pool_status(crd, namespace)
    assert (pool["readyReplicas"], pool["settled"]) == (4, True)

    # Flip the pool: its template changes and rolls with surge; the count stays the autoscaler's.
    _apply(
        crd,
        _manifest(
            namespace, latency=HPA, batch=KEDA, patch={"spec": {"pools": {"latency": {"speculation": "Off"}}}}
        ),
    )

    def flipped():
        p = _pool_status(crd, namespace)
        return p if p.get("speculation") == "Off" and p.get("settled") else None

    wait_for("latency flipped Off and settled", flipped, timeout=120)
    deploy = _get(crd, "deployment", "assistant-latency", namespace)
    assert deploy["metadata"]["labels"]["specfleet.io/speculation"] == "Off"
    assert "--speculative-config" not in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deploy["spec"]["replicas"] == 4
    assert deploy["status"]["readyReplicas"] == 4
    wait_resyncs(operator, namespace, "assistant", 2)
    assert _replicas(crd, namespace) == 4
    _ready(crd, namespace)


def test_turning_autoscaling_on_keeps_the_count_and_off_prunes_the_hpa(crd, operator, namespace):
    _apply(
        crd,
        _manifest(
            namespace, patch={"spec": {"pools": {"latency": {"replicas": 3}, "batch": {"replicas": 2}}}}
        ),
    )
    _ready(crd, namespace)
    assert _replicas(crd, namespace) == 3
    assert FIELD_MANAGER in _replica_managers(_get(crd, "deployment", "assistant-latency", namespace))

    # On, with minReplicas 1: were the count reset to 1 (what an apply that drops a field it alone owns
    # does), nothing would raise it again. It stays 3, held by the hand-over manager.
    on = {**HPA, "minReplicas": 1}
    _apply(crd, _manifest(namespace, latency=on, patch={"spec": {"pools": {"latency": {"replicas": 3}}}}))
    wait_for("the HPA", lambda: _get(crd, "hpa", "assistant-latency", namespace), timeout=60)
    wait_for(
        "replicas released",
        lambda: (
            FIELD_MANAGER not in _replica_managers(_get(crd, "deployment", "assistant-latency", namespace))
        ),
        timeout=60,
    )
    deploy = _get(crd, "deployment", "assistant-latency", namespace)
    assert deploy["spec"]["replicas"] == 3
    assert HANDOVER_MANAGER in _replica_managers(deploy)
    wait_resyncs(operator, namespace, "assistant", 2)
    assert _replicas(crd, namespace) == 3
    _scale(crd, namespace, 2)
    wait_resyncs(operator, namespace, "assistant", 3)
    assert _replicas(crd, namespace) == 2

    # Off again: the HPA is pruned and the operator owns the count again (the spec's 3).
    _apply(crd, _manifest(namespace, patch={"spec": {"pools": {"latency": {"replicas": 3}}}}))
    wait_for("HPA pruned", lambda: _get(crd, "hpa", "assistant-latency", namespace) is None, timeout=60)
    wait_for("replicas back to the spec's", lambda: _replicas(crd, namespace) == 3, timeout=60)
    assert FIELD_MANAGER in _replica_managers(_get(crd, "deployment", "assistant-latency", namespace))
    wait_for_event(crd.kubectl, namespace, "ChildrenPruned")
    _ready(crd, namespace)


def _rendered_autoscalers() -> list[dict[str, Any]]:
    sd = parse_resource(load_yaml(ROOT / "examples" / "06-autoscaled-pools.yaml"))
    return [
        c
        for c in render_children(sd, decided_plan(sd))
        if c["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
    ]


@pytest.mark.parametrize("metric", ["RunningRequests", "WaitingRequests", "KVCacheUsage"])
def test_rendered_autoscalers_pass_strict_validation(crd, namespace, metric):
    doc = load_yaml(ROOT / "examples" / "06-autoscaled-pools.yaml")
    doc = merge(
        doc,
        {
            "spec": {
                "pools": {p: {"autoscaling": {"metric": metric, "target": 50}} for p in ("latency", "batch")}
            }
        },
    )
    sd = parse_resource(doc)
    rendered = [
        c
        for c in render_children(sd, decided_plan(sd))
        if c["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
    ]
    assert sorted(c["kind"] for c in rendered) == ["HorizontalPodAutoscaler", "ScaledObject"]
    for manifest in rendered:
        result = strict_dry_run(crd, namespace, manifest)
        assert result.returncode == 0, f"{manifest['kind']}: {result.stderr}"
        stored = json.loads(result.stdout)["spec"]
        for key, value in manifest["spec"].items():
            assert stored[key] == value, (manifest["kind"], key)


def test_a_wrong_scaled_object_field_is_refused(crd, namespace):
    # The check above can fail: KEDA's schema refuses a field it does not have.
    so = next(c for c in _rendered_autoscalers() if c["kind"] == "ScaledObject")
    so["spec"]["minReplicas"] = so["spec"].pop("minReplicaCount")
    result = strict_dry_run(crd, namespace, so)
    assert result.returncode != 0
    assert "minReplicas: field not declared in schema" in result.stderr
