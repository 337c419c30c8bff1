"""Example resources, the table of invalid ones and the chart, shared by the unit and cluster tiers.

The same table is checked against `specfleet render` (unit tier) and the real apiserver (cluster
tier): each case must be rejected with its expected message by both.
"""

from __future__ import annotations

import copy
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID_TABLE = ROOT / "tests" / "data" / "invalid_manifests.yaml"
CRD = ROOT / "crds" / "specfleet.io_speculativedeployments.yaml"
CHART = ROOT / "charts" / "specfleet"
# The field manager the tests apply CRDs under (server-side, as an installer would).
TEST_FIELD_MANAGER = "specfleet-tests"


def load_yaml(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def apply_crds(cluster: Any, *paths: Path) -> None:
    """Apply CRD files server-side and wait until each is Established (its schema accepted)."""
    for path in paths:
        cluster.kubectl("apply", "--server-side", f"--field-manager={TEST_FIELD_MANAGER}", "-f", str(path))
    cluster.wait_established(*(f"crd/{load_yaml(path)['metadata']['name']}" for path in paths))


def chart_template(cluster: Any, *args: str) -> str:
    """The chart rendered by the test bed's helm (`helm template specfleet CHART *args`), no cluster asked."""
    return subprocess.run(
        [str(cluster.bin_dir / "helm"), "template", "specfleet", str(CHART), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386): dicts merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


# The Threshold rules the in-memory tests and benchmarks script: the simplest rule to drive a flip with.
CLASSIC_THRESHOLDS = {
    "stopBelowAcceptanceLengthMilli": 1400,
    "resumeAboveAcceptanceLengthMilli": 1700,
    "stopAboveConcurrencyPerReplica": 48,
    "resumeBelowConcurrencyPerReplica": 32,
}


def two_pool_example(policy: dict[str, Any]) -> dict[str, Any]:
    """Example 01 as the in-memory controller runs it: 2 latency replicas, 1 batch replica Off, `policy`."""
    return merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {
            "metadata": {"uid": "u1", "generation": 1},
            "spec": {
                "pools": {"latency": {"replicas": 2}, "batch": {"replicas": 1, "speculation": "Off"}},
                "policy": policy,
            },
        },
    )


@dataclass(frozen=True)
class InvalidCase:
    name: str
    message: str
    manifest: dict[str, Any]


def invalid_cases() -> list[InvalidCase]:
    table = yaml.safe_load(INVALID_TABLE.read_text())
    base = load_yaml(ROOT / table["base"])
    cases = []
    for entry in table["cases"]:
        manifest = merge(base, {"spec": entry["spec"]})
        # A case about the name itself gives it as metadataName; the others are named after the case.
        manifest["metadata"] = {**manifest["metadata"], "name": entry.get("metadataName", entry["name"])}
        cases.append(InvalidCase(entry["name"], entry["message"], manifest))
    return cases
