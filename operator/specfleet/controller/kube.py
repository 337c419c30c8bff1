"""The real `Cluster`: get and server-side apply through the Kubernetes API (the only child I/O).

Uses the official client's dynamic client, so any kind the renderer emits works without a table of
paths. Errors are sorted into permanent ones (reported as Degraded, not retried hot) and transient
ones (raised, so Kopf retries with a delay).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError, ResourceNotFoundError

from specfleet.api.constants import FIELD_MANAGER, HANDOVER_MANAGER
from specfleet.reconcile import ApplyRejectedError, Event
from specfleet.render import Manifest

# Every API call gives up after this long (seconds): a hung connection must not hold a worker thread
# (reconciles) or the policy scheduler forever; the caller retries.
REQUEST_TIMEOUT_SECONDS = 30
# Kubernetes caps an Event's message.
_EVENT_MESSAGE_LIMIT = 1024
# 4xx answers that no retry can fix (the object itself is wrong); others are transient.
_PERMANENT_STATUSES = frozenset({400, 403, 404, 409, 422})


def load_kube_config(kubeconfig: str | None = None) -> k8s_client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig file."""
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig is None:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            raise k8s_config.ConfigException("kubeconfig given")
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    # One client serves the change and resync workers, the policy scheduler's deciders and its
    # queries: keep a connection for each instead of the default 5 per CPU (extra ones are discarded).
    configuration.connection_pool_maxsize = 32
    return k8s_client.ApiClient(configuration)


def _reason(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "{}").get("message", err.reason))
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)


def _decode(response: Any) -> Manifest:
    """The JSON body of a raw response (the dynamic client's own wrapping is several times slower)."""
    result: Manifest = json.loads(response.data)
    return result


