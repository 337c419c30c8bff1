"""Many small SpeculativeDeployments at once, for the cluster tier's scale test and `make bench-scale`.

Pools and router run zero replicas: every child (Deployments, Services, PDBs, RBAC, ConfigMap) is
created and reconciled as usual, but no pod has to be scheduled, so a 2-core test bed holds hundreds
of them. `SilentServer` plays a Prometheus that accepts connections and never answers (a hung one),
so each policy sweep waits out the query timeout: the sweep is busy while the test changes a spec.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from typing import Any

import yaml

from support.manifests import ROOT, load_yaml, merge


def small_fleet(
    namespace: str,
    name: str,
    *,
    prometheus_url: str,
    evaluation_interval_seconds: int = 30,
    timeout_seconds: int = 5,
    latency_replicas: int = 0,
) -> dict[str, Any]:
    """The minimal example with no pods: an Auto latency pool (so the policy evaluates it)."""
    doc = load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml")
    return merge(
        doc,
        {
            "metadata": {"namespace": namespace, "name": name},
            "spec": {
                "pools": {"latency": {"replicas": latency_replicas}, "batch": {"replicas": 0}},
                "routing": {"router": {"replicas": 0}},
                "monitoring": {"podMonitor": False},
                "policy": {
                    "evaluationIntervalSeconds": evaluation_interval_seconds,
                    "prometheus": {"url": prometheus_url, "timeoutSeconds": timeout_seconds},
                },
            },
        },
    )


def as_yaml(docs: Iterable[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(docs))


MANAGED = "labelSelector=app.kubernetes.io%2Fmanaged-by%3Dspecfleet-operator"
SD_PATH = "/apis/specfleet.io/v1alpha1"
# Every kind the operator writes for a resource (no PodMonitor: monitoring.podMonitor is off).
CHILD_PATHS = (
    "/apis/apps/v1/deployments",
    "/api/v1/services",
    "/api/v1/configmaps",
    "/api/v1/serviceaccounts",
    "/apis/policy/v1/poddisruptionbudgets",
    "/apis/rbac.authorization.k8s.io/v1/roles",
    "/apis/rbac.authorization.k8s.io/v1/rolebindings",
)


def _scoped(prefix: str, namespace: str | None) -> str:
    """An API list path, in one namespace or across all of them."""
    head, kind = prefix.rsplit("/", 1)
    return f"{head}/namespaces/{namespace}/{kind}" if namespace else prefix


def list_resources(cluster: Any, namespace: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.api_get(_scoped(f"{SD_PATH}/speculativedeployments", namespace))[
        "items"
    ]
    return items


def list_children(
    cluster: Any, namespace: str | None = None, paths: Iterable[str] = CHILD_PATHS
) -> list[dict[str, Any]]:
    """Every object the operator manages (raw JSON through the admin API: fast for thousands)."""
    out: list[dict[str, Any]] = []
    for path in paths:
        out += cluster.api_get(f"{_scoped(path, namespace)}?{MANAGED}")["items"]
    return out


def unreconciled(cluster: Any, children_per_resource: int, namespace: str | None = None) -> list[str]:
    """Resources whose status has not caught up with their generation, or whose Deployments are missing.

    Empty when every resource (in `namespace`, or anywhere) is reconciled: what the scale test and
    benchmark wait for.
    """
    owned: dict[str, int] = {}
    for d in list_children(cluster, namespace, paths=CHILD_PATHS[:1]):
        for ref in d["metadata"].get("ownerReferences", []):
            owned[ref["uid"]] = owned.get(ref["uid"], 0) + 1
    behind: list[str] = []
    for sd in list_resources(cluster, namespace):
        meta = sd["metadata"]
        observed = (sd.get("status") or {}).get("observedGeneration")
        if observed != meta["generation"] or owned.get(meta["uid"], 0) < children_per_resource:
            behind.append(f"{meta['namespace']}/{meta['name']}")
    return behind


class SilentServer:
    """A loopback TCP server that accepts connections and never answers (a hung Prometheus)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    @property
    def connections(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._sock.close()
