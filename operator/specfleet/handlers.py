"""Kopf handlers: the operator's only contact with the Kubernetes API for its own resource.

Level-based: create, update and resume all run the same idempotent `reconcile`, and a timer runs it
again to restore children edited or deleted by hand and to refresh status. Each handler writes only
the status keys that changed (so a quiet resync writes nothing) and never touches `spec`.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Histogram
from urllib3.exceptions import HTTPError

from specfleet.api.constants import GROUP, PLURAL, VERSION
from specfleet.kube import KubeCluster, load_kube_config
from specfleet.reconcile import reconcile, status_patch
from specfleet.render import RenderOptions

# Read once at import: Kopf needs the timer interval when the decorator runs.
RESYNC_SECONDS = float(os.environ.get("SPECFLEET_RESYNC_SECONDS", "30"))
ROUTER_IMAGE = os.environ.get("SPECFLEET_ROUTER_IMAGE", RenderOptions().router_image)

RECONCILE_SECONDS = Histogram(
    "specfleet_reconcile_duration_seconds", "Time spent in one reconcile.", ["trigger"]
)
RECONCILE_ERRORS = Counter("specfleet_reconcile_errors_total", "Reconciles that raised.", ["trigger"])
CHILDREN_APPLIED = Counter("specfleet_children_applied_total", "Child objects written.", ["kind"])


class _State:
    """Process-wide state created at startup: the API client and per-object locks."""

    cluster: KubeCluster | None = None
    locks: dict[str, threading.Lock] = {}
    guard = threading.Lock()

    @classmethod
    def lock_for(cls, uid: str) -> threading.Lock:
        with cls.guard:
            return cls.locks.setdefault(uid, threading.Lock())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    """Every Kopf setting in one place, each with its reason."""
    # Keep Kopf's bookkeeping under our own API group (Kopf's default prefix changed across versions).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Events come only from explicit kopf.event() calls, not from every log line.
    settings.posting.loggers = False
    # Reconnect watches well before proxies and load balancers cut idle connections.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    # Sync handlers run in threads; a few are plenty for one operator replica.
    settings.execution.max_workers = 8
    # A handler that keeps failing backs off instead of hammering the API.
    settings.batching.error_delays = (5, 10, 20, 40, 80, 160, 300)
    _State.cluster = KubeCluster(load_kube_config(os.environ.get("KUBECONFIG")))
    logger.info("specfleet operator configured (resync every %ss)", RESYNC_SECONDS)


@kopf.on.probe(id="cluster")
def probe_cluster(**_: Any) -> bool:
    """Liveness reports whether startup created the API client."""
    return _State.cluster is not None


def _run(trigger: str, body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger) -> None:
    cluster = _State.cluster
    if cluster is None:
        raise kopf.TemporaryError("the operator is still starting", delay=5)
    uid = str(body.get("metadata", {}).get("uid", ""))
    started = time.monotonic()
    # The timer and the change handlers may fire together for one object; serialise them.
    with _State.lock_for(uid):
        try:
            result = reconcile(body, cluster, datetime.now(UTC), RenderOptions(router_image=ROUTER_IMAGE))
        except (ApiException, HTTPError, OSError) as err:
            RECONCILE_ERRORS.labels(trigger).inc()
            raise kopf.TemporaryError(f"Kubernetes API error: {err}", delay=15) from err
        finally:
            RECONCILE_SECONDS.labels(trigger).observe(time.monotonic() - started)
    for kind_name in result.applied:
        CHILDREN_APPLIED.labels(kind_name.split("/", 1)[0]).inc()
    changed = status_patch(body.get("status"), result.status)
    for key, value in changed.items():
        patch.status[key] = value
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    if result.applied:
        logger.info("applied %s", ", ".join(result.applied))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def on_change(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
    """Create, update and operator restart: one idempotent reconcile."""
    _run("change", body, patch, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
    """Periodic reconcile: restores drifted children and refreshes pool status."""
    _run("resync", body, patch, logger)
