"""The policy against baselines and oracles, on one workload, in one run.

Strategies: `policy` (the operator's), `alwaysOff`, `alwaysOnK<k>` for every K the profile measured up
to the drafter's (`alwaysOn` is the drafter's own K), `engineDynamicSD` (vLLM's in-engine K per batch
size, K=0 penalised), `bestStatic` (the static setting with the highest time-weighted ratio to the per-level
oracle, the measure every ratio uses, in hindsight) and `perLevelOracle` (per pool and per evaluation window, the best static
setting's window, in hindsight, with no rollout cost; "best" judged over the window and two on each
side, so that sampling luck in one window does not inflate it) and `rolloutPayingOracle` (the best
hindsight schedule of static settings that pays each change's surge rollout, simulated: the most a
real policy could have done; `specfleet.sim.bound`).

The measure all ratios use is generated tokens per request-second (tokens a pool generated in a window
over the time its requests spent in the system in that window, queueing included): under a closed
loop, where the running requests are fixed, it is proportional to tokens/s; under an open loop it is
the speed a request sees. `worstMinuteRatioToPerLevelOracle` is the lowest one-minute ratio from the
earliest time the policy can react on (one window plus one evaluation interval after the start).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.predict.dynamic_sd import best_schedule
from specfleet.sim.accounts import (
    RunResult,
    histogram_percentile,
    load_per_replica,
    percentile,
    window_latency,
)
from specfleet.sim.bound import NAME as BOUND
from specfleet.sim.bound import held_through, rollout_paying_oracle
from specfleet.sim.fleet import simulate
from specfleet.sim.options import POOLS, SimOptions, Strategy
from specfleet.sim.workload import ClosedLoop, Trace
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile

# Windows on each side over which the per-level oracle judges which static setting is best.
SMOOTH = 2


def static_ks(profile: StepTimeProfile, drafter_k: int) -> list[int]:
    """The K values a static baseline runs: those the profile measured, up to the drafter's."""
    ks = [k for k in profile.speculative_tokens if 1 <= k <= drafter_k]
    return ks or [drafter_k]


def strategies(profile: StepTimeProfile, drafter_k: int) -> list[Strategy]:
    out = [Strategy("policy", "policy"), Strategy("alwaysOff", "static", "Off")]
    out += [Strategy(f"alwaysOnK{k}", "static", "On", k) for k in static_ks(profile, drafter_k)]
    out.append(Strategy("engineDynamicSD", "engineDynamicSD", "On"))
    return out


# The two measures every ratio is reported in (see the module docstring and `Comparison.request_ratio`).
TIME_WEIGHTED = "time-weighted"
ALL_REQUESTS = "over all requests"
# How far below the best fixed setting a policy may fall before the benchmark counts the cell as behind.
BEHIND_MARGIN = 0.01
# The kinds of run a user could launch every engine with and keep: one static setting, or vLLM's
# in-engine Dynamic SD (its own K per batch size), which needs no operator either.
FIXED_KINDS = ("static", "engineDynamicSD")


@dataclass(frozen=True)
class Shortfall:
    """The policy's ratio to the per-level oracle minus the best fixed setting's, on one measure."""

    gap: float  # negative: the policy is behind that setting
    best: str  # the fixed setting with the highest ratio on this measure


def shortfall(policy: float | None, fixed: Mapping[str, float | None]) -> Shortfall | None:
    """`policy` minus the highest of the `fixed` settings' ratios (None when either is unknown)."""
    known = {name: value for name, value in fixed.items() if value is not None}
    if policy is None or not known:
        return None
    best = max(known, key=lambda name: known[name])
    return Shortfall(policy - known[best], best)


def extra_engines(run: Any, declared: Mapping[str, int], bins: int) -> np.ndarray:
    """Per window (the first `bins`): whether `run` had more ready engines in a pool of `declared`
    than it declares there, at the window's start or end (the run's timeline holds each window's state
    at its end)."""
    after = np.zeros(bins, dtype=bool)
    for i, row in enumerate(run.timeline[:bins] if declared else ()):
        for pool, count in declared.items():
            after[i] |= float((row.get(pool) or {}).get("readyReplicas") or 0) > count
    before = np.concatenate(([False], after[:-1]))
    return after | before


