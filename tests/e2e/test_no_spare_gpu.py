"""A fleet on a node set with no spare GPU (issue 38): the pool's engines are pinned to a kwok node whose
`nvidia.com/gpu` equals replicas x GPUs per engine, so the real scheduler has nowhere to put a surge
pod. A Surge flip ends Unschedulable and is reverted after `policy.rolloutDeadlineSeconds`; a Replace
flip (maxUnavailable 1) rolls within the pool's own GPUs and completes. Both flips are the policy's own
(an acceptance drop seen by the real Prometheus), under load through the router; no request may fail.

The node is tainted and only these fleets tolerate it, so nothing else of the shared cluster lands
on it, and each test deletes its fleet and then the node.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from specfleet.api.constants import LABEL_INSTANCE, LABEL_POOL
from specfleet_sandbox.load import LoadGenerator
from specfleet_sandbox.processes import wait_for, wait_for_event
from specfleet_testbed.cluster import gpu_node
from support.e2e_env import (
    PUBLISHED_ACCEPTANCE,
    Env,
    engine_args,
    fleet,
    history,
    latency,
    print_dump_if_failed,
    running_env,
    wait_metrics,
    wait_mode,
    wait_settled,
)

pytestmark = pytest.mark.e2e

REPLICAS = 2  # one GPU per engine (the default): the node has exactly these GPUs
NODE_SET_LABEL = "e2e.specfleet.io/node-set"
TAINT_KEY = "e2e.specfleet.io/no-spare-gpu"
# The emulators' acceptance drops to 1.06 tokens per step, below the stop value (1.40): the policy
# turns the pool off by itself.
LOW_ACCEPTANCE = [0.05, 0.01, 0.0]
# The shortest deadline the API allows: a stuck surge is reverted a minute after the flip.
DEADLINE_SECONDS = 60


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory) -> Iterator[Env]:
    with running_env(cluster, tmp_path_factory.mktemp("e2e")) as e:
        yield e


@pytest.fixture(autouse=True)
def dump_on_failure(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_dump_if_failed(env, request)


@pytest.fixture
def full_node(env: Env) -> Iterator[str]:
    """A kwok node with exactly REPLICAS GPUs, tainted so only the test's engines land there; after the
    test, the test's fleets are deleted (their pods leave the node) and the node with them."""
    name = f"nospare-{uuid.uuid4().hex[:6]}"
    node = gpu_node(name, 200, gpus=REPLICAS)
    node["metadata"]["labels"][NODE_SET_LABEL] = name
    node["spec"] = {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]}
    env.kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        wait_for(f"node {name} Ready", lambda: _node_ready(env, name), timeout=60)
        yield name
    finally:
        assert env.runner is not None
        env.runner.set_acceptance(PUBLISHED_ACCEPTANCE)
        env.kubectl("delete", "sd", "--all", "-n", env.namespace, "--wait=true", "--timeout=90s", check=False)
        wait_for(f"no pod left on {name}", lambda: not _pods_on(env, name), timeout=90)
        env.kubectl("delete", "node", name, "--wait=true", "--timeout=60s", check=False)


def _node_ready(env: Env, name: str) -> bool:
    node = json.loads(env.kubectl("get", "node", name, "-o", "json").stdout)
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _pods_on(env: Env, node: str) -> list[str]:
    out = env.kubectl(
        "get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "name", check=False
    ).stdout
    return [line for line in out.splitlines() if line]


