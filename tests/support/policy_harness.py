"""A small fluid model of one Auto pool, driving the operator's real policy (`decide` + `record`).

It is the measurement the policy is tuned with in unit tests, not the fleet simulator: load is given
as running requests per replica (closed loop, as the issue's measurements did), every engine's
throughput comes from the cost profile (tokens per step over step time), and a pool change takes
effect after a fixed rollout delay (surge: the old engines serve until then; a stuck rollout never
finishes). What the engines run is read from the renderer's own Deployments (replicas and
--speculative-config of the stable and canary tracks), so the harness follows what the operator
would apply. Observations are windowed like the PromQL: load averaged over `windowSeconds`, per-position
acceptance as accepted-per-position over drafts of every speculating engine of the pool.

Baselines over the same load: always-off, always-on at each K, and the per-level oracle (the best
setting of each evaluation interval, in hindsight, without rollout cost or canaries).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from specfleet.api.validation import SpeculativeDeployment, parse_spec
from specfleet.policy import PoolObservation, decide
from specfleet.policy.decision.record import record
from specfleet.policy.inputs.scraping import ScrapeSetup
from specfleet.policy.inputs.status import pool_states
from specfleet.reconcile import decided_plan
from specfleet.render import render_children
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile

START = datetime(2026, 1, 1, tzinfo=UTC)
WEAK = (0.3, 0.1, 0.03, 0.01, 0.0)
PUBLISHED = (0.68, 0.39, 0.20, 0.10, 0.05)
STRONG = (0.9, 0.8, 0.7, 0.6, 0.5)

Load = Callable[[float], float]
Acceptance = Callable[[float], Sequence[float]]


def ramp(points: Sequence[tuple[float, float]]) -> Load:
    """Piecewise-linear load through (seconds, running per replica) points."""

    def load(t: float) -> float:
        if t <= points[0][0]:
            return points[0][1]
        for (t0, c0), (t1, c1) in itertools.pairwise(points):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return points[-1][1]

    return load


def issue_ramp(low: float = 2, high: float = 200, minutes: float = 10) -> tuple[Load, float]:
    """The issue's ramp: low -> high in `minutes`, hold, high -> low, hold (each `minutes`)."""
    m = minutes * 60
    return ramp([(0, low), (m, high), (2 * m, high), (3 * m, low), (4 * m, low)]), 4 * m


def engine_tokens_per_second(
    profile: StepTimeProfile, c: float, k: int, acceptance: Sequence[float]
) -> float:
    """Tokens/s of one engine with `c` running requests drafting `k` tokens (k=0: no speculation)."""
    if c <= 0:
        return 0.0
    return c * (1 + sum(acceptance[:k])) / profile.step_time_s(c, k)


@dataclass
class Engines:
    """What runs: (replicas, K) per track; K=0 is a non-speculative engine."""

    tracks: list[tuple[int, int]]

    def tokens(self, profile: StepTimeProfile, c: float, acceptance: Sequence[float]) -> float:
        return sum(n * engine_tokens_per_second(profile, c, k, acceptance) for n, k in self.tracks)


def rendered_engines(sd: SpeculativeDeployment, pool: str) -> Engines:
    """The pool's engines as the renderer would deploy them now (from spec and status)."""
    children = render_children(sd, decided_plan(sd))
    tracks = []
    for child in children:
        labels = child["metadata"]["labels"]
        if child["kind"] != "Deployment" or labels.get("specfleet.io/pool") != pool:
            continue
        args = child["spec"]["template"]["spec"]["containers"][0]["args"]
        k = 0
        if "--speculative-config" in args:
            k = json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"]
        tracks.append((int(child["spec"]["replicas"]), int(k)))
    return Engines(tracks)


@dataclass
class Change:
    at: float
    kind: str  # "flip", "retune" or another decision that changed the pool
    reason: str
    mode: str
    k: int | None


