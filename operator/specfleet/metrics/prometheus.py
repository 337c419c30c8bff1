"""Observations of every pool from Prometheus (PromQL through prometheus-api-client).

One round of queries serves the whole fleet: `fleet_queries` asks each number once for every pool,
grouped by the pool's labels (`sum by (namespace, specfleet_io_deployment, specfleet_io_pool)`),
`query_fleet` runs them through a query function into `FleetAnswers`, and `observe` (pure) picks
one pool out of the answers and builds its `PoolObservation`. Every way data can be missing is
reported in `problem` (Prometheus unreachable, a query error, no samples, stale or partial samples)
and never read as 0.

Engine series are selected by the labels Prometheus' Kubernetes discovery copies from the pods
(`labelmap` of `__meta_kubernetes_pod_label_(.+)`, or a PodMonitor's podTargetLabels):
`namespace`, `specfleet_io_deployment`, `specfleet_io_pool`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specfleet.policy.answers import (
    MIN_DRAFTS_FOR_ACCEPTANCE,
    POOL_LABELS,
    STALE_AFTER_SECONDS,
    FleetAnswers,
    PoolKey,
    PoolSelector,
    observe,
)
from specfleet_runtime import vllm_metrics as vm

__all__ = [
    "MIN_DRAFTS_FOR_ACCEPTANCE",
    "POOL_LABELS",
    "STALE_AFTER_SECONDS",
    "FleetAnswers",
    "PoolKey",
    "PoolSelector",
    "PrometheusAuth",
    "PrometheusQuerier",
    "QueryError",
    "QueryFn",
    "fleet_queries",
    "observe",
    "query_fleet",
]

# A query function: PromQL in, Prometheus' instant-vector result out (list of {metric, value}).
QueryFn = Callable[[str], list[dict[str, Any]]]


class QueryError(Exception):
    """Prometheus could not answer (unreachable, timeout, bad status)."""


def fleet_queries(window_seconds: int) -> dict[str, str]:
    """The PromQL for every number the policy uses, by name, each grouped by pool."""
    by = ", ".join(POOL_LABELS)
    # Only specfleet engines: the pod labels the renderer sets on every engine pod.
    sel = 'specfleet_io_deployment!="",specfleet_io_pool!=""'
    w = f"{window_seconds}s"

    def rate_sum(metric: str) -> str:
        return f"sum by ({by}) (rate({metric}{{{sel}}}[{w}]))"

    def itl_quantile(q: float) -> str:
        return f"histogram_quantile({q}, sum by ({by}, le) (rate({vm.INTER_TOKEN_LATENCY}_bucket{{{sel}}}[{w}])))"

    return {
        "drafts": rate_sum(vm.SPEC_DRAFTS),
        "draft_tokens": rate_sum(vm.SPEC_DRAFT_TOKENS),
        "accepted": rate_sum(vm.SPEC_ACCEPTED_TOKENS),
        "accepted_per_pos": (
            f"sum by ({by}, {vm.LABEL_POSITION}) (rate({vm.SPEC_ACCEPTED_PER_POS}{{{sel}}}[{w}]))"
        ),
        "running_per_replica": f"avg by ({by}) (avg_over_time({vm.REQUESTS_RUNNING}{{{sel}}}[{w}]))",
        "replicas": f"count by ({by}) ({vm.REQUESTS_RUNNING}{{{sel}}})",
        "waiting": f"sum by ({by}) ({vm.REQUESTS_WAITING}{{{sel}}})",
        "generation_tps": rate_sum(vm.GENERATION_TOKENS),
        "itl_p50": itl_quantile(0.5),
        "itl_p99": itl_quantile(0.99),
        "sample_age": f"time() - max by ({by}) (timestamp({vm.REQUESTS_RUNNING}{{{sel}}}))",
    }


def query_fleet(query: QueryFn, window_seconds: int) -> FleetAnswers:
    """Run each fleet query once; the first failure stops the round (every pool then holds)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for name, promql in fleet_queries(window_seconds).items():
        try:
            results[name] = query(promql)
        except QueryError as err:
            return FleetAnswers(error=str(err))
    return FleetAnswers.from_results(results)


@dataclass(frozen=True)
class PrometheusAuth:
    """How the operator talks to Prometheus over TLS and authenticates, from files mounted into its pod
    (a Secret or the projected service-account token: the operator reads no Secret through the API).

    Certificates are verified by default, against `ca_file` when given (else the system's CAs);
    `insecure_skip_verify` turns verification off and must be asked for. Files are read again for each
    querier, so rotated tokens and certificates are picked up.
    """

    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token_file: str | None = None
    # One line, "username:password".
    basic_auth_file: str | None = None

    def verify(self) -> bool | str:
        """requests' `verify`: False, a CA bundle path, or True (the system's CAs)."""
        if self.insecure_skip_verify:
            return False
        return self.ca_file or True

    def headers(self) -> dict[str, str]:
        if self.bearer_token_file is None:
            return {}
        with open(self.bearer_token_file, encoding="utf-8") as f:
            return {"Authorization": f"Bearer {f.read().strip()}"}

    def basic_auth(self) -> tuple[str, str] | None:
        if self.basic_auth_file is None:
            return None
        with open(self.basic_auth_file, encoding="utf-8") as f:
            user, sep, password = f.read().strip().partition(":")
        if not sep:
            raise ValueError(f"{self.basic_auth_file} must hold one line 'username:password'")
        return user, password


class PrometheusQuerier:
    """A `QueryFn` over a real Prometheus, with a timeout and no hidden retries (the policy holds instead)."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float,
        on_query: Callable[[float, bool], None] | None = None,
        auth: PrometheusAuth | None = None,
        evaluation_time: float | None = None,
    ):
        import requests
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        auth = auth or PrometheusAuth()
        session = requests.Session()
        session.verify = auth.verify()
        self._client = PrometheusConnect(
            url=url,
            headers=auth.headers() or None,
            auth=auth.basic_auth(),
            retry=Retry(total=0),
            timeout=timeout_seconds,
            session=session,
        )
        self._url = url
        self._on_query = on_query
        # Every query evaluated at this instant (Unix seconds): one round is one consistent snapshot,
        # so ratios of its answers (acceptance = accepted / drafts) do not drift between queries.
        self._params = {"timeout": f"{timeout_seconds}s"}
        if evaluation_time is not None:
            self._params["time"] = f"{evaluation_time:.3f}"

    def __call__(self, promql: str) -> list[dict[str, Any]]:
        started = time.monotonic()
        ok = False
        try:
            result = self._client.custom_query(query=promql, params=dict(self._params))
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
    from urllib3.exceptions import ReadTimeoutError

    # With urllib3 retries set (Retry(total=0)), requests reports a read timeout as a ConnectionError
    # whose MaxRetryError names the timeout: a slow Prometheus is not an unreachable one.
    retried = err.args[0] if isinstance(err, requests.exceptions.ConnectionError) and err.args else None
    timed_out = isinstance(getattr(retried, "reason", None), ReadTimeoutError)
    if timed_out or isinstance(err, requests.exceptions.Timeout):
        return f"{url} did not answer in time"
    if isinstance(err, requests.exceptions.ConnectionError):
        return f"cannot connect to {url}"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"
