"""What the policy sees of a pool: plain data. `policy.inputs.fleet_answers` builds each observation
from one round of Prometheus answers (asked by `specfleet.observe.prometheus`, or the simulator), and
`policy.inputs.status` builds each pool's state from status.

Missing data is explicit: a value of None means "not measured", never zero, and `problem` says why a
whole observation cannot be trusted (Prometheus down, a query error, no samples, stale samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

# A Dynamic SD schedule: (first batch size, last batch size, K) rows, sorted, covering 1..MAX_BATCH
# (`policy.predict.dynamic_sd`).
Schedule = tuple[tuple[int, int, int], ...]
# A latency histogram over the window: (upper bound in seconds, cumulative requests per second) buckets
# sorted by bound, the last one +Inf (every request); empty: not measured.
Histogram = tuple[tuple[float, float], ...]
# A pool's window is whole where its youngest engine series covers at least this share of it: with the
# default 120 s window and 15 s scrapes, all but one scrape (7 of 8 samples), a rate within ~1/8 of
# what was served; a series younger than that makes its pool's rates rise over the next windows alone.
WHOLE_WINDOW = 0.85


@dataclass(frozen=True)
class PoolObservation:
    """One pool's metrics over the policy window."""

    pool: str
    at: datetime
    # Why the observation cannot be used (None when it can).
    problem: str | None = None
    # Mean acceptance length, 1 + accepted / drafts (None: no drafts in the window, e.g. speculation off).
    acceptance_length: float | None = None
    # Cumulative per-position acceptance p_i = accepted_per_pos[i] / drafts.
    per_position: tuple[float, ...] = ()
    # accepted / draft tokens.
    draft_acceptance_rate: float | None = None
    # Where the acceptance numbers came from: "pool" (the pool's own engines) or "canary".
    acceptance_source: str | None = None
    running_per_replica: float | None = None
    waiting: float | None = None
    generation_tokens_per_second: float | None = None
    # The share of the window the pool's youngest engine series covers (the fleet query
    # window_coverage; None: not measured). Below `WHOLE_WINDOW`, an engine started within the window
    # (the pool's first window, a new pod's), and the counter rates count only part of it.
    window_coverage: float | None = None
    itl_p50_seconds: float | None = None
    itl_p99_seconds: float | None = None
    replicas_reporting: int = 0
    # Ready pods of the pool for which Prometheus answered with no series at all (0: it had some, or no
    # pod is Ready; None: Prometheus did not answer, so whether it scrapes them is not known).
    ready_without_series: int | None = 0
    # Drafts counted in the window; acceptance is only reported when there were enough of them.
    drafts_in_window: float = 0.0
    # Memory (None: not measured; the policy's memory reasoning then stays off). Mean KV cache usage
    # (0..1) of the pool's engines, preemptions per second (all engines), KV cache tokens of one engine
    # without / with the drafter (vllm:cache_config_info of pods of that setting), and mean prompt
    # and generated tokens of requests finished in the window.
    kv_usage: float | None = None
    preemptions_per_second: float | None = None
    kv_capacity_tokens_off: int | None = None
    kv_capacity_tokens_on: int | None = None
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None
    # Share of the prompt tokens looked up that the engines' prefix caches held (vllm:prefix_cache_hits
    # over vllm:prefix_cache_queries in the window; None: no lookup counted, or not exported).
    prefix_hit_rate: float | None = None
    # The pool's requests by time to first token and by time per output token (vLLM's
    # vllm:time_to_first_token_seconds and vllm:request_time_per_output_token_seconds), summed over its
    # engines: what a latency objective is measured from (`policy.inputs.slo_attainment`).
    ttft_histogram: Histogram = ()
    tpot_histogram: Histogram = ()

    @property
    def usable(self) -> bool:
        return self.problem is None

    @property
    def whole_window(self) -> bool:
        """Every engine series of the pool covers (nearly) the whole window, so its counter rates
        (the tokens served) are the window's; True where the coverage was not measured."""
        return self.window_coverage is None or self.window_coverage >= WHOLE_WINDOW

    @property
    def demand_per_replica(self) -> float | None:
        """Requests in the pool per replica: running plus waiting (waiting counts as 0 unmeasured)."""
        if self.running_per_replica is None:
            return None
        waiting = self.waiting if self.waiting is not None and math.isfinite(self.waiting) else 0.0
        return self.running_per_replica + max(0.0, waiting) / max(1, self.replicas_reporting)

    @property
    def prompt_per_output(self) -> float:
        """Mean prompt tokens per generated token of the requests finished in the window, which prices
        the prefill in every prediction; 0 (decode only: no prefill is priced) when either length is not
        measured."""
        p, out = self.mean_prompt_tokens, self.mean_output_tokens
        if p is None or out is None or not (math.isfinite(p) and math.isfinite(out)) or p < 0 or out <= 0:
            return 0.0
        return p / out

    @property
    def prefill_hit_share(self) -> float:
        """The share of prompt tokens whose prefill the prefix cache saves, for the prediction; 0 (every
        prompt token prefilled, the cautious side) when not measured."""
        h = self.prefix_hit_rate
        if h is None or not math.isfinite(h):
            return 0.0
        return min(1.0, max(0.0, h))

    @property
    def decision_problem(self) -> str | None:
        """Why no decision can be made from this observation: its `problem`, or no load measured (every
        decision needs it, and an unmeasured load is not an idle pool). None: one can."""
        if self.problem is not None:
            return self.problem
        load = self.running_per_replica
        if load is None:
            return f"no running-request count for pool {self.pool}"
        if not math.isfinite(load) or load < 0:
            return f"running requests per replica of pool {self.pool} is {load:g}, not a count"
        return None

    def as_text(self) -> dict[str, str]:
        """The numbers as strings, for status history and Events."""
        out: dict[str, str] = {}
        for name, value in (
            ("acceptanceLength", self.acceptance_length),
            ("draftAcceptanceRate", self.draft_acceptance_rate),
            ("runningPerReplica", self.running_per_replica),
            ("waiting", self.waiting),
            ("generationTokensPerSecond", self.generation_tokens_per_second),
            ("itlP99Seconds", self.itl_p99_seconds),
            ("kvCacheUsage", self.kv_usage),
            ("preemptionsPerSecond", self.preemptions_per_second),
            ("meanPromptTokens", self.mean_prompt_tokens),
            ("meanOutputTokens", self.mean_output_tokens),
            ("prefixCacheHitRate", self.prefix_hit_rate),
        ):
            if value is not None:
                out[name] = f"{value:.3g}"
        for name, tokens in (
            ("kvCacheTokensOff", self.kv_capacity_tokens_off),
            ("kvCacheTokensOn", self.kv_capacity_tokens_on),
        ):
            if tokens is not None:
                out[name] = str(tokens)
        if self.per_position:
            out["perPosition"] = ",".join(f"{p:.2f}" for p in self.per_position)
        if self.acceptance_source:
            out["acceptanceSource"] = self.acceptance_source
        out["replicasReporting"] = str(self.replicas_reporting)
        out["draftsInWindow"] = f"{self.drafts_in_window:.0f}"
        return out