@dataclass
class Result:
    """Tokens per second (time-weighted) of the policy and the baselines, and what the policy did."""

    policy_tokens: list[float]
    oracle_tokens: list[float]
    static_tokens: dict[str, list[float]]
    changes: list[Change]
    decisions: list[tuple[float, Any]]
    interval: int
    status: Any = None
    loads: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Time-weighted: the mean over seconds of policy over oracle tokens/s."""
        return _mean_ratio(self.policy_tokens, self.oracle_tokens)

    @property
    def token_ratio(self) -> float:
        """Token-weighted: all tokens of the policy over all tokens of the oracle."""
        return sum(self.policy_tokens) / sum(self.oracle_tokens)

    def static_ratio(self, name: str) -> float:
        return _mean_ratio(self.static_tokens[name], self.oracle_tokens)

    def minute_ratios(self, after: float = 0.0) -> list[float]:
        out = []
        for m in range(math.ceil(after / 60), len(self.policy_tokens) // 60):
            p = sum(self.policy_tokens[m * 60 : (m + 1) * 60])
            o = sum(self.oracle_tokens[m * 60 : (m + 1) * 60])
            if o > 0:
                out.append(p / o)
        return out

    @property
    def first_reaction(self) -> float:
        return self.changes[0].at if self.changes else 0.0

    def worst_minute(self, after_first_reaction: bool = True) -> float:
        ratios = self.minute_ratios(self.first_reaction if after_first_reaction else 0.0)
        return min(ratios) if ratios else 1.0

    @property
    def flips(self) -> list[Change]:
        return [c for c in self.changes if c.kind == "flip"]

    def summary(self) -> str:
        statics = " ".join(f"{n}={self.static_ratio(n):.3f}" for n in self.static_tokens)
        return (
            f"policy={self.ratio:.3f} (tokens {self.token_ratio:.3f}) worstMinute={self.worst_minute():.3f} flips={len(self.flips)} "
            f"changes={len(self.changes)} [{statics}] "
            + " ".join(f"{c.at:.0f}s:{c.reason}->{c.mode}/K{c.k}" for c in self.changes)
        )


def simulate(
    spec: dict[str, Any],
    load: Load,
    duration: float,
    acceptance: Acceptance | Sequence[float] = PUBLISHED,
    *,
    pool: str = "latency",
    profile: StepTimeProfile | None = None,
    rollout_delay: float = 60.0,
    stuck: Callable[[float], bool] = lambda t: False,
    noise: Callable[[float], float] | None = None,
) -> Result:
    """Run the policy on one Auto pool for `duration` seconds, one-second steps.

    `stuck(t)` says whether a rollout started at time t never finishes (no free GPU for a surge pod).
    `noise(t)`, if given, multiplies the load the policy observes (measurement noise), not the load.
    """
    profile = profile or default_profile()
    accept: Acceptance = acceptance if callable(acceptance) else (lambda t, a=tuple(acceptance): a)
    parsed = parse_spec(spec)
    policy = parsed.policy
    k_max = parsed.drafter.num_speculative_tokens
    replicas = getattr(parsed.pools, pool).replicas
    sd = SpeculativeDeployment("sim", "default", "uid", 1, parsed, _initial_status())
    running = rendered_engines(sd, pool)
    target: Engines | None = None
    rollout_done: float | None = None
    interval = policy.evaluation_interval_seconds
    window = policy.window_seconds
    ks = sorted({k for k in profile.speculative_tokens if 1 <= k <= k_max} | {k_max})
    settings = [0, *ks]
    policy_tokens: list[float] = []
    static = {("alwaysOff" if k == 0 else f"alwaysOnK{k}"): [] for k in settings}  # type: ignore[var-annotated]
    per_setting: list[list[float]] = []
    seen_load: list[float] = []
    drafts: list[float] = []
    accepted: list[list[float]] = []
    widths: list[int] = []
    changes: list[Change] = []
    decisions: list[tuple[float, Any]] = []
    for t in range(int(duration)):
        c = load(float(t))
        a = tuple(accept(float(t))) + (0.0,) * 10
        if rollout_done is not None and t >= rollout_done and target is not None:
            running, target, rollout_done = target, None, None
            sd = _with_settled(sd, pool, True)
        policy_tokens.append(running.tokens(profile, c, a))
        row = [replicas * engine_tokens_per_second(profile, c, k, a) for k in settings]
        per_setting.append(row)
        for k, v in zip(settings, row, strict=True):
            static["alwaysOff" if k == 0 else f"alwaysOnK{k}"].append(v)
        # Engine counters: every request drafts once per step; position i is counted by engines with K > i.
        d = 0.0
        acc = [0.0] * 10
        widest = 0
        for n, k in running.tracks:
            if k == 0 or n == 0 or c <= 0:
                continue
            steps = n * c / profile.step_time_s(c, k)
            d += steps
            widest = max(widest, k)
            for i in range(k):
                acc[i] += steps * a[i]
        seen_load.append(c * (noise(float(t)) if noise else 1.0))
        drafts.append(d)
        accepted.append(acc)
        widths.append(widest)
        if t > 0 and t % interval == 0:
            now = START + timedelta(seconds=t)
            lo = max(0, t - window)
            load_w = sum(seen_load[lo:t]) / (t - lo)
            d_w = sum(drafts[lo:t])
            # Prometheus reports a position for as long as an engine drafting it is in the window.
            positions = max(widths[lo:t], default=0)
            obs_kwargs: dict[str, Any] = {}
            if d_w >= 100 and positions > 0:
                acc_w = [sum(x[i] for x in accepted[lo:t]) for i in range(10)]
                per_pos = tuple(min(1.0, acc_w[i] / d_w) for i in range(positions))
                mode = sd.status.pools.model_dump()[pool]["speculation"]
                obs_kwargs = {
                    "acceptance_length": 1 + sum(acc_w) / d_w,
                    "per_position": per_pos,
                    "acceptance_source": "pool" if mode == "On" else "canary",
                    "drafts_in_window": d_w,
                }
            obs = PoolObservation(
                pool=pool, at=now, running_per_replica=load_w, replicas_reporting=replicas, **obs_kwargs
            )
            states = pool_states(sd.spec, sd.status, now)
            out = decide(policy, k_max, states, {pool: obs}, now, profile)
            decisions.append((t, out[0]))
            recorded = record(
                sd.status,
                out,
                {pool: obs},
                sd.generation,
                now,
                ScrapeSetup.of(sd),
                window_seconds=policy.window_seconds,
            )
            sd = _replace_status(sd, recorded.status)
            if recorded.flipped:
                d0 = recorded.flipped[0]
                kind = "flip" if d0.flip else ("retune" if d0.target_k is not None else "other")
                ps = getattr(sd.status.pools, pool)
                changes.append(Change(t, kind, d0.reason, ps.speculation, ps.num_speculative_tokens))
                wanted = rendered_engines(sd, pool)
                if wanted.tracks != running.tracks:
                    target = wanted
                    rollout_done = math.inf if stuck(float(t)) else t + rollout_delay
                else:
                    target, rollout_done = None, None
                    sd = _with_settled(sd, pool, True)
    oracle: list[float] = []
    for start in range(0, len(per_setting), interval):
        block = per_setting[start : start + interval]
        best = max(range(len(settings)), key=lambda j: sum(r[j] for r in block))
        oracle += [r[best] for r in block]
    return Result(
        policy_tokens,
        oracle,
        static,
        changes,
        decisions,
        interval,
        sd.status,
        [load(float(t)) for t in range(int(duration))],
    )


def _mean_ratio(xs: Sequence[float], oracle: Sequence[float]) -> float:
    pairs = [(x, o) for x, o in zip(xs, oracle, strict=True) if o > 0]
    return sum(x / o for x, o in pairs) / len(pairs)


def _initial_status() -> Any:
    from specfleet.api.status import SpeculativeDeploymentStatus

    status = SpeculativeDeploymentStatus()
    pools = status.pools.model_copy(deep=True)
    for p in ("latency", "batch"):
        setattr(pools, p, getattr(pools, p).model_copy(update={"settled": True}))
    return status.model_copy(update={"pools": pools})


def _replace_status(sd: SpeculativeDeployment, status: Any) -> SpeculativeDeployment:
    return SpeculativeDeployment(sd.name, sd.namespace, sd.uid, sd.generation, sd.spec, status)


def _with_settled(sd: SpeculativeDeployment, pool: str, settled: bool) -> SpeculativeDeployment:
    pools = sd.status.pools.model_copy(deep=True)
    setattr(pools, pool, getattr(pools, pool).model_copy(update={"settled": settled}))
    return _replace_status(sd, sd.status.model_copy(update={"pools": pools}))


def example_spec(**policy: Any) -> dict[str, Any]:
    """Example 02's latency pool and gates (3 replicas, one canary), with policy overrides."""
    base: dict[str, Any] = {
        "evaluationIntervalSeconds": 30,
        "windowSeconds": 120,
        "minDwellSeconds": 300,
        "cooldownSeconds": 600,
        "maxFlipsPerHour": 4,
        "reentry": {"canaryReplicas": 1},
    }
    base.update(policy)
    return {
        "model": {"name": "m"},
        "drafter": {"method": "eagle3", "model": "d", "numSpeculativeTokens": 3},
        "pools": {
            "latency": {"replicas": 3, "speculation": "Auto"},
            "batch": {"replicas": 2, "speculation": "On"},
        },
        "policy": base,
    }


def poisson_noise(
    level: float, duration: float, seed: int = 0, tau: float = 20.0
) -> Callable[[float], float]:
    """Multiplicative noise of a running count around `level`: standard deviation sqrt(level) (as the
    count of an M/G/inf queue), correlated over `tau` seconds (an Ornstein-Uhlenbeck process)."""
    import random

    rng = random.Random(seed)
    sigma = math.sqrt(max(level, 1.0)) / max(level, 1.0)
    a = math.exp(-1.0 / tau)
    x = 0.0
    values = []
    for _ in range(int(duration) + 1):
        x = a * x + math.sqrt(1 - a * a) * rng.gauss(0.0, sigma)
        values.append(max(0.0, 1.0 + x))
    return lambda t: values[min(int(t), len(values) - 1)]
