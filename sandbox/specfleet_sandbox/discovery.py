"""Pod discovery for Debian's Prometheus, which is built without `kubernetes_sd_configs`.

Debian's prometheus 2.42 compiles in only the dns, file and http service discoveries (checked with
`strings /usr/bin/prometheus`). This adapter serves Prometheus' HTTP SD format from the real
apiserver's pod list, with the same `__meta_kubernetes_pod_*` labels Kubernetes SD would attach, so
the relabelling config is the one a Kubernetes SD user writes. Loopback only; stopped with its thread.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _label(prefix: str, key: str) -> str:
    return prefix + _INVALID.sub("_", key)


def pod_targets(pods: list[Any]) -> list[dict[str, Any]]:
    """One HTTP SD target group per pod container port, labelled like Kubernetes SD's role: pod."""
    groups = []
    for pod in pods:
        if not pod.status.pod_ip:
            continue
        base = {
            "__meta_kubernetes_namespace": pod.metadata.namespace,
            "__meta_kubernetes_pod_name": pod.metadata.name,
            "__meta_kubernetes_pod_ip": pod.status.pod_ip,
            "__meta_kubernetes_pod_phase": pod.status.phase or "",
            "__meta_kubernetes_pod_uid": pod.metadata.uid,
        }
        for key, value in (pod.metadata.labels or {}).items():
            base[_label("__meta_kubernetes_pod_label_", key)] = value
        for key, value in (pod.metadata.annotations or {}).items():
            base[_label("__meta_kubernetes_pod_annotation_", key)] = value
        for container in pod.spec.containers:
            for port in container.ports or []:
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_name": container.name,
                    "__meta_kubernetes_pod_container_port_name": port.name or "",
                    "__meta_kubernetes_pod_container_port_number": str(port.container_port),
                }
                groups.append({"targets": [f"{pod.status.pod_ip}:{port.container_port}"], "labels": labels})
    return groups


class PodDiscovery:
    """Serves /targets for one namespace on 127.0.0.1 (`port`, or a free one)."""

    def __init__(self, kubeconfig: Path, namespace: str, port: int = 0) -> None:
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        core = k8s.CoreV1Api(api)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    body = json.dumps(pod_targets(core.list_namespaced_pod(namespace).items)).encode()
                    self.send_response(200)
                except Exception as err:
                    body = str(err).encode()
                    self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pod-discovery", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/targets"

    def start(self) -> PodDiscovery:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