@dataclass(frozen=True)
class MeasuredAcceptance:
    """The acceptance a pool measured while it (or its canaries) speculated, kept for later decisions.

    `per_position` is the longest vector measured: a pool drafting fewer positions refreshes the
    first ones and keeps the deeper ones (rescaled), each with the time it was last measured in
    `per_position_at` (empty: all at `at`).
    """

    acceptance_length: float
    per_position: tuple[float, ...]
    at: datetime
    per_position_at: tuple[datetime, ...] = ()

    def measured_at(self, position: int) -> datetime:
        """When `position` was last measured."""
        if position < len(self.per_position_at):
            return self.per_position_at[position]
        return self.at


@dataclass(frozen=True)
class RealizedRecord:
    """The policy's check on its own prediction for a pool (status.pools.<pool>.realizedCheck): each
    ratio is generated tokens per second measured over predicted, at the running requests measured."""

    sampled_at: datetime
    off_ratio: float | None = None  # the engine without the drafter, last window measured
    on_ratio: float | None = None  # the speculating setting, last window measured
    below_windows: int = 0  # consecutive windows on_ratio / off_ratio was below 1 - margin
    shortfall: float | None = None  # the realized share of the prediction the guard acted on

    @property
    def realized_over_predicted(self) -> float | None:
        """The share of its predicted gain the speculating setting delivered (the plain engine's ratio
        as reference: 1 where never measured)."""
        if self.on_ratio is None:
            return None
        return self.on_ratio / (self.off_ratio or 1.0)


