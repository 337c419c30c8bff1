"""What Prometheus would hold about the simulated engines, and the policy's queries over it.

Each ready or draining engine is scraped every `scrape_interval` seconds (a starting engine has no
`/metrics` yet). An engine a Standby flip puts to sleep is scraped on, asleep, its counters flat, as
the PodMonitor scrapes both engines of a Standby pod (`render/monitoring.py`), and the engine it wakes
has a flat series from the scrape before (`Prometheus.park`, `Prometheus.waking`): a window that spans
the flip counts what each served in it. A query at time t evaluates, per series, over the samples in (t - window, t]:

- `rate(counter[w])` with Prometheus' extrapolation (`extrapolatedRate` in promql/functions.go:
  extrapolate to the window's edges by at most 1.1 average sample intervals, and not below zero);
- `avg_over_time(gauge[w])` as the mean of the samples, `count_over_time` as their number; instant
  gauges (`count`, `sum`) from the newest sample within the 5-minute lookback of series still
  scraped (a deleted pod's series is stale).

`answers` returns them in the shape of Prometheus' instant-vector results, keyed by the names of
`specfleet.observe.prometheus.fleet_queries`; `fleet_answers` labels and indexes them as the operator
does (`FleetAnswers.from_results`) for the shared policy evaluation (`specfleet.policy.decision.evaluation`), so
simulator and operator decide from one set of rules.
The memory series are there too: KV cache usage (mean of the window's samples), preemptions (a
counter), each engine's `vllm:cache_config_info` (its speculation label, blocks and block size), and the
mean prompt and output length of the requests finished in the window, and the prefix cache's hit rate
(the rate of vllm:prefix_cache_hits over that of vllm:prefix_cache_queries, summed over the pool's
engines; no lookup in the window is no answer), and the TTFT and TPOT histograms' buckets (each
engine's requests counted when they finish, at vLLM's bucket bounds; a pool's SLO attainment is read
from them as the operator reads it). Inter-token latency quantiles are not simulated (None), as the
policy only reports them.

Each sample also says whether its engine is awake (vllm:engine_sleep_state): as the fleet queries of a
Standby round do, the replica count, the KV usage mean and the cache configs take only the engines
awake at t, and the running mean divides every engine's window mean by the awake ones' count. With
every engine awake that is the plain queries' answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specfleet.policy.inputs.fleet_answers import BUCKET_BOUND, FleetAnswers, PoolSelector, pool_observation
from specfleet.policy.inputs.observation import PoolObservation
from specfleet.sim.engine import Replica
from specfleet.sim.histograms import LatencyCounts
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import POOL_LABELS
from specfleet_runtime.names import SERIES_SPECULATION as SPECULATION_LABEL

LOOKBACK_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_pos: tuple[float, ...]
    generation_tokens: float
    running: float
    waiting: float
    kv_usage: float = 0.0
    preemptions: float = 0.0
    # vllm:request_prompt_tokens / vllm:request_generation_tokens histograms' _sum and _count
    prompt_sum: float = 0.0
    output_sum: float = 0.0
    finished: float = 0.0
    # vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (tokens)
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    # vllm:engine_sleep_state{sleep_state="awake"}: False while a Standby pod's engine is parked.
    awake: bool = True
    # The TTFT and TPOT histograms' cumulative buckets (vLLM's bounds, then +Inf).
    ttft: tuple[float, ...] = ()
    tpot: tuple[float, ...] = ()


@dataclass
class Series:
    """The samples of one engine (one pod), and its vllm:cache_config_info (speculation label, KV size)."""

    pool: str
    samples: list[Sample] = field(default_factory=list)
    deleted_at: float | None = None
    speculation: str = "Off"
    num_gpu_blocks: int = 0
    block_size: int = 16


def _window(samples: Sequence[Sample], t: float, window: float) -> list[Sample]:
    # Samples are appended in time order; the window is short, so walk back from the end.
    out: list[Sample] = []
    for s in reversed(samples):
        if s.t > t:
            continue
        if s.t <= t - window:
            break
        out.append(s)
    out.reverse()
    return out


def extrapolated_rate(points: Sequence[tuple[float, float]], t: float, window: float) -> float | None:
    """Prometheus' `rate()` of a counter over (t - window, t] from its (time, value) samples."""
    if len(points) < 2:
        return None
    start, end = t - window, t
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    delta = last_v - first_v
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    to_start = first_t - start
    to_end = end - last_t
    average = sampled / (len(points) - 1)
    threshold = average * 1.1
    if delta > 0 and first_v >= 0:
        to_zero = sampled * (first_v / delta)
        to_start = min(to_start, to_zero)
    extrapolate = sampled
    extrapolate += to_start if to_start < threshold else average / 2
    extrapolate += to_end if to_end < threshold else average / 2
    return delta * (extrapolate / sampled) / window


