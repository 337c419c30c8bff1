"""A round of fleet answers from Prometheus and one pool's observation out of it (pure).

`FleetAnswers` indexes Prometheus' instant vectors (each number grouped by the pool's labels) by
pool, range-checking every sample on the way (well-formed, finite, counts and rates >= 0, times not
in the future, positions 0..n-1, bucket bounds numbers or +Inf, no more accepted than drafted): a
sample that fails is skipped and counted, and only the pool it names goes without that number (a
histogram with one bucket rejected goes whole). `pool_observation` picks one pool out and
builds its `PoolObservation`, reporting every way data can be missing in `problem` (Prometheus
unreachable, no samples, stale or partial samples, no load) and never as 0.
The operator fills the answers from Prometheus (specfleet.observe.prometheus); the fleet simulator
fills them from its own series, so both decide from the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specfleet.policy.inputs.observation import Histogram, PoolObservation
from specfleet.policy.inputs.scraping import ready_pods
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import MIN_DRAFTS_IN_WINDOW as MIN_DRAFTS_FOR_ACCEPTANCE
from specfleet_runtime.names import POOL_LABELS
from specfleet_runtime.names import SERIES_SPECULATION as SPECULATION_LABEL

# Samples older than this many scrape windows mean the targets are gone or Prometheus stopped scraping.
STALE_AFTER_SECONDS = 60.0
# Fewer drafts than MIN_DRAFTS_FOR_ACCEPTANCE in the window (a freshly started or nearly idle pool):
# acceptance is then reported as unknown rather than decided on. POOL_LABELS: in the order of `PoolKey`.
# (namespace, deployment, pool)
PoolKey = tuple[str, str, str]


@dataclass(frozen=True)
class PoolSelector:
    """Which engine series belong to one pool of one SpeculativeDeployment."""

    namespace: str
    deployment: str
    pool: str

    @property
    def key(self) -> PoolKey:
        return (self.namespace, self.deployment, self.pool)


# The label of a histogram bucket's upper bound ("+Inf" for the last, which counts everything).
BUCKET_BOUND = "le"
# The latency histograms the fleet queries ask for, one series per bucket.
HISTOGRAM_QUERIES = ("ttft_buckets", "tpot_buckets")

# Prometheus' evaluation time and the operator's clock may disagree by this much (NTP keeps them far
# closer): a sample time, or a newest scrape, further in the future than this is rejected.
CLOCK_SKEW_SECONDS = 10.0
# Rates extrapolated to a window's edges can put accepted tokens a little past what was drafted; past
# this fraction the answers contradict each other and the accepted numbers are rejected.
ACCEPTANCE_SLACK = 0.5

# What each fleet query measures, for its range check: "rate" and "count" must be finite and >= 0;
# "seconds" and "mean" too, where NaN is Prometheus' answer for no data (a quantile of no observations,
# a mean over no finished requests); "fraction" also <= 1; "ratio" is a fraction whose NaN is no data
# (a share of nothing counted); "age" is finite and not in the future.
# kv_capacity's labels must name a setting and positive block counts (its value is 1).
QUERY_KINDS: Mapping[str, str] = {
    "drafts": "rate",
    "draft_tokens": "rate",
    "accepted": "rate",
    "accepted_per_pos": "rate",
    "generation_tps": "rate",
    "running_per_replica": "count",
    "replicas": "count",
    "waiting": "count",
    "itl_p50": "seconds",
    "itl_p99": "seconds",
    "sample_age": "age",
    "window_coverage": "count",
    "kv_usage": "fraction",
    "preemptions": "rate",
    "kv_capacity": "count",
    "prompt_len": "mean",
    "output_len": "mean",
    "prefix_hit_rate": "ratio",
    "ttft_buckets": "rate",
    "tpot_buckets": "rate",
}
# Kinds whose NaN is Prometheus' answer for no data (a quantile of no observations, 0 / 0 requests).
NAN_IS_NO_DATA = ("seconds", "mean", "ratio")

# Why a sample was rejected (the `reason` label of specfleet_prometheus_samples_rejected_total).
MALFORMED = "malformed"
NOT_FINITE = "not_finite"
NEGATIVE = "negative"
FUTURE = "future"
BAD_POSITION = "bad_position"
POSITION_GAP = "position_gap"
DUPLICATE = "duplicate"
ACCEPTED_EXCEEDS_DRAFTED = "accepted_exceeds_drafted"
ABOVE_ONE = "above_one"
BAD_CACHE_CONFIG = "bad_cache_config"
BAD_BUCKET = "bad_bucket"


class _Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass
class _Tally:
    """The samples one round rejected: counts by (query, reason), and why, by (query, pool)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    why: dict[tuple[str, PoolKey], str] = field(default_factory=dict)

    def add(self, name: str, key: PoolKey | None, reason: str, detail: str, count: int = 1) -> None:
        self.counts[(name, reason)] = self.counts.get((name, reason), 0) + count
        if key is not None:
            self.why[(name, key)] = detail


