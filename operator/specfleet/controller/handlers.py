"""Kopf handlers: thin wrappers that run the Controller's reconcile and feed the policy scheduler.

Level-based: create, update and resume run the same idempotent reconcile, and a timer runs it again
to restore children edited or deleted by hand and to refresh status. The speculation policy is not a
handler: one `EvaluationSweeper` thread (started at startup) evaluates every resource at its own
`policy.evaluationIntervalSeconds`, fed by an event handler that tracks which resources exist. No
handler holds a worker thread longer than one reconcile. The Controller writes status itself under a
per-object lock; Kopf's own patch stays empty, and `spec` is never written.

Settings arrive explicitly: `build_registry(config)` registers the handlers for one `OperatorConfig`
(the CLI's `run` builds it from its flags) and passes it to them through Kopf's `memo`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Gauge, Histogram
from urllib3.exceptions import HTTPError

from specfleet.api.constants import GROUP, PLURAL, VERSION, PoolName
from specfleet.api.validation import SpeculativeDeployment
from specfleet.controller.control import Controller, Outcome, resource_ref
from specfleet.controller.evaluation_sweeper import EvaluationSweeper, SweepReport
from specfleet.controller.kube import KubeCluster, load_kube_config
from specfleet.controller.resync import ResyncScheduler
from specfleet.controller.standby_driver import StandbyDriver
from specfleet.controller.standby_flips import KubePods, StandbyFlipper, Tick
from specfleet.observe.gauges import ResourceGauges
from specfleet.observe.prometheus import PrometheusAuth, PrometheusQuerier, QueryError, QueryFn
from specfleet.render import RenderOptions
from specfleet_runtime.names import DECISIONS as DECISIONS_NAME
from specfleet_runtime.names import FLIPS as FLIPS_NAME
from specfleet_runtime.router.endpoints import AddressMap

logger = logging.getLogger(__name__)
# Logged (debug) after each resync of one resource, with its namespace and name.
RESYNCED_LOG = "resynced %s/%s"

RECONCILE_SECONDS = Histogram(
    "specfleet_reconcile_duration_seconds", "Time spent in one reconcile.", ["trigger"]
)
RECONCILE_ERRORS = Counter("specfleet_reconcile_errors_total", "Loop iterations that raised.", ["trigger"])
CHILDREN_APPLIED = Counter("specfleet_children_applied_total", "Child objects written.", ["kind"])
DECISIONS = Counter(DECISIONS_NAME, "Policy decisions by pool and reason.", ["pool", "reason"])
FLIPS = Counter(FLIPS_NAME, "Speculation flips by pool and new mode.", ["pool", "to"])
RETUNES = Counter("specfleet_speculation_retunes_total", "Changes of K while speculating, by pool.", ["pool"])
QUERY_SECONDS = Histogram("specfleet_prometheus_query_duration_seconds", "PromQL query latency.")
QUERY_ERRORS = Counter("specfleet_prometheus_query_errors_total", "PromQL queries that got no answer.")
SWEEP_SECONDS = Histogram(
    "specfleet_policy_sweep_duration_seconds",
    "Time one policy sweep took (queries plus every due resource's decision).",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
)
SWEEP_RESOURCES = Gauge("specfleet_policy_sweep_resources", "Resources evaluated by the last policy sweep.")
TRACKED = Gauge("specfleet_policy_tracked_resources", "Resources the policy scheduler knows about.")
# Per-resource gauges (conditions, pool mode and K, replicas, last acceptance) for alerts and dashboards,
# refreshed from every watch event (each status write arrives as one).
RESOURCE_GAUGES = ResourceGauges()


@dataclass(frozen=True)
class OperatorConfig:
    """Everything `specfleet run` decides from its flags, passed to the handlers through memo."""

    kubeconfig: str | None = None
    resync_seconds: float = 30.0
    router_image: str = RenderOptions().router_image
    # Reconciles from changes that may run at once (Kopf's thread pool for sync handlers).
    max_workers: int = 16
    # Periodic resyncs that may run at once, in their own pool: hundreds of timers falling due together
    # queue there and never in front of a user's change.
    resync_workers: int = 2
    # TLS verification and credentials for every Prometheus the resources name.
    prometheus_auth: PrometheusAuth = field(default_factory=PrometheusAuth)
    # Labels on every PodMonitor and PrometheusRule the operator renders (RenderOptions.monitoring_labels).
    monitoring_labels: tuple[tuple[str, str], ...] = ()
    # Pod IPs dialed at other addresses for Standby flips (the router's --endpoint-address-map).
    engine_address_map: AddressMap = ()
    # Where the operator runs (the chart's POD_NAMESPACE): admitted to Standby pools' engines.
    operator_namespace: str | None = None


def _observe_query(seconds: float, ok: bool) -> None:
    QUERY_SECONDS.observe(seconds)
    if not ok:
        QUERY_ERRORS.inc()


def _querier_factory(auth: PrometheusAuth) -> Callable[[str, int], QueryFn]:
    def querier(url: str, timeout_seconds: int) -> QueryFn:
        """A querier for one round of fleet queries (made per round), all evaluated at its creation."""
        try:
            return PrometheusQuerier(
                url, timeout_seconds, on_query=_observe_query, auth=auth, evaluation_time=time.time()
            )
        except (OSError, ValueError) as err:  # an unreadable token or CA file: no answer, the policy holds
            message = f"Prometheus credentials: {err}"

            def fail(_: str) -> list[dict[str, Any]]:
                raise QueryError(message)

            return fail

    return querier


def _count(outcome: Outcome, log: logging.Logger | kopf.Logger) -> None:
    for kind_name in outcome.applied:
        CHILDREN_APPLIED.labels(kind_name.split("/", 1)[0]).inc()
    for decision in outcome.decisions:
        DECISIONS.labels(decision.pool, decision.reason).inc()
        if decision.flip:
            FLIPS.labels(decision.pool, decision.target).inc()
        elif decision.changes:
            RETUNES.labels(decision.pool).inc()
    if outcome.applied:
        log.info("applied %s", ", ".join(outcome.applied))


def _policy_emitter(cluster: KubeCluster) -> Callable[[Mapping[str, Any], Outcome], None]:
    """What the scheduler does with an outcome: its Events (posted directly: no Kopf handler context
    in the scheduler's thread), counters and log lines."""

    def emit(body: Mapping[str, Any], outcome: Outcome) -> None:
        for event in outcome.events:
            try:
                cluster.post_event(body, event)
            except (ApiException, HTTPError, OSError) as err:
                logger.warning(
                    "could not post event %s on %s: %s", event.reason, body["metadata"]["name"], err
                )
        _count(outcome, logger)

    return emit


def _log_sweep(report: SweepReport) -> None:
    SWEEP_SECONDS.observe(report.seconds)
    SWEEP_RESOURCES.set(report.evaluated)
    logger.info(
        "policy sweep: %d resources, %d Prometheus targets, %d failed, %.2fs",
        report.evaluated,
        report.targets,
        report.failed,
        report.seconds,
    )


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Every Kopf setting in one place, each with its reason; then the controller and the scheduler."""
    config: OperatorConfig = memo.config
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
    # After a broken watch, wait 1 s before reconnecting (Kopf's 0.1 s hammers a struggling apiserver).
    settings.watching.reconnect_backoff = 1.0
    settings.networking.request_timeout = 60
    # Sync handlers run in this pool; each holds a worker for one reconcile only (the policy runs in
    # its own scheduler thread), so a small pool serves any number of resources. More threads would
    # not add CPU (one interpreter) but would add memory.
    settings.execution.max_workers = config.max_workers
    # A handler that keeps failing backs off instead of hammering the API.
    settings.queueing.error_delays = (5, 10, 20, 40, 80, 160, 300)
    # Leader election (cli/main.py, a Lease) decides which replica runs at all; Kopf's own peering, which
    # pauses operators of equal priority instead of electing one, stays off.
    settings.peering.standalone = True

    cluster = KubeCluster(load_kube_config(config.kubeconfig))
    controller = Controller(
        cluster,
        RenderOptions(
            router_image=config.router_image,
            monitoring_labels=config.monitoring_labels,
            operator_namespace=config.operator_namespace,
        ),
        _querier_factory(config.prometheus_auth),
    )
    emit = _policy_emitter(cluster)
    scheduler = EvaluationSweeper(controller, emit)
    memo.controller, memo.scheduler, memo.emit = controller, scheduler, emit

    def standby_ticked(sd: SpeculativeDeployment, pool: PoolName, tick: Tick) -> None:
        body = resource_ref(sd.namespace, sd.name)
        body["metadata"]["uid"] = sd.uid  # Events name the object by its uid too
        emit(body, controller.record_standby(sd, pool, tick))

    memo.standby = StandbyDriver(
        StandbyFlipper(KubePods(cluster), address_map=config.engine_address_map),
        standby_ticked,
        idle_seconds=config.resync_seconds,
    )
    memo.standby.start()
    memo.resyncs = ResyncScheduler(
        config.resync_seconds, functools.partial(_resync, memo), workers=config.resync_workers
    )
    memo.resyncs.start()
    scheduler.start(on_sweep=_log_sweep)
    logger.info("specfleet operator configured (resync every %ss)", config.resync_seconds)


def stop_scheduler(memo: kopf.Memo, **_: Any) -> None:
    """Stop the policy scheduler and the resync pool when the operator exits."""
    scheduler: EvaluationSweeper | None = memo.get("scheduler")
    if scheduler is not None:
        scheduler.stop()
    resyncs: ResyncScheduler | None = memo.get("resyncs")
    if resyncs is not None:
        resyncs.stop()
    standby: StandbyDriver | None = memo.get("standby")
    if standby is not None:
        standby.stop()


def probe_controller(memo: kopf.Memo, **_: Any) -> bool:
    """Liveness reports whether startup created the controller."""
    return memo.get("controller") is not None


def _controller(memo: kopf.Memo) -> Controller:
    controller: Controller | None = memo.get("controller")
    if controller is None:
        raise kopf.TemporaryError("the operator is still starting", delay=5)
    return controller


def _reconcile(
    trigger: str, memo: kopf.Memo, body: kopf.Body, name: str, namespace: str | None, logger: kopf.Logger
) -> None:
    with RECONCILE_SECONDS.labels(trigger).time():
        try:
            outcome = _controller(memo).reconcile_object(namespace or "default", name)
        except (ApiException, HTTPError, OSError) as err:
            RECONCILE_ERRORS.labels(trigger).inc()
            raise kopf.TemporaryError(f"Kubernetes API error: {err}", delay=15) from err
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    _count(outcome, logger)


def on_change(
    memo: kopf.Memo, body: kopf.Body, name: str, namespace: str | None, logger: kopf.Logger, **_: Any
) -> None:
    """Create, update and operator restart: one idempotent reconcile."""
    _reconcile("change", memo, body, name, namespace, logger)


def _resync(memo: kopf.Memo, body: Mapping[str, Any]) -> None:
    """Periodic reconcile (ResyncScheduler's pool): restores drifted children and refreshes status.

    Outside Kopf's handler context, so events are posted directly, as the policy scheduler does.
    """
    meta = body["metadata"]
    namespace = meta.get("namespace") or "default"
    with RECONCILE_SECONDS.labels("resync").time():
        try:
            outcome = _controller(memo).reconcile_object(namespace, meta["name"])
        except (ApiException, HTTPError, OSError) as err:
            RECONCILE_ERRORS.labels("resync").inc()
            logger.warning(
                "resync of %s failed, next one in %ss: %s", meta["name"], memo.config.resync_seconds, err
            )
            return
    memo.emit(body, outcome)
    # After its writes and events: tests count these lines to wait for N resyncs of one resource.
    logger.debug(RESYNCED_LOG, namespace, meta["name"])


async def track(memo: kopf.Memo, event: Mapping[str, Any], body: kopf.Body, **_: Any) -> None:
    """Every watch event keeps the scheduler's list of resources current (async: no thread, no I/O)."""
    scheduler: EvaluationSweeper | None = memo.get("scheduler")
    if scheduler is None:
        return
    meta = body.get("metadata") or {}
    resyncs: ResyncScheduler = memo.resyncs
    if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
        scheduler.forget(meta.get("namespace") or "default", meta["name"])
        resyncs.forget(meta.get("namespace") or "default", meta["name"])
        memo.standby.forget(meta.get("namespace") or "default", meta["name"])
        RESOURCE_GAUGES.forget(meta.get("namespace") or "default", meta["name"])
    else:
        tracked = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
        scheduler.track(tracked)
        resyncs.track(tracked)
        # The driver reads the decided mode from status: it gets the whole body.
        memo.standby.track(body)
        RESOURCE_GAUGES.publish(body)
    TRACKED.set(scheduler.tracked())


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """The handlers for one configuration (the timer's interval must be known when registering)."""
    registry = kopf.OperatorRegistry()
    # Our own registry has none of the default one's login handlers: log in as the client library does.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(configure)
    kopf.on.cleanup(registry=registry)(stop_scheduler)
    kopf.on.probe(id="controller", registry=registry)(probe_controller)
    resource = (GROUP, VERSION, PLURAL)
    kopf.on.resume(*resource, registry=registry)(on_change)
    kopf.on.create(*resource, registry=registry)(on_change)
    kopf.on.update(*resource, registry=registry)(on_change)
    # No kopf.timer: timers put a finalizer on every resource (see resync.py); resyncs are ours.
    kopf.on.event(*resource, registry=registry)(track)
    return registry