def _vector(value: float | None, t: float, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [{"metric": labels or {}, "value": [t, repr(float(value))]}]


def answers(series: Sequence[Series], t: float, window: float) -> dict[str, list[dict[str, Any]]]:
    """The pool's query results at `t` (names as in `pool_queries`), from its engines' series."""
    live = [
        s
        for s in series
        if s.samples
        and (s.deleted_at is None or s.deleted_at > t)
        and s.samples[0].t <= t
        and t - max(x.t for x in s.samples if x.t <= t) <= LOOKBACK_SECONDS
    ]
    rates: dict[str, list[float]] = {
        "drafts": [],
        "draft_tokens": [],
        "accepted": [],
        "generation_tps": [],
        "preemptions": [],
        "prompt_sum": [],
        "output_sum": [],
        "finished": [],
        "prefix_queries": [],
        "prefix_hits": [],
    }
    per_pos: dict[int, list[float]] = {}
    running_avgs: list[float] = []
    awake_running = 0  # engines with a window mean of running requests that are awake at t
    kv_avgs: list[float] = []
    caches: set[tuple[str, int, int]] = set()
    waiting = 0.0
    newest = -math.inf
    awake = 0
    coverage: list[float] = []  # each series' samples in the window over those in its second half, halved
    for s in live:
        win = _window(s.samples, t, window)
        half = len(_window(s.samples, t, window / 2))
        if half:
            coverage.append(len(win) / half / 2)
        latest = next(x for x in reversed(s.samples) if x.t <= t)
        newest = max(newest, latest.t)
        awake += latest.awake
        if win:
            waiting += sum(x.waiting for x in win) / len(win)
            running_avgs.append(sum(x.running for x in win) / len(win))
            if latest.awake:
                awake_running += 1
                kv_avgs.append(sum(x.kv_usage for x in win) / len(win))
        if s.num_gpu_blocks > 0 and latest.awake:
            caches.add((s.speculation, s.num_gpu_blocks, s.block_size))
        for name, attr in (
            ("drafts", "drafts"),
            ("draft_tokens", "draft_tokens"),
            ("accepted", "accepted"),
            ("generation_tps", "generation_tokens"),
            ("preemptions", "preemptions"),
            ("prompt_sum", "prompt_sum"),
            ("output_sum", "output_sum"),
            ("finished", "finished"),
            ("prefix_queries", "prefix_queries"),
            ("prefix_hits", "prefix_hits"),
        ):
            r = extrapolated_rate([(x.t, getattr(x, attr)) for x in win], t, window)
            if r is not None:
                rates[name].append(r)
        positions = len(latest.accepted_pos)
        for i in range(positions):
            r = extrapolated_rate(
                [(x.t, x.accepted_pos[i]) for x in win if len(x.accepted_pos) > i], t, window
            )
            if r is not None:
                per_pos.setdefault(i, []).append(r)
    sums = {name: sum(values) if values else None for name, values in rates.items()}
    finished = sums.pop("finished")
    prompt_sum, output_sum = sums.pop("prompt_sum"), sums.pop("output_sum")
    queries, hits = sums.pop("prefix_queries"), sums.pop("prefix_hits")
    out: dict[str, list[dict[str, Any]]] = {name: _vector(value, t) for name, value in sums.items()}
    # rate(_sum) / rate(_count): no finished request in the window is Prometheus' NaN, i.e. no answer.
    for name, total in (("prompt_len", prompt_sum), ("output_len", output_sum)):
        out[name] = _vector(total / finished if total is not None and finished else None, t)
    # sum(rate(hits)) / sum(rate(queries)): no lookup in the window is 0 / 0, NaN, i.e. no answer.
    out["prefix_hit_rate"] = _vector(hits / queries if hits is not None and queries else None, t)
    out["kv_usage"] = _vector(sum(kv_avgs) / len(kv_avgs) if kv_avgs else None, t)
    out["kv_capacity"] = [
        {
            "metric": {
                SPECULATION_LABEL: setting,
                vm.LABEL_NUM_GPU_BLOCKS: str(blocks),
                vm.LABEL_BLOCK_SIZE: str(size),
            },
            "value": [t, "1.0"],
        }
        for setting, blocks, size in sorted(caches)
    ]
    out["accepted_per_pos"] = [
        {"metric": {"position": str(i)}, "value": [t, repr(float(sum(v)))]}
        for i, v in sorted(per_pos.items())
    ]
    out["running_per_replica"] = _vector(sum(running_avgs) / awake_running if awake_running else None, t)
    out["replicas"] = _vector(float(awake) if awake else None, t)
    out["waiting"] = _vector(waiting if live else None, t)
    out["itl_p50"] = []
    out["itl_p99"] = []
    out["ttft_buckets"] = _buckets(live, "ttft", vm.TIME_TO_FIRST_TOKEN_BUCKETS, t, window)
    out["tpot_buckets"] = _buckets(live, "tpot", vm.TOKEN_LATENCY_BUCKETS, t, window)
    out["sample_age"] = _vector(t - newest if live else None, t)
    out["window_coverage"] = _vector(min(coverage) if coverage else None, t)
    return out


def _buckets(
    live: Sequence[Series], attr: str, bounds: Sequence[float], t: float, window: float
) -> list[dict[str, Any]]:
    """`sum by (le) (rate(<histogram>_bucket[w]))` over the engines: one sample per bucket bound that
    some engine's window has a rate for."""
    sums: dict[int, float] = {}
    for s in live:
        win = _window(s.samples, t, window)
        for i in range(len(bounds) + 1):
            r = extrapolated_rate(
                [(x.t, getattr(x, attr)[i]) for x in win if len(getattr(x, attr)) > i], t, window
            )
            if r is not None:
                sums[i] = sums.get(i, 0.0) + r
    return [
        {
            "metric": {BUCKET_BOUND: "+Inf" if i == len(bounds) else repr(float(bounds[i]))},
            "value": [t, repr(v)],
        }
        for i, v in sorted(sums.items())
    ]


def _sample(rep: Replica, now: float) -> Sample:
    """What a scrape of `rep`'s /metrics at `now` reads."""
    return Sample(
        t=now,
        drafts=rep.drafts,
        draft_tokens=rep.draft_tokens,
        accepted=rep.accepted,
        accepted_pos=tuple(rep.accepted_pos[: rep.config.k]),
        generation_tokens=rep.generation_tokens,
        running=float(rep.running),
        waiting=float(len(rep.waiting)),
        kv_usage=rep.kv_usage,
        preemptions=float(rep.preemptions),
        prompt_sum=rep.finished_prompt_tokens,
        output_sum=rep.finished_output_tokens,
        finished=float(rep.finished),
        prefix_queries=rep.prefix_queries,
        prefix_hits=rep.prefix_hits,
        ttft=LatencyCounts.cumulative(rep.latency.ttft),
        tpot=LatencyCounts.cumulative(rep.latency.tpot),
    )


def _asleep(sample: Sample, t: float) -> Sample:
    """`sample`'s counters at `t` from an engine asleep: nothing running, waiting or in its KV cache."""
    return dataclasses.replace(sample, t=t, running=0.0, waiting=0.0, kv_usage=0.0, awake=False)


class Prometheus:
    """The simulated Prometheus: one series per engine, sampled when the fleet scrapes it."""

    def __init__(self) -> None:
        self.series: dict[int, Series] = {}
        # Engines asleep in a Standby pod (serial -> their counters when they slept): the pod still
        # serves their metrics, so every scrape samples them on, flat (`scrape_parked`).
        self.parked: dict[int, Sample] = {}
        self.last_scrape: float | None = None  # the latest scrape's time (None: none yet)

    def track(self, rep: Replica) -> None:
        self.series[rep.serial] = Series(
            pool=rep.pool,
            speculation="On" if rep.config.speculative else "Off",
            num_gpu_blocks=rep.kv_blocks,
            block_size=rep.config.block_size,
        )

    def deleted(self, rep: Replica, at: float) -> None:
        s = self.series[rep.serial]
        s.deleted_at = at if s.deleted_at is None else min(s.deleted_at, at)
        self.parked.pop(rep.serial, None)

    def park(self, rep: Replica, at: float) -> None:
        """A Standby pod's engine put to sleep at `at`: its later scrapes read its counters as they are
        now, nothing running, asleep (no sample at `at` itself: Prometheus scrapes on its interval)."""
        if not self.series[rep.serial].samples:
            self.deleted(rep, at)
            return
        self.parked[rep.serial] = _asleep(_sample(rep, at), at)

    def waking(self, rep: Replica, at: float) -> None:
        """A Standby pod's other engine, about to wake: it was scraped all along, asleep with its counters
        flat, so its series holds the scrape before `at` (what it serves from its wake on counts)."""
        s = self.series[rep.serial]
        if not s.samples:
            before = at if self.last_scrape is None else min(self.last_scrape, at)
            s.samples.append(_asleep(_sample(rep, before), before))

    def scrape_parked(self, now: float) -> None:
        """The parked engines' samples of one scrape at `now` (the fleet scrapes every engine then)."""
        self.last_scrape = now
        for serial, sample in sorted(self.parked.items()):
            self.series[serial].samples.append(dataclasses.replace(sample, t=now))

    def scrape(self, rep: Replica, now: float) -> None:
        self.series[rep.serial].samples.append(_sample(rep, now))

    def fleet_answers(
        self, namespace: str, name: str, pools: Iterable[str], t: float, window: float
    ) -> FleetAnswers:
        """`fleet_answers` over every engine of each of `pools`."""
        series = {pool: [s for s in self.series.values() if s.pool == pool] for pool in pools}
        return fleet_answers(namespace, name, series, t, window)


def fleet_answers(
    namespace: str, name: str, pools: Mapping[str, Sequence[Series]], t: float, window: float
) -> FleetAnswers:
    """One round of the operator's fleet queries at `t` over each pool's engines: the answers labelled
    as the fleet queries' `sum by (pool labels)` would label them, indexed by the operator's own code."""
    labelled: dict[str, list[dict[str, Any]]] = {}
    for pool, series in pools.items():
        selector = PoolSelector(namespace, name, pool)
        for query, vector in _labelled(answers(series, t, window), selector).items():
            labelled.setdefault(query, []).extend(vector)
    return FleetAnswers.from_results(labelled)


def _labelled(
    result: Mapping[str, list[dict[str, Any]]], selector: PoolSelector
) -> dict[str, list[dict[str, Any]]]:
    labels = dict(zip(POOL_LABELS, selector.key, strict=True))
    return {
        name: [{**sample, "metric": {**(sample.get("metric") or {}), **labels}} for sample in vector]
        for name, vector in result.items()
    }


def observation(
    pool: str,
    result: dict[str, list[dict[str, Any]]],
    window_seconds: int,
    now: datetime,
    *,
    pool_mode: str = "On",
    expected_replicas: int | None = None,
) -> PoolObservation:
    """The observation the operator builds from one pool's answers: its own `observe`, on answers
    labelled as the fleet queries' `sum by (pool labels)` would label them."""
    selector = PoolSelector("sim", "sim", pool)
    return pool_observation(
        FleetAnswers.from_results(_labelled(result, selector)),
        selector,
        window_seconds,
        now,
        pool_mode=pool_mode,
        expected_replicas=expected_replicas,
    )