def _parse(name: str, sample: Any, now: float | None) -> tuple[PoolKey, float | None, Mapping[str, str]]:
    """A sample's pool, value and labels; the value is None for NaN where NaN means no data.

    Raises `_Rejected` for a sample that is malformed or out of range."""
    if not isinstance(sample, Mapping):
        raise _Rejected(MALFORMED, "a sample that is not an object")
    labels = sample.get("metric") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise _Rejected(MALFORMED, "a sample with malformed labels")
    pair = sample.get("value")
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise _Rejected(MALFORMED, "a sample without a [time, value] pair")
    try:
        at, value = float(pair[0]), float(pair[1])
    except (TypeError, ValueError):
        raise _Rejected(MALFORMED, f"a sample whose time or value is not a number: {pair!r:.80}") from None
    if not math.isfinite(at):
        raise _Rejected(MALFORMED, f"sample time {at} is not a number")
    if now is not None and at > now + CLOCK_SKEW_SECONDS:
        raise _Rejected(FUTURE, f"sample time is {at - now:.0f}s in the future")
    kind = QUERY_KINDS.get(name, "rate")
    if math.isnan(value) and kind in NAN_IS_NO_DATA:
        return _key(labels), None, labels
    if not math.isfinite(value):
        raise _Rejected(NOT_FINITE, f"value {value} is not a finite number")
    if kind == "age":
        if value < -CLOCK_SKEW_SECONDS:
            raise _Rejected(FUTURE, f"newest sample is {-value:.0f}s in the future")
    elif value < 0:
        raise _Rejected(NEGATIVE, f"negative value {value:g}")
    if kind in ("fraction", "ratio") and value > 1:
        raise _Rejected(ABOVE_ONE, f"a fraction of {value:g}")
    return _key(labels), value, labels


def _cache_capacity(labels: Mapping[str, str]) -> tuple[str, int]:
    """(speculation setting, KV cache tokens) of a cache_config_info series: num_gpu_blocks x block_size."""
    setting = labels.get(SPECULATION_LABEL, "")
    if setting not in ("On", "Off"):
        raise _Rejected(BAD_CACHE_CONFIG, f"{SPECULATION_LABEL}={setting!r} is not On or Off")
    numbers = []
    for name in (vm.LABEL_NUM_GPU_BLOCKS, vm.LABEL_BLOCK_SIZE):
        text = labels.get(name, "")
        if not (text.isascii() and text.isdigit() and int(text) > 0):
            raise _Rejected(BAD_CACHE_CONFIG, f"{name}={text!r} is not a positive count")
        numbers.append(int(text))
    return setting, numbers[0] * numbers[1]


def _position(labels: Mapping[str, str]) -> int:
    text = labels.get(vm.LABEL_POSITION, "")
    if not (text.isascii() and text.isdigit()):
        raise _Rejected(BAD_POSITION, f"{vm.LABEL_POSITION}={text!r} is not a position")
    return int(text)


def _bucket_bound(labels: Mapping[str, str]) -> float:
    """A bucket's upper bound in seconds: a number >= 0, or +Inf."""
    text = labels.get(BUCKET_BOUND, "")
    try:
        bound = float(text)
    except ValueError:
        raise _Rejected(BAD_BUCKET, f"{BUCKET_BOUND}={text!r} is not a bucket bound") from None
    if math.isnan(bound) or bound < 0:
        raise _Rejected(BAD_BUCKET, f"{BUCKET_BOUND}={text!r} is not a bucket bound")
    return bound


def _key(labels: Mapping[str, str]) -> PoolKey:
    return (labels.get(POOL_LABELS[0], ""), labels.get(POOL_LABELS[1], ""), labels.get(POOL_LABELS[2], ""))