def count_behind(cells: Iterable[Shortfall | None], margin: float = BEHIND_MARGIN) -> int:
    """How many cells have the policy more than `margin` below the best fixed setting."""
    return sum(1 for cell in cells if cell is not None and cell.gap < -margin)


@dataclass
class Comparison:
    """Every strategy's run and the derived oracles."""

    runs: dict[str, RunResult]
    oracle_tokens: dict[str, np.ndarray]
    oracle_reqsec: dict[str, np.ndarray]
    oracle_choice: dict[str, list[str]]
    best_static: str
    always_on: str
    first_reaction: float
    bin_seconds: float
    duration: float
    schedule: tuple[tuple[int, int, int], ...]
    extra: dict[str, Any] = field(default_factory=dict)
    # Engines each pool declares (`spec.pools.<pool>.replicas`): what the fixed settings and the
    # oracle serve with; empty: not known (every window counts as plain).
    declared: dict[str, int] = field(default_factory=dict)

    # -- measures -----------------------------------------------------------------------------------

    def _bins(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name == "perLevelOracle":
            return sum(self.oracle_tokens.values()), sum(self.oracle_reqsec.values())  # type: ignore[return-value]
        run = self.runs[self.best_static if name == "bestStatic" else name]
        return sum(run.bin_tokens.values()), sum(run.bin_request_seconds.values())  # type: ignore[return-value]

    def bin_ratio(self, name: str) -> np.ndarray:
        """Per window: tokens per request-second of `name` over the per-level oracle's (NaN when idle)."""
        tokens, reqsec = self._bins(name)
        o_tokens, o_reqsec = self._bins("perLevelOracle")
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(reqsec > 0, tokens / reqsec, np.nan)
            oracle = np.where(o_reqsec > 0, o_tokens / o_reqsec, np.nan)
            return np.where(oracle > 0, value / oracle, np.nan)

    def ratio(self, name: str, windows: np.ndarray | None = None) -> float | None:
        """The mean of `name`'s per-window ratios (over `windows`, a mask, where given)."""
        r = self.bin_ratio(name)
        keep = ~np.isnan(r) if windows is None else ~np.isnan(r) & windows
        r = r[keep]
        return float(r.mean()) if r.size else None

    def extra_engine_windows(self, name: str = "policy") -> np.ndarray:
        """Per window: whether run `name` had more ready engines in a pool than it declares at the
        window's start or end (a surge rollout's new pods beside the old ones, a canary hand-over's
        growing Deployment): a window served partly by engines no fixed setting nor the oracle has,
        so a ratio there can exceed what any decision earns."""
        return extra_engines(self.runs[name], self.declared, len(self.bin_ratio(name)))

    def plain_windows(self) -> np.ndarray:
        """The windows where the policy ran no more engines than declared (`extra_engine_windows`)."""
        return ~self.extra_engine_windows("policy")

    def minute_ratios(self, name: str) -> list[tuple[float, float]]:
        r = self.bin_ratio(name)
        per_minute = max(1, round(60 / self.bin_seconds))
        out = []
        for start in range(0, len(r), per_minute):
            chunk = r[start : start + per_minute]
            chunk = chunk[~np.isnan(chunk)]
            if chunk.size:
                out.append((start * self.bin_seconds, float(chunk.mean())))
        return out

    def worst_minute(self, name: str) -> float | None:
        values = [v for t, v in self.minute_ratios(name) if t >= self.first_reaction]
        return min(values) if values else None

    def worst_minute_start(self, name: str) -> float | None:
        """When the worst minute (see `worst_minute`) began, in seconds."""
        values = [(v, t) for t, v in self.minute_ratios(name) if t >= self.first_reaction]
        return min(values)[1] if values else None

    def held_through(
        self, change_at: float, hold_seconds: float
    ) -> tuple[float, str, dict[str, tuple[float, float]]]:
        """`specfleet.sim.bound.held_through` on this run's static settings, for a change at `change_at`
        (s) that no policy can answer within `hold_seconds` of it: per setting, its mean minute ratio
        from the first reaction up to the change, and its mean over the whole minutes between the
        change and `change_at + hold_seconds` (the first minute after it when that span is shorter).
        Returns the bound, the setting or mix reaching it, and each setting's (before, after)."""
        per: dict[str, tuple[float, float]] = {}
        for name, run in self.runs.items():
            if run.strategy.kind != "static":
                continue
            minutes = self.minute_ratios(name)
            before = [v for t, v in minutes if t >= self.first_reaction and t + 60 <= change_at]
            after = [v for t, v in minutes if t >= change_at and t + 60 <= change_at + hold_seconds]
            if not after:
                after = [v for t, v in minutes if t >= change_at][:1]
            if before and after:
                per[name] = (float(np.mean(before)), float(np.mean(after)))
        value, how = held_through({n: b for n, (b, _) in per.items()}, {n: a for n, (_, a) in per.items()})
        return value, how, per

    def tokens_per_second(self, name: str) -> float:
        tokens, _ = self._bins(name)
        return float(tokens.sum()) / self.duration if self.duration else 0.0

    def per_request(self, name: str, windows: np.ndarray | None = None) -> float | None:
        tokens, reqsec = self._bins(name)
        if windows is not None:
            tokens, reqsec = tokens[windows], reqsec[windows]
        total = float(reqsec.sum())
        return float(tokens.sum()) / total if total > 0 else None

    def request_ratio(self, name: str, windows: np.ndarray | None = None) -> float | None:
        """Over all requests: `name`'s tokens per request-second over the whole run (over `windows`, a
        mask, where given), to the per-level oracle's. Unlike `ratio` (the mean of per-window ratios, a
        calm window weighing as much as a busy one), the requests that queued in a few busy windows
        weigh as much as they waited."""
        value, oracle = self.per_request(name, windows), self.per_request("perLevelOracle", windows)
        return value / oracle if value is not None and oracle else None

    def fixed_settings(self) -> list[str]:
        """The runs a user could have picked as one launch setting (`FIXED_KINDS`), in run order."""
        return [name for name, run in self.runs.items() if run.strategy.kind in FIXED_KINDS]

    def behind_best_fixed(self, measure: str, windows: np.ndarray | None = None) -> Shortfall | None:
        """The policy against the best fixed setting in hindsight, on `measure` (each measure picks
        its own best: the setting best over all requests need not be the time-weighted best), over
        `windows` (a mask) where given."""
        ratio = self.ratio if measure == TIME_WEIGHTED else self.request_ratio
        return shortfall(
            ratio("policy", windows), {name: ratio(name, windows) for name in self.fixed_settings()}
        )

    # -- report -------------------------------------------------------------------------------------

    def names(self) -> list[str]:
        statics = [n for n in self.runs if n.startswith("alwaysOnK")]
        return [
            "policy",
            "alwaysOff",
            "alwaysOn",
            *statics,
            "engineDynamicSD",
            "bestStatic",
            *([BOUND] if BOUND in self.runs else []),
            "perLevelOracle",
        ]

    def run_for(self, name: str) -> RunResult | None:
        if name == "alwaysOn":
            return self.runs[self.always_on]
        if name == "bestStatic":
            return self.runs[self.best_static]
        return self.runs.get(name)

    def strategy_json(self, name: str) -> dict[str, Any]:
        run = self.run_for(name)
        doc: dict[str, Any] = {
            "tokensPerSecond": round(
                self.tokens_per_second(name if name != "alwaysOn" else self.always_on), 2
            ),
            "tokensPerRequestSecond": _round(
                self.per_request(name if name != "alwaysOn" else self.always_on)
            ),
            "ratioToPerLevelOracle": _round(self.ratio(name if name != "alwaysOn" else self.always_on)),
            "worstMinuteRatioToPerLevelOracle": _round(
                self.worst_minute(name if name != "alwaysOn" else self.always_on)
            ),
            "allRequestsRatioToPerLevelOracle": _round(
                self.request_ratio(name if name != "alwaysOn" else self.always_on)
            ),
            "flips": sum(1 for c in run.changes if c.kind == "flip") if run else 0,
            "retunes": sum(1 for c in run.changes if c.kind == "retune") if run else 0,
            "canaryChanges": sum(1 for c in run.changes if c.kind == "canaries") if run else 0,
        }
        if name == "bestStatic":
            doc["setting"] = self.best_static
        if name == "alwaysOn":
            doc["setting"] = self.always_on
        if name == "perLevelOracle":
            doc["settingsUsed"] = sorted({c for choices in self.oracle_choice.values() for c in choices if c})
        if run is not None:
            doc["gpuSeconds"] = round(sum(p.gpu_seconds for p in run.pools.values()), 1)
            doc["pools"] = {pool: _pool_json(run, pool) for pool in POOLS}
            if name == "policy":
                doc["timeline"] = self.timeline_json(run)
            if run.changes:
                doc["changes"] = [
                    {
                        "timeSeconds": round(c.time, 1),
                        "pool": c.pool,
                        "kind": c.kind,
                        "from": c.from_mode if c.kind == "flip" else f"K{c.from_k}",
                        "to": c.to_mode
                        if c.kind == "flip"
                        else (
                            (f"schedule up to K{c.to_k}" if c.schedule else f"K{c.to_k}")
                            if c.kind == "retune"
                            else f"{c.canaries} canaries"
                        ),
                        "schedule": c.schedule,
                        "k": c.to_k,
                        "reason": c.reason,
                        "observedRunningPerReplica": _round(c.observed_load, 1),
                        "expectedRunningPerReplica": _round(c.expected_load, 1),
                    }
                    for c in run.changes
                ]
        return doc

    def timeline_json(self, run: RunResult) -> list[dict[str, Any]]:
        """Per window: each pool's mode, K, replicas (canaries: speculating in an off pool), load and
        tokens/s, and the oracle's tokens/s."""
        loads = {pool: load_per_replica(run, pool) for pool in POOLS}
        latency = {pool: window_latency(run, pool, 90) for pool in POOLS}
        rows = []
        for i, row in enumerate(run.timeline):
            entry: dict[str, Any] = {"timeSeconds": round(row["t"], 1)}
            for pool in POOLS:
                state = row[pool]
                entry[pool] = {
                    "mode": state["mode"],
                    "k": state["k"] if state["mode"] == "On" else None,
                    "replicas": state["replicas"],
                    "readyReplicas": state["readyReplicas"],
                    "canaryReplicas": state["canaryReplicas"],
                    "requestsPerReplica": round(loads[pool][i], 2),
                    "tokensPerSecond": round(float(run.bin_tokens[pool][i]) / self.bin_seconds, 1),
                    "oracleTokensPerSecond": round(float(self.oracle_tokens[pool][i]) / self.bin_seconds, 1),
                    "oracleSetting": self.oracle_choice[pool][i] or None,
                    # Of the requests that finished in the window.
                    "ttftP90Seconds": _round(latency[pool][i][0]),
                    "tpotP90Seconds": _round(latency[pool][i][1]),
                }
                if "reason" in state:
                    # The policy's last evaluation of the pool up to this window: why it did what it did.
                    entry[pool]["decision"] = {
                        "reason": state["reason"],
                        "observedRunningPerReplica": _round(state.get("observedRunningPerReplica"), 1),
                        "expectedRunningPerReplica": _round(state.get("expectedRunningPerReplica"), 1),
                        "predictedSpeedup": _float(state.get("predictedSpeedup")),
                    }
            rows.append(entry)
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "durationSeconds": round(self.duration, 1),
            "windowSeconds": self.bin_seconds,
            "firstReactionSeconds": round(self.first_reaction, 1),
            "engineDynamicSDSchedule": [list(r) for r in self.schedule],
            **self.extra,
            "results": {name: self.strategy_json(name) for name in self.names()},
        }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _pool_json(run: RunResult, pool: str) -> dict[str, Any]:
    res = run.pools[pool]
    duration = run.duration or 1.0
    return {
        "tokensPerSecond": round(res.tokens / duration, 2),
        "requests": res.requests,
        "rejected": res.rejected,
        "unfinished": res.unfinished,
        "ttftP50Seconds": _round(percentile(res.ttft, 50)),
        "ttftP90Seconds": _round(percentile(res.ttft, 90)),
        "ttftP99Seconds": _round(percentile(res.ttft, 99)),
        "tpotP50Seconds": _round(percentile(res.tpot, 50)),
        "tpotP90Seconds": _round(percentile(res.tpot, 90)),
        "tpotP99Seconds": _round(percentile(res.tpot, 99)),
        "itlP50Seconds": _round(histogram_percentile(res.itl, 50)),
        "itlP99Seconds": _round(histogram_percentile(res.itl, 99)),
        "gpuSeconds": round(res.gpu_seconds, 1),
        "preemptions": res.preemptions,
        "meanKvCacheUsage": _round(res.mean_kv_usage),
    }


