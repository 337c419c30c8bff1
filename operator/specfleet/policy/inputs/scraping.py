"""Whether Prometheus scrapes each Auto pool's Ready pods, and what to check when it does not (pure).

An empty answer for one evaluation is normal right after pods become Ready (the first scrape, a
discovery refresh); an empty answer for NOT_SCRAPING_EVALUATIONS evaluations in a row while pods are
Ready means Prometheus is not scraping them. The count lives in status
(`pools.<pool>.unscrapedEvaluations`), so a restarted operator goes on counting; the message names
the series the policy's queries select and what should make Prometheus scrape the pods (the
PodMonitor and its labels, or the scrape annotations).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specfleet.api.constants import LABEL_DEPLOYMENT, LABEL_POOL
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.inputs.observation import PoolObservation
from specfleet_runtime.names import SERIES_DEPLOYMENT, SERIES_POOL

# Evaluations in a row with no series of a pool's Ready pods before MetricsAvailable says that
# Prometheus is not scraping them (fewer: MetricsUnavailable, as any missing data).
NOT_SCRAPING_EVALUATIONS = 3


@dataclass(frozen=True)
class ScrapeSetup:
    """What should make Prometheus scrape one resource's pods: its spec.monitoring and the
    installation's PodMonitor labels (the chart's monitoring.labels)."""

    namespace: str
    name: str
    pod_monitor: bool
    scrape_annotations: bool
    # The labels a Prometheus' podMonitorSelector would match on the PodMonitor: the installation's,
    # then the resource's (which win), as the renderer sets them.
    monitor_labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(
        cls, sd: SpeculativeDeployment, installation_labels: Iterable[tuple[str, str]] = ()
    ) -> ScrapeSetup:
        monitoring = sd.spec.monitoring
        labels = {**dict(installation_labels), **monitoring.labels}
        return cls(
            namespace=sd.namespace,
            name=sd.name,
            pod_monitor=monitoring.pod_monitor,
            scrape_annotations=monitoring.scrape_annotations,
            monitor_labels=tuple(sorted(labels.items())),
        )


def unscraped_evaluations(previous: int | None, observation: PoolObservation | None) -> int | None:
    """The pool's count after this evaluation: one more while Prometheus answers with no series of its
    Ready pods (up to NOT_SCRAPING_EVALUATIONS, so a lasting outage writes no more status), kept when
    Prometheus did not answer, unset otherwise (series seen, no pod Ready, or not an Auto pool)."""
    if observation is None:
        return None
    if observation.ready_without_series is None:
        return previous
    if observation.ready_without_series <= 0:
        return None
    return min(max(previous or 0, 0) + 1, NOT_SCRAPING_EVALUATIONS)


def not_scraping(count: int | None, observation: PoolObservation) -> bool:
    """Prometheus answered again with no series of the pool's Ready pods, for long enough to say so."""
    return bool(observation.ready_without_series) and (count or 0) >= NOT_SCRAPING_EVALUATIONS


def ready_pods(count: int) -> str:
    """The subject of "... Ready": "1 pod is", "2 pods are"."""
    return "1 pod is" if count == 1 else f"{count} pods are"


def series_selector(namespace: str, name: str, pool: str) -> str:
    """The labels the policy's queries group a pool's engine series by, as a PromQL selector."""
    return f'{{namespace="{namespace}",{SERIES_DEPLOYMENT}="{name}",{SERIES_POOL}="{pool}"}}'


def _what_to_check(setup: ScrapeSetup) -> str:
    if setup.pod_monitor:
        labels = ",".join(f"{k}={v}" for k, v in setup.monitor_labels) or "none beyond specfleet's own"
        return (
            f"that your Prometheus selects PodMonitor {setup.namespace}/{setup.name}: its "
            f"podMonitorSelector must match the PodMonitor's labels ({labels}; kube-prometheus-stack's "
            "wants release=<its Helm release name>: set it in spec.monitoring.labels or the chart's "
            f"monitoring.labels) and its podMonitorNamespaceSelector must include namespace {setup.namespace}"
        )
    if setup.scrape_annotations:
        return (
            f"that a Prometheus scrape job keeps the pods of namespace {setup.namespace} annotated "
            "prometheus.io/scrape=true (port and path in prometheus.io/port and prometheus.io/path) and "
            "copies their labels onto the series (labelmap of __meta_kubernetes_pod_label_(.+)), or set "
            "spec.monitoring.podMonitor: true"
        )
    return (
        "that a scrape job of your own keeps these pods with their labels: spec.monitoring sets neither "
        "podMonitor nor scrapeAnnotations, so nothing specfleet renders makes Prometheus scrape them "
        "(set spec.monitoring.podMonitor: true)"
    )


def not_scraping_message(setup: ScrapeSetup, pool: str, ready: int) -> str:
    """What a pool whose Ready pods Prometheus does not scrape says, and what to check."""
    selector = series_selector(setup.namespace, setup.name, pool)
    return (
        f"{pool}: Prometheus is not scraping this pool's pods: {ready_pods(ready)} Ready, but it has had no "
        f"series {selector} for {NOT_SCRAPING_EVALUATIONS} evaluations in a row (the pods' labels "
        f"{LABEL_DEPLOYMENT}={setup.name}, {LABEL_POOL}={pool} become those series labels); check "
        f"{_what_to_check(setup)}"
    )
