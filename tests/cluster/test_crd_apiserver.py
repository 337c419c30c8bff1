"""The generated CRD against the real apiserver: accepted, and the invalid table rejected by it."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from support.failure_report import PRINTER_COLUMNS
from support.manifests import EXAMPLES, ROOT, InvalidCase, invalid_cases, load_yaml

pytestmark = pytest.mark.cluster


def test_crd_is_established_with_structural_schema(crd):
    doc = json.loads(crd.kubectl("get", "crd", "speculativedeployments.specfleet.io", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in doc["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions.get("NonStructuralSchema", "False") == "False"
    assert doc["status"]["acceptedNames"]["shortNames"] == ["specdeploy", "sd"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_accepted(crd, namespace, path):
    doc = load_yaml(path)
    doc["metadata"]["namespace"] = namespace
    out = crd.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(doc))
    stored = json.loads(out.stdout)
    # The schema's defaults are applied by the apiserver, as by the Python models.
    assert stored["spec"]["pools"]["latency"]["speculation"] in ("On", "Off", "Auto")
    assert stored["spec"]["policy"]["mode"] in ("Goodput", "Threshold")
    assert stored["spec"]["policy"]["minDwellSeconds"] >= 0


def test_apiserver_defaults_match_the_models(crd, namespace):
    from specfleet.api.validation import parse_spec

    doc = load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml")
    doc["metadata"]["namespace"] = namespace
    out = crd.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(doc))
    stored = json.loads(out.stdout)["spec"]
    assert parse_spec(doc["spec"]).to_wire() == parse_spec(stored).to_wire()


def test_the_model_cache_example_and_its_fill_job_are_accepted(crd, namespace):
    """examples/model-cache/fill-cache.yaml (claim and Job) and the engines of examples/08 that mount the
    claim read-only: the apiserver's own validation of PVCs, Jobs and pod templates accepts them."""
    from specfleet.api.constants import LABEL_COMPONENT
    from specfleet.api.validation import parse_resource
    from specfleet.reconcile import decided_plan
    from specfleet.render import render_children
    from specfleet.render.engine import ENGINE_COMPONENT

    fill = [
        d
        for d in yaml.safe_load_all((ROOT / "examples" / "model-cache" / "fill-cache.yaml").read_text())
        if d
    ]
    doc = load_yaml(ROOT / "examples" / "08-model-cache-pvc.yaml")
    doc["metadata"]["namespace"] = namespace
    sd = parse_resource(doc)
    engines = [
        c
        for c in render_children(sd, decided_plan(sd))
        if c["kind"] == "Deployment" and c["metadata"]["labels"][LABEL_COMPONENT] == ENGINE_COMPONENT
    ]
    assert len(engines) == 3  # both pools and the latency pool's canary
    for manifest in [*fill, *engines]:
        manifest["metadata"]["namespace"] = namespace
        out = crd.kubectl(
            "apply", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(manifest)
        )
        stored = json.loads(out.stdout)
        assert stored["kind"] == manifest["kind"]
        if manifest["kind"] == "Deployment":
            volumes = stored["spec"]["template"]["spec"]["volumes"]
            cache = next(v for v in volumes if v["name"] == "model-cache")
            assert cache["persistentVolumeClaim"] == {"claimName": "hf-cache", "readOnly": True}


CASES = invalid_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_invalid_case_rejected_by_apiserver(crd, namespace, case: InvalidCase):
    doc = {**case.manifest, "metadata": {**case.manifest["metadata"], "namespace": namespace}}
    result = crd.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0, f"apiserver accepted {case.name}: {result.stdout}"
    assert case.message in result.stderr, result.stderr


def test_conditions_are_a_map_list_and_kubectl_get_shows_k_and_progressing(crd, namespace):
    doc = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    doc["metadata"]["namespace"] = namespace
    crd.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))

    def condition(type_: str, status: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": "Test",
            "lastTransitionTime": "2026-11-29T12:00:00Z",
        }

    def patch_status(status: dict[str, Any], check: bool = True):
        body = json.dumps({"status": status})
        return crd.kubectl(
            "patch",
            "sd",
            "assistant",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            body,
            check=check,
        )

    # The apiserver enforces one condition per type (x-kubernetes-list-type: map, keyed by type).
    twice = patch_status(
        {"conditions": [condition("Ready", "True"), condition("Ready", "False")]}, check=False
    )
    assert twice.returncode != 0
    assert "Duplicate value" in twice.stderr
    patch_status({"conditions": [condition("Ready", "True"), condition("Progressing", "True")]})
    # K is what each pool drafts now (status), not the spec's K (3): a K the policy chose shows.
    pools = {"latency": {"speculation": "On", "k": 2}, "batch": {"speculation": "Off", "k": 0}}
    patch_status({"pools": pools})
    table = crd.kubectl("get", "sd", "assistant", "-n", namespace).stdout.splitlines()
    assert table[0].split() == PRINTER_COLUMNS
    assert table[1].split()[:7] == ["assistant", "On", "Off", "2", "0", "True", "True"]
    # The policy's Dynamic SD schedule (status, policy/predict/dynamic_sd.py) is kept by the apiserver, not pruned.
    schedule = [
        {"minBatchSize": 1, "maxBatchSize": 45, "numSpeculativeTokens": 3},
        {"minBatchSize": 46, "maxBatchSize": 252, "numSpeculativeTokens": 1},
        {"minBatchSize": 253, "maxBatchSize": 65536, "numSpeculativeTokens": 0},
    ]
    rollout = {"time": "2026-12-01T08:00:00Z", "fromMode": "On", "fromDynamicSchedule": schedule[:1]}
    patch_status({"pools": {"latency": {"dynamicSchedule": schedule, "rollout": rollout}}})
    latency = json.loads(crd.kubectl("get", "sd", "assistant", "-n", namespace, "-o", "json").stdout)[
        "status"
    ]["pools"]["latency"]
    assert latency["dynamicSchedule"] == schedule
    assert latency["rollout"]["fromDynamicSchedule"] == schedule[:1]