@dataclass(frozen=True)
class PoolRolloutState:
    """The policy's last change of a pool (from status): what it replaced, and whether it settled."""

    at: datetime
    reason: str = ""
    from_mode: str = "On"
    from_k: int | None = None
    from_canaries: int | None = None
    # The Dynamic SD schedule it replaced ((first, last batch size, K) rows; None: none).
    from_schedule: Schedule | None = None
    # Fewest positions any speculating engine of the pool drafted before / after the change (0: none).
    drafted_before: int = 0
    drafted_after: int = 0
    settled_at: datetime | None = None


@dataclass(frozen=True)
class PoolState:
    """The policy-relevant part of a pool's status."""

    mode: str  # "On" or "Off"
    # When the pool last flipped (On <-> Off).
    last_transition: datetime | None = None
    # This pool's flips in the last hour.
    recent_flips: tuple[datetime, ...] = field(default_factory=tuple)
    settled: bool = True
    last_acceptance: MeasuredAcceptance | None = None
    # K the pool drafts while speculating, if the policy chose one (None: the drafter's K).
    k: int | None = None
    # The Dynamic SD schedule the policy chose for the pool while it speculates (None: none).
    schedule: Schedule | None = None
    # Adjustments that keep the mode (a new K, canaries scaled): the last one and those of the last hour.
    last_retune: datetime | None = None
    recent_retunes: tuple[datetime, ...] = field(default_factory=tuple)
    # Canary replicas the policy runs while the pool is off (None: policy.reentry.canaryReplicas).
    canary_replicas: int | None = None
    # The policy's last change and its rollout (None: none recorded).
    rollout: PoolRolloutState | None = None
    # (when, running per replica) of the last evaluations, oldest first (for the load's trend).
    recent_load: tuple[tuple[datetime, float], ...] = field(default_factory=tuple)
    # Generated tokens per second per replica of the last evaluations (the arrivals' trend).
    recent_tokens_per_second: tuple[tuple[datetime, float], ...] = field(default_factory=tuple)
    # The pool's engines' --max-num-seqs (None: not set, vLLM's default).
    max_num_seqs: int | None = None
    # The pool's engines' --gpu-memory-utilization and --tensor-parallel-size, which size their KV
    # cache where it is not measured (None: as the cost profile's memory was measured).
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    # How the pool's engines roll out (pools.<pool>.rollout): "Surge" or "Replace", the engines a
    # Replace stops at once, and the pool's replicas (None: autoscaled, the engines reporting count).
    rollout_strategy: str = "Surge"
    max_unavailable: int = 0
    replicas: int | None = None
    # The engines a Surge rollout starts at once (pools.<pool>.maxSurge), and one engine's start-up
    # measured from the pool's pods (status.pools.<pool>.startupSeconds; None: not measured yet).
    max_surge: int = 1
    startup_seconds: float | None = None
    # How a flip reaches the engines (pools.<pool>.rollout.flip: "Restart" or "Standby"), one Standby
    # replica's flip measured from the pool's own flips (status.pools.<pool>.standbyFlipSeconds; None:
    # not measured yet), and the engine pods' terminationGracePeriodSeconds (bounds a drain).
    flip: str = "Restart"
    standby_flip_seconds: float | None = None
    termination_grace_seconds: float = 120.0
    # Goodput mode: what the engines delivered against the prediction (None: not checked yet).
    realized: RealizedRecord | None = None

    @property
    def last_change(self) -> datetime | None:
        """The pool's last change of any kind (flip or adjustment)."""
        times = [t for t in (self.last_transition, self.last_retune) if t is not None]
        return max(times, default=None)
