"""reconcile() against the in-memory cluster: idempotence, drift repair, status and Degraded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api import reasons
from specfleet.reconcile import reconcile, status_patch
from support.fake_cluster import FakeCluster, merge_patch
from support.manifests import ROOT, load_yaml, merge

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
EXAMPLE = ROOT / "examples" / "02-two-pools-routing-policy.yaml"


def _body(patch=None, status=None, generation=1):
    doc = load_yaml(EXAMPLE)
    doc["metadata"].update(uid="uid-1", generation=generation)
    if patch:
        doc = merge(doc, patch)
    if status is not None:
        doc["status"] = status
    return doc


def _conditions(status):
    return {c["type"]: c for c in status["conditions"]}


@pytest.fixture
def cluster():
    return FakeCluster()


def test_first_reconcile_applies_every_child_and_reports_progress(cluster):
    result = reconcile(_body(), cluster, NOW)
    # 15 children, plus the engines' NetworkPolicy and the router's PodDisruptionBudget (2 routers).
    assert len(result.applied) == 17
    assert len(cluster.objects) == 17
    cond = _conditions(result.status)
    assert cond["Ready"]["status"] == "False"
    assert cond["Progressing"]["status"] == "True"
    assert cond["Degraded"]["status"] == "False"
    assert all(c["observedGeneration"] == 1 for c in cond.values())
    assert result.status["pools"]["latency"]["speculation"] == "On"
    assert [e.reason for e in result.events] == ["ChildrenApplied"]


def test_second_reconcile_writes_nothing_and_status_settles(cluster):
    first = reconcile(_body(), cluster, NOW)
    cluster.roll_out()
    cluster.writes.clear()
    second = reconcile(_body(status=first.status), cluster, NOW + timedelta(seconds=30))
    assert cluster.writes == []
    assert second.applied == []
    cond = _conditions(second.status)
    assert cond["Ready"]["status"] == "True"
    assert cond["Progressing"]["status"] == "False"
    assert second.status["pools"]["latency"]["readyReplicas"] == 3
    assert second.status["pools"]["latency"]["settled"] is True
    third = reconcile(_body(status=second.status), cluster, NOW + timedelta(seconds=60))
    assert status_patch(second.status, third.status) == {}
    assert third.events == []


def test_transition_time_kept_when_status_unchanged(cluster):
    first = reconcile(_body(), cluster, NOW)
    later = reconcile(_body(status=first.status), cluster, NOW + timedelta(minutes=5))
    t1 = _conditions(first.status)["Degraded"]["lastTransitionTime"]
    assert _conditions(later.status)["Degraded"]["lastTransitionTime"] == t1


def test_hand_edited_child_is_restored(cluster):
    first = reconcile(_body(), cluster, NOW)
    cluster.roll_out()
    deploy = cluster.objects[("Deployment", "inference", "assistant-latency")]
    deploy["spec"]["replicas"] = 7
    deploy["spec"]["template"]["spec"]["containers"][0]["args"].append("--enforce-eager")
    cluster.writes.clear()
    result = reconcile(_body(status=first.status), cluster, NOW)
    assert cluster.writes == ["Deployment/assistant-latency"]
    assert cluster.objects[("Deployment", "inference", "assistant-latency")]["spec"]["replicas"] == 3
    assert any(e.reason == "DriftCorrected" for e in result.events)


def test_deleted_child_is_recreated(cluster):
    first = reconcile(_body(), cluster, NOW)
    cluster.delete("ConfigMap", "inference", "assistant-routing")
    cluster.writes.clear()
    result = reconcile(_body(status=first.status), cluster, NOW)
    assert cluster.writes == ["ConfigMap/assistant-routing"]
    assert any(e.reason == "DriftCorrected" for e in result.events)


def test_changing_one_pool_rewrites_only_that_pool(cluster):
    first = reconcile(_body(), cluster, NOW)
    cluster.writes.clear()
    patch = {"spec": {"pools": {"batch": {"engine": {"maxNumSeqs": 128}}}}}
    reconcile(_body(patch=patch, status=first.status, generation=2), cluster, NOW)
    assert cluster.writes == ["Deployment/assistant-batch", "Deployment/assistant-batch-canary"]


def test_auto_pool_follows_the_mode_in_status(cluster):
    status = {"pools": {"latency": {"speculation": "Off"}, "batch": {"speculation": "On"}}}
    reconcile(_body(status=status), cluster, NOW)
    latency = cluster.objects[("Deployment", "inference", "assistant-latency")]
    assert "--speculative-config" not in latency["spec"]["template"]["spec"]["containers"][0]["args"]


def test_pinned_pool_ignores_status(cluster):
    status = {"pools": {"latency": {"speculation": "Off"}}}
    result = reconcile(
        _body(patch={"spec": {"pools": {"latency": {"speculation": "On"}}}}, status=status), cluster, NOW
    )
    assert result.status["pools"]["latency"]["speculation"] == "On"


def test_unrunnable_spec_is_degraded_without_writes(cluster):
    body = _body(patch={"spec": {"engine": {"image": "vllm/vllm-openai:v0.6.0"}}})
    result = reconcile(body, cluster, NOW)
    assert cluster.writes == []
    cond = _conditions(result.status)
    assert cond["Degraded"]["status"] == "True"
    assert cond["Degraded"]["reason"] == "UnsupportedConfiguration"
    assert "needs vLLM >= 0.8.5" in cond["Degraded"]["message"]
    link = reasons.troubleshooting_url(reasons.UNSUPPORTED_CONFIGURATION)
    assert cond["Degraded"]["message"].endswith(f"(see {link})")
    assert cond["Ready"]["status"] == "False"
    assert [(e.type, e.message) for e in result.events] == [("Warning", cond["Degraded"]["message"])]
    # The same spec again: no new event, no status change (no hot loop of writes).
    again = reconcile({**body, "status": result.status}, cluster, NOW + timedelta(minutes=1))
    assert again.events == []
    assert status_patch(result.status, again.status) == {}


def test_conflicting_overrides_are_degraded(cluster):
    patch = {
        "spec": {"pools": {"batch": {"engine": {"extraArgs": ["--port=9000"], "tensorParallelSize": 2}}}}
    }
    result = reconcile(_body(patch=patch), cluster, NOW)
    message = _conditions(result.status)["Degraded"]["message"]
    assert "extraArgs sets --port" in message
    assert "tensorParallelSize 2 needs 2 GPUs" in message
    assert cluster.writes == []


def test_invalid_spec_is_degraded_not_raised(cluster):
    body = _body(patch={"spec": {"drafter": {"numSpeculativeTokens": 99}}})
    result = reconcile(body, cluster, NOW)
    cond = _conditions(result.status)["Degraded"]
    assert cond["reason"] == "InvalidSpec"
    assert "less than or equal to 10" in cond["message"]


def test_recovery_from_degraded_emits_event(cluster):
    bad = reconcile(_body(patch={"spec": {"engine": {"image": "vllm/vllm-openai:v0.6.0"}}}), cluster, NOW)
    good = reconcile(_body(status=bad.status, generation=2), cluster, NOW)
    assert _conditions(good.status)["Degraded"]["status"] == "False"
    assert "Recovered" in [e.reason for e in good.events]


def test_rejected_child_reports_apply_failed_but_applies_the_rest(cluster):
    cluster.reject_kinds.add("PodMonitor")
    result = reconcile(_body(), cluster, NOW)
    cond = _conditions(result.status)["Degraded"]
    assert cond["status"] == "True"
    assert cond["reason"] == "ApplyFailed"
    assert "PodMonitor/assistant" in cond["message"]
    assert cond["message"].endswith(f"(see {reasons.troubleshooting_url(reasons.APPLY_FAILED)})")
    assert len(cluster.objects) == 16
    assert [e.message for e in result.events if e.reason == "Degraded"] == [cond["message"]]
    # Still refused at the next resync: the condition keeps its message and no new Event is sent.
    again = reconcile(_body(status=result.status), cluster, NOW + timedelta(minutes=1))
    assert [e for e in again.events if e.reason == "Degraded"] == []


def test_status_patch_only_changed_keys():
    assert status_patch({"a": 1, "b": [1]}, {"a": 1, "b": [2]}) == {"b": [2]}
    assert status_patch(None, {"a": 1}) == {"a": 1}


def test_status_patch_deletes_fields_status_no_longer_has():
    # A merge patch keeps what it leaves out: a field unset in status is sent as null.
    current = {
        "pools": {"latency": {"k": 2, "unscrapedEvaluations": 3, "rollout": {"time": "t", "reason": "r"}}}
    }
    desired = {"pools": {"latency": {"k": 2, "rollout": {"time": "t"}}, "batch": {"k": 0}}}
    patch = status_patch(current, desired)
    assert patch == {
        "pools": {
            "latency": {"k": 2, "rollout": {"time": "t", "reason": None}, "unscrapedEvaluations": None},
            "batch": {"k": 0},
        }
    }
    assert merge_patch(current, patch) == desired


def test_desired_state_is_pure_and_matches_what_reconcile_applies(cluster):
    from specfleet.api.validation import parse_resource
    from specfleet.reconcile import decided_plan, desired_state
    from specfleet.render import render_children

    body = _body()
    desired = desired_state(body, NOW)
    assert desired.stopped is None
    assert desired.children == render_children(parse_resource(body), decided_plan(parse_resource(body)))
    assert cluster.writes == []  # nothing touched the cluster
    reconcile(body, cluster, NOW)
    assert sorted(cluster.writes) == sorted(f"{c['kind']}/{c['metadata']['name']}" for c in desired.children)


def test_a_typed_status_decides_the_render_without_a_serialized_round_trip(cluster):
    from specfleet.api.validation import parse_resource
    from specfleet.reconcile import decided_plan, desired_state
    from specfleet.render import PoolPlan

    body = _body()
    sd = parse_resource(body)
    flipped = sd.status.model_copy(
        update={
            "pools": sd.status.pools.model_copy(
                update={"latency": sd.status.pools.latency.model_copy(update={"speculation": "Off"})}
            )
        }
    )
    # The body's own status still says On; the typed status given wins.
    assert decided_plan(sd, flipped)["latency"] == PoolPlan("Off")
    desired = desired_state(body, NOW, status=flipped)
    latency = next(
        c
        for c in desired.children
        if (c["kind"], c["metadata"]["name"]) == ("Deployment", "assistant-latency")
    )
    assert "--speculative-config" not in latency["spec"]["template"]["spec"]["containers"][0]["args"]
    result = reconcile(body, cluster, NOW, status=flipped)
    assert result.status["pools"]["latency"]["speculation"] == "Off"


def test_degraded_resource_has_no_desired_children():
    from specfleet.reconcile import desired_state

    desired = desired_state(_body({"spec": {"engine": {"image": "vllm/vllm-openai:v0.6.0"}}}), NOW)
    assert desired.children == []
    assert desired.stopped is not None
    assert _conditions(desired.stopped.status)["Degraded"]["reason"] == "UnsupportedConfiguration"


def _names(cluster, kind):
    return sorted(name for (k, _, name) in cluster.objects if k == kind)


def test_children_the_spec_no_longer_wants_are_pruned_on_the_spec_change(cluster):
    first = reconcile(_body(), cluster, NOW)
    assert "assistant-latency-canary" in _names(cluster, "Deployment")
    assert _names(cluster, "PodMonitor") == ["assistant"]
    # A look-alike with our labels but another owner must survive the prune.
    stranger = dict(cluster.objects[("Deployment", "inference", "assistant-batch-canary")])
    stranger = {**stranger, "metadata": {**stranger["metadata"], "name": "assistant-other"}}
    stranger["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    cluster.objects[("Deployment", "inference", "assistant-other")] = stranger
    cluster.roll_out()
    assert _names(cluster, "NetworkPolicy") == ["assistant-engines"]
    assert "assistant-router" in _names(cluster, "PodDisruptionBudget")
    patch = {
        "spec": {
            "policy": {"reentry": {"canaryReplicas": 0}},
            "monitoring": {"podMonitor": False},
            "networkPolicy": {"enabled": False},
            "routing": {"router": {"replicas": 1}},
        }
    }
    second = reconcile(_body(patch, status=first.status, generation=2), cluster, NOW + timedelta(seconds=30))
    assert _names(cluster, "NetworkPolicy") == []
    assert _names(cluster, "PodDisruptionBudget") == ["assistant-batch", "assistant-latency"]
    assert "assistant-latency-canary" not in _names(cluster, "Deployment")
    assert "assistant-batch-canary" not in _names(cluster, "Deployment")
    assert "assistant-other" in _names(cluster, "Deployment")
    assert _names(cluster, "PodMonitor") == []
    pruned = [e for e in second.events if e.reason == "ChildrenPruned"]
    assert len(pruned) == 1
    assert "Deployment/assistant-latency-canary" in pruned[0].message
    assert "PodMonitor/assistant" in pruned[0].message
    assert "NetworkPolicy/assistant-engines" in pruned[0].message
    assert "PodDisruptionBudget/assistant-router" in pruned[0].message


def test_no_prune_without_a_spec_change(cluster):
    first = reconcile(_body(), cluster, NOW)
    cluster.roll_out()
    extra = dict(cluster.objects[("Service", "inference", "assistant-latency")])
    extra = {**extra, "metadata": {**extra["metadata"], "name": "assistant-left-over"}}
    cluster.objects[("Service", "inference", "assistant-left-over")] = extra
    reconcile(_body(status=first.status), cluster, NOW + timedelta(seconds=30))
    assert "assistant-left-over" in _names(cluster, "Service"), (
        "a resync with the same generation lists nothing"
    )


def test_status_k_is_what_each_pool_drafts_now(cluster):
    # kubectl's K column reads status.pools.<pool>.k: the policy's K where it chose one, else the drafter's,
    # 0 for a pool that does not speculate.
    status = {
        "pools": {
            "latency": {"speculation": "On", "numSpeculativeTokens": 2},
            "batch": {"speculation": "Off"},
        }
    }
    result = reconcile(_body(status=status), cluster, NOW)
    assert result.status["pools"]["latency"]["k"] == 2
    assert result.status["pools"]["batch"]["k"] == 0
    on = {"pools": {"latency": {"speculation": "On"}, "batch": {"speculation": "On"}}}
    result = reconcile(_body(status=on), cluster, NOW)
    assert [result.status["pools"][p]["k"] for p in ("latency", "batch")] == [3, 3]


def _replicas(cluster, name):
    return cluster.objects[("Deployment", "inference", name)]["spec"]["replicas"]


def _settled_status(cluster):
    first = reconcile(_body(), cluster, NOW)
    cluster.roll_out()
    return reconcile(_body(status=first.status), cluster, NOW + timedelta(seconds=30)).status


def test_canaries_coming_up_start_before_the_pool_gives_a_replica_up(cluster):
    status = _settled_status(cluster)
    # The policy turns the latency pool off; its one canary keeps speculating.
    status["pools"]["latency"]["speculation"] = "Off"
    status["pools"]["latency"]["canaryReplicas"] = 1
    flipping = reconcile(_body(status=status), cluster, NOW + timedelta(minutes=1)).status
    assert _replicas(cluster, "assistant-latency-canary") == 1
    # Held at its 3 until the canary is ready (applied at 2 the old pod would stop at once).
    assert _replicas(cluster, "assistant-latency") == 3
    assert flipping["pools"]["latency"]["settled"] is False
    # Nothing ready yet: still held on the next reconcile.
    again = reconcile(_body(status=flipping), cluster, NOW + timedelta(minutes=1, seconds=30)).status
    assert _replicas(cluster, "assistant-latency") == 3
    cluster.roll_out()
    released = reconcile(_body(status=again), cluster, NOW + timedelta(minutes=2)).status
    assert _replicas(cluster, "assistant-latency") == 2
    assert released["pools"]["latency"]["settled"] is False  # the stable one is now giving one up
    cluster.roll_out()
    done = reconcile(_body(status=released), cluster, NOW + timedelta(minutes=3)).status
    assert done["pools"]["latency"]["settled"] is True
    assert done["pools"]["latency"]["readyReplicas"] == 3


def _through(cluster, status, minute):
    """Reconcile `status`, then roll out and reconcile twice (a hand-over takes two): settled again."""
    for m in range(3):
        if m:
            cluster.roll_out()
        status = reconcile(_body(status=status), cluster, NOW + timedelta(minutes=minute + m)).status
    return status


def test_canaries_going_down_stop_only_once_the_pool_has_its_replica_back(cluster):
    status = _settled_status(cluster)
    status["pools"]["latency"]["speculation"] = "Off"
    status["pools"]["latency"]["canaryReplicas"] = 1
    off = _through(cluster, status, 1)
    assert (_replicas(cluster, "assistant-latency"), _replicas(cluster, "assistant-latency-canary")) == (2, 1)
    # Far past break-even: the policy scales the canary down.
    off["pools"]["latency"]["canaryReplicas"] = 0
    down = reconcile(_body(status=off), cluster, NOW + timedelta(minutes=4)).status
    assert _replicas(cluster, "assistant-latency") == 3
    assert _replicas(cluster, "assistant-latency-canary") == 1  # held until the pool's third is ready
    cluster.roll_out()
    down = reconcile(_body(status=down), cluster, NOW + timedelta(minutes=5)).status
    assert _replicas(cluster, "assistant-latency-canary") == 0
    cluster.roll_out()
    down = reconcile(_body(status=down), cluster, NOW + timedelta(minutes=6)).status
    assert down["pools"]["latency"]["settled"] is True
    # A pool turning back on also keeps its canary until its own three new pods are ready.
    down["pools"]["latency"]["canaryReplicas"] = 1
    off = _through(cluster, down, 7)
    off["pools"]["latency"]["speculation"] = "On"
    on = reconcile(_body(status=off), cluster, NOW + timedelta(minutes=10)).status
    assert (_replicas(cluster, "assistant-latency"), _replicas(cluster, "assistant-latency-canary")) == (3, 1)
    cluster.roll_out()
    on = reconcile(_body(status=on), cluster, NOW + timedelta(minutes=11)).status
    assert _replicas(cluster, "assistant-latency-canary") == 0


def test_hand_over_leaves_a_first_reconcile_and_settled_pools_as_rendered(cluster):
    status = {"pools": {"latency": {"speculation": "Off", "canaryReplicas": 1}}}
    reconcile(_body(status=status), cluster, NOW)  # nothing live yet: nothing to hold
    assert (_replicas(cluster, "assistant-latency"), _replicas(cluster, "assistant-latency-canary")) == (2, 1)
