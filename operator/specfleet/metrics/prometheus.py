"""Observations of a pool from Prometheus (PromQL through prometheus-api-client).

Split in two: `pool_queries` builds the PromQL (pure, unit-tested), `observe_pool` runs it through a
query function and turns answers into a `PoolObservation`. Every way data can be missing is reported
in `problem` (Prometheus unreachable, a query error, no samples, stale samples) and never read as 0.

Engine series are selected by the labels Prometheus' Kubernetes discovery copies from the pods
(`labelmap` of `__meta_kubernetes_pod_label_(.+)`, or a PodMonitor's podTargetLabels):
`namespace`, `specfleet_io_deployment`, `specfleet_io_pool`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specfleet.policy.observations import PoolObservation
from specfleet_runtime import vllm_metrics as vm

# A query function: PromQL in, Prometheus' instant-vector result out (list of {metric, value}).
QueryFn = Callable[[str], list[dict[str, Any]]]

# Samples older than this many scrape windows mean the targets are gone or Prometheus stopped scraping.
STALE_AFTER_SECONDS = 60.0
# Fewer drafts than this in the window say little about acceptance (a freshly started or nearly idle
# pool): acceptance is then reported as unknown rather than decided on.
MIN_DRAFTS_FOR_ACCEPTANCE = 100


class QueryError(Exception):
    """Prometheus could not answer (unreachable, timeout, bad status)."""


@dataclass(frozen=True)
class PoolSelector:
    """Which engine series belong to one pool of one SpeculativeDeployment."""

    namespace: str
    deployment: str
    pool: str

    def promql(self) -> str:
        return (
            f'namespace="{self.namespace}",specfleet_io_deployment="{self.deployment}",'
            f'specfleet_io_pool="{self.pool}"'
        )


def pool_queries(selector: PoolSelector, window_seconds: int) -> dict[str, str]:
    """The PromQL for every number the policy uses, by name."""
    sel = selector.promql()
    w = f"{window_seconds}s"

    def rate_sum(metric: str) -> str:
        return f"sum(rate({metric}{{{sel}}}[{w}]))"

    return {
        "drafts": rate_sum(vm.SPEC_DRAFTS),
        "draft_tokens": rate_sum(vm.SPEC_DRAFT_TOKENS),
        "accepted": rate_sum(vm.SPEC_ACCEPTED_TOKENS),
        "accepted_per_pos": f"sum by ({vm.LABEL_POSITION}) (rate({vm.SPEC_ACCEPTED_PER_POS}{{{sel}}}[{w}]))",
        "running_per_replica": f"avg(avg_over_time({vm.REQUESTS_RUNNING}{{{sel}}}[{w}]))",
        "replicas": f"count({vm.REQUESTS_RUNNING}{{{sel}}})",
        "waiting": f"sum({vm.REQUESTS_WAITING}{{{sel}}})",
        "generation_tps": rate_sum(vm.GENERATION_TOKENS),
        "itl_p50": f"histogram_quantile(0.5, sum by (le) (rate({vm.INTER_TOKEN_LATENCY}_bucket{{{sel}}}[{w}])))",
        "itl_p99": f"histogram_quantile(0.99, sum by (le) (rate({vm.INTER_TOKEN_LATENCY}_bucket{{{sel}}}[{w}])))",
        "sample_age": f"time() - max(timestamp({vm.REQUESTS_RUNNING}{{{sel}}}))",
    }


def _scalar(result: list[dict[str, Any]]) -> float | None:
    """The single value of an aggregated instant vector; None when empty or not a number."""
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


def observe_pool(
    query: QueryFn,
    selector: PoolSelector,
    window_seconds: int,
    now: datetime,
    *,
    pool_mode: str = "On",
    expected_replicas: int | None = None,
) -> PoolObservation:
    """Run the pool's queries and build its observation; never raises for missing data.

    `expected_replicas` (the ready engines of a settled pool) turns "some engines have no samples"
    into a problem: averages over part of a pool would misstate its load.
    """
    queries = pool_queries(selector, window_seconds)
    answers: dict[str, list[dict[str, Any]]] = {}
    for name, promql in queries.items():
        try:
            answers[name] = query(promql)
        except QueryError as err:
            return PoolObservation(pool=selector.pool, at=now, problem=f"Prometheus query failed: {err}")
    replicas = _scalar(answers["replicas"])
    if not replicas:
        return PoolObservation(
            pool=selector.pool, at=now, problem=f"no engine samples for pool {selector.pool} in Prometheus"
        )
    if expected_replicas is not None and replicas < expected_replicas:
        return PoolObservation(
            pool=selector.pool,
            at=now,
            problem=f"partial metrics for pool {selector.pool}: {int(replicas)} of {expected_replicas} "
            "ready engines have samples",
            replicas_reporting=int(replicas),
        )
    age = _scalar(answers["sample_age"])
    if age is None or age > max(STALE_AFTER_SECONDS, window_seconds):
        return PoolObservation(
            pool=selector.pool,
            at=now,
            problem=f"stale metrics for pool {selector.pool}: newest sample is {age or float('nan'):.0f}s old",
            replicas_reporting=int(replicas),
        )
    drafts = _scalar(answers["drafts"])
    accepted = _scalar(answers["accepted"])
    draft_tokens = _scalar(answers["draft_tokens"])
    acceptance_length = None
    per_position: tuple[float, ...] = ()
    rate = None
    drafts_in_window = (drafts or 0.0) * window_seconds
    if drafts and drafts_in_window >= MIN_DRAFTS_FOR_ACCEPTANCE and accepted is not None:
        acceptance_length = 1 + accepted / drafts
        by_pos = {
            int(r["metric"].get(vm.LABEL_POSITION, -1)): float(r["value"][1])
            for r in answers["accepted_per_pos"]
        }
        per_position = tuple(min(1.0, max(0.0, by_pos[i] / drafts)) for i in sorted(by_pos) if i >= 0)
        if draft_tokens:
            rate = accepted / draft_tokens
    return PoolObservation(
        pool=selector.pool,
        at=now,
        acceptance_length=acceptance_length,
        per_position=per_position,
        draft_acceptance_rate=rate,
        acceptance_source=None if acceptance_length is None else ("pool" if pool_mode == "On" else "canary"),
        running_per_replica=_scalar(answers["running_per_replica"]),
        waiting=_scalar(answers["waiting"]),
        generation_tokens_per_second=_scalar(answers["generation_tps"]),
        itl_p50_seconds=_scalar(answers["itl_p50"]),
        itl_p99_seconds=_scalar(answers["itl_p99"]),
        replicas_reporting=int(replicas),
        drafts_in_window=drafts_in_window,
    )


class PrometheusQuerier:
    """A `QueryFn` over a real Prometheus, with a timeout and no hidden retries (the policy holds instead)."""

    def __init__(
        self, url: str, timeout_seconds: float, on_query: Callable[[float, bool], None] | None = None
    ):
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self._client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout_seconds
        )
        self._timeout = timeout_seconds
        self._url = url
        self._on_query = on_query

    def __call__(self, promql: str) -> list[dict[str, Any]]:
        started = time.monotonic()
        ok = False
        try:
            result = self._client.custom_query(query=promql, params={"timeout": f"{self._timeout}s"})
            ok = True
        except Exception as err:  # the client raises requests' and its own errors; all mean "no answer"
            raise QueryError(_short_reason(err, self._url)) from err
        finally:
            if self._on_query is not None:
                self._on_query(time.monotonic() - started, ok)
        if not isinstance(result, list):
            raise QueryError(f"unexpected answer: {result!r:.200}")
        return result


def _short_reason(err: Exception, url: str) -> str:
    """One line a human can act on (requests' messages embed the whole query URL)."""
    import requests

    if isinstance(err, requests.exceptions.Timeout):
        return f"{url} did not answer in time"
    if isinstance(err, requests.exceptions.ConnectionError):
        return f"cannot connect to {url}"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"
