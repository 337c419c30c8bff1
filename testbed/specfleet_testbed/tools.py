"""External programs the tests and the demo run, each installed on demand by the project's own script.

Nothing outside the project may be assumed to exist on a fresh machine: every external binary is
resolved here, through the script that installs it (once, then a warm check of a second or less).
The control plane has ``ensure_binaries()`` (testbed/build.sh); Prometheus and promtool come from
Debian's package through ``scripts/setup-prometheus.sh``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PrometheusTools",
    "ToolError",
    "ensure_epp",
    "ensure_extproc_client",
    "ensure_gateway_api_crds",
    "ensure_inference_extension_crds",
    "ensure_keda_crds",
    "ensure_prometheus",
    "ensure_prometheus_operator_crds",
]

# testbed/specfleet_testbed/tools.py -> repository root
REPO = Path(__file__).resolve().parents[2]
SETUP_PROMETHEUS = REPO / "scripts" / "setup-prometheus.sh"
SETUP_PROMETHEUS_OPERATOR_CRDS = REPO / "scripts" / "setup-prometheus-operator-crds.sh"
SETUP_KEDA_CRDS = REPO / "scripts" / "setup-keda-crds.sh"
SETUP_GATEWAY_API_CRDS = REPO / "scripts" / "setup-gateway-api-crds.sh"
SETUP_INFERENCE_EXTENSION_CRDS = REPO / "scripts" / "setup-inference-extension-crds.sh"
BUILD_EPP = REPO / "scripts" / "build-epp.sh"
BUILD_EXTPROC_CLIENT = REPO / "scripts" / "build-extproc-client.sh"


class ToolError(RuntimeError):
    """An external program could not be installed or found."""


@dataclass(frozen=True)
class PrometheusTools:
    """The Prometheus server and promtool from one installation."""

    prometheus: Path
    promtool: Path


def _run_setup(script: Path) -> Path:
    """Run an installer script (progress on our stderr) and return the path on its last stdout line."""
    if not script.is_file():
        raise ToolError(f"installer not found: {script}")
    result = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ToolError(f"{script.name} failed with exit code {result.returncode}; see its output above")
    return Path(lines[-1])


@functools.cache
def ensure_prometheus() -> PrometheusTools:
    """Prometheus and promtool, installed first if this machine lacks them.

    ``SPECFLEET_PROMETHEUS_DIR`` may name a directory that already holds both binaries (another
    distribution's build, say); it is checked, not installed into.
    """
    override = os.environ.get("SPECFLEET_PROMETHEUS_DIR")
    bin_dir = Path(override) if override else _run_setup(SETUP_PROMETHEUS)
    tools = PrometheusTools(prometheus=bin_dir / "prometheus", promtool=bin_dir / "promtool")
    missing = [str(p) for p in (tools.prometheus, tools.promtool) if not os.access(p, os.X_OK)]
    if missing:
        raise ToolError(f"not executable: {', '.join(missing)}")
    return tools


@functools.cache
def ensure_prometheus_operator_crds() -> Path:
    """The directory of prometheus-operator's CRDs, generated first (controller-gen) if missing."""
    crd_dir = _run_setup(SETUP_PROMETHEUS_OPERATOR_CRDS)
    if not (crd_dir / "monitoring.coreos.com_prometheusrules.yaml").is_file():
        raise ToolError(f"no prometheus-operator CRDs in {crd_dir}")
    return crd_dir


@functools.cache
def ensure_keda_crds() -> Path:
    """The directory of KEDA's CRDs (ScaledObject, ...), generated first (controller-gen) if missing."""
    crd_dir = _run_setup(SETUP_KEDA_CRDS)
    if not (crd_dir / "keda.sh_scaledobjects.yaml").is_file():
        raise ToolError(f"no KEDA CRDs in {crd_dir}")
    return crd_dir


@functools.cache
def ensure_gateway_api_crds() -> Path:
    """The directory of the Gateway API's standard-channel CRDs (HTTPRoute, ...), fetched first if missing."""
    crd_dir = _run_setup(SETUP_GATEWAY_API_CRDS)
    if not (crd_dir / "gateway.networking.k8s.io_httproutes.yaml").is_file():
        raise ToolError(f"no Gateway API CRDs in {crd_dir}")
    return crd_dir


@functools.cache
def ensure_inference_extension_crds() -> Path:
    """The directory of the Gateway API Inference Extension's CRDs (InferencePool, InferenceObjective),
    fetched first if missing."""
    crd_dir = _run_setup(SETUP_INFERENCE_EXTENSION_CRDS)
    if not (crd_dir / "inference.networking.k8s.io_inferencepools.yaml").is_file():
        raise ToolError(f"no Inference Extension CRDs in {crd_dir}")
    return crd_dir


@functools.cache
def ensure_epp() -> Path:
    """The Gateway API Inference Extension's endpoint picker binary, built first (Go) if missing.

    ``SPECFLEET_EPP`` may name an existing binary (another build of the same version); it is checked,
    not built.
    """
    override = os.environ.get("SPECFLEET_EPP")
    epp = Path(override) if override else _run_setup(BUILD_EPP)
    if not os.access(epp, os.X_OK):
        raise ToolError(f"not executable: {epp}")
    return epp


@functools.cache
def ensure_extproc_client() -> Path:
    """The test bed's ext_proc client (testbed/extproc-client: plays a gateway's data plane against the
    endpoint picker), built first (Go, with the picker's module pins) if this source version is missing."""
    client = _run_setup(BUILD_EXTPROC_CLIENT)
    if not os.access(client, os.X_OK):
        raise ToolError(f"not executable: {client}")
    return client
