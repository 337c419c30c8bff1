"""Gateway mode against the real apiserver: every object specfleet renders for it (InferencePools,
InferenceObjectives, the HTTPRoute, the endpoint pickers and their RBAC) applied with strict field
validation against the real CRDs (the Gateway API's standard channel and the Inference Extension's, as
their Go modules publish them); and the chart's operator ClusterRole, with and without
gatewayMode.enabled, against what the operator must create."""

from __future__ import annotations

import json

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from support.manifests import ROOT, chart_template, load_yaml, merge
from support.strict_apply import stored_as_rendered, strict_dry_run

pytestmark = pytest.mark.cluster
EXAMPLE = ROOT / "examples" / "09-gateway.yaml"
# Variants that reach the other branches of the renderer: an existing picker, the pool header first,
# enough tenants to split a rule, no pool header at all.
VARIANTS = {
    "example": {},
    "existing-picker": {
        "spec": {"routing": {"gateway": {"endpointPicker": {"services": {"batch": {"name": "my-epp"}}}}}}
    },
    "pool-header-first": {"spec": {"routing": {"poolHeaderTrust": "Always"}}},
    "many-tenants": {
        "spec": {"routing": {"tenantRules": [{"pool": "batch", "tenants": [f"t{i}" for i in range(100)]}]}}
    },
    "listener-and-shape": {
        "spec": {
            "routing": {
                "poolHeaderTrust": "Ignored",
                "shape": {"batchIfNAtLeast": 4},
                "gateway": {"parentRefs": [{"name": "gw", "sectionName": "http"}, {"name": "gw2"}]},
            }
        }
    },
}


def _render(patch):
    sd = parse_resource(merge(load_yaml(EXAMPLE), patch) if patch else load_yaml(EXAMPLE))
    return render_children(sd, decided_plan(sd))


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_every_gateway_mode_object_passes_strict_validation(gateway_crds, namespace, variant):
    rendered = _render(VARIANTS[variant])
    kinds = {c["kind"] for c in rendered}
    assert {"InferencePool", "InferenceObjective", "HTTPRoute"} <= kinds
    for manifest in rendered:
        result = strict_dry_run(gateway_crds, namespace, manifest)
        describe = f"{manifest['kind']}/{manifest['metadata']['name']}"
        assert result.returncode == 0, f"{describe}: {result.stderr}"
        if manifest["kind"] == "Deployment" and not manifest["metadata"]["name"].endswith("-epp"):
            continue  # the engines (checked by test_crd_apiserver; their quantities come back as strings)
        # Nothing pruned: every rendered field is stored as written (the server may add defaults).
        stored = json.loads(result.stdout)
        for key in ("spec", "rules", "roleRef", "subjects"):
            if key in manifest:
                assert stored_as_rendered(stored[key], manifest[key]), f"{describe}: {key}"


def test_a_wrong_field_or_value_is_refused(gateway_crds, namespace):
    # The check above can fail: the real schemas refuse what they do not declare or allow.
    rendered = _render({})
    pool = next(c for c in rendered if c["kind"] == "InferencePool")
    pool["spec"]["endpointPickerRef"]["failureMode"] = "FailSoft"
    result = strict_dry_run(gateway_crds, namespace, pool)
    assert result.returncode != 0
    assert "failureMode" in result.stderr
    route = next(c for c in rendered if c["kind"] == "HTTPRoute")
    route["spec"]["rules"][0]["matches"][0]["headers"][0]["kind"] = "Exact"
    result = strict_dry_run(gateway_crds, namespace, route)
    assert result.returncode != 0
    assert "field not declared in schema" in result.stderr


def _chart_cluster_role(cluster, gateway_mode: bool, name: str) -> dict[str, object]:
    rendered = chart_template(
        cluster,
        "--set",
        f"gatewayMode.enabled={str(gateway_mode).lower()}",
        "--show-only",
        "templates/rbac.yaml",
    )
    role = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ClusterRole")
    role["metadata"] = {"name": name}
    return role


@pytest.mark.parametrize("gateway_mode", [True, False], ids=["gatewayMode", "no-gatewayMode"])
def test_the_chart_role_lets_the_operator_write_gateway_children_only_in_gateway_mode(
    gateway_crds, namespace, gateway_mode
):
    """As a ServiceAccount bound to the chart's ClusterRole: can-i on the gateway kinds, and the real
    apply of each rendered picker Role and gateway object (RBAC refuses a Role granting more than its
    creator holds)."""
    cluster = gateway_crds
    name = f"{namespace}-operator"
    cluster.kubectl("create", "serviceaccount", "operator", "-n", namespace)
    role = _chart_cluster_role(cluster, gateway_mode, name)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": namespace}],
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))
    account = f"--as=system:serviceaccount:{namespace}:operator"
    try:
        for resource in (
            "inferencepools.inference.networking.k8s.io",
            "inferenceobjectives.inference.networking.x-k8s.io",
            "httproutes.gateway.networking.k8s.io",
        ):
            for verb in ("create", "patch", "delete"):
                out = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, account, check=False)
                assert out.stdout.strip() == ("yes" if gateway_mode else "no"), f"{verb} {resource}"
        out = cluster.kubectl(
            "auth", "can-i", "update", "inferencepools.inference.networking.k8s.io", account, check=False
        )
        assert out.stdout.strip() == "no"
        wanted = ("Role", "InferencePool", "InferenceObjective", "HTTPRoute")
        for manifest in (c for c in _render({}) if c["kind"] in wanted):
            body = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
            body["metadata"].pop("ownerReferences", None)
            result = cluster.kubectl(
                "apply", "--server-side", "--field-manager=specfleet-tests", account, "-f", "-",
                input=yaml.safe_dump(body), check=False,
            )  # fmt: skip
            describe = f"{manifest['kind']}/{manifest['metadata']['name']}"
            if gateway_mode:
                assert result.returncode == 0, f"{describe}: {result.stderr}"
            else:
                assert result.returncode != 0, describe
                assert "forbidden" in result.stderr.lower(), f"{describe}: {result.stderr}"
    finally:
        cluster.kubectl("delete", "clusterrolebinding", name, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterrole", name, "--wait=false", check=False)
