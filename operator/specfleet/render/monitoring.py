"""Render a prometheus-operator PodMonitor for engines and router, when the spec asks for one (pure)."""

from __future__ import annotations

from specfleet.api.constants import (
    LABEL_DEPLOYMENT,
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_SPECULATION,
    LABEL_TRACK,
)
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import Manifest, metadata


def render_pod_monitor(sd: SpeculativeDeployment) -> Manifest:
    """One PodMonitor scraping /metrics on the `http` port of every pod of this resource."""
    meta = metadata(sd, sd.name, "monitoring")
    meta["labels"].update(sd.spec.monitoring.labels)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {LABEL_INSTANCE: sd.name, LABEL_DEPLOYMENT: sd.name}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
            # The policy's PromQL selects engine series by these (as specfleet_io_deployment, ...).
            "podTargetLabels": [LABEL_DEPLOYMENT, LABEL_POOL, LABEL_SPECULATION, LABEL_TRACK],
        },
    }
