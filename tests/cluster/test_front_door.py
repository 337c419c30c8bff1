"""The engines' NetworkPolicy and the router's PodDisruptionBudget against the real control plane: both
pass strict field validation, their selectors pick the pods the real Deployment controller made (kwok
runs them), the disruption controller counts the router pods, the CEL rule refuses a policy without
its scraper namespace, and the chart's ClusterRole lets the operator manage and prune both kinds.

No pod IP is ever dialed: the test bed enforces no NetworkPolicy, so what is checked is what the
policy selects, which is what a network plugin would enforce.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.render import plan_of, render_children
from specfleet_sandbox.processes import wait_for
from support.manifests import ROOT, chart_template, load_yaml, merge
from support.strict_apply import strict_dry_run

pytestmark = pytest.mark.cluster


def _children(namespace: str) -> list[dict[str, Any]]:
    """Example 02 rendered into `namespace`, sized for kwok nodes (no GPU product, no model cache PVC)."""
    doc = merge(
        load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml"),
        {
            "metadata": {"namespace": namespace},
            "spec": {
                "pools": {"latency": {"replicas": 2}, "batch": {"replicas": 2}},
                "engine": {"nodeSelector": None, "modelCache": {"persistentVolumeClaimName": None}},
            },
        },
    )
    return render_children(parse_resource(doc), plan_of({"latency": "On", "batch": "On"}))


def _one(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(c for c in children if c["kind"] == kind and c["metadata"]["name"] == name)


def _apply(cluster, namespace: str, manifest: dict[str, Any]) -> None:
    manifest = {**manifest, "metadata": {**manifest["metadata"]}}
    manifest["metadata"].pop("ownerReferences", None)  # the owner does not exist here
    cluster.kubectl(
        "apply", "--server-side", "--field-manager=specfleet-tests", "-n", namespace, "-f", "-",
        input=yaml.safe_dump(manifest),
    )  # fmt: skip


def _pod_names(cluster, namespace: str, match_labels: dict[str, str]) -> set[str]:
    selector = ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return {p["metadata"]["name"] for p in json.loads(out.stdout)["items"]}


def test_network_policy_and_router_pdb_pass_strict_validation(cluster, namespace):
    children = _children(namespace)
    for manifest in (
        _one(children, "NetworkPolicy", "assistant-engines"),
        _one(children, "PodDisruptionBudget", "assistant-router"),
    ):
        result = strict_dry_run(cluster, namespace, manifest)
        assert result.returncode == 0, result.stderr
        stored = json.loads(result.stdout)
        assert stored["spec"] == {**stored["spec"], **manifest["spec"]}, "the apiserver changed the spec"


def test_selectors_pick_the_pods_the_controllers_made(cluster, namespace):
    children = _children(namespace)
    # The pods need their ServiceAccount; the rest of the router's RBAC is not needed to exist.
    for child in children:
        if child["kind"] in {"ServiceAccount", "Deployment", "NetworkPolicy", "PodDisruptionBudget"}:
            _apply(cluster, namespace, child)
    engines = {"assistant-latency": 2, "assistant-batch": 2}  # canaries at 0 while speculating
    routers = 2

    def pods_of(match_labels: dict[str, str], count: int):
        names = _pod_names(cluster, namespace, match_labels)
        return names if len(names) == count else None

    policy = _one(children, "NetworkPolicy", "assistant-engines")["spec"]
    engine_pods = wait_for(
        "the engine pods",
        lambda: pods_of(policy["podSelector"]["matchLabels"], sum(engines.values())),
        timeout=60,
    )
    assert all(name.startswith(tuple(engines)) for name in engine_pods)
    router_peer = policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    router_pods = wait_for("the router pods", lambda: pods_of(router_peer, routers), timeout=60)
    assert all(name.startswith("assistant-router-") for name in router_pods)
    assert not engine_pods & router_pods

    # The disruption controller finds the router pods behind the budget and allows one drain at a time.
    def budget():
        out = cluster.kubectl("get", "pdb", "assistant-router", "-n", namespace, "-o", "json")
        status = json.loads(out.stdout).get("status") or {}
        return (
            status
            if status.get("expectedPods") == routers and status.get("currentHealthy") == routers
            else None
        )

    status = wait_for("the router budget to count its pods", budget, timeout=90)
    assert status["disruptionsAllowed"] == 1


def test_enabling_without_a_metrics_namespace_is_refused(crd, namespace):
    doc = merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {"metadata": {"namespace": namespace}, "spec": {"networkPolicy": {"enabled": True}}},
    )
    result = crd.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0
    assert "networkPolicy.enabled needs networkPolicy.metricsNamespaces" in result.stderr
    unscraped = {"networkPolicy": {"enabled": True}, "monitoring": {"scrapeAnnotations": False}}
    result = crd.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=yaml.safe_dump(merge(doc, {"spec": unscraped})),
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_chart_lets_the_operator_manage_and_prune_both_kinds(cluster, namespace):
    rendered = chart_template(cluster, "--show-only", "templates/rbac.yaml")
    role = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ClusterRole")
    # A name of this test's own, bound in this namespace only, to an account of this namespace.
    role["metadata"] = {"name": f"{namespace}-operator"}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    try:
        cluster.kubectl("create", "serviceaccount", "operator", "-n", namespace)
        cluster.kubectl(
            "create", "rolebinding", "operator", "-n", namespace, f"--clusterrole={role['metadata']['name']}",
            f"--serviceaccount={namespace}:operator",
        )  # fmt: skip
        as_operator = f"--as=system:serviceaccount:{namespace}:operator"
        for resource in ("networkpolicies.networking.k8s.io", "poddisruptionbudgets.policy"):
            for verb in ("get", "list", "create", "patch", "delete"):
                result = cluster.kubectl(
                    "auth", "can-i", verb, resource, "-n", namespace, as_operator, check=False
                )
                assert result.stdout.strip() == "yes", f"{verb} {resource}: {result.stdout} {result.stderr}"
            result = cluster.kubectl(
                "auth", "can-i", "update", resource, "-n", namespace, as_operator, check=False
            )
            assert result.stdout.strip() == "no"
    finally:
        cluster.kubectl("delete", "clusterrole", role["metadata"]["name"], check=False)
