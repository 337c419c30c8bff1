"""Export the per-resource gauges of `specfleet.observe.resource_metrics` through prometheus_client.

The controller calls `publish(body)` after each reconcile or status write of a resource and
`forget(namespace, name)` when it is deleted; series of conditions or pools that disappeared are
removed, so a dashboard never shows a stale value as current.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from specfleet.observe.resource_metrics import HELP, LABELS, resource_samples


class ResourceGauges:
    """The gauges of every resource this operator reconciles, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        self._gauges = {
            name: Gauge(name, HELP[name], list(labels), registry=registry) for name, labels in LABELS.items()
        }
        # (namespace, name) -> the (metric, labels) it exported last time.
        self._exported: dict[tuple[str, str], set[tuple[str, tuple[str, ...]]]] = {}

    def publish(self, body: Mapping[str, Any]) -> None:
        """Set every gauge of one resource from its body, and drop its series that no longer exist."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        now: set[tuple[str, tuple[str, ...]]] = set()
        for sample in resource_samples(body):
            self._gauges[sample.name].labels(*sample.labels).set(sample.value)
            now.add((sample.name, sample.labels))
        for name, labels in self._exported.get(key, set()) - now:
            self._gauges[name].remove(*labels)
        self._exported[key] = now

    def forget(self, namespace: str, name: str) -> None:
        """Remove every series of a deleted resource."""
        for metric, labels in self._exported.pop((namespace, name), set()):
            self._gauges[metric].remove(*labels)
