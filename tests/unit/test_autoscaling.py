"""Autoscaled pools: what is rendered (HPA or ScaledObject, Deployments without replicas) and how
reconcile hands the replica count over to the autoscaler and reads it back (in-memory cluster; the
cluster tier checks the same against a real apiserver and controller-manager)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.constants import FIELD_MANAGER, HANDOVER_MANAGER
from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.reconcile import reconcile
from specfleet.reconcile.children import owns_replicas
from specfleet.render import MANAGED_KINDS, plan_of, render_children
from specfleet.render.autoscaling import HPA_METRIC_NAMES, keda_query
from support.fake_cluster import FakeCluster
from support.manifests import ROOT, load_yaml, merge

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TWO_POOLS = ROOT / "examples" / "02-two-pools-routing-policy.yaml"
HPA = {"minReplicas": 2, "maxReplicas": 6, "metric": "RunningRequests", "target": 24}
KEDA = {"kind": "ScaledObject", "minReplicas": 1, "maxReplicas": 4, "metric": "KVCacheUsage", "target": 80}


def _doc(latency=None, batch=None, generation=1, status=None):
    doc = load_yaml(TWO_POOLS)
    doc["metadata"].update(uid="uid-1", generation=generation)
    pools = {"latency": {"autoscaling": latency}, "batch": {"autoscaling": batch}}
    doc = merge(doc, {"spec": {"pools": pools}})
    if status is not None:
        doc["status"] = status
    return doc


def _by_key(children):
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def _render(latency=None, batch=None, modes=("On", "On")):
    sd = parse_resource(_doc(latency, batch))
    return _by_key(render_children(sd, plan_of({"latency": modes[0], "batch": modes[1]})))


def test_hpa_targets_the_stable_deployment_on_a_pods_metric():
    children = _render(latency=HPA)
    hpa = children[("HorizontalPodAutoscaler", "assistant-latency")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "assistant-latency",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_running"},
                "target": {"type": "AverageValue", "averageValue": "24"},
            },
        }
    ]
    # Owned and labelled like every child, so prune finds it.
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert hpa["metadata"]["labels"]["app.kubernetes.io/instance"] == "assistant"
    assert ("autoscaling/v2", "HorizontalPodAutoscaler") in MANAGED_KINDS
    assert not any(k == "HorizontalPodAutoscaler" and n == "assistant-batch" for k, n in children)


def test_kv_cache_percent_becomes_the_fraction_vllm_reports():
    hpa = _render(latency={**HPA, "metric": "KVCacheUsage", "target": 80})[
        ("HorizontalPodAutoscaler", "assistant-latency")
    ]
    target = hpa["spec"]["metrics"][0]["pods"]
    assert target["metric"]["name"] == HPA_METRIC_NAMES["KVCacheUsage"] == "vllm_kv_cache_usage_perc"
    assert target["target"]["averageValue"] == "800m"  # 0.8 of vLLM's 0-1 gauge


def test_scaled_object_queries_the_policys_prometheus_for_the_stable_track():
    children = _render(batch=KEDA)
    so = children[("ScaledObject", "assistant-batch")]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["scaleTargetRef"]["name"] == "assistant-batch"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 4)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
        "query": '100 * sum(vllm:kv_cache_usage_perc{namespace="inference",specfleet_io_deployment='
        '"assistant",specfleet_io_pool="batch",specfleet_io_track="stable"})',
        "threshold": "80",
    }
    assert ("keda.sh/v1alpha1", "ScaledObject") in MANAGED_KINDS
    sd = parse_resource(_doc())
    assert keda_query(sd, "latency", "WaitingRequests").startswith("sum(vllm:num_requests_waiting{")


@pytest.mark.parametrize("modes", [("On", "On"), ("Off", "Off")])
def test_autoscaled_stable_deployment_has_no_replicas_but_canaries_keep_theirs(modes):
    children = _render(latency=HPA, modes=modes)
    assert "replicas" not in children[("Deployment", "assistant-latency")]["spec"]
    canary = children[("Deployment", "assistant-latency-canary")]
    assert canary["spec"]["replicas"] == (1 if modes[0] == "Off" else 0)
    # The fixed pool still renders its count (less its canary while off).
    assert children[("Deployment", "assistant-batch")]["spec"]["replicas"] == (2 if modes[1] == "On" else 1)


def test_autoscaled_pdb_allows_one_disruption_at_any_count():
    children = _render(latency=HPA)
    assert children[("PodDisruptionBudget", "assistant-latency")]["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in children[("PodDisruptionBudget", "assistant-latency")]["spec"]
    assert children[("PodDisruptionBudget", "assistant-batch")]["spec"]["minAvailable"] == 1


def test_canaries_of_an_autoscaled_pool_are_bounded_by_max_replicas():
    # replicas (1) no longer bounds the canaries of an autoscaled pool: maxReplicas does.
    doc = merge(_doc(latency=HPA), {"spec": {"pools": {"latency": {"replicas": 1}}}})
    parse_resource(doc)
    doc = merge(
        doc, {"spec": {"policy": {"reentry": {"canaryReplicas": 6}}, "pools": {"batch": {"replicas": 9}}}}
    )
    with pytest.raises(InvalidResourceError, match=r"autoscaling\.maxReplicas when autoscaled"):
        parse_resource(doc)


def _deployment(cluster, name="assistant-latency"):
    return cluster.objects[("Deployment", "inference", name)]


def test_turning_autoscaling_on_hands_the_live_count_over_then_a_scale_survives():
    cluster = FakeCluster()
    first = reconcile(_doc(), cluster, NOW)
    cluster.roll_out()
    status = reconcile(_doc(status=first.status), cluster, NOW).status
    assert _deployment(cluster)["spec"]["replicas"] == 3
    assert owns_replicas(_deployment(cluster), FIELD_MANAGER)

    # Autoscaling on: a plain apply without replicas would reset them to 1; the hand-over keeps 3.
    result = reconcile(_doc(latency=HPA, generation=2, status=status), cluster, NOW + timedelta(seconds=5))
    assert "handover Deployment/assistant-latency" in cluster.writes
    assert "HorizontalPodAutoscaler/assistant-latency" in result.applied
    live = _deployment(cluster)
    assert live["spec"]["replicas"] == 3
    assert not owns_replicas(live, FIELD_MANAGER)
    assert owns_replicas(live, HANDOVER_MANAGER)

    # The autoscaler scales to 5 (an update of the scale subresource): resyncs write nothing and
    # report the new count.
    cluster.scale("inference", "assistant-latency", 5)
    cluster.roll_out()
    cluster.writes.clear()
    status = result.status
    for i in range(3):
        status = reconcile(
            _doc(latency=HPA, generation=2, status=status), cluster, NOW + timedelta(seconds=10 + i)
        ).status
    assert cluster.writes == []
    assert _deployment(cluster)["spec"]["replicas"] == 5
    pool = status["pools"]["latency"]
    assert (pool["desiredReplicas"], pool["readyReplicas"], pool["settled"]) == (5, 5, True)
    cond = {c["type"]: c for c in status["conditions"]}
    assert cond["Ready"]["status"] == "True"


def test_an_autoscaled_pool_flips_and_keeps_the_autoscalers_count():
    cluster = FakeCluster()
    status = reconcile(_doc(latency=HPA), cluster, NOW).status
    cluster.scale("inference", "assistant-latency", 4)
    cluster.roll_out()
    status = reconcile(_doc(latency=HPA, status=status), cluster, NOW).status
    # The pool flips off (pinned in the spec here; the policy's flip renders the same way).
    doc = merge(
        _doc(latency=HPA, generation=2, status=status),
        {"spec": {"pools": {"latency": {"speculation": "Off"}}}},
    )
    result = reconcile(doc, cluster, NOW + timedelta(seconds=5))
    assert "Deployment/assistant-latency" in result.applied
    live = _deployment(cluster)
    assert live["spec"]["replicas"] == 4
    assert live["metadata"]["labels"]["specfleet.io/speculation"] == "Off"
    # Rolling: not settled until the new template runs on the autoscaler's 4, so the policy waits and
    # the partial-metrics rule expects no count yet.
    assert result.status["pools"]["latency"]["settled"] is False
    cluster.roll_out()
    after = reconcile(merge(doc, {"status": result.status}), cluster, NOW + timedelta(seconds=9)).status
    assert (after["pools"]["latency"]["desiredReplicas"], after["pools"]["latency"]["settled"]) == (4, True)


def test_a_scale_up_short_of_ready_engines_is_not_ready_until_they_are():
    cluster = FakeCluster()
    status = reconcile(_doc(latency=HPA), cluster, NOW).status
    cluster.scale("inference", "assistant-latency", 2)
    cluster.roll_out()
    status = reconcile(_doc(latency=HPA, status=status), cluster, NOW).status
    assert {c["type"]: c for c in status["conditions"]}["Ready"]["status"] == "True"
    cluster.scale("inference", "assistant-latency", 4)  # new pods not ready yet
    status = reconcile(_doc(latency=HPA, status=status), cluster, NOW).status
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "False"
    assert "latency 2/4" in ready["message"]
    assert status["pools"]["latency"]["settled"] is False


def test_turning_autoscaling_off_prunes_the_autoscaler_and_owns_replicas_again():
    cluster = FakeCluster()
    status = reconcile(_doc(latency=HPA, batch=KEDA), cluster, NOW).status
    cluster.scale("inference", "assistant-latency", 5)
    cluster.roll_out()
    status = reconcile(_doc(latency=HPA, batch=KEDA, status=status), cluster, NOW).status
    assert ("ScaledObject", "inference", "assistant-batch") in cluster.objects
    result = reconcile(_doc(generation=2, status=status), cluster, NOW + timedelta(seconds=5))
    assert "HorizontalPodAutoscaler/assistant-latency" not in result.applied
    assert set(cluster.writes) >= {
        "delete HorizontalPodAutoscaler/assistant-latency",
        "delete ScaledObject/assistant-batch",
    }
    assert _deployment(cluster)["spec"]["replicas"] == 3
    assert owns_replicas(_deployment(cluster), FIELD_MANAGER)


def _conditions(status):
    return {c["type"]: c for c in status["conditions"]}


def test_autoscaling_active_comes_from_the_autoscalers_own_conditions():
    cluster = FakeCluster()
    status = reconcile(_doc(latency=HPA, batch=KEDA), cluster, NOW).status
    cond = _conditions(status)["AutoscalingActive"]
    assert (cond["status"], cond["reason"]) == ("Unknown", "AutoscalerPending")
    assert "latency: the HorizontalPodAutoscaler has not reported ScalingActive yet" in cond["message"]

    hpa = cluster.objects[("HorizontalPodAutoscaler", "inference", "assistant-latency")]
    so = cluster.objects[("ScaledObject", "inference", "assistant-batch")]
    hpa["status"] = {
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
            {
                "type": "ScalingActive",
                "status": "False",
                "reason": "FailedGetPodsMetric",
                "message": "unable to get metric vllm_num_requests_running: no custom metrics API",
            },
        ]
    }
    so["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "ScaledObjectReady"}]}
    status = reconcile(_doc(latency=HPA, batch=KEDA, status=status), cluster, NOW).status
    cond = _conditions(status)["AutoscalingActive"]
    assert (cond["status"], cond["reason"]) == ("False", "FailedGetPodsMetric")
    assert (
        "latency: HorizontalPodAutoscaler ScalingActive=False (FailedGetPodsMetric): unable to get metric"
        in (cond["message"])
    )
    assert "batch" not in cond["message"]

    hpa["status"]["conditions"][1].update(status="True", reason="ValidMetricFound", message="")
    status = reconcile(_doc(latency=HPA, batch=KEDA, status=status), cluster, NOW).status
    cond = _conditions(status)["AutoscalingActive"]
    assert (cond["status"], cond["reason"]) == ("True", "AutoscalersActive")

    # No autoscaled pool left: the condition goes (a stale one would describe nothing).
    status = reconcile(_doc(generation=2, status=status), cluster, NOW).status
    assert "AutoscalingActive" not in _conditions(status)


def test_a_first_reconcile_reads_an_autoscaled_deployment_it_may_already_own():
    # A resource re-created over children it owned (or whose status was lost): its first reconcile
    # must not reset a live count it still owns.
    cluster = FakeCluster()
    reconcile(_doc(), cluster, NOW)
    assert _deployment(cluster)["spec"]["replicas"] == 3
    reconcile(_doc(latency={**HPA, "minReplicas": 1}), cluster, NOW)  # no status: "never reconciled"
    assert _deployment(cluster)["spec"]["replicas"] == 3
    assert "handover Deployment/assistant-latency" in cluster.writes
