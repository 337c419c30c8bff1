"""Fixtures of the cluster tier: the SpeculativeDeployment CRD applied, and the real operator.

- `crd` (module): the CRD applied and Established; yields the cluster. A module that needs more
  CRDs (KEDA's, say) overrides it with a fixture of the same name that requests this one.
- `gateway_crds` (module): the Gateway API's and the Inference Extension's CRDs applied (gateway mode's
  kinds); removed again after the module, as other modules run without them.
- `operator`: `specfleet run` as a process against the cluster, started and stopped per test. A
  module sets how it runs by overriding `operator_options` (keyword arguments of `OperatorProcess`:
  a longer resync, `--namespace`). After the test the log must hold only JSON objects, one a line
  (log pipelines parse them); when the test failed, the log and the namespace's events are printed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specfleet_sandbox.processes import OperatorProcess
from specfleet_testbed import ensure_gateway_api_crds, ensure_inference_extension_crds
from support.failure_report import print_if_failed
from support.manifests import CRD, apply_crds

GATEWAY_CRDS = ("gatewayclasses", "gateways", "httproutes")
INFERENCE_CRDS = (
    ("inference.networking.k8s.io", "inferencepools"),
    ("inference.networking.x-k8s.io", "inferenceobjectives"),
    ("inference.networking.x-k8s.io", "inferencemodelrewrites"),
)


@pytest.fixture(scope="module")
def crd(cluster: Any) -> Any:
    apply_crds(cluster, CRD)
    return cluster


@pytest.fixture(scope="module")
def gateway_crds(cluster: Any) -> Iterator[Any]:
    gateway_dir, inference_dir = ensure_gateway_api_crds(), ensure_inference_extension_crds()
    paths = [gateway_dir / f"gateway.networking.k8s.io_{kind}.yaml" for kind in GATEWAY_CRDS]
    paths += [inference_dir / f"{group}_{kind}.yaml" for group, kind in INFERENCE_CRDS]
    apply_crds(cluster, *paths)
    yield cluster
    names = [f"{kind}.gateway.networking.k8s.io" for kind in GATEWAY_CRDS]
    names += [f"{kind}.{group}" for group, kind in INFERENCE_CRDS]
    # Other cluster tests run without the Gateway API.
    cluster.kubectl("delete", "crd", *names, "--wait=false", check=False)


@pytest.fixture
def operator_options() -> dict[str, Any]:
    """How `operator` runs (OperatorProcess keyword arguments); the default resync is 2 s."""
    return {}


@pytest.fixture
def operator(
    crd: Any, operator_options: dict[str, Any], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd.kubeconfig, tmp_path / "operator.log", **operator_options).start()
    yield proc
    proc.stop()
    print_if_failed(request, crd, {"": proc})
    not_json = [line for line in proc.log().splitlines() if not _json_object(line)]
    assert not not_json, f"operator log lines that are not JSON objects: {not_json[:5]}"


def _json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