class KubeCluster:
    """`reconcile.Cluster` over a live apiserver."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self._dynamic = DynamicClient(api_client)  # type: ignore[no-untyped-call]
        # The dynamic client's discovery cache is not thread-safe; Kopf runs handlers in threads.
        self._lock = threading.Lock()
        # Found API resources by (apiVersion, kind): discovery searches every API on each lookup.
        # Misses are not kept, so a CRD installed later (PodMonitor) is found then.
        self._resources: dict[tuple[str, str], Any] = {}

    def _resource(self, manifest: Mapping[str, Any]) -> Any:
        key = (manifest["apiVersion"], manifest["kind"])
        with self._lock:
            found = self._resources.get(key)
            if found is None:
                found = self._resources[key] = self._dynamic.resources.get(api_version=key[0], kind=key[1])
            return found

    def get(self, manifest: Manifest) -> Manifest | None:
        try:
            resource = self._resource(manifest)
        except ResourceNotFoundError:
            return None
        meta = manifest["metadata"]
        try:
            response = resource.get(
                name=meta["name"],
                namespace=meta.get("namespace"),
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except NotFoundError:
            return None
        return _decode(response)

    def apply(self, manifest: Manifest) -> Manifest:
        try:
            resource = self._resource(manifest)
        except ResourceNotFoundError:
            raise ApplyRejectedError(
                f"the cluster has no {manifest['kind']} ({manifest['apiVersion']}); is its CRD installed?"
            ) from None
        return _decode(self._server_side_apply(resource, manifest, FIELD_MANAGER))

    @staticmethod
    def _server_side_apply(resource: Any, body: Manifest, field_manager: str) -> Any:
        """Server-side apply `body` as `field_manager` (forcing conflicts); a permanent refusal is an
        ApplyRejectedError with the apiserver's reason, anything else is raised as it is."""
        meta = body["metadata"]
        try:
            return resource.server_side_apply(
                body=body,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=field_manager,
                force_conflicts=True,
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as err:
            if err.status in _PERMANENT_STATUSES:
                raise ApplyRejectedError(_reason(err)) from None
            raise

    def hand_over_replicas(self, manifest: Manifest, replicas: int) -> None:
        """Apply only `spec.replicas` (its live value) under the hand-over field manager (see
        reconcile.apply.apply_children): the operator's next apply then releases the field unchanged."""
        meta = manifest["metadata"]
        body = {
            "apiVersion": manifest["apiVersion"],
            "kind": manifest["kind"],
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
            "spec": {"replicas": replicas},
        }
        self._server_side_apply(self._resource(manifest), body, HANDOVER_MANAGER)

    def list_children(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[Manifest]:
        try:
            resource = self._resource({"apiVersion": api_version, "kind": kind})
        except ResourceNotFoundError:
            return []  # e.g. no prometheus-operator CRDs: nothing of that kind can exist
        try:
            response = resource.get(
                namespace=namespace,
                label_selector=",".join(f"{k}={v}" for k, v in sorted(labels.items())),
                serialize=False,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except ApiException as err:
            if err.status in _PERMANENT_STATUSES:  # e.g. RBAC without list on that kind
                raise ApplyRejectedError(_reason(err)) from None
            raise
        items: list[Manifest] = _decode(response).get("items") or []
        return items

    def delete_child(self, manifest: Manifest) -> None:
        resource = self._resource(manifest)
        meta = manifest["metadata"]
        try:
            resource.delete(
                name=meta["name"],
                namespace=meta.get("namespace"),
                # Only the object we looked at: a newer one of the same name is left alone. Background
                # propagation: a pruned Job takes its pods with it (the API orphans them by default).
                body={
                    "propagationPolicy": "Background",
                    **({"preconditions": {"uid": meta["uid"]}} if meta.get("uid") else {}),
                },
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except NotFoundError:
            return
        except ApiException as err:
            if err.status in _PERMANENT_STATUSES:
                raise ApplyRejectedError(_reason(err)) from None
            raise

    def patch_status(self, manifest: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
        """JSON merge patch of the status subresource (only the keys that changed are sent)."""
        resource = self._resource(manifest)
        meta = manifest["metadata"]
        self._dynamic.patch(  # type: ignore[no-untyped-call]
            resource.subresources["status"],
            body={"status": dict(patch)},
            name=meta["name"],
            namespace=meta.get("namespace"),
            content_type="application/merge-patch+json",
            serialize=False,
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
        )

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None],
    ) -> None:
        """JSON merge patch of a pod's labels and annotations (None deletes a key): one write, so a
        Standby flip's label and mark change together."""
        self._dynamic.patch(  # type: ignore[no-untyped-call]
            self._resource({"apiVersion": "v1", "kind": "Pod"}),
            body={"metadata": {"labels": dict(labels), "annotations": dict(annotations)}},
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
            serialize=False,
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
        )

    def post_event(self, body: Mapping[str, Any], event: Event) -> None:
        """A core/v1 Event on the resource (for code that runs outside Kopf's handlers)."""
        meta = body["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:_EVENT_MESSAGE_LIMIT],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._resource(doc).create(
            body=doc, namespace=meta["namespace"], _request_timeout=REQUEST_TIMEOUT_SECONDS
        )


class KubeLease:
    """`leader.LeaseApi` over one coordination.k8s.io/v1 Lease."""

    def __init__(self, api_client: k8s_client.ApiClient, namespace: str, name: str) -> None:
        self._leases = DynamicClient(api_client).resources.get(  # type: ignore[no-untyped-call]
            api_version="coordination.k8s.io/v1", kind="Lease"
        )
        self.namespace, self.name = namespace, name

    def get(self) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = self._leases.get(
                name=self.name, namespace=self.namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
            ).to_dict()
        except NotFoundError:
            return None
        return lease

    def create(self, lease: Mapping[str, Any]) -> bool:
        try:
            self._leases.create(
                body=dict(lease), namespace=self.namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
            )
        except ConflictError:
            return False
        return True

    def replace(self, lease: Mapping[str, Any]) -> bool:
        try:
            self._leases.replace(
                body=dict(lease),
                name=self.name,
                namespace=self.namespace,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except ConflictError:
            return False
        return True