@dataclass(frozen=True)
class FleetAnswers:
    """One round of fleet queries: each number by pool, or why Prometheus gave none.

    A malformed or out-of-range sample is skipped: the pool it names goes without that number (and says
    why), every other pool is unaffected; `rejected` counts them for the operator's metrics.
    """

    error: str | None = None
    # query name -> pool -> value (absent: no sample, or not a number)
    values: Mapping[str, Mapping[PoolKey, float]] = field(default_factory=dict)
    # pool -> position -> accepted tokens per second at that position (positions 0..n-1)
    per_position: Mapping[PoolKey, Mapping[int, float]] = field(default_factory=dict)
    # pool -> speculation setting ("On" / "Off") -> smallest KV cache (tokens) of an engine reporting it
    kv_capacity: Mapping[PoolKey, Mapping[str, int]] = field(default_factory=dict)
    # histogram query name (HISTOGRAM_QUERIES) -> pool -> its cumulative buckets, sorted by bound
    histograms: Mapping[str, Mapping[PoolKey, Histogram]] = field(default_factory=dict)
    # (query name, reason) -> samples rejected in this round
    rejected: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # (query name, pool) -> why that pool's sample was rejected
    rejected_for: Mapping[tuple[str, PoolKey], str] = field(default_factory=dict)

    @classmethod
    def from_results(
        cls, results: Mapping[str, list[dict[str, Any]]], now: float | None = None
    ) -> FleetAnswers:
        """Index Prometheus' answers (query name -> instant vector) by pool, range-checking each sample.

        `now` (Unix seconds; None: not checked) is when the round was asked: later sample times are
        rejected beyond CLOCK_SKEW_SECONDS.
        """
        values: dict[str, dict[PoolKey, float]] = {}
        per_position: dict[PoolKey, dict[int, float]] = {}
        kv_capacity: dict[PoolKey, dict[str, int]] = {}
        buckets: dict[str, dict[PoolKey, dict[float, float]]] = {}
        tally = _Tally()
        # (query, pool, position or bucket bound): one sample each
        seen: set[tuple[str, PoolKey, float]] = set()
        # (histogram query, pool) with a sample rejected: a histogram short of a bucket would mislead
        broken: set[tuple[str, PoolKey | None]] = set()
        for name, samples in results.items():
            # An answer that is not a vector at all counts as one malformed sample.
            for sample in samples if isinstance(samples, list) else [samples]:
                key: PoolKey | None = None
                try:
                    key, number, labels = _parse(name, sample, now)
                    position = _position(labels) if name == "accepted_per_pos" else -1
                    bound = _bucket_bound(labels) if name in HISTOGRAM_QUERIES else -1.0
                    if name == "kv_capacity":
                        setting, tokens = _cache_capacity(labels)
                except _Rejected as err:
                    key = key or _loose_key(sample)
                    tally.add(name, key, err.reason, err.detail)
                    if name in HISTOGRAM_QUERIES:
                        broken.add((name, key))
                    continue
                if name == "kv_capacity":
                    # One series per distinct cache config: the smallest bounds what the pool holds.
                    held = kv_capacity.setdefault(key, {})
                    held[setting] = min(tokens, held.get(setting, tokens))
                    continue
                series = (name, key, bound if name in HISTOGRAM_QUERIES else position)
                if series in seen:
                    # Two answers for one series (grouping makes that impossible): neither is trusted.
                    tally.add(name, key, DUPLICATE, "two samples for one series")
                    values.get(name, {}).pop(key, None)
                    per_position.get(key, {}).pop(position, None)
                    broken.add((name, key))
                    continue
                seen.add(series)
                if number is None:
                    continue
                if name in HISTOGRAM_QUERIES:
                    buckets.setdefault(name, {}).setdefault(key, {})[bound] = number
                elif name == "accepted_per_pos":
                    per_position.setdefault(key, {})[position] = number
                else:
                    values.setdefault(name, {})[key] = number
        for key, by_pos in per_position.items():
            # Positions count from 0 with none missing; those past a gap are not what they claim.
            n = 0
            while n in by_pos:
                n += 1
            if len(by_pos) > n:
                tally.add("accepted_per_pos", key, POSITION_GAP, f"position {n} missing", len(by_pos) - n)
                per_position[key] = {i: by_pos[i] for i in range(n)}
        _cross_check(values, per_position, tally)
        histograms = {
            name: {key: tuple(sorted(b.items())) for key, b in by_pool.items() if (name, key) not in broken}
            for name, by_pool in buckets.items()
        }
        return cls(
            values=values,
            per_position=per_position,
            kv_capacity=kv_capacity,
            histograms=histograms,
            rejected=tally.counts,
            rejected_for=tally.why,
        )

    def get(self, name: str, key: PoolKey) -> float | None:
        return self.values.get(name, {}).get(key)

    def histogram(self, name: str, key: PoolKey) -> Histogram:
        """A pool's cumulative buckets of histogram query `name` (empty: not measured)."""
        return self.histograms.get(name, {}).get(key, ())

    def why_missing(self, name: str, key: PoolKey) -> str:
        """Why a pool has no `name` ("" when Prometheus simply had no sample)."""
        why = self.rejected_for.get((name, key))
        return f" ({name} sample rejected: {why})" if why else ""


def _loose_key(sample: Any) -> PoolKey | None:
    """The pool a rejected sample names, where its labels can be read."""
    labels = sample.get("metric") if isinstance(sample, Mapping) else None
    if not isinstance(labels, Mapping):
        return None
    return _key({str(k): str(v) for k, v in labels.items()})


