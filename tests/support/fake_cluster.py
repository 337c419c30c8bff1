"""An in-memory stand-in for the apiserver behind `reconcile.Cluster`, for unit tests.

It copies the behaviours reconcile depends on: a write bumps resourceVersion, a spec change bumps a
Deployment's generation, quantities come back as strings, and server-side apply's rule for a
Deployment's replicas (an apply that leaves out a field only it owned resets it to the default 1;
another manager's hold, or a scale, keeps it). The cluster tier checks the same reconcile against a
real apiserver.
"""

from __future__ import annotations

import copy
from typing import Any

from specfleet.api.constants import FIELD_MANAGER, HANDOVER_MANAGER
from specfleet.reconcile import ApplyRejectedError


def _stringify_quantities(obj: dict[str, Any]) -> None:
    for container in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        for section in ("requests", "limits"):
            values = container.get("resources", {}).get(section, {})
            for key, value in values.items():
                values[key] = str(value)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the apiserver applies a merge patch: objects merge key by key, null deletes a key,
    anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeCluster:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[str] = []
        self.reject_kinds: set[str] = set()
        self._rv = 0
        # Managers holding each Deployment's spec.replicas.
        self.replica_owners: dict[tuple[str, str, str], set[str]] = {}

    @staticmethod
    def key(manifest: dict[str, Any]) -> tuple[str, str, str]:
        meta = manifest["metadata"]
        return (manifest["kind"], meta.get("namespace", ""), meta["name"])

    def get(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        live = self.objects.get(self.key(manifest))
        return copy.deepcopy(live) if live is not None else None

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] in self.reject_kinds:
            raise ApplyRejectedError(f"no {manifest['kind']} here")
        key = self.key(manifest)
        old = self.objects.get(key)
        new = copy.deepcopy(manifest)
        _stringify_quantities(new)
        if manifest["kind"] == "Deployment":
            owners = self.replica_owners.setdefault(key, set())
            if "replicas" in new["spec"]:
                owners.add(FIELD_MANAGER)
            else:
                owners.discard(FIELD_MANAGER)
                new["spec"]["replicas"] = old["spec"]["replicas"] if old is not None and owners else 1
            new["metadata"]["managedFields"] = [
                {"manager": m, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
                for m in sorted(owners)
            ]
        self._rv += 1
        generation = (old or {}).get("metadata", {}).get("generation", 0)
        if old is None or old.get("spec") != new.get("spec"):
            generation += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        new["metadata"]["generation"] = generation
        if old is not None and "status" in old:
            new["status"] = old["status"]
        self.objects[key] = new
        self.writes.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
        return copy.deepcopy(new)

    def hand_over_replicas(self, manifest: dict[str, Any], replicas: int) -> None:
        key = self.key(manifest)
        self.objects[key]["spec"]["replicas"] = replicas
        self.replica_owners.setdefault(key, set()).add(HANDOVER_MANAGER)
        self.writes.append(f"handover {manifest['kind']}/{manifest['metadata']['name']}")

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        """What an autoscaler does through the scale subresource: an update that takes the field."""
        key = ("Deployment", namespace, name)
        self.objects[key]["spec"]["replicas"] = replicas
        self.objects[key]["metadata"]["generation"] += 1
        self.replica_owners[key] = {"autoscaler"}

    def delete(self, kind: str, namespace: str, name: str) -> None:
        del self.objects[(kind, namespace, name)]

    def list_children(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, str]
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj)
            for (k, ns, _), obj in sorted(self.objects.items())
            if k == kind
            and ns == namespace
            and all((obj["metadata"].get("labels") or {}).get(key) == v for key, v in labels.items())
        ]

    def delete_child(self, manifest: dict[str, Any]) -> None:
        self.objects.pop(self.key(manifest), None)
        self.writes.append(f"delete {manifest['kind']}/{manifest['metadata']['name']}")

    def roll_out(self) -> None:
        """What the controller-manager and kwok would do: every Deployment becomes fully ready."""
        for (kind, _, _), obj in self.objects.items():
            if kind == "Deployment":
                replicas = obj["spec"]["replicas"]
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "updatedReplicas": replicas,
                    "availableReplicas": replicas,
                }

    def patch_status(self, manifest: dict[str, Any], patch: dict[str, Any]) -> None:
        live = self.objects[self.key(manifest)]
        live["status"] = merge_patch(live.get("status") or {}, patch)
        self._rv += 1
        live["metadata"]["resourceVersion"] = str(self._rv)
        self.writes.append(f"{manifest['kind']}/{manifest['metadata']['name']}/status")
