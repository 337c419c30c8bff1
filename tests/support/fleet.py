"""Many small SpeculativeDeployments at once, for the cluster tier's scale test and `make bench-scale`.

Pools and router run zero replicas: every child (Deployments, Services, PDBs, RBAC, ConfigMap) is
created and reconciled as usual, but no pod has to be scheduled, so a 2-core test bed holds hundreds
of them. `SilentServer` plays a Prometheus that accepts connections and never answers (a hung one),
so each policy sweep waits out the query timeout: the sweep is busy while the test changes a spec.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
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


def list_json(kubectl: Callable[..., Any], *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl("get", *args, "-o", "json").stdout)["items"]
    return items


def unreconciled(kubectl: Callable[..., Any], namespaces: list[str], children_per_resource: int) -> list[str]:
    """Resources whose status has not caught up with their generation, or whose children are missing.

    Empty when every resource in `namespaces` is reconciled (what the test and benchmark wait for).
    """
    behind: list[str] = []
    for ns in namespaces:
        sds = list_json(kubectl, "sd", "-n", ns)
        deployments = list_json(
            kubectl, "deployments", "-n", ns, "-l", "app.kubernetes.io/managed-by=specfleet-operator"
        )
        owned: dict[str, int] = {}
        for d in deployments:
            for ref in d["metadata"].get("ownerReferences", []):
                owned[ref["uid"]] = owned.get(ref["uid"], 0) + 1
        for sd in sds:
            meta = sd["metadata"]
            observed = (sd.get("status") or {}).get("observedGeneration")
            if observed != meta["generation"] or owned.get(meta["uid"], 0) < children_per_resource:
                behind.append(f"{ns}/{meta['name']}")
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
