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

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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

# The labels that name a pool on engine series, in the order of `PoolKey`.
POOL_LABELS = ("namespace", "specfleet_io_deployment", "specfleet_io_pool")
# (namespace, deployment, pool)
PoolKey = tuple[str, str, str]


class QueryError(Exception):
    """Prometheus could not answer (unreachable, timeout, bad status)."""


@dataclass(frozen=True)
class PoolSelector:
    """Which engine series belong to one pool of one SpeculativeDeployment."""

    namespace: str
    deployment: str
    pool: str

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.deployment, self.pool)


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


def _number(sample: dict[str, Any]) -> float | None:
    """A sample's value; None when it is not a number (NaN, +-Inf: e.g. a quantile of no data)."""
    value = float(sample["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


def _key(sample: dict[str, Any]) -> PoolKey:
    labels = sample.get("metric") or {}
    return (labels.get(POOL_LABELS[0], ""), labels.get(POOL_LABELS[1], ""), labels.get(POOL_LABELS[2], ""))


@dataclass(frozen=True)
class FleetAnswers:
    """One round of fleet queries: each number by pool, or why Prometheus gave none."""

    error: str | None = None
    # query name -> pool -> value (absent: no sample, or not a number)
    values: Mapping[str, Mapping[PoolKey, float]] = field(default_factory=dict)
    # pool -> position -> accepted tokens per second at that position
    per_position: Mapping[PoolKey, Mapping[int, float]] = field(default_factory=dict)

    @classmethod
    def from_results(cls, results: Mapping[str, list[dict[str, Any]]]) -> FleetAnswers:
        """Index Prometheus' answers (query name -> instant vector) by pool."""
        values: dict[str, dict[PoolKey, float]] = {}
        per_position: dict[PoolKey, dict[int, float]] = {}
        for name, samples in results.items():
            for sample in samples:
                number = _number(sample)
                if number is None:
                    continue
                if name == "accepted_per_pos":
                    position = int((sample.get("metric") or {}).get(vm.LABEL_POSITION, -1))
                    if position >= 0:
                        per_position.setdefault(_key(sample), {})[position] = number
                else:
                    values.setdefault(name, {})[_key(sample)] = number
        return cls(values=values, per_position=per_position)

    def get(self, name: str, key: PoolKey) -> float | None:
        return self.values.get(name, {}).get(key)


def query_fleet(query: QueryFn, window_seconds: int) -> FleetAnswers:
    """Run each fleet query once; the first failure stops the round (every pool then holds)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for name, promql in fleet_queries(window_seconds).items():
        try:
            results[name] = query(promql)
        except QueryError as err:
            return FleetAnswers(error=str(err))
    return FleetAnswers.from_results(results)


def observe(
    answers: FleetAnswers,
    selector: PoolSelector,
    window_seconds: int,
    now: datetime,
    *,
    pool_mode: str = "On",
    expected_replicas: int | None = None,
) -> PoolObservation:
    """One pool's observation from the fleet's answers (pure; never raises for missing data).

    `expected_replicas` (the ready engines of a settled pool) turns "some engines have no samples"
    into a problem: averages over part of a pool would misstate its load.
    """
    pool, key = selector.pool, selector.key
    if answers.error is not None:
        return PoolObservation(pool=pool, at=now, problem=f"Prometheus query failed: {answers.error}")
    replicas = answers.get("replicas", key)
    if not replicas:
        return PoolObservation(pool=pool, at=now, problem=f"no engine samples for pool {pool} in Prometheus")
    if expected_replicas is not None and replicas < expected_replicas:
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"partial metrics for pool {pool}: {int(replicas)} of {expected_replicas} "
            "ready engines have samples",
            replicas_reporting=int(replicas),
        )
    age = answers.get("sample_age", key)
    if age is None or age > max(STALE_AFTER_SECONDS, window_seconds):
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"stale metrics for pool {pool}: newest sample is {age or float('nan'):.0f}s old",
            replicas_reporting=int(replicas),
        )
    drafts = answers.get("drafts", key)
    accepted = answers.get("accepted", key)
    draft_tokens = answers.get("draft_tokens", key)
    acceptance_length = None
    per_position: tuple[float, ...] = ()
    rate = None
    drafts_in_window = (drafts or 0.0) * window_seconds
    if drafts and drafts_in_window >= MIN_DRAFTS_FOR_ACCEPTANCE and accepted is not None:
        acceptance_length = 1 + accepted / drafts
        by_pos = answers.per_position.get(key, {})
        per_position = tuple(min(1.0, max(0.0, by_pos[i] / drafts)) for i in sorted(by_pos))
        if draft_tokens:
            rate = accepted / draft_tokens
    return PoolObservation(
        pool=pool,
        at=now,
        acceptance_length=acceptance_length,
        per_position=per_position,
        draft_acceptance_rate=rate,
        acceptance_source=None if acceptance_length is None else ("pool" if pool_mode == "On" else "canary"),
        running_per_replica=answers.get("running_per_replica", key),
        waiting=answers.get("waiting", key),
        generation_tokens_per_second=answers.get("generation_tps", key),
        itl_p50_seconds=answers.get("itl_p50", key),
        itl_p99_seconds=answers.get("itl_p99", key),
        replicas_reporting=int(replicas),
        drafts_in_window=drafts_in_window,
    )


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

    if isinstance(err, requests.exceptions.Timeout):
        return f"{url} did not answer in time"
    if isinstance(err, requests.exceptions.ConnectionError):
        return f"cannot connect to {url}"
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"
