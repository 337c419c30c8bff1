"""The rendered router RBAC against the real apiserver: its own ConfigMap (get, and list/watch with the
name field selector the router uses) and EndpointSlices, and no other ConfigMap."""

from __future__ import annotations

import json

import pytest

from specfleet.api.validation import parse_resource
from specfleet.render import plan_of, render_children
from specfleet.render.common import routing_config_map_name
from support.manifests import ROOT, load_yaml

pytestmark = pytest.mark.cluster


def test_router_role_reaches_only_its_config_map(cluster, namespace):
    doc = load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml")
    doc["metadata"]["namespace"] = namespace
    sd = parse_resource(doc)
    children = render_children(sd, plan_of({"latency": "On", "batch": "Off"}))
    wanted = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap"}
    for child in children:
        if child["kind"] in wanted and child["metadata"]["name"].startswith(sd.name):
            child["metadata"].pop("ownerReferences", None)
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(child))
    role = next(c for c in children if c["kind"] == "Role")
    config_map = routing_config_map_name(sd)
    cluster.kubectl("create", "configmap", "someone-elses", "-n", namespace, "--from-literal=secret=x")
    as_router = f"--as=system:serviceaccount:{namespace}:{role['metadata']['name']}"

    def allowed(*args: str) -> bool:
        return cluster.kubectl(*args, "-n", namespace, as_router, "-o", "name", check=False).returncode == 0

    assert allowed("get", "configmap", config_map)
    assert allowed("get", "configmaps", f"--field-selector=metadata.name={config_map}")
    assert allowed("get", "endpointslices.discovery.k8s.io")
    assert not allowed("get", "configmap", "someone-elses")
    assert not allowed("get", "configmaps")
    assert not allowed("get", "configmaps", "--field-selector=metadata.name=someone-elses")
