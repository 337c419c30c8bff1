"""The engines' NetworkPolicy (the router as their only front door) and the router's PodDisruptionBudget:
what they select, who they admit, when they are rendered, and that the chart lets the operator manage
and prune every kind it renders."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.render import MANAGED_KINDS, plan_of, render_children
from specfleet.render.network_policy import NAMESPACE_NAME_LABEL
from specfleet_runtime.names import ENGINE_PORT
from support.manifests import ROOT, load_yaml, merge

TWO_POOLS = ROOT / "examples" / "02-two-pools-routing-policy.yaml"
MINIMAL = ROOT / "examples" / "01-minimal-eagle3.yaml"
CHART_RBAC = ROOT / "charts" / "specfleet" / "templates" / "rbac.yaml"
# Both speculation modes (the pods' speculation label differs); example 02 renders its canaries in both.
OFF = plan_of({"latency": "Off", "batch": "Off"})
ON = plan_of({"latency": "On", "batch": "On"})


def _sd(path=TWO_POOLS, patch=None):
    doc = load_yaml(path)
    doc["metadata"]["uid"] = "uid-1"
    return parse_resource(merge(doc, patch) if patch else doc)


def _of_kind(children, kind):
    return [c for c in children if c["kind"] == kind]


def _pod_labels(deploy: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deploy["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects(match_labels: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match_labels.items())


def _engines_and_routers(children):
    deploys = _of_kind(children, "Deployment")
    routers = [d for d in deploys if d["metadata"]["name"] == "assistant-router"]
    return [d for d in deploys if d not in routers], routers


def test_no_network_policy_unless_enabled():
    sd = _sd(MINIMAL)
    assert not sd.spec.network_policy.enabled
    assert _of_kind(render_children(sd, ON), "NetworkPolicy") == []


@pytest.mark.parametrize("plan", [OFF, ON], ids=["off-with-canaries", "on"])
def test_network_policy_selects_every_engine_pod_and_no_router_pod(plan):
    children = render_children(_sd(), plan)
    (policy,) = _of_kind(children, "NetworkPolicy")
    engines, routers = _engines_and_routers(children)
    assert any(d["metadata"]["name"].endswith("-canary") for d in engines)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert all(_selects(selector, _pod_labels(d)) for d in engines)
    assert not any(_selects(selector, _pod_labels(d)) for d in routers)
    # Nothing a flip or a canary changes: the policy is the same object whatever the plan.
    assert policy == _of_kind(render_children(_sd(), ON if plan is OFF else OFF), "NetworkPolicy")[0]


def test_network_policy_admits_the_router_and_the_metrics_namespaces_on_the_engine_port():
    children = render_children(
        _sd(patch={"spec": {"networkPolicy": {"metricsNamespaces": ["monitoring", "obs"]}}}), ON
    )
    (policy,) = _of_kind(children, "NetworkPolicy")
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": ENGINE_PORT}]
    router_peer, *namespace_peers = rule["from"]
    # A podSelector alone: router pods of this namespace only, not a look-alike elsewhere.
    assert set(router_peer) == {"podSelector"}
    _, routers = _engines_and_routers(children)
    assert _selects(router_peer["podSelector"]["matchLabels"], _pod_labels(routers[0]))
    assert namespace_peers == [
        {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}}},
        {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "obs"}}},
    ]
    engines, _ = _engines_and_routers(children)
    ports = {
        p["containerPort"] for d in engines for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert ports == {ENGINE_PORT}


def test_network_policy_comes_before_the_engine_pods():
    kinds = [c["kind"] for c in render_children(_sd(), ON)]
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")


def test_enabled_needs_metrics_namespaces_while_engines_are_scraped():
    enabled = {"networkPolicy": {"enabled": True, "metricsNamespaces": []}}
    with pytest.raises(InvalidResourceError, match=r"needs networkPolicy\.metricsNamespaces"):
        _sd(patch={"spec": enabled})
    unscraped = {**enabled, "monitoring": {"podMonitor": False, "scrapeAnnotations": False}}
    assert _sd(patch={"spec": unscraped}).spec.network_policy.enabled


def test_router_pdb_for_more_than_one_router():
    children = render_children(_sd(), ON)
    pdbs = {p["metadata"]["name"]: p for p in _of_kind(children, "PodDisruptionBudget")}
    router_pdb = pdbs["assistant-router"]
    assert router_pdb["spec"]["maxUnavailable"] == 1
    engines, routers = _engines_and_routers(children)
    selector = router_pdb["spec"]["selector"]["matchLabels"]
    assert _selects(selector, _pod_labels(routers[0]))
    assert not any(_selects(selector, _pod_labels(d)) for d in engines)


@pytest.mark.parametrize("replicas", [0, 1])
def test_no_router_pdb_for_one_router_or_none(replicas):
    children = render_children(_sd(patch={"spec": {"routing": {"router": {"replicas": replicas}}}}), ON)
    names = [p["metadata"]["name"] for p in _of_kind(children, "PodDisruptionBudget")]
    assert names == ["assistant-latency", "assistant-batch"]


def _plural(kind: str) -> str:
    return kind.lower()[:-1] + "ies" if kind.endswith("y") else kind.lower() + "s"


def _operator_cluster_role() -> list[dict[str, Any]]:
    """The rules of the chart's operator ClusterRole (its first document; template lines dropped)."""
    first = CHART_RBAC.read_text().split("\n---")[0]
    plain = "\n".join(line for line in first.splitlines() if "{{" not in line)
    rules: list[dict[str, Any]] = yaml.safe_load(plain)["rules"]
    return rules


@pytest.mark.parametrize(("api_version", "kind"), MANAGED_KINDS, ids=[k for _, k in MANAGED_KINDS])
def test_chart_lets_the_operator_apply_and_prune_every_rendered_kind(api_version, kind):
    group = api_version.rpartition("/")[0]
    verbs = {
        verb
        for rule in _operator_cluster_role()
        if group in rule["apiGroups"] and _plural(kind) in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {"get", "list", "create", "patch", "delete"} <= verbs, (kind, verbs)