def _pinned_fleet(env: Env, name: str, node: str, rollout: dict[str, Any]) -> str:
    """The e2e fleet with REPLICAS latency engines on `node` and the given rollout."""
    patch = {
        "spec": {
            "engine": {
                "nodeSelector": {NODE_SET_LABEL: node},
                "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            },
            "pools": {"latency": {"replicas": REPLICAS, "rollout": rollout}},
            "policy": {"rolloutDeadlineSeconds": DEADLINE_SECONDS},
        }
    }
    return fleet(env, name, patch)


def _engine_pods(env: Env, name: str) -> list[dict[str, Any]]:
    selector = f"{LABEL_INSTANCE}={name},{LABEL_POOL}=latency"
    out = env.kubectl("get", "pods", "-n", env.namespace, "-l", selector, "-o", "json").stdout
    pods: list[dict[str, Any]] = json.loads(out)["items"]
    return [p for p in pods if "deletionTimestamp" not in p["metadata"]]


def _unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message for a pod it could not place (None: placed, or not tried yet)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def _deployment(env: Env, name: str) -> dict[str, Any]:
    out = env.kubectl("get", "deployment", f"{name}-latency", "-n", env.namespace, "-o", "json").stdout
    deploy: dict[str, Any] = json.loads(out)
    return deploy


def _replica_sets(env: Env, name: str) -> list[dict[str, Any]]:
    """The latency Deployment's ReplicaSets (owned by it)."""
    uid = _deployment(env, name)["metadata"]["uid"]
    out = env.kubectl("get", "replicasets", "-n", env.namespace, "-o", "json").stdout
    return [
        rs
        for rs in json.loads(out)["items"]
        if any(o.get("uid") == uid for o in rs["metadata"].get("ownerReferences", []))
    ]


def _rolled_out(env: Env, name: str) -> dict[str, Any] | None:
    """The Deployment once its current template's ReplicaSet runs every replica ready and no other
    ReplicaSet keeps a pod (None before)."""
    deploy = _deployment(env, name)
    status = deploy.get("status") or {}
    replicas = deploy["spec"]["replicas"]
    done = (
        status.get("observedGeneration") == deploy["metadata"]["generation"]
        and status.get("updatedReplicas") == replicas
        and status.get("readyReplicas") == replicas
        and status.get("replicas") == replicas
    )
    return deploy if done else None


def test_surge_flip_without_a_spare_gpu_ends_unschedulable_and_is_reverted(env, full_node):
    name = _pinned_fleet(env, "surge", full_node, {"strategy": "Surge"})
    strategy = _deployment(env, name)["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0, strategy
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        wait_metrics(env, name)
        wait_for(
            "acceptance measured above the resume value",
            lambda: float(latency(env, name).get("acceptanceLength") or 0) > 1.7,
            timeout=60,
        )
        before = {p["metadata"]["name"] for p in _engine_pods(env, name)}
        assert len(before) == REPLICAS
        env.runner.set_acceptance(LOW_ACCEPTANCE)
        off = wait_mode(env, name, "Off", timeout=60)
        assert off["reason"] == "AcceptanceBelowThreshold"
        # Good acceptance again: once reverted, the pool has no reason to flip a second time. The policy
        # holds while the rollout is unsettled (RolloutInProgress), so the revert is the only way back.
        env.runner.set_acceptance(PUBLISHED_ACCEPTANCE)
        # The surge pod finds no GPU: the real scheduler says so, and the resource carries its words.
        pending = wait_for(
            "a surge pod the scheduler cannot place",
            lambda: [p for p in _engine_pods(env, name) if _unschedulable(p)],
            timeout=30,
        )
        assert [p["metadata"]["name"] for p in pending if p["metadata"]["name"] in before] == []
        assert "Insufficient nvidia.com/gpu" in (_unschedulable(pending[0]) or "")
        progressing = wait_for(
            "Progressing=True with reason Unschedulable",
            lambda: (c := env.conditions(name).get("Progressing", {})).get("reason") == "Unschedulable" and c,
            timeout=30,
        )
        assert progressing["status"] == "True"
        assert "Insufficient nvidia.com/gpu" in progressing["message"], progressing
        assert "latency" in progressing["message"], progressing
        assert env.conditions(name)["SpeculationSettled"]["status"] == "False"
        ready = env.conditions(name)["Ready"]
        assert ready["status"] == "True", ready  # only Progressing says why: the old engines still serve
        # The old engines keep serving: both still there and ready while the surge pod waits.
        assert len([p for p in _engine_pods(env, name) if p["metadata"]["name"] in before]) == REPLICAS
        # The deadline passes: the policy undoes its own flip.
        served_while_stuck = load.snapshot().ok
        back = wait_mode(env, name, "On", timeout=DEADLINE_SECONDS + 45)
        assert back["reason"] == "RolloutFailed", back
        assert f"deadline {DEADLINE_SECONDS}s" in back["message"], back
        wait_settled(env, name, timeout=60)
        wait_for_event(env.kubectl, env.namespace, "RolloutFailed")
        assert load.snapshot().ok > served_while_stuck
    finally:
        stats = load.stop()
    entries = env.sd(name)["status"]["history"]
    assert history(env, name) == [("On", "Off"), ("Off", "On")], entries
    assert entries[-1]["reason"] == "RolloutFailed", entries
    # Back on the old template: the surge pod is gone, the engines that served all along remain.
    assert {p["metadata"]["name"] for p in _engine_pods(env, name)} == before
    assert "--speculative-config" in engine_args(env, name)
    assert _rolled_out(env, name) is not None
    assert env.conditions(name)["Progressing"]["status"] == "False"
    # Served before the stuck rollout and after it (above); how many depends on the machine's speed.
    assert served_while_stuck > 0
    assert stats.failed == 0, stats.errors


def test_replace_flip_without_a_spare_gpu_completes_without_failed_requests(env, full_node):
    name = _pinned_fleet(env, "replace", full_node, {"strategy": "Replace", "maxUnavailable": 1})
    strategy = _deployment(env, name)["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}, strategy
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        wait_metrics(env, name)
        wait_for(
            "acceptance measured above the resume value",
            lambda: float(latency(env, name).get("acceptanceLength") or 0) > 1.7,
            timeout=60,
        )
        before = {p["metadata"]["name"] for p in _engine_pods(env, name)}
        old_sets = {rs["metadata"]["name"] for rs in _replica_sets(env, name)}
        assert len(before) == REPLICAS
        assert "--speculative-config" in engine_args(env, name)
        env.runner.set_acceptance(LOW_ACCEPTANCE)
        off = wait_mode(env, name, "Off", timeout=60)
        assert off["reason"] == "AcceptanceBelowThreshold"
        served_at_flip = load.snapshot().ok
        # Two engines, one at a time, each waiting for its predecessor's GPU: well inside the deadline.
        wait_settled(env, name, timeout=DEADLINE_SECONDS - 10)
        deploy = wait_for("the new ReplicaSet fully ready", lambda: _rolled_out(env, name), timeout=30)
        # The pool answers after the flip too (during it, whether a request ends inside a rollout of a
        # few seconds is the machine's timing; that none failed is asserted below).
        wait_for("requests completed after the flip", lambda: load.snapshot().ok > served_at_flip, timeout=60)
    finally:
        stats = load.stop()
    assert latency(env, name)["speculation"] == "Off"
    assert history(env, name) == [("On", "Off")], env.sd(name)["status"]["history"]
    assert "--speculative-config" not in engine_args(env, name)
    assert "--speculative-config" not in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    # Every engine was replaced, by a new ReplicaSet that now runs them all.
    after = {p["metadata"]["name"] for p in _engine_pods(env, name)}
    assert len(after) == REPLICAS
    assert after.isdisjoint(before), (before, after)
    current = [rs for rs in _replica_sets(env, name) if rs["metadata"]["name"] not in old_sets]
    assert len(current) == 1, [rs["metadata"]["name"] for rs in _replica_sets(env, name)]
    assert (current[0].get("status") or {}).get("readyReplicas") == REPLICAS
    assert all(
        rs["spec"]["replicas"] == 0 for rs in _replica_sets(env, name) if rs["metadata"]["name"] in old_sets
    )
    assert env.conditions(name)["Ready"]["status"] == "True"
    # Served before the flip and during the dip (above); how many depends on the machine's speed.
    assert served_at_flip > 0
    assert stats.failed == 0, stats.errors
