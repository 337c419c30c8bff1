"""The operator, run for real as `specfleet run`, against the real control plane with kwok nodes."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import yaml

from specfleet.api.constants import LABEL_POOL, LABEL_TRACK
from specfleet_sandbox.processes import events_by_time, wait_for, wait_for_event
from specfleet_testbed import PROBED_NAMESPACE_PREFIX, READY_ANNOTATION
from support.failure_report import PRINTER_COLUMNS
from support.manifests import ROOT, load_yaml, merge
from support.operator_log import wait_resyncs

pytestmark = pytest.mark.cluster
FIELD_MANAGER = "specfleet-operator"
# Logged by Kopf for each resource when the operator (re)starts: the resume ran its reconcile.
RESUMED = "Handler 'on_change' succeeded"
NO_PROMETHEUS = "http://127.0.0.1:9"


def _get(cluster, kind: str, name: str, ns: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions", [])}


def _manifest(ns: str, patch: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    # No prometheus-operator in the test bed: scrape annotations instead of a PodMonitor; small pools.
    doc = merge(
        doc,
        {
            "metadata": {"namespace": ns},
            "spec": {
                "monitoring": {"podMonitor": False},
                "pools": {"latency": {"replicas": 2}, "batch": {"replicas": 2}},
                "engine": {"nodeSelector": None, "modelCache": {"persistentVolumeClaimName": None}},
                # No Prometheus in this tier: a closed loopback port (no DNS lookups, no traffic out).
                "policy": {"prometheus": {"url": NO_PROMETHEUS}},
            },
        },
    )
    return merge(doc, patch or {})


def _apply(cluster, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))


def _children(cluster, ns: str) -> dict[str, dict[str, Any]]:
    kinds = "deployments,services,configmaps,poddisruptionbudgets,serviceaccounts,roles,rolebindings,networkpolicies"
    out = cluster.kubectl(
        "get",
        kinds,
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/managed-by=specfleet-operator",
        "-o",
        "json",
        "--show-managed-fields",
    )
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in json.loads(out.stdout)["items"]}


def _ready(cluster, ns: str, name: str = "assistant"):
    def probe():
        obj = _get(cluster, "sd", name, ns)
        cond = _conditions(obj)
        ok = (
            cond.get("Ready", {}).get("status") == "True"
            and cond["Ready"].get("observedGeneration") == obj["metadata"]["generation"]
        )
        return obj if ok else None

    return wait_for(f"{name} Ready=True", probe, timeout=90)


def _versions(children: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {k: v["metadata"]["resourceVersion"] for k, v in children.items()}


def _snapshot(cluster, ns: str, name: str = "assistant") -> dict[str, str]:
    """The resourceVersion of the resource and of each of its children: any write changes one."""
    sd = _get(cluster, "sd", name, ns)
    return {**_versions(_children(cluster, ns)), "sd": sd["metadata"]["resourceVersion"] if sd else ""}


def _quiet_snapshot(cluster, operator, ns: str, name: str = "assistant") -> dict[str, str]:
    """`_snapshot` once a whole resync wrote nothing (the first ones may still record readiness)."""

    def quiet() -> dict[str, str] | None:
        before = _snapshot(cluster, ns, name)
        wait_resyncs(operator, ns, name, 1)
        return before if _snapshot(cluster, ns, name) == before else None

    return wait_for(f"a resync of {name} that wrote nothing", quiet, timeout=90)


def _spec_versions(children: dict[str, dict[str, Any]]) -> dict[str, str]:
    """generation where the kind has one (status updates by controllers do not count), else resourceVersion."""
    return {
        k: str(v["metadata"].get("generation", v["metadata"]["resourceVersion"])) for k, v in children.items()
    }


EXPECTED_CHILDREN = {
    "ConfigMap/assistant-routing",
    "ServiceAccount/assistant-router",
    "Role/assistant-router",
    "RoleBinding/assistant-router",
    "Service/assistant-latency",
    "Service/assistant-batch",
    "Service/assistant",
    "PodDisruptionBudget/assistant-latency",
    "PodDisruptionBudget/assistant-batch",
    "PodDisruptionBudget/assistant-router",
    "NetworkPolicy/assistant-engines",
    "Deployment/assistant-latency",
    "Deployment/assistant-latency-canary",
    "Deployment/assistant-batch",
    "Deployment/assistant-batch-canary",
    "Deployment/assistant-router",
}


def test_reconciles_example_to_ready(crd, operator, namespace):
    _apply(crd, _manifest(namespace))
    sd = _ready(crd, namespace)
    children = _children(crd, namespace)
    assert set(children) == EXPECTED_CHILDREN
    for key, child in children.items():
        owners = child["metadata"]["ownerReferences"]
        assert owners == [
            {
                "apiVersion": "specfleet.io/v1alpha1",
                "kind": "SpeculativeDeployment",
                "name": "assistant",
                "uid": sd["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], key
        managers = {m["manager"] for m in child["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert managers == {FIELD_MANAGER}, key
    pods = json.loads(
        crd.kubectl(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=engine", "-o", "json"
        ).stdout
    )["items"]
    assert len(pods) == 4
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert sd["status"]["pools"]["latency"]["readyReplicas"] == 2
    assert sd["status"]["observedGeneration"] == sd["metadata"]["generation"]
    # The routing ConfigMap the router reads names the pool Services.
    routing = json.loads(children["ConfigMap/assistant-routing"]["data"]["routing.json"])
    assert routing["pools"]["batch"]["service"] == "assistant-batch"
    # kubectl get shows the printer columns.
    table = crd.kubectl("get", "sd", "assistant", "-n", namespace).stdout.splitlines()
    assert table[0].split() == PRINTER_COLUMNS
    assert table[1].split()[:7] == ["assistant", "On", "On", "3", "3", "True", "False"]
    assert sd["status"]["pools"]["batch"]["k"] == 3
    # The spec the user wrote is untouched (GitOps sees no drift): no manager but kubectl owns spec.
    full = json.loads(
        crd.kubectl("get", "sd", "assistant", "-n", namespace, "-o", "json", "--show-managed-fields").stdout
    )
    spec_writers = {
        m["manager"]
        for m in full["metadata"]["managedFields"]
        if "f:spec" in json.dumps(m.get("fieldsV1", {}))
    }
    assert FIELD_MANAGER not in spec_writers


def test_no_writes_when_nothing_changed_even_across_restart(crd, operator, namespace):
    _apply(crd, _manifest(namespace))
    _ready(crd, namespace)
    # Let the status settle (the policy's first evaluation included: it records MetricsAvailable,
    # on its own interval's grid), then take a snapshot of every resourceVersion.
    wait_for(
        "the policy's first evaluation",
        lambda: "MetricsAvailable" in _conditions(_get(crd, "sd", "assistant", namespace)),
        timeout=60,
    )
    before = _quiet_snapshot(crd, operator, namespace)
    wait_resyncs(operator, namespace, "assistant", 3)
    assert _snapshot(crd, namespace) == before
    resumed = operator.log().count(RESUMED)
    operator.stop()
    operator.start()
    wait_for("operator resumed", lambda: operator.log().count(RESUMED) > resumed, timeout=60)
    wait_resyncs(operator, namespace, "assistant", 2)  # by the new process: the old one is gone
    assert _snapshot(crd, namespace) == before


def test_changing_one_pool_rolls_only_that_pool(crd, operator, namespace):
    _apply(crd, _manifest(namespace))
    _ready(crd, namespace)
    _quiet_snapshot(crd, operator, namespace)
    before = _spec_versions(_children(crd, namespace))
    _apply(crd, _manifest(namespace, {"spec": {"pools": {"batch": {"engine": {"maxNumSeqs": 64}}}}}))

    def changed():
        now = _spec_versions(_children(crd, namespace))
        diff = {k for k in before if now.get(k) != before[k]}
        return diff if {"Deployment/assistant-batch", "Deployment/assistant-batch-canary"} <= diff else None

    diff = wait_for("batch pool rolled", changed, timeout=60)
    wait_resyncs(operator, namespace, "assistant", 2)  # what would touch the other pool has run
    now = _spec_versions(_children(crd, namespace))
    diff = {k for k in before if now.get(k) != before[k]}
    assert diff == {"Deployment/assistant-batch", "Deployment/assistant-batch-canary"}
    batch = _children(crd, namespace)["Deployment/assistant-batch"]
    assert "64" in batch["spec"]["template"]["spec"]["containers"][0]["args"]
    _ready(crd, namespace)


def _pods(cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    return json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout)["items"]


def _mark_ready(cluster, ns: str, selector: str) -> None:
    for pod in _pods(cluster, ns, selector):
        if (pod["metadata"].get("annotations") or {}).get(READY_ANNOTATION) != "true":
            cluster.kubectl(
                "annotate", "pod", pod["metadata"]["name"], "-n", ns, f"{READY_ANNOTATION}=true", check=False
            )


def test_canaries_come_up_before_their_pool_gives_up_a_replica(crd, operator):
    """A canary scaling moves a replica between two real Deployments: the pool's Deployment keeps its
    replicas until the canary's pod is ready (reconcile.apply.hand_over), so it never serves on fewer."""
    # In an e2e- namespace kwok keeps pods unready until they are annotated ready (as a readiness
    # probe would until vLLM answers), so the test decides when the canary's pod is ready.
    namespace = f"{PROBED_NAMESPACE_PREFIX}handover-{uuid.uuid4().hex[:6]}"
    crd.create_namespace(namespace)
    try:
        _apply(crd, _manifest(namespace))
        wait_for(
            "Ready",
            lambda: (
                (_mark_ready(crd, namespace, "app.kubernetes.io/managed-by=specfleet-operator") or True)
                and _conditions(_get(crd, "sd", "assistant", namespace)).get("Ready", {}).get("status")
                == "True"
            ),
            timeout=120,
        )
        # What the policy writes when it turns the pool off near break-even: Off, one canary.
        status = {"status": {"pools": {"latency": {"speculation": "Off", "canaryReplicas": 1}}}}
        crd.kubectl(
            "patch", "sd", "assistant", "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip
        canary = f"{LABEL_TRACK}=canary,{LABEL_POOL}=latency"
        wait_for("the canary's pod", lambda: _pods(crd, namespace, canary), timeout=60)
        # Several resyncs with the canary unready: the pool's Deployment keeps its 2 replicas.
        wait_resyncs(operator, namespace, "assistant", 3)
        stable = _get(crd, "deployment", "assistant-latency", namespace)
        assert stable is not None
        assert stable["spec"]["replicas"] == 2
        _mark_ready(crd, namespace, canary)
        wait_for(
            "the pool's Deployment at 1 once the canary is ready",
            lambda: (
                ((_get(crd, "deployment", "assistant-latency", namespace) or {}).get("spec") or {}).get(
                    "replicas"
                )
                == 1
            ),
            timeout=60,
        )
    finally:
        crd.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_drift_is_corrected_and_deletion_garbage_collects(crd, operator, namespace):
    _apply(crd, _manifest(namespace))
    _ready(crd, namespace)
    crd.kubectl("scale", "deployment/assistant-latency", "-n", namespace, "--replicas=5")
    crd.kubectl(
        "patch",
        "deployment/assistant-batch",
        "-n",
        namespace,
        "--type=json",
        "-p",
        '[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--enforce-eager"}]',
    )
    crd.kubectl("delete", "configmap/assistant-routing", "-n", namespace)

    def restored():
        kids = _children(crd, namespace)
        latency = kids.get("Deployment/assistant-latency")
        batch = kids.get("Deployment/assistant-batch")
        return (
            "ConfigMap/assistant-routing" in kids
            and latency is not None
            and latency["spec"]["replicas"] == 2
            and batch is not None
            and "--enforce-eager" not in batch["spec"]["template"]["spec"]["containers"][0]["args"]
        )

    wait_for("children restored", restored, timeout=30)
    wait_for_event(crd.kubectl, namespace, "DriftCorrected")

    crd.kubectl("delete", "sd", "assistant", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("children garbage-collected", lambda: _children(crd, namespace) == {}, timeout=60)
    pods = crd.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.strip()
    wait_for(
        "pods gone",
        lambda: crd.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.strip() == "",
        timeout=60,
    )
    assert pods is not None


def test_unrunnable_spec_is_degraded_without_retry_storm(crd, operator, namespace):
    doc = load_yaml(ROOT / "examples" / "05-degraded-old-image.yaml")
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["policy"] = {"prometheus": {"url": NO_PROMETHEUS}}
    _apply(crd, doc)

    def degraded():
        cond = _conditions(_get(crd, "sd", "too-old", namespace)).get("Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for("Degraded=True", degraded, timeout=30)
    assert cond["reason"] == "UnsupportedConfiguration"
    assert "needs vLLM >= 0.8.5" in cond["message"]
    assert _children(crd, namespace) == {}
    rv = _get(crd, "sd", "too-old", namespace)["metadata"]["resourceVersion"]
    log_lines = len(operator.log().splitlines())
    wait_resyncs(operator, namespace, "too-old", 3)
    assert _get(crd, "sd", "too-old", namespace)["metadata"]["resourceVersion"] == rv, (
        "status rewritten in a loop"
    )
    assert operator.alive()
    new_lines = operator.log().splitlines()[log_lines:]
    assert not any("Traceback" in line for line in new_lines)
    warnings = [e for e in events_by_time(crd.kubectl, namespace).splitlines() if "Warning Degraded" in e]
    assert len(warnings) == 1
    # Fixing the spec recovers.
    _apply(
        crd,
        merge(
            doc,
            {
                "spec": {
                    "engine": {"image": "vllm/vllm-openai:v0.32.0"},
                    "pools": {"latency": {"replicas": 1}, "batch": {"replicas": 1}},
                }
            },
        ),
    )
    wait_for(
        "recovered",
        lambda: (
            _conditions(_get(crd, "sd", "too-old", namespace)).get("Degraded", {}).get("status") == "False"
        ),
        timeout=30,
    )


def test_a_child_the_spec_no_longer_wants_is_deleted(crd, operator, namespace):
    _apply(crd, _manifest(namespace))
    _ready(crd, namespace)
    assert "Deployment/assistant-latency-canary" in _children(crd, namespace)
    # Turning the canaries off must remove them: a forgotten canary keeps a GPU and keeps speculating.
    _apply(crd, _manifest(namespace, {"spec": {"policy": {"reentry": {"canaryReplicas": 0}}}}))
    wait_for(
        "canaries pruned",
        lambda: not any(name.endswith("-canary") for name in _children(crd, namespace)),
        timeout=60,
    )
    children = _children(crd, namespace)
    assert "Deployment/assistant-latency" in children
    assert "Deployment/assistant-batch" in children
    wait_for_event(crd.kubectl, namespace, "ChildrenPruned")
    _ready(crd, namespace)


def test_a_pool_the_scheduler_cannot_place_says_why(crd, operator, namespace):
    # Three fake nodes with 8 GPUs each: four 8-GPU engines cannot all be placed, by the real scheduler.
    patch = {
        "spec": {
            "engine": {"resources": {"gpus": 8}},
            "pools": {"latency": {"replicas": 4}, "batch": {"replicas": 0}},
            "policy": {"reentry": {"canaryReplicas": 0}},
        }
    }
    _apply(crd, _manifest(namespace, patch))
    ready = wait_for(
        "Ready=False with the scheduler's reason",
        lambda: (
            (c := _conditions(_get(crd, "sd", "assistant", namespace)).get("Ready", {})).get("reason")
            == "Unschedulable"
            and c
        ),
        timeout=90,
    )
    assert "Insufficient nvidia.com/gpu" in ready["message"]
    assert "latency" in ready["message"]
    wait_for_event(crd.kubectl, namespace, "PoolNotReady")
    # Give the GPUs back before other tests schedule their pods.
    crd.kubectl("delete", "sd", "assistant", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(
        "pods gone",
        lambda: not json.loads(crd.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"],
        timeout=90,
    )


def test_a_drafter_that_does_not_fit_stops_the_pool_with_drafter_incompatible(crd, operator, namespace):
    # kwok plays the pods, so the preflight init container does not really run: the kubelet's report of
    # its failure (the preflight's own stderr as the termination message) is written as the pod status.
    patch = {
        "spec": {
            "pools": {"latency": {"replicas": 1}, "batch": {"replicas": 1}},
            "policy": {"reentry": {"canaryReplicas": 0}},
        }
    }
    _apply(crd, _manifest(namespace, patch))
    _ready(crd, namespace)
    pods = json.loads(
        crd.kubectl("get", "pods", "-n", namespace, "-l", "specfleet.io/pool=latency", "-o", "json").stdout
    )["items"]
    (pod,) = pods
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["drafter-preflight"]
    assert init[0]["command"] == ["python", "-m", "specfleet_runtime.drafter_preflight"]
    line = (
        "DrafterIncompatible: hidden size: the drafter's target_hidden_size is 8192, "
        "the target's hidden_size is 4096"
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "conditions": [
                {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized", "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": "ContainersNotInitialized", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "False", "reason": "ContainersNotInitialized", "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            ],
            "initContainerStatuses": [
                {
                    "name": "drafter-preflight",
                    "image": init[0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 1,
                    "started": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": line + "\n", "startedAt": now, "finishedAt": now}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "image": pod["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": {"reason": "PodInitializing"}},
                }
            ],
        }
    }  # fmt: skip
    crd.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    ready = wait_for(
        "Ready=False with reason DrafterIncompatible",
        lambda: (
            (c := _conditions(_get(crd, "sd", "assistant", namespace)).get("Ready", {})).get("reason")
            == "DrafterIncompatible"
            and c
        ),
        timeout=120,
    )
    assert (
        "the drafter does not fit the target: hidden size: the drafter's target_hidden_size is 8192"
        in (ready["message"])
    )
    assert "latency" in ready["message"]
    wait_for_event(crd.kubectl, namespace, "PoolNotReady")


def test_the_policy_reads_the_cost_profile_config_map_the_spec_names(crd, operator, namespace):
    """Missing: CostProfileLoaded=False with why (read through the operator's real client and RBAC);
    created by `specfleet profile --config-map`'s format: the next evaluation loads it."""
    cluster = crd
    _apply(
        cluster,
        _manifest(namespace, {"spec": {"policy": {"goodput": {"costProfileConfigMap": "gpu-profile"}}}}),
    )

    def condition(status: str):
        def probe():
            cond = _conditions(_get(cluster, "sd", "assistant", namespace)).get("CostProfileLoaded")
            return cond if cond is not None and cond["status"] == status else None

        return probe

    missing = wait_for("CostProfileLoaded=False", condition("False"), timeout=120)
    assert missing["reason"] == "CostProfileUnavailable"
    assert f"ConfigMap {namespace}/gpu-profile" in missing["message"]
    assert "does not exist" in missing["message"]
    profile = {
        "name": "measured-here",
        "batchSizes": [1, 64],
        "numSpeculativeTokens": [0, 1],
        "stepTimeMs": [[5.0, 5.5], [6.0, 7.5]],
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-profile", "namespace": namespace},
        "data": {"profile.yaml": yaml.safe_dump(profile)},
    }
    _apply(cluster, config_map)
    loaded = wait_for("CostProfileLoaded=True", condition("True"), timeout=120)
    assert loaded["reason"] == "ProfileFromConfigMap"
    wait_for_event(cluster.kubectl, namespace, "CostProfileUnavailable")