def _cross_check(
    values: dict[str, dict[PoolKey, float]],
    per_position: dict[PoolKey, dict[int, float]],
    tally: _Tally,
) -> None:
    """Accepted tokens never exceed those drafted: per position (acceptance within [0, 1]) and in all
    (accepted / draft tokens). Answers that say otherwise (beyond rate-extrapolation noise) are dropped."""
    limit = 1 + ACCEPTANCE_SLACK
    drafts = values.get("drafts", {})
    for key, by_pos in per_position.items():
        d = drafts.get(key)
        if not d:
            continue
        bad = next((i for i in sorted(by_pos) if by_pos[i] > limit * d), None)
        if bad is not None:
            dropped = [i for i in by_pos if i >= bad]
            tally.add(
                "accepted_per_pos",
                key,
                ACCEPTED_EXCEEDS_DRAFTED,
                f"acceptance {by_pos[bad] / d:.2f} at position {bad} is above 1",
                len(dropped),
            )
            per_position[key] = {i: v for i, v in by_pos.items() if i < bad}
    accepted, draft_tokens = values.get("accepted", {}), values.get("draft_tokens", {})
    for key, a in list(accepted.items()):
        t = draft_tokens.get(key)
        if t is not None and a > limit * t:
            tally.add("accepted", key, ACCEPTED_EXCEEDS_DRAFTED, f"{a:g} accepted tokens/s of {t:g} drafted")
            del accepted[key]


def pool_observation(
    answers: FleetAnswers,
    selector: PoolSelector,
    window_seconds: int,
    now: datetime,
    *,
    pool_mode: str = "On",
    expected_replicas: int | None = None,
    ready_replicas: int = 0,
) -> PoolObservation:
    """One pool's observation from the fleet's answers (pure; never raises for missing data).

    `expected_replicas` (the ready engines of a settled pool) turns "some engines have no samples"
    into a problem: averages over part of a pool would misstate its load. `ready_replicas` (the pool's
    Ready pods, settled or not) is recorded as `ready_without_series` when Prometheus answered with no
    series of the pool at all: a sign that it does not scrape them.
    """
    pool, key = selector.pool, selector.key
    if answers.error is not None:
        return PoolObservation(
            pool=pool, at=now, problem=f"Prometheus query failed: {answers.error}", ready_without_series=None
        )
    replicas = answers.get("replicas", key)
    if not replicas:
        rejected = answers.why_missing("replicas", key)
        # Series that were there but rejected are scraped: only an empty answer says "not scraping".
        unscraped = 0 if rejected else max(ready_replicas, 0)
        ready = f" although {ready_pods(unscraped)} Ready" if unscraped else ""
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"no engine samples for pool {pool} in Prometheus{ready}{rejected}",
            ready_without_series=unscraped,
        )
    if expected_replicas is not None and replicas < expected_replicas:
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"partial metrics for pool {pool}: {int(replicas)} of {expected_replicas} "
            "ready engines have samples",
            replicas_reporting=int(replicas),
        )
    age = answers.get("sample_age", key)
    if age is None:
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"no sample age for pool {pool} in Prometheus{answers.why_missing('sample_age', key)}",
            replicas_reporting=int(replicas),
        )
    if age > max(STALE_AFTER_SECONDS, window_seconds):
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"stale metrics for pool {pool}: newest sample is {age:.0f}s old",
            replicas_reporting=int(replicas),
        )
    running = answers.get("running_per_replica", key)
    if running is None:
        # Every decision needs the load: not measured is not zero (it would read as an idle pool).
        why = answers.why_missing("running_per_replica", key)
        return PoolObservation(
            pool=pool,
            at=now,
            problem=f"no running-request count for pool {pool} in Prometheus{why}",
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
        running_per_replica=running,
        waiting=answers.get("waiting", key),
        generation_tokens_per_second=answers.get("generation_tps", key),
        window_coverage=answers.get("window_coverage", key),
        itl_p50_seconds=answers.get("itl_p50", key),
        itl_p99_seconds=answers.get("itl_p99", key),
        replicas_reporting=int(replicas),
        drafts_in_window=drafts_in_window,
        kv_usage=answers.get("kv_usage", key),
        preemptions_per_second=answers.get("preemptions", key),
        kv_capacity_tokens_off=answers.kv_capacity.get(key, {}).get("Off"),
        kv_capacity_tokens_on=answers.kv_capacity.get(key, {}).get("On"),
        mean_prompt_tokens=answers.get("prompt_len", key),
        mean_output_tokens=answers.get("output_len", key),
        prefix_hit_rate=answers.get("prefix_hit_rate", key),
        ttft_histogram=answers.histogram("ttft_buckets", key),
        tpot_histogram=answers.histogram("tpot_buckets", key),
    )
