"""Kopf handlers: thin wrappers that run the Controller's two loops and emit their events.

Level-based: create, update and resume run the same idempotent reconcile, and a timer runs it again
to restore children edited or deleted by hand and to refresh status. A daemon per resource runs the
speculation policy at the resource's own `policy.evaluationIntervalSeconds`. The Controller writes
status itself under a per-object lock; Kopf's own patch stays empty, and `spec` is never written.
"""

from __future__ import annotations

import os
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Histogram
from urllib3.exceptions import HTTPError

from specfleet.api.constants import GROUP, PLURAL, VERSION
from specfleet.control import Controller, Outcome
from specfleet.kube import KubeCluster, load_kube_config
from specfleet.metrics.prometheus import PrometheusQuerier, QueryFn
from specfleet.metrics.resources import ResourceGauges
from specfleet.render import RenderOptions

# Read once at import: Kopf needs the timer interval when the decorator runs.
RESYNC_SECONDS = float(os.environ.get("SPECFLEET_RESYNC_SECONDS", "30"))
ROUTER_IMAGE = os.environ.get("SPECFLEET_ROUTER_IMAGE", RenderOptions().router_image)

RECONCILE_SECONDS = Histogram(
    "specfleet_reconcile_duration_seconds", "Time spent in one reconcile.", ["trigger"]
)
RECONCILE_ERRORS = Counter("specfleet_reconcile_errors_total", "Loop iterations that raised.", ["trigger"])
CHILDREN_APPLIED = Counter("specfleet_children_applied_total", "Child objects written.", ["kind"])
DECISIONS = Counter(
    "specfleet_policy_decisions_total", "Policy decisions by pool and reason.", ["pool", "reason"]
)
FLIPS = Counter(
    "specfleet_speculation_flips_total", "Speculation flips by pool and new mode.", ["pool", "to"]
)
RETUNES = Counter("specfleet_speculation_retunes_total", "Changes of K while speculating, by pool.", ["pool"])
QUERY_SECONDS = Histogram("specfleet_prometheus_query_duration_seconds", "PromQL query latency.")
QUERY_ERRORS = Counter("specfleet_prometheus_query_errors_total", "PromQL queries that got no answer.")
# Per-resource gauges (conditions, pool mode and K, replicas, last acceptance) for alerts and dashboards.
RESOURCE_GAUGES = ResourceGauges()


def _observe_query(seconds: float, ok: bool) -> None:
    QUERY_SECONDS.observe(seconds)
    if not ok:
        QUERY_ERRORS.inc()


def _querier(url: str, timeout_seconds: int) -> QueryFn:
    return PrometheusQuerier(url, timeout_seconds, on_query=_observe_query)


class _State:
    """Process-wide state created at startup."""

    controller: Controller | None = None


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
    # Sync handlers and daemons run in threads: one per resource daemon plus handlers.
    settings.execution.max_workers = 32
    # A handler that keeps failing backs off instead of hammering the API.
    settings.batching.error_delays = (5, 10, 20, 40, 80, 160, 300)
    cluster = KubeCluster(load_kube_config(os.environ.get("KUBECONFIG")))
    _State.controller = Controller(cluster, RenderOptions(router_image=ROUTER_IMAGE), _querier)
    logger.info("specfleet operator configured (resync every %ss)", RESYNC_SECONDS)


@kopf.on.probe(id="controller")
def probe_controller(**_: Any) -> bool:
    """Liveness reports whether startup created the controller."""
    return _State.controller is not None


def _controller() -> Controller:
    if _State.controller is None:
        raise kopf.TemporaryError("the operator is still starting", delay=5)
    return _State.controller


def _emit(body: kopf.Body, outcome: Outcome, logger: kopf.Logger) -> None:
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    for kind_name in outcome.applied:
        CHILDREN_APPLIED.labels(kind_name.split("/", 1)[0]).inc()
    for decision in outcome.decisions:
        DECISIONS.labels(decision.pool, decision.reason).inc()
        if decision.flip:
            FLIPS.labels(decision.pool, decision.target).inc()
        elif decision.changes:
            RETUNES.labels(decision.pool).inc()
    if outcome.applied:
        logger.info("applied %s", ", ".join(outcome.applied))


def _reconcile(trigger: str, body: kopf.Body, name: str, namespace: str | None, logger: kopf.Logger) -> None:
    with RECONCILE_SECONDS.labels(trigger).time():
        try:
            outcome = _controller().reconcile_object(namespace or "default", name)
        except (ApiException, HTTPError, OSError) as err:
            RECONCILE_ERRORS.labels(trigger).inc()
            raise kopf.TemporaryError(f"Kubernetes API error: {err}", delay=15) from err
    _emit(body, outcome, logger)
    RESOURCE_GAUGES.publish(body)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def on_change(body: kopf.Body, name: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    """Create, update and operator restart: one idempotent reconcile."""
    _reconcile("change", body, name, namespace, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, name: str, namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    """Periodic reconcile: restores drifted children and refreshes pool status."""
    _reconcile("resync", body, name, namespace, logger)


@kopf.daemon(GROUP, VERSION, PLURAL, initial_delay=5, cancellation_timeout=10)
def policy_loop(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Evaluate the speculation policy every policy.evaluationIntervalSeconds until the resource goes."""
    controller = _controller()
    while not stopped:
        delay = 30.0
        try:
            outcome = controller.evaluate_policy(namespace or "default", name)
            delay = outcome.next_seconds
            _emit(body, outcome, logger)
        except (ApiException, HTTPError, OSError) as err:
            RECONCILE_ERRORS.labels("policy").inc()
            logger.warning("policy evaluation failed, retrying in %ss: %s", delay, err)
        stopped.wait(delay)
    controller.forget(namespace or "default", name)
    RESOURCE_GAUGES.forget(namespace or "default", name)
