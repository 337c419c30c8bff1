"""Observations of every pool from Prometheus (PromQL through prometheus-api-client).

One round of queries serves the whole fleet: `fleet_queries` asks each number once for every pool,
grouped by the pool's labels (`sum by (namespace, specfleet_io_deployment, specfleet_io_pool)`),
`query_fleet` runs them through a query function into `FleetAnswers`, and `observe` (pure) picks
one pool out of the answers and builds its `PoolObservation`. Every way data can be missing is
reported in `problem` (Prometheus unreachable, a query error, no samples, stale or partial samples)
and never read as 0.

Engine series are selected by the labels Prometheus' Kubernetes discovery copies from the pods
(`labelmap` of `__meta_kubernetes_pod_label_(.+)`, or a PodMonitor's podTargetLabels):
`namespace`, `specfleet_io_deployment`, `specfleet_io_pool`, and only in the namespaces of the
resources being evaluated: a pod elsewhere that carries the two labels is never asked about. A
malformed or out-of-range sample is skipped (the pool it names goes without that number) and counted
in `specfleet_prometheus_samples_rejected_total`; it never fails the round.

A Standby pool's pods each hold two engines, one asleep; rounds for resources with Standby pools ask
`fleet_queries(..., standby=True)`, whose per-replica numbers count awake engines only (`vllm_metrics.awake_only`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from specfleet.policy.inputs.fleet_answers import (
    BUCKET_BOUND,
    STALE_AFTER_SECONDS,
    FleetAnswers,
    PoolKey,
    PoolSelector,
    pool_observation,
)
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import BY_POOL, POOL_LABELS, SERIES_DEPLOYMENT, SERIES_POOL
from specfleet_runtime.names import MIN_DRAFTS_IN_WINDOW as MIN_DRAFTS_FOR_ACCEPTANCE
from specfleet_runtime.names import SERIES_SPECULATION as SPECULATION_LABEL

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
    "namespace_matcher",
    "pool_observation",
    "query_fleet",
]

logger = logging.getLogger(__name__)

# A query function: PromQL in, Prometheus' instant-vector result out (list of {metric, value}).
QueryFn = Callable[[str], list[dict[str, Any]]]

SAMPLES_REJECTED = Counter(
    "specfleet_prometheus_samples_rejected_total",
    "Samples in Prometheus' answers skipped as malformed or out of range, by fleet query and reason.",
    ["query", "reason"],
)
# Characters RE2 (Prometheus' regex engine) gives a meaning; escaped to match themselves.
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


class QueryError(Exception):
    """Prometheus could not answer (unreachable, timeout, bad status)."""


def namespace_matcher(namespaces: Collection[str]) -> str:
    """A label matcher selecting series of exactly these namespaces (a PromQL string literal; several
    namespaces as an anchored regex of escaped alternatives)."""
    names = sorted(set(namespaces))
    if not names:
        raise ValueError("no namespace to select")
    if len(names) == 1:
        return f"namespace={json.dumps(names[0], ensure_ascii=False)}"
    pattern = "|".join(_RE2_SPECIAL.sub(r"\\\1", name) for name in names)
    # JSON's string escapes are all valid in PromQL's double-quoted strings (Go's).
    return f"namespace=~{json.dumps(pattern, ensure_ascii=False)}"


def fleet_queries(
    window_seconds: int, namespaces: Collection[str], *, standby: bool = False
) -> dict[str, str]:
    """The PromQL for every number the policy uses, by name, each grouped by pool, over the engines of
    `namespaces` (those of the resources the round serves).

    `standby`: the round serves resources with Standby pools, whose pods each run a second engine
    asleep (scraped too: vLLM >= 0.32 exports vllm:engine_sleep_state, 0 for `awake` while asleep).
    A sleeping engine still reports running 0, KV usage 0 and its own cache config, so counted it
    would add a replica to `replicas` (replicas_reporting) and halve the per-replica means; these
    queries count only awake engines (`vllm_metrics.awake_only`). `running_per_replica` becomes every engine's
    window mean summed over the awake engines' count, so the requests an engine served before it fell
    asleep within the window still count, against one replica per pod. Counter rates and sums need no
    filter (a sleeping engine adds nothing to them) and stay as they are. Without Standby pools the
    queries are the plain ones, unchanged, and such rounds are asked apart (`PrometheusTarget.standby`).
    """
    by = BY_POOL
    # Only specfleet engines (the pod labels the renderer sets on every engine pod) of those namespaces.
    sel = f'{namespace_matcher(namespaces)},{SERIES_DEPLOYMENT}!="",{SERIES_POOL}!=""'
    w = f"{window_seconds}s"

    def rate_sum(metric: str) -> str:
        return f"sum by ({by}) (rate({metric}{{{sel}}}[{w}]))"

    def mean_per_request(histogram: str) -> str:
        return f"{rate_sum(histogram + '_sum')} / {rate_sum(histogram + '_count')}"

    def buckets(histogram: str) -> str:
        """Each cumulative bucket's rate, summed over the pool's engines (one series per `le`)."""
        return f"sum by ({by}, {BUCKET_BOUND}) (rate({histogram}_bucket{{{sel}}}[{w}]))"

    def itl_quantile(q: float) -> str:
        return f"histogram_quantile({q}, {buckets(vm.INTER_TOKEN_LATENCY)})"

    running = f"avg_over_time({vm.REQUESTS_RUNNING}{{{sel}}}[{w}])"
    kv_usage = f"avg_over_time({vm.KV_CACHE_USAGE}{{{sel}}}[{w}])"
    replicas = f"{vm.REQUESTS_RUNNING}{{{sel}}}"
    cache_config = f"{vm.CACHE_CONFIG_INFO}{{{sel}}}"
    if standby:
        running_per_replica = f"sum by ({by}) ({running}) / count by ({by}) {vm.awake_only(running, sel)}"
        kv_usage_mean = f"avg by ({by}) {vm.awake_only(kv_usage, sel)}"
        replicas, cache_config = vm.awake_only(replicas, sel), vm.awake_only(cache_config, sel)
    else:
        running_per_replica, kv_usage_mean = f"avg by ({by}) ({running})", f"avg by ({by}) ({kv_usage})"
        replicas, cache_config = f"({replicas})", f"({cache_config})"

    return {
        "drafts": rate_sum(vm.SPEC_DRAFTS),
        "draft_tokens": rate_sum(vm.SPEC_DRAFT_TOKENS),
        "accepted": rate_sum(vm.SPEC_ACCEPTED_TOKENS),
        "accepted_per_pos": (
            f"sum by ({by}, {vm.LABEL_POSITION}) (rate({vm.SPEC_ACCEPTED_PER_POS}{{{sel}}}[{w}]))"
        ),
        "running_per_replica": running_per_replica,
        "replicas": f"count by ({by}) {replicas}",
        # Averaged over the window like the running count: the two make the demand, and its trend.
        "waiting": f"sum by ({by}) (avg_over_time({vm.REQUESTS_WAITING}{{{sel}}}[{w}]))",
        "generation_tps": rate_sum(vm.GENERATION_TOKENS),
        "itl_p50": itl_quantile(0.5),
        "itl_p99": itl_quantile(0.99),
        "sample_age": f"time() - max by ({by}) (timestamp({vm.REQUESTS_RUNNING}{{{sel}}}))",
        # How much of the window the pool's youngest series covers, without knowing the scrape
        # interval: its samples in the window over those in the window's second half, halved (1: the
        # whole window; 0.5 or less: at most its second half). A counter's rate over a window that
        # began before its series (a pod that started in it) counts only the part it covers.
        "window_coverage": (
            f"min by ({by}) (count_over_time({vm.REQUESTS_RUNNING}{{{sel}}}[{w}]) "
            f"/ count_over_time({vm.REQUESTS_RUNNING}{{{sel}}}[{window_seconds * 500}ms])) / 2"
        ),
        # Memory (each missing answer only turns the policy's memory reasoning off).
        "kv_usage": kv_usage_mean,
        "preemptions": rate_sum(vm.NUM_PREEMPTIONS),
        "kv_capacity": (
            f"max by ({by}, {SPECULATION_LABEL}, {vm.LABEL_NUM_GPU_BLOCKS}, {vm.LABEL_BLOCK_SIZE}) "
            f"{cache_config}"
        ),
        "prompt_len": mean_per_request(vm.REQUEST_PROMPT_TOKENS),
        "output_len": mean_per_request(vm.REQUEST_GENERATION_TOKENS),
        # Share of prompt tokens the engines' prefix caches served: hits over lookups, both in tokens
        # (no lookup in the window is 0 / 0, NaN: not measured).
        "prefix_hit_rate": f"{rate_sum(vm.PREFIX_CACHE_HITS)} / {rate_sum(vm.PREFIX_CACHE_QUERIES)}",
        # Requests by latency, for a pool's SLO attainment (each missing answer leaves it unmeasured).
        "ttft_buckets": buckets(vm.TIME_TO_FIRST_TOKEN),
        "tpot_buckets": buckets(vm.TIME_PER_OUTPUT_TOKEN),
    }


def query_fleet(
    query: QueryFn,
    window_seconds: int,
    namespaces: Collection[str],
    now: float | None = None,
    *,
    standby: bool = False,
) -> FleetAnswers:
    """Run each fleet query once over `namespaces`; the first failure stops the round (every pool then
    holds). Rejected samples are counted (and logged); `now` (Unix seconds) bounds sample times.
    `standby`: the round's resources have Standby pools (see `fleet_queries`)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for name, promql in fleet_queries(window_seconds, namespaces, standby=standby).items():
        try:
            results[name] = query(promql)
        except QueryError as err:
            return FleetAnswers(error=str(err))
    answers = FleetAnswers.from_results(results, now)
    for (name, reason), count in answers.rejected.items():
        SAMPLES_REJECTED.labels(name, reason).inc(count)
    if answers.rejected:
        logger.info(
            "skipped Prometheus samples: %s",
            ", ".join(f"{n} {name} ({reason})" for (name, reason), n in sorted(answers.rejected.items())),
        )
    return answers


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
