"""A pool's engines' start-up, from pod shapes the apiserver returns, kept in status by the reconcile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from specfleet.reconcile import reconcile
from specfleet.reconcile.pod_startup import pod_startup_seconds, pool_startup_seconds
from support.fake_cluster import FakeCluster
from support.manifests import ROOT, load_yaml

CREATED = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(
    name: str, ready_after: float | None, *, restarts: int = 0, ready: str = "True", pool: str = "latency"
) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp(CREATED)}]
    if ready_after is not None:
        at = CREATED + timedelta(seconds=ready_after)
        conditions.append({"type": "Ready", "status": ready, "lastTransitionTime": _stamp(at)})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "inference",
            "creationTimestamp": _stamp(CREATED),
            "labels": {
                "app.kubernetes.io/instance": "assistant",
                "app.kubernetes.io/managed-by": "specfleet-operator",
                "specfleet.io/pool": pool,
            },
        },
        "status": {
            "conditions": conditions,
            "containerStatuses": [{"name": "vllm", "restartCount": restarts, "ready": ready == "True"}],
        },
    }


def test_a_ready_pod_started_in_creation_to_ready() -> None:
    assert pod_startup_seconds(_pod("a", 95)) == 95.0


def test_pods_not_ready_or_restarted_are_left_out() -> None:
    assert pod_startup_seconds(_pod("starting", None)) is None
    assert pod_startup_seconds(_pod("unready", 40, ready="False")) is None
    assert pod_startup_seconds(_pod("crashed", 400, restarts=1)) is None
    assert pool_startup_seconds([_pod("a", 90), _pod("b", None), _pod("c", 900, restarts=2)]) == 90


def test_the_median_of_the_ready_pods_so_one_slow_node_does_not_set_it() -> None:
    assert pool_startup_seconds([_pod("a", 60), _pod("b", 70), _pod("c", 600)]) == 70
    assert pool_startup_seconds([_pod("a", 60), _pod("b", 71)]) == 66  # 65.5, rounded to even


def test_no_pods_or_no_times_measure_nothing() -> None:
    assert pool_startup_seconds([]) is None
    assert pool_startup_seconds([{"metadata": {}, "status": {}}]) is None
    odd = _pod("a", 60)
    odd["metadata"]["creationTimestamp"] = "not a time"
    assert pool_startup_seconds([odd]) is None


def test_the_reconcile_keeps_the_measured_start_up_in_status_and_lists_pods_only_until_it_has_one() -> None:
    cluster = FakeCluster()
    body = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    body["metadata"].update(uid="uid-1", generation=1)
    now = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)
    first = reconcile(body, cluster, now)
    cluster.roll_out()
    for pod in (
        _pod("assistant-latency-a", 80),
        _pod("assistant-latency-b", 100),
        _pod("assistant-batch-a", 250, pool="batch"),
    ):
        cluster.objects[("Pod", "inference", pod["metadata"]["name"])] = pod
    second = reconcile({**body, "status": first.status}, cluster, now + timedelta(seconds=30))
    assert second.status["pools"]["latency"]["startupSeconds"] == 90
    assert second.status["pools"]["batch"]["startupSeconds"] == 250

    # Settled and measured: the pods are not listed again, and the measurement is kept.
    listed: list[dict[str, str]] = []
    list_children = cluster.list_children

    def counting(api_version: str, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        listed.append(labels)
        return list_children(api_version, kind, namespace, labels)

    cluster.list_children = counting  # type: ignore[method-assign]
    third = reconcile({**body, "status": second.status}, cluster, now + timedelta(seconds=60))
    assert listed == []
    assert third.status["pools"]["latency"]["startupSeconds"] == 90
