"""specfleet's local Kubernetes test bed: a real control plane plus kwok, on 127.0.0.1.

- ``ensure_binaries()`` builds (once, cached outside the checkout) or finds the pinned binaries.
- ``Cluster`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, and
  creates fake GPU nodes; use it as a context manager or call ``start()``/``stop()``.
- ``ensure_prometheus()`` installs (once) or finds Debian's Prometheus and promtool.
- ``python -m specfleet_testbed up|down|status|bin`` does the same from a shell.

Standard library only (plus the ``openssl`` command), so it runs before any project dependency is
installed.
"""

from .binaries import BinariesError, ensure_binaries
from .cluster import (
    DEFAULT_POD_CIDR,
    DEFAULT_SERVICE_CIDR,
    Cluster,
    ClusterError,
    KubectlError,
    local_address,
)
from .processes import process_start_time
from .stages import PROBED_NAMESPACE_PREFIX, READY_ANNOTATION
from .tools import (
    PrometheusTools,
    ToolError,
    ensure_epp,
    ensure_extproc_client,
    ensure_gateway_api_crds,
    ensure_inference_extension_crds,
    ensure_keda_crds,
    ensure_prometheus,
    ensure_prometheus_operator_crds,
)

__all__ = [
    "DEFAULT_POD_CIDR",
    "DEFAULT_SERVICE_CIDR",
    "PROBED_NAMESPACE_PREFIX",
    "READY_ANNOTATION",
    "BinariesError",
    "Cluster",
    "ClusterError",
    "KubectlError",
    "PrometheusTools",
    "ToolError",
    "ensure_binaries",
    "ensure_epp",
    "ensure_extproc_client",
    "ensure_gateway_api_crds",
    "ensure_inference_extension_crds",
    "ensure_keda_crds",
    "ensure_prometheus",
    "ensure_prometheus_operator_crds",
    "local_address",
    "process_start_time",
]
