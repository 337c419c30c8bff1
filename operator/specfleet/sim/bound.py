"""A hindsight oracle that pays for its rollouts: what the best schedule of changes could have done.

The per-level oracle (`specfleet.sim.compare`) takes every window's best static setting with no cost
for changing it, so it switches even on a burst that is over before a rollout could finish. No real
policy can follow that. This bound chooses, in hindsight, one schedule of changes per Auto pool and
then runs it through the simulator (`Strategy(kind="schedule")`), so each of its changes is a real
surge rollout: a new pod starts (`startup_seconds`) while the old ones serve, then replaces one, and
the pool runs a mix of old and new engines until the last one is replaced. A Standby pool's flip is
one replica at a time, each its sleep + wake + check (and, in the run, its drain).

The schedule is a dynamic program over the windows (`best_schedule`): in each window a pool either
keeps its setting (and scores that setting's window, from the static runs) or starts a change, which
commits the next windows to the rollout's mix of the old and new settings' windows (`rollout_mix`)
and allows the next change only once that rollout is over. A window scores its setting's tokens per
request-second over the best setting's in that window (each window weighs the same, as the benchmark's
time-weighted ratio does), judged, like the per-level oracle, on the window and its neighbours so that
the schedule follows load levels, not one window's sampling luck.

It ignores the resource's stability gates (dwell, cooldown, flip budgets): it says what the physics
(start-up time, surge rollout) allows, so a policy's shortfall against it is a decision's or a gate's,
and a shortfall of the bound itself against the per-level oracle is one no policy can avoid. It is the
best schedule under the mix model, simulated; not a proof that no schedule does better.

Two variants answer narrower questions (`rollout_paying_oracle(objective=..., gated=...)`): the
schedule chosen for its worst window instead of its sum (what the best worst minute is, not the best
average), and the schedule whose flips are as far apart as the resource's dwell lets a pool's
policy flip (what the resource's own gates allow, still knowing the future).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from specfleet.api.constants import PoolName
from specfleet.api.effective import pool_engine
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.inputs.status import auto_pools
from specfleet.policy.predict.rollout_time import STANDBY
from specfleet.sim.accounts import RunResult
from specfleet.sim.fleet import simulate
from specfleet.sim.options import SimOptions, Strategy
from specfleet.sim.rollout import switch_seconds
from specfleet.sim.workload import ClosedLoop, Trace
from specfleet_runtime.cost_profile import StepTimeProfile

NAME = "rolloutPayingOracle"
REACTIVE = "reactiveBound"
# The reaction bound (`reaction_hold_seconds`), its schedule chosen for the time-weighted measure and
# for the one over all requests.
REACTION = "reactionBound"
REACTION_REQUESTS = "reactionBoundRequests"


def rollout_mix(replicas: int, max_surge: int, startup_seconds: float, bin_seconds: float) -> list[float]:
    """Per window from a change on: the time-averaged fraction of the pool's serving engines that are
    new. With maxUnavailable 0 and maxSurge m, m new pods start at once; each ready one replaces an
    old one and the next m start, so batch i is serving from i x startup on. The list ends with the
    window in which the last old pod is replaced (that window is partly new)."""
    replicas = max(1, replicas)
    surge = max(1, max_surge)
    batches = math.ceil(replicas / surge)
    total = batches * startup_seconds
    windows = max(1, math.ceil(total / bin_seconds - 1e-9))
    out = []
    steps = 64
    for w in range(windows):
        acc = 0.0
        for j in range(steps):
            t = (w + (j + 0.5) / steps) * bin_seconds
            acc += min(replicas, surge * math.floor(t / startup_seconds)) / replicas
        out.append(acc / steps)
    return out


def best_schedule(
    values: Mapping[str, Sequence[float] | np.ndarray],
    mix: Sequence[float],
    flip_gap: int = 0,
    objective: str = "total",
    skip: int = 0,
    start: str | None = None,
    hold: int = 0,
) -> list[str]:
    """The per-window setting sequence with the highest score, when a change from a to b in window w
    scores windows w..w+len(mix)-1 as (1 - f) x a + f x b (f from `mix`) and allows no other change
    before that rollout is over. `values[s][w]` is setting s's score in window w (NaN: no traffic,
    scores 0). The returned list names, per window, the setting the pool is moving to (the change is
    made at that window's start).

    `flip_gap` > 0: a flip (a change between "alwaysOff" and a speculating setting) starts at least
    that many windows after the previous flip started (a resource's dwell); a change of
    K between speculating settings is not a flip (the policy's retunes do not spend them either).
    `objective` "total" maximises the sum of the windows' scores; "worst" the lowest window score
    from window `skip` on (ties: the sum), a max-min program whose sum is only a tie-break, so not
    the best sum under that minimum in every case.

    `start` fixes the setting serving at window 0 (None: the best one), and no change starts before
    window `hold`."""
    names = list(values)
    if not names:
        return []
    n = len(values[names[0]])
    v = {s: np.nan_to_num(np.asarray(values[s], dtype=float), nan=0.0) for s in names}
    # For the minimum a window without traffic constrains nothing.
    floor = {
        s: np.where(np.isnan(np.asarray(values[s], dtype=float)) | (np.arange(n) < skip), math.inf, v[s])
        for s in names
    }
    worst = objective == "worst"
    off = [s == "alwaysOff" for s in names]
    r = len(mix)
    gap = max(0, flip_gap)
    # best[w][i][g]: the best (primary, total) the windows w.. can score with setting i serving at w's
    # start, no rollout in flight, and min(gap, windows since the last flip started) = g.
    end_value = (math.inf if worst else 0.0, 0.0)
    best = [[[end_value] * (gap + 1) for _ in names] for _ in range(n + 1)]
    move = [[[-1] * (gap + 1) for _ in names] for _ in range(n)]

    def better(x: tuple[float, float], y: tuple[float, float]) -> bool:
        # (Primaries may both be infinite: no window constrains the minimum yet.)
        return x[0] > y[0] + 1e-12 or (x[0] >= y[0] - 1e-12 and x[1] > y[1] + 1e-12)

    for w in range(n - 1, -1, -1):
        for i, a in enumerate(names):
            for g in range(gap + 1):
                rest = best[w + 1][i][min(gap, g + 1)]
                here = (min(floor[a][w], rest[0]) if worst else v[a][w] + rest[0], v[a][w] + rest[1])
                choice, score = -1, here
                for j, b in enumerate(names):
                    if j == i or w < hold:
                        continue
                    flip = off[i] != off[j]
                    if flip and g < gap:
                        continue
                    end = min(n, w + r)
                    span = range(w, end)
                    total = sum((1 - mix[t - w]) * v[a][t] + mix[t - w] * v[b][t] for t in span)
                    low = min(
                        (
                            (1 - mix[t - w]) * floor[a][t] + mix[t - w] * floor[b][t]
                            if math.isfinite(floor[a][t]) and math.isfinite(floor[b][t])
                            else math.inf
                            for t in span
                        ),
                        default=math.inf,
                    )
                    after = min(gap, end - w) if flip else min(gap, g + end - w)
                    rest = best[end][j][after]
                    value = (min(low, rest[0]) if worst else total + rest[0], total + rest[1])
                    if better(value, score):
                        choice, score = j, value
                best[w][i][g] = score
                move[w][i][g] = choice
    # Start with the setting that does best from window 0 (no rollout at the start: the static runs
    # start that way too), free to flip at once (a new pool has no last flip).
    current = (
        names.index(start) if start is not None else max(range(len(names)), key=lambda i: best[0][i][gap])
    )
    out: list[str] = []
    w, g = 0, gap
    while w < n:
        j = move[w][current][g]
        if j < 0:
            out.append(names[current])
            w, g = w + 1, min(gap, g + 1)
            continue
        end = min(n, w + r)
        out.extend([names[j]] * (end - w))
        g = min(gap, end - w) if off[current] != off[j] else min(gap, g + end - w)
        current, w = j, end
    return out


def first_best(values: Mapping[str, np.ndarray]) -> str:
    """The setting best in the first window with traffic."""
    names = list(values)
    for w in range(len(values[names[0]])):
        if any(not math.isnan(values[s][w]) for s in names):
            return max(names, key=lambda s: float(np.nan_to_num(values[s][w], nan=-1.0)))
    return names[0]


def scores(runs: Mapping[str, RunResult], pool: str, smooth: int) -> dict[str, np.ndarray]:
    """Per static setting and window: its tokens per request-second over the best setting's (both
    judged on the window and `smooth` windows either side)."""
    kernel = np.ones(2 * smooth + 1)
    per: dict[str, np.ndarray] = {}
    for name, run in runs.items():
        tokens = np.convolve(run.bin_tokens[pool], kernel, mode="same")
        reqsec = np.convolve(run.bin_request_seconds[pool], kernel, mode="same")
        per[name] = np.where(reqsec > 0, tokens / np.where(reqsec > 0, reqsec, 1), np.nan)
    stacked = np.vstack(list(per.values()))
    with np.errstate(invalid="ignore", divide="ignore"):
        top = np.nanmax(np.where(np.isnan(stacked), -np.inf, stacked), axis=0)
        return {name: np.where(top > 0, value / top, np.nan) for name, value in per.items()}


def request_scores(runs: Mapping[str, RunResult], pool: str, smooth: int) -> dict[str, np.ndarray]:
    """Per static setting and window: minus its request-seconds (judged on the window and `smooth`
    windows either side), over the largest of any setting's window. Summed over the windows, the
    schedule with the highest total holds its requests the least time: over the same requests and
    tokens, the highest tokens per request-second over the whole run (the measure over all requests,
    where a window with a queue weighs as much as its requests hold)."""
    kernel = np.ones(2 * smooth + 1)
    per = {
        name: np.convolve(run.bin_request_seconds[pool], kernel, mode="same") for name, run in runs.items()
    }
    top = max((float(np.max(v)) for v in per.values() if v.size), default=0.0) or 1.0
    return {name: -value / top for name, value in per.items()}


def departure_seconds(runs: Mapping[str, RunResult], pool: str, smooth: int, margin: float) -> float | None:
    """When the setting best in the first window with traffic (`first_best`) first scores below that
    window's best setting by more than `margin` (`scores`), in seconds from the start; None: never."""
    values = scores(runs, pool, smooth)
    start = first_best(values)
    stacked = np.vstack([np.nan_to_num(v, nan=-np.inf) for v in values.values()])
    top = stacked.max(axis=0)
    mine = values[start]
    step = next(iter(runs.values())).bin_seconds
    for w in range(len(mine)):
        if not math.isnan(mine[w]) and top[w] - mine[w] > margin:
            return w * step
    return None


def setting_of(name: str) -> tuple[str, int | None]:
    """A static strategy's name as (mode, K): alwaysOff -> (Off, None), alwaysOnK3 -> (On, 3)."""
    if name == "alwaysOff":
        return "Off", None
    return "On", int(name.removeprefix("alwaysOnK"))


def schedule_of(
    choices: Mapping[str, Sequence[str]], bin_seconds: float
) -> tuple[tuple[float, str, str, int | None], ...]:
    """Per-window settings per pool as the change list a `schedule` strategy runs."""
    out: list[tuple[float, str, str, int | None]] = []
    for pool, seq in choices.items():
        last = None
        for w, name in enumerate(seq):
            if name != last:
                mode, k = setting_of(name)
                out.append((w * bin_seconds, pool, mode, k))
                last = name
    return tuple(sorted(out))


def rollout_paying_oracle(
    sd: SpeculativeDeployment,
    workload: Trace | ClosedLoop,
    statics: Mapping[str, RunResult],
    options: SimOptions,
    profile: StepTimeProfile,
    smooth: int = 2,
    lag_seconds: float = 0.0,
    objective: str = "total",
    gated: bool = False,
    name: str = NAME,
    hold_seconds: float | None = None,
    measure: str = "time",
) -> RunResult:
    """The best hindsight schedule of static settings that pays each change's surge rollout, simulated
    (see the module docstring). `statics` are the static runs on the same workload and seed.

    `lag_seconds` > 0 runs the same schedule with every change made that much later (rounded to a
    window): a diagnostic of how much of the bound comes from starting a rollout before the change it
    answers (a policy that measures sees a change only after part of a window). Not a bound: a
    schedule chosen knowing the lag could do differently.

    `objective` "worst" chooses the schedule for its lowest window from the policy's first reaction
    on (one window plus one evaluation; see `best_schedule`) instead of for the sum. `gated` starts a
    flip no sooner than minDwellSeconds after the pool's previous one, as the resource's gates allow a
    policy (the cooldown between flips of different pools, the hourly flip budget and the retune
    interval are not modelled: the bound stays above what the gates allow).

    `hold_seconds` (not None) gives the reactive bound (`REACTIVE`): the schedule starts in the
    setting best in the first window and starts no change before `hold_seconds` (when the workload
    first moves: nothing measured before it tells the trace from one that stays as it began), then
    follows the best schedule knowing the rest. A policy that serves the first stretch in its best
    setting has no reason to leave it sooner, so on this trace it scores at most this (within the mix
    model); one that leaves it anyway pays on every trace whose first stretch lasts.

    `measure` "requests" scores a schedule by its request-seconds (`request_scores`: the measure over
    all requests) instead of each window's ratio (the time-weighted measure); the start and the hold
    are the same."""
    options = options.resolved(sd.spec)
    any_run = next(iter(statics.values()))
    policy = sd.spec.policy
    step = any_run.bin_seconds
    gap = math.ceil(policy.min_dwell_seconds / step - 1e-9) if gated else 0
    skip = math.ceil((policy.window_seconds + policy.evaluation_interval_seconds) / step - 1e-9)
    if hold_seconds is not None and name == NAME:
        name = REACTIVE
    choices: dict[str, list[str]] = {}
    for pool in auto_pools(sd.spec):
        mix = pool_mix(sd, pool, options, profile, step)
        values = scores(statics, pool, smooth)
        start, hold = None, 0
        if hold_seconds is not None:
            start = first_best(values)
            hold = math.floor(hold_seconds / step + 1e-9)
        if measure == "requests":
            values = request_scores(statics, pool, smooth)
        choices[pool] = best_schedule(values, mix, gap, objective, skip, start, hold)
    schedule = schedule_of(choices, any_run.bin_seconds)
    if lag_seconds > 0:
        lag = round(lag_seconds / any_run.bin_seconds) * any_run.bin_seconds
        schedule = tuple((at + lag if at > 0 else at, *rest) for at, *rest in schedule)  # type: ignore[misc]
        name = f"{name}Lagged"
    return simulate(sd, workload, Strategy(name, "schedule", schedule=schedule), options, profile)


def pool_mix(
    sd: SpeculativeDeployment,
    pool: PoolName,
    options: SimOptions,
    profile: StepTimeProfile,
    bin_seconds: float,
) -> list[float]:
    """`rollout_mix` for one pool's change as its resource rolls it out (`options` resolved)."""
    spec = getattr(sd.spec.pools, pool)
    if spec.rollout.flip == STANDBY:
        # One replica at a time, each down for its switch (its drain, which the trace decides, is
        # left to the simulated run).
        tp = pool_engine(sd.spec, pool).tensor_parallel_size
        return rollout_mix(spec.replicas, 1, switch_seconds(options, profile, tp), bin_seconds)
    return rollout_mix(spec.replicas, spec.max_surge, options.startup, bin_seconds)


def held_through(pre: Mapping[str, float], post: Mapping[str, float]) -> tuple[float, str]:
    """The best worst minute a policy can have when it cannot know when a change comes.

    `pre[s]` is static setting s's ratio to the per-level oracle before the change, `post[s]` in the
    first minute after it (before any policy could have seen the change and started a new engine:
    an evaluation interval plus a start-up). A policy that does not know when the change comes (it
    could come in any minute of a stationary stretch) serves every minute of that stretch with a
    setting that must do well on both sides of it: its best worst minute is at most the largest
    min(pre, post) over the settings and over fixed mixes of two of them (some replicas at one, the
    rest at the other: the linear mix of `rollout_mix` and `best_schedule`). Returns that value and
    the setting or mix that reaches it."""
    names = [s for s in pre if s in post]
    best, how = -math.inf, ""
    for a in names:
        value = min(pre[a], post[a])
        if value > best:
            best, how = value, a
        for b in names:
            if b <= a:
                continue
            # min of two lines in the mix fraction f of b: the best is where they cross (or an end).
            d_pre, d_post = pre[b] - pre[a], post[b] - post[a]
            if d_pre == d_post:
                continue
            f = (post[a] - pre[a]) / (d_pre - d_post)
            if 0 < f < 1:
                value = min(pre[a] + f * d_pre, post[a] + f * d_post)
                if value > best:
                    best, how = value, f"{1 - f:.2f} x {a} + {f:.2f} x {b}"
    return best, how


def reaction_hold_seconds(
    sd: SpeculativeDeployment,
    statics: Mapping[str, RunResult],
    smooth: int,
    lag_seconds: float,
    margin: float,
) -> float:
    """When the reaction bound may first start a change: `lag_seconds` (a windowed measurement's lag
    plus an evaluation interval) after the setting best in the first window first falls behind the
    best by more than `margin` in any Auto pool (`departure_seconds`); the run's end where it never
    does (that setting is best throughout)."""
    any_run = next(iter(statics.values()))
    pools = auto_pools(sd.spec)
    departures = [d for pool in pools if (d := departure_seconds(statics, pool, smooth, margin)) is not None]
    if not departures:
        return float(max(len(any_run.bin_tokens[pool]) for pool in pools) * any_run.bin_seconds)
    return min(departures) + lag_seconds


def reaction_bounds(
    sd: SpeculativeDeployment,
    workload: Trace | ClosedLoop,
    statics: Mapping[str, RunResult],
    options: SimOptions,
    profile: StepTimeProfile,
    smooth: int,
    lag_seconds: float,
    margin: float,
    hold_seconds: float | None = None,
) -> dict[str, RunResult]:
    """The reaction bound, its schedule chosen for each measure ({`REACTION`: time-weighted,
    `REACTION_REQUESTS`: over all requests}): the best schedule of settings that pays its rollouts,
    starts in the setting best in the first window and starts no change before a policy's
    measurements could show that setting falling behind (`reaction_hold_seconds`), knowing the rest.

    Where the load moves from the start (a replayed trace), the reactive bound's hold (no change before
    the load first moves) is no hold at all; this one asks instead when the first window's setting
    stops being the best: until then it is the best there is in every window, and a policy that left
    it earlier would have bet on a change its measurements had not shown (and lost on every trace
    where the change does not come). A burst that begins and ends within a lag plus a rollout is
    served in the start setting by any policy that reacts to it; so is the part of a longer one before
    the reaction serves. It assumes the first change is not announced by the load's trend before it
    (a ramp's crossing can be: the reactive bound is the one to read there). `hold_seconds`: that
    hold where the caller has it already (None: computed here)."""
    hold = (
        reaction_hold_seconds(sd, statics, smooth, lag_seconds, margin)
        if hold_seconds is None
        else hold_seconds
    )
    return {
        name: rollout_paying_oracle(
            sd, workload, statics, options, profile, smooth, name=name, hold_seconds=hold, measure=measure
        )
        for name, measure in ((REACTION, "time"), (REACTION_REQUESTS, "requests"))
    }
