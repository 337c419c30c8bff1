"""The Argo CD health script (deploy/argocd/health.lua), run with Lua 5.1 (lupa) as Argo CD runs it.

Statuses come from the operator's own reconcile() against the in-memory cluster (first apply, a
finished rollout, a speculation flip, a failed apply, an invalid spec) plus edge cases; the docs'
argocd-cm snippet must carry the same script.
"""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from specfleet.api import reasons
from specfleet.reconcile import reconcile
from support.argocd import HEALTH_SCRIPT as SCRIPT
from support.argocd import argocd_health as health
from support.fake_cluster import FakeCluster
from support.manifests import ROOT, load_yaml, merge

DOC = ROOT / "docs" / "argocd.md"
EXAMPLE = ROOT / "examples" / "02-two-pools-routing-policy.yaml"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _body(
    status: dict[str, Any] | None = None, generation: int = 1, patch: dict[str, Any] | None = None
) -> dict[str, Any]:
    doc = load_yaml(EXAMPLE)
    doc["metadata"].update(uid="uid-1", generation=generation)
    if patch:
        doc = merge(doc, patch)
    if status is not None:
        doc["status"] = copy.deepcopy(status)
    return doc


def _settled(cluster: FakeCluster) -> dict[str, Any]:
    first = reconcile(_body(), cluster, NOW)
    cluster.roll_out()
    return reconcile(_body(first.status), cluster, NOW + timedelta(seconds=30)).status


def test_no_status_yet_is_progressing():
    assert health(_body()) == ("Progressing", "Waiting for the specfleet operator to report status")


def test_first_apply_is_progressing():
    status = reconcile(_body(), FakeCluster(), NOW).status
    state, message = health(_body(status))
    assert state == "Progressing"
    assert message.startswith("RollingOut: rolling out: latency, batch")


def test_settled_and_ready_is_healthy():
    status = _settled(FakeCluster())
    assert health(_body(status)) == ("Healthy", "all pools have their replicas ready")


def test_a_speculation_flip_is_progressing_not_degraded():
    cluster = FakeCluster()
    status = _settled(cluster)
    # The policy decided Off for the latency pool: the next reconcile starts the surge rollout.
    status["pools"]["latency"]["speculation"] = "Off"
    flipping = reconcile(_body(status), cluster, NOW + timedelta(minutes=5)).status
    conditions = {c["type"]: c["status"] for c in flipping["conditions"]}
    assert conditions["Ready"] == "True"
    assert conditions["Degraded"] == "False"
    assert health(_body(flipping)) == ("Progressing", "RollingOut: rolling out: latency")
    # The pool's canary starts first; its stable Deployment keeps its replicas until the canary is
    # ready (make before break), and gives one up in the next reconcile.
    cluster.roll_out()
    handing_over = reconcile(_body(flipping), cluster, NOW + timedelta(minutes=7)).status
    assert health(_body(handing_over)) == ("Progressing", "RollingOut: rolling out: latency")
    cluster.roll_out()
    done = reconcile(_body(handing_over), cluster, NOW + timedelta(minutes=8)).status
    assert health(_body(done))[0] == "Healthy"


def test_failed_apply_is_degraded_with_the_conditions_message():
    cluster = FakeCluster()
    cluster.reject_kinds.add("PodMonitor")
    status = reconcile(_body(), cluster, NOW).status
    state, message = health(_body(status))
    assert state == "Degraded"
    # The message ends with where the reason is explained, so Argo CD's UI shows the link too.
    link = reasons.troubleshooting_url(reasons.APPLY_FAILED)
    assert message == f"ApplyFailed: PodMonitor/assistant: no PodMonitor here (see {link})"


def test_invalid_spec_is_degraded():
    bad = _body(patch={"spec": {"drafter": {"model": None}}})
    status = reconcile(bad, FakeCluster(), NOW).status
    state, message = health(_body(status, patch={"spec": {"drafter": {"model": None}}}))
    assert state == "Degraded"
    assert message.startswith("InvalidSpec: ")
    assert "drafter.model is required" in message


def test_newer_generation_than_reconciled_is_progressing():
    status = _settled(FakeCluster())
    assert health(_body(status, generation=2)) == (
        "Progressing",
        "Waiting for the operator to reconcile generation 2",
    )


def test_ready_with_metrics_unavailable_stays_healthy_and_says_why():
    status = _settled(FakeCluster())
    status["conditions"].append(
        {
            "type": "MetricsAvailable",
            "status": "False",
            "reason": "MetricsUnavailable",
            "message": "cannot connect to http://prometheus:9090",
            "lastTransitionTime": "2026-11-29T12:00:00Z",
        }
    )
    state, message = health(_body(status))
    assert state == "Healthy"
    assert message.endswith(
        "the speculation policy holds: MetricsUnavailable: cannot connect to http://prometheus:9090"
    )


def test_engines_lost_after_settling_is_progressing():
    cluster = FakeCluster()
    status = _settled(cluster)
    for (kind, _, name), obj in cluster.objects.items():
        if kind == "Deployment" and name.endswith("-batch"):
            obj["status"]["readyReplicas"] = 1
    lost = reconcile(_body(status), cluster, NOW + timedelta(minutes=1)).status
    assert health(_body(lost)) == ("Progressing", "RollingOut: rolling out: batch")


def test_ready_false_alone_is_progressing_with_its_message():
    status = _settled(FakeCluster())
    for condition in status["conditions"]:
        if condition["type"] == "Ready":
            condition.update(status="False", reason="PoolsNotReady", message="ready replicas: batch 1/2")
    assert health(_body(status)) == ("Progressing", "PoolsNotReady: ready replicas: batch 1/2")


@pytest.mark.parametrize("conditions", [[], [{"status": "True"}], [{"type": "Ready"}]])
def test_odd_conditions_do_not_break_the_script(conditions):
    state, _ = health(_body({"observedGeneration": 1, "conditions": conditions}))
    assert state == "Progressing"


def test_docs_argocd_cm_snippet_carries_the_same_script():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    config_maps = [yaml.safe_load(b) for b in blocks if "argocd-cm" in b]
    assert len(config_maps) == 1
    data = config_maps[0]["data"]
    assert data["resource.customizations.health.specfleet.io_SpeculativeDeployment"] == SCRIPT.read_text()