def compare(
    sd: SpeculativeDeployment,
    workload: Trace | ClosedLoop,
    options: SimOptions | None = None,
    profile: StepTimeProfile | None = None,
    progress: Callable[[str], None] | None = None,
    only: Sequence[str] | None = None,
) -> Comparison:
    """Run every strategy on the same workload and seed, and derive bestStatic and perLevelOracle (on
    `profile`, default: the published one of the spec's drafter method)."""
    options = (options or SimOptions()).resolved(sd.spec)
    profile = profile or default_profile(sd.spec.drafter.method)
    drafter_k = sd.spec.drafter.num_speculative_tokens
    # The table a user would give vLLM: the same one the policy makes from this acceptance.
    schedule = best_schedule(profile, options.acceptance, drafter_k)
    runs: dict[str, RunResult] = {}
    for strategy in strategies(profile, drafter_k):
        if only is not None and strategy.name not in only and strategy.kind != "static":
            continue
        if progress:
            progress(strategy.name)
        runs[strategy.name] = simulate(sd, workload, strategy, options, profile, schedule)
    statics = [n for n in runs if runs[n].strategy.kind == "static"]
    if (only is None or BOUND in only) and len(statics) > 1:
        if progress:
            progress(BOUND)
        runs[BOUND] = rollout_paying_oracle(
            sd, workload, {n: runs[n] for n in statics}, options, profile, SMOOTH
        )
    any_run = runs[statics[0]]
    nbins = len(any_run.bin_tokens[POOLS[0]])
    oracle_tokens = {p: np.zeros(nbins) for p in POOLS}
    oracle_reqsec = {p: np.zeros(nbins) for p in POOLS}
    oracle_choice: dict[str, list[str]] = {p: [""] * nbins for p in POOLS}
    # Which setting is best in a window is judged over that window and its neighbours (+-SMOOTH), so
    # that the oracle picks the setting that suits the load level, not the run that was luckiest in
    # one window's sampling; the window's own numbers of that setting are then used.
    kernel = np.ones(2 * SMOOTH + 1)
    for pool in POOLS:
        smoothed = {}
        for name in statics:
            run = runs[name]
            tokens = np.convolve(run.bin_tokens[pool], kernel, mode="same")
            reqsec = np.convolve(run.bin_request_seconds[pool], kernel, mode="same")
            smoothed[name] = np.where(reqsec > 0, tokens / np.where(reqsec > 0, reqsec, 1), -1.0)
        for b in range(nbins):
            best, best_value = None, -1.0
            for name in statics:
                value = smoothed[name][b] if runs[name].bin_request_seconds[pool][b] > 0 else -1.0
                if value > best_value:
                    best, best_value = name, value
            if best is not None and best_value >= 0:
                oracle_tokens[pool][b] = runs[best].bin_tokens[pool][b]
                oracle_reqsec[pool][b] = runs[best].bin_request_seconds[pool][b]
                oracle_choice[pool][b] = best

    always_on = f"alwaysOnK{drafter_k}" if f"alwaysOnK{drafter_k}" in runs else statics[-1]
    # The earliest the policy can react: one full window, then one evaluation.
    window = sd.spec.policy.window_seconds + sd.spec.policy.evaluation_interval_seconds
    comparison = Comparison(
        runs=runs,
        oracle_tokens=oracle_tokens,
        oracle_reqsec=oracle_reqsec,
        oracle_choice=oracle_choice,
        best_static=statics[0],
        always_on=always_on,
        first_reaction=float(window),
        bin_seconds=any_run.bin_seconds,
        duration=any_run.duration,
        schedule=schedule,
        declared={
            pool: spec.replicas for pool in POOLS if (spec := getattr(sd.spec.pools, pool, None)) is not None
        },
    )
    # bestStatic is judged by the measure every ratio uses (time-weighted ratio to the oracle).
    comparison.best_static = max(statics, key=lambda name: comparison.ratio(name) or 0.0)
    return comparison
