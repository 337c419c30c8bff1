"""What a reconcile hands back, and the seam it reaches the Kubernetes API through."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from specfleet.render import Manifest

EventType = Literal["Normal", "Warning"]


class ApplyRejectedError(Exception):
    """The API refused a child for good (invalid object, missing CRD): report it, do not retry hot."""


class Cluster(Protocol):
    """What reconcile needs from the Kubernetes API."""

    def get(self, manifest: Manifest) -> Manifest | None:
        """The live object with the manifest's kind, namespace and name, or None."""

    def apply(self, manifest: Manifest) -> Manifest:
        """Server-side apply under the operator's field manager; returns the live object."""

    def list_children(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[Manifest]:
        """Objects of one kind in a namespace carrying all `labels` ([] if the kind does not exist)."""

    def delete_child(self, manifest: Manifest) -> None:
        """Delete the object (gone already is fine)."""

    def hand_over_replicas(self, manifest: Manifest, replicas: int) -> None:
        """Server-side apply of only `spec.replicas` (at its live value) under `HANDOVER_MANAGER`."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to emit on the resource."""

    type: EventType
    reason: str
    message: str


@dataclass
class ReconcileResult:
    """The full new status (wire form), the events to emit and the children written."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
