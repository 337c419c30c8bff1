"""Latency SLO attainment of simulated runs (pure): the share of a pool's requests whose time to first
token and time per output token both meet a pool's `LatencySlo` targets, per window and over a run, and
the per-level oracle's.

A request counts in the window it finished in (`RunResult.bin_latency`). A request of one output token
has no TPOT and is judged by its TTFT alone; a target the SLO leaves unset is met by every request.
The per-level oracle runs, in each window, the static setting whose attainment is highest there, judged
over the window and its `SMOOTH` neighbours (as `compare`'s throughput oracle judges tokens per
request-second), and counts that setting's requests of the window: what a policy that knew each
window's best setting for the SLO, and paid nothing to switch, would attain.

The start-paying bound (`start_paying_bound`) is what a reacting policy can attain at most: the best
hindsight schedule of static settings for the SLO's met requests that starts in the setting the resource
declares (every engine starts there, the policy's too), changes nothing before the policy first
evaluates, and pays each change's rollout (`specfleet.sim.bound`), simulated. Where it falls behind the
best fixed setting, a fixed setting other than the declared one wins by starting where the policy can
only arrive after a rollout, or by hindsight: no policy that starts as declared and reacts reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specfleet.api.constants import PoolName
from specfleet.api.pools import LatencySlo
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.inputs.status import auto_pools
from specfleet.sim.accounts import RunResult
from specfleet.sim.bound import best_schedule, pool_mix, schedule_of, scores
from specfleet.sim.compare import SMOOTH
from specfleet.sim.fleet import simulate
from specfleet.sim.options import SimOptions, Strategy
from specfleet.sim.workload import ClosedLoop, Trace
from specfleet_runtime.cost_profile import StepTimeProfile

START_PAYING = "startPayingBound"


@dataclass(frozen=True)
class Targets:
    """An SLO's two targets in seconds (None: no target)."""

    ttft_s: float | None
    tpot_s: float | None

    @classmethod
    def of(cls, slo: LatencySlo) -> Targets:
        ttft, tpot = slo.time_to_first_token_milliseconds, slo.time_per_output_token_milliseconds
        return cls(None if ttft is None else ttft / 1000, None if tpot is None else tpot / 1000)

    def met(self, ttft: float, tpot: float | None) -> bool:
        """Whether one request met both targets."""
        if self.ttft_s is not None and ttft > self.ttft_s:
            return False
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s

    def text(self) -> str:
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:.0f} ms")
        if self.tpot_s is not None:
            parts.append(f"TPOT {self.tpot_s * 1000:.0f} ms")
        return ", ".join(parts) or "no target"


def window_counts(run: RunResult, pool: str, targets: Targets) -> tuple[np.ndarray, np.ndarray]:
    """Per window: the requests of `pool` that finished in it and met the targets, and all that finished."""
    met = np.array(
        [sum(1 for ttft, tpot in done if targets.met(ttft, tpot)) for done in run.bin_latency[pool]]
    )
    done = np.array([len(done) for done in run.bin_latency[pool]])
    return met.astype(float), done.astype(float)


def attainment(run: RunResult, pool: str, targets: Targets) -> float | None:
    """The share of the pool's finished requests that met the targets (None: none finished)."""
    met, done = window_counts(run, pool, targets)
    return float(met.sum() / done.sum()) if done.sum() > 0 else None


@dataclass(frozen=True)
class OracleAttainment:
    """The per-level oracle's attainment and the setting it ran in each window ("" where none finished)."""

    attainment: float | None
    choice: tuple[str, ...]


def oracle_attainment(
    runs: Mapping[str, RunResult], statics: Sequence[str], pool: str, targets: Targets, smooth: int = SMOOTH
) -> OracleAttainment:
    """The per-level oracle over the `statics` runs for `targets` (see the module docstring)."""
    counts = {name: window_counts(runs[name], pool, targets) for name in statics}
    kernel = np.ones(2 * smooth + 1)
    judged = {}
    for name, (met, done) in counts.items():
        m, d = np.convolve(met, kernel, mode="same"), np.convolve(done, kernel, mode="same")
        judged[name] = np.where(d > 0, m / np.where(d > 0, d, 1), -1.0)
    nbins = min(len(done) for _, done in counts.values())
    met_total = done_total = 0.0
    choice = []
    for b in range(nbins):
        best = max(statics, key=lambda name: judged[name][b])
        if judged[best][b] < 0:
            choice.append("")
            continue
        choice.append(best)
        met_total += counts[best][0][b]
        done_total += counts[best][1][b]
    return OracleAttainment(met_total / done_total if done_total > 0 else None, tuple(choice))


def declared_setting(sd: SpeculativeDeployment) -> str:
    """The static strategy every engine starts in: speculation On at the drafter's K."""
    return f"alwaysOnK{sd.spec.drafter.num_speculative_tokens}"


def met_scores(
    runs: Mapping[str, RunResult], pool: str, targets: Targets, smooth: int
) -> dict[str, np.ndarray]:
    """Per static run and window: the requests of `pool` that met `targets` in the window and its `smooth`
    neighbours (NaN where none finished), the scores `start_paying_bound`'s schedule adds up."""
    kernel = np.ones(2 * smooth + 1)
    out = {}
    for name, run in runs.items():
        met, done = window_counts(run, pool, targets)
        out[name] = np.where(
            np.convolve(done, kernel, mode="same") > 0, np.convolve(met, kernel, mode="same"), np.nan
        )
    return out


def start_paying_bound(
    sd: SpeculativeDeployment,
    workload: Trace | ClosedLoop,
    statics: Mapping[str, RunResult],
    options: SimOptions,
    profile: StepTimeProfile,
    pool: PoolName,
    targets: Targets,
    smooth: int = SMOOTH,
) -> RunResult:
    """The start-paying bound of `pool` for `targets` (see the module docstring), simulated; the other
    Auto pools follow the throughput bound's schedule (`specfleet.sim.bound`). `statics` are the static
    runs on the same workload and seed."""
    options = options.resolved(sd.spec)
    step = next(iter(statics.values())).bin_seconds
    start = declared_setting(sd)
    hold = math.floor(sd.spec.policy.evaluation_interval_seconds / step + 1e-9)
    choices: dict[str, list[str]] = {}
    for p in auto_pools(sd.spec):
        mix = pool_mix(sd, p, options, profile, step)
        if p == pool and start in statics:
            choices[p] = best_schedule(met_scores(statics, p, targets, smooth), mix, start=start, hold=hold)
        else:
            choices[p] = best_schedule(scores(statics, p, smooth), mix)
    schedule = schedule_of(choices, step)
    return simulate(sd, workload, Strategy(START_PAYING, "schedule", schedule=schedule), options, profile)
