"""A round of fleet answers from Prometheus and one pool's observation out of it (pure).

`FleetAnswers` indexes Prometheus' instant vectors (each number grouped by the pool's labels) by
pool; `observe` picks one pool out and builds its `PoolObservation`, reporting every way data can be
missing in `problem` (Prometheus unreachable, no samples, stale or partial samples) and never as 0.
The operator fills the answers from Prometheus (specfleet.metrics.prometheus); the fleet simulator
fills them from its own series, so both decide from the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specfleet.policy.observations import PoolObservation
from specfleet_runtime import vllm_metrics as vm

# Samples older than this many scrape windows mean the targets are gone or Prometheus stopped scraping.
STALE_AFTER_SECONDS = 60.0
# Fewer drafts than this in the window say little about acceptance (a freshly started or nearly idle
# pool): acceptance is then reported as unknown rather than decided on.
MIN_DRAFTS_FOR_ACCEPTANCE = 100

# The labels that name a pool on engine series, in the order of `PoolKey`.
POOL_LABELS = ("namespace", "specfleet_io_deployment", "specfleet_io_pool")
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
