"""What a pool's latency objective asks for (pure): among off, each K and the Dynamic SD table, the setting
predicted to have the most requests within every target of the SLO (`slo_wanted`).

Each setting's share comes from `policy.predict.latency`: its mean TTFT and TPOT from the same continuous
model as Goodput's throughput (step time at its batch, tokens per step, the prefill with the drafter's
share, Erlang C's queue over its batch slots) at the tokens per second the current setting serves at the
demand, its tail read from the histograms measured under the current setting (TPOT's at the load its
requests near the target ran at, `_tpot_load`). Where off and the best
speculating setting meet the SLO alike (within `TIE`) and one serves more arrivals by more than the
Goodput margin, the pool runs that one (`_roomier`, SloHeadroom), where both keep the SLO's promise:
targets met alike now are missed first by the setting whose capacity a rise of the load passes. Otherwise
throughput's rule is the tie-break: where no setting's share differs from Goodput's choice by more than
`TIE`, Goodput's ask stands unchanged. A flip, the SLO's or throughput's, must cut the share of requests
that miss by more than the Goodput margin (the same hysteresis as the throughput rule), so the pool does
not flap between two settings the prediction barely tells apart. While the pool stays On, the SLO retunes
it the same way: to the K (or the Dynamic SD schedule) predicted to meet it most, under the same
hysteresis (`slo_retune`, rolled out as any retune is, `policy.decision.deployment._adjust`).
Where the load moves, the SLO overrides throughput only if it asks the same along the flip's commit path
(the loads a flip decided now would serve) as at the demand measured (`slo_along_path`): where the two
part, the load decides the sign of the SLO's verdict, and throughput, judged along that path, decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.api.pools import LatencySlo
from specfleet.policy.inputs.observation import PoolObservation, PoolState, Schedule
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.inputs.slo_attainment import MILLISECONDS
from specfleet.policy.predict.dynamic_sd import best_schedule
from specfleet.policy.predict.latency import Latency, predict_latency, scaled_share
from specfleet.policy.predict.throughput import OFF, SCHEDULE, PoolModel, setting_name
from specfleet.policy.rules.goodput import candidate_ks
from specfleet.policy.rules.results import Wanted

# Predicted shares closer than this (0.1 point) are a tie, which throughput decides. Small on purpose: the
# drafter's share of the prefill moves TTFT by a few percent, which a share within a wide vLLM bucket
# reflects only as a small difference, yet a steady one; the margin on a flip keeps the pool from flapping.
TIE = 0.001
TTFT = "TTFT"
TPOT = "TPOT"


@dataclass(frozen=True)
class SettingShares:
    """One setting's predicted share of requests within each target of the SLO, and its tokens/s."""

    name: str
    k: int  # the K a flip to it runs (0: off)
    by_target: dict[str, float]  # TTFT / TPOT -> share within it
    tokens_per_second: float
    # Share within every target, the targets' shares taken as independent (their product).
    attainment: float
    # The Dynamic SD table the SCHEDULE setting follows (None: a fixed K, or off).
    schedule: Schedule | None = None
    # The most tokens/s per replica it serves (at the largest batch it runs): the arrivals it absorbs.
    capacity: float = math.inf
    # Its share within every target idle and at a fluctuation of the demand above it (`setting_shares`'s
    # `band`); empty: not predicted there.
    across_load: tuple[float, ...] = ()


def _mean(shares: Sequence[SettingShares]) -> SettingShares:
    """One setting's shares averaged over the demands of a path."""
    n = len(shares)
    first = shares[0]
    by_target = {t: sum(s.by_target[t] for s in shares) / n for t in first.by_target}
    tokens = sum(s.tokens_per_second for s in shares) / n
    attainment = sum(s.attainment for s in shares) / n
    return SettingShares(
        first.name, first.k, by_target, tokens, attainment, first.schedule, first.capacity, first.across_load
    )


def _targets(slo: LatencySlo) -> list[tuple[str, float]]:
    out = []
    if slo.time_to_first_token_milliseconds is not None:
        out.append((TTFT, slo.time_to_first_token_milliseconds / MILLISECONDS))
    if slo.time_per_output_token_milliseconds is not None:
        out.append((TPOT, slo.time_per_output_token_milliseconds / MILLISECONDS))
    return out


def setting_shares(
    slo: LatencySlo,
    obs: PoolObservation,
    model: PoolModel,
    per_position: Sequence[float],
    demands: Sequence[float],
    max_k: int,
    schedules: bool,
    band: float = 0.0,
    window_loads: tuple[float, float] | None = None,
    ttft_demand: float | None = None,
) -> list[SettingShares] | None:
    """Each setting's predicted shares within the SLO's targets averaged over `demands` (running + waiting
    requests per replica); None when the prediction cannot tell at one of them (`_shares_at`). With a
    `band` (the demand's own noise, requests per replica), each setting's share idle and at the mean
    demand plus `band` as well (`across_load`, empty where the prediction cannot tell there): whether a
    gain holds at every load the pool may fall to and at a fluctuation above, which the met share's
    growth must (`_pays`). `window_loads`: the lowest and highest demand measured over the histograms'
    window (None: the demand predicted at, as if the load held still), where `_tpot_load` looks for
    the load the TPOT histogram's requests near the target ran at. `ttft_demand`: the one demand TTFT's
    means are taken at for every demand of `demands` (None: each demand's own), as along a flip's commit
    path (`slo_along_path`), where TTFT stays at the demand measured: its spread is the queue's at one
    load, which a projected load near capacity would blow up."""
    each = [
        _shares_at(slo, obs, model, per_position, d, max_k, schedules, window_loads, ttft_demand)
        for d in demands
    ]
    if not each or any(e is None for e in each):
        return None
    per_demand = [e for e in each if e is not None]
    out = [_mean([e[i] for e in per_demand]) for i in range(len(per_demand[0]))]
    if band <= 0:
        return out
    mean = sum(demands) / len(demands)
    edges = [_shares_at(slo, obs, model, per_position, d, max_k, schedules) for d in (0.0, mean + band)]
    if any(e is None or [s.name for s in e] != [s.name for s in out] for e in edges):
        return out
    return [
        replace(s, across_load=tuple(e[i].attainment for e in edges if e is not None))
        for i, s in enumerate(out)
    ]


def _shares_at(
    slo: LatencySlo,
    obs: PoolObservation,
    model: PoolModel,
    per_position: Sequence[float],
    demand: float,
    max_k: int,
    schedules: bool,
    window_loads: tuple[float, float] | None = None,
    ttft_demand: float | None = None,
) -> list[SettingShares] | None:
    """Each setting's predicted shares at `demand`; None when the prediction cannot tell: no histogram or
    request sizes measured, or the current setting does not serve the arrivals (what it measured is a
    queue's growth, no scale for another)."""
    prompt, output = obs.mean_prompt_tokens, obs.mean_output_tokens
    if prompt is None or not output or output <= 0:
        return None
    histograms = {TTFT: obs.ttft_histogram, TPOT: obs.tpot_histogram}
    targets = _targets(slo)
    if not targets or any(not histograms[t] for t, _ in targets):
        return None
    current = model.current or OFF
    rate = model.tokens_per_second(current, per_position, demand)
    candidates: list[tuple[PoolModel, str, int]] = [(model, OFF, 0)]
    if schedules:
        # A speculating pool follows a Dynamic SD table: the table a flip would give it, or its own.
        table = (
            model
            if model.schedule is not None
            else model.with_schedule(best_schedule(model.profile, per_position, max_k))
        )
        assert table.schedule is not None
        top = max((kk for _, _, kk in table.schedule), default=0)
        if top > 0:
            candidates.append((table, SCHEDULE, top))
    else:
        candidates += [(model, setting_name(kk), kk) for kk in candidate_ks(model.profile, max_k)]
    if current not in {n for _, n, _ in candidates} and current in model.settings:
        candidates.append((model, current, model.settings[current].lookahead))
    candidates = [(m, n, kk) for m, n, kk in candidates if n in m.settings]

    def latency(m: PoolModel, name: str) -> Latency:
        return predict_latency(m, name, per_position, rate, prompt, output)

    now = latency(model, current)
    if not (math.isfinite(now.ttft) and math.isfinite(now.tpot) and now.ttft > 0 and now.tpot > 0):
        return None
    ttft_rate = rate if ttft_demand is None else model.tokens_per_second(current, per_position, ttft_demand)

    def ttft(m: PoolModel, name: str) -> float:
        return predict_latency(m, name, per_position, ttft_rate, prompt, output).ttft

    now_ttft = ttft(model, current)
    if not (math.isfinite(now_ttft) and now_ttft > 0):
        return None
    lo, hi = window_loads or (demand, demand)
    tpot_target = dict(targets).get(TPOT)
    tpot_rate = rate
    if tpot_target is not None and hi > lo:
        load = _tpot_load(
            model, current, per_position, tpot_target, min(lo, demand), max(hi, demand), prompt, output
        )
        tpot_rate = model.tokens_per_second(current, per_position, load)
    # The TPOT histogram's scale: the current setting's mean where its requests near the target ran.
    measured_tpot = predict_latency(model, current, per_position, tpot_rate, prompt, output).tpot
    if not (math.isfinite(measured_tpot) and measured_tpot > 0):
        return None
    out = []
    for m, name, kk in candidates:
        other = latency(m, name)
        means = {TTFT: (now_ttft, ttft(m, name)), TPOT: (measured_tpot, other.tpot)}
        by_target = {}
        for target, seconds in targets:
            mean_now, mean_other = means[target]
            scale = mean_other / mean_now if math.isfinite(mean_other) else math.inf
            share = scaled_share(histograms[target], seconds, scale)
            if share is None:
                return None
            by_target[target] = share
        tokens = m.tokens_per_second(name, per_position, demand)
        follows = m.schedule if name == SCHEDULE else None
        attains = math.prod(by_target.values())
        out.append(
            SettingShares(name, kk, by_target, tokens, attains, follows, m.capacity(name, per_position))
        )
    return out


def _tpot_load(
    model: PoolModel,
    current: str,
    per_position: Sequence[float],
    target: float,
    lo: float,
    hi: float,
    prompt: float,
    output: float,
) -> float:
    """The demand (requests per replica, within the window's `lo`..`hi`) at which the current setting's
    predicted mean TPOT is `target`: the load the histogram's requests near the target ran at, which
    a setting's predicted mean at the demand now is scaled against.

    A request's TPOT is a mean over its many decode steps, so where the load moved within the window
    the TPOT histogram is a mix of the loads it passed: the requests near the target ran where the
    current setting's mean is near it (the early, lighter part of a rising window, say), not at the
    demand now. Scaling them by a ratio of means both taken at the demand now (a peak near capacity,
    where every setting's mean is many times the target) moves the light load's requests across the
    target as if they had run at the peak. Where the load held still (`lo` = `hi`) it is that load, and
    the scale the ratio at the demand now. TTFT is left at the demand now: its spread is the queue's
    at one load."""

    def tpot(demand: float) -> float:
        rate = model.tokens_per_second(current, per_position, demand)
        return predict_latency(model, current, per_position, rate, prompt, output).tpot

    if tpot(lo) >= target:
        return lo
    if not tpot(hi) > target:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tpot(mid) < target else (lo, mid)
    return (lo + hi) / 2


def _pays(new: SettingShares, old: SettingShares, margin: float) -> bool:
    """Whether the share within the SLO of `new` is worth a change from `old` (the current setting): it
    cuts the share of requests that miss by more than `margin`, or it grows the share that meets it by
    more than `margin` where the gain's sign is sure: `new` is within no target less often than `old`
    (within `TIE`: it trades nothing), gains on TTFT alone, and beats it by more than `TIE` idle and at
    a fluctuation of the demand above the one measured as well (`across_load`).

    Where few requests meet the SLO (a TTFT a long prompt's prefill nears, where the drafter's share of it
    decides a few points at any load), a cut of the missed share by the margin asks for a gain the physics
    cannot give, while the met share grows by a tenth. A trade (one target met more often, another less)
    hangs on how the targets' shares combine, and a gain that holds at the demand measured but not idle
    or a Poisson fluctuation above it is a crossover (TPOT near break-even, where speculation's per-token
    gain turns into a loss as batches grow), whose sign the load decides: those must cut the missed
    share, as any TPOT gain must (speculation's per-token gain turns with the batch). The drafter's share
    of the prefill is the opposite case: off reaches the first token sooner at every load."""
    if 1 - new.attainment < (1 - old.attainment) * (1 - margin):
        return True
    trades = any(new.by_target[t] < old.by_target[t] - TIE for t in new.by_target)
    gained = [t for t in new.by_target if new.by_target[t] - old.by_target[t] > TIE]
    holds = (
        bool(new.across_load)
        and len(new.across_load) == len(old.across_load)
        and all(n - o > TIE for n, o in zip(new.across_load, old.across_load, strict=True))
    )
    return (
        not trades
        and gained == [TTFT]
        and holds
        and new.attainment - old.attainment > TIE
        and new.attainment > old.attainment * (1 + margin)
    )


def _binding(chosen: SettingShares, other: SettingShares) -> str:
    """The target whose share most separates the chosen setting from the other (the one that decided)."""
    return max(chosen.by_target, key=lambda t: chosen.by_target[t] - other.by_target[t])


def slo_wanted(
    policy: PolicySpec,
    state: PoolState,
    current: str,
    shares: list[SettingShares],
    throughput: Wanted,
    goal: float,
) -> Wanted:
    """What the SLO asks for, given each setting's predicted `shares`, the setting the pool runs now
    (`current`) and what Goodput asks for (`throughput`): the setting with the most requests within the
    SLO, unless it ties (within `TIE`) with the setting throughput asks for, or is a flip throughput does
    not ask for that does not cut the missed share by more than the Goodput margin. Where off and
    speculation tie at a share of at least `goal` (the SLO's percentile: both keep its promise), the
    one with more capacity (`_roomier`). A better K in the
    mode the pool keeps is `slo_retune`'s to find."""
    by_name = {s.name: s for s in shares}
    off = by_name[OFF]
    on = [s for s in shares if s.name != OFF]
    if not on or current not in by_name:
        return throughput
    best_on = max(on, key=lambda s: (s.attainment, s.tokens_per_second))
    mine = by_name[current]
    if throughput.mode == state.mode:
        asked = mine
    elif throughput.mode == "Off":
        asked = off
    else:
        asked = next((s for s in on if s.k == throughput.k), best_on)
    numbers = {
        **throughput.numbers,
        "predictedSloAttainmentOff": f"{off.attainment:.3f}",
        "predictedSloAttainmentOn": f"{best_on.attainment:.3f}",
        "predictedSloAttainmentBestK": str(best_on.k),
    }
    best = max((off, best_on), key=lambda s: (s.attainment, s.tokens_per_second))
    mode = "Off" if best is off else "On"
    flip_throughput_skips = mode != state.mode and throughput.mode == state.mode
    margin = goodput_margin(policy)
    if state.mode == throughput.mode == mode == "Off" and best.attainment - best_on.attainment > TIE:
        # Both keep the pool off; the SLO says so, which keeps canaries (the drafter) off its requests.
        why = f"{off.attainment:.3f} off against {best_on.attainment:.3f} {_setting_text(best_on)}"
        target = _binding(off, best_on)
        reason = r.SLO_TTFT_BOUND if target == TTFT else r.SLO_TPOT_BOUND
        return Wanted(
            "Off", reason, f"stays Off: predicted share within the SLO {why} ({target} decides)", numbers
        )
    roomier = _roomier(off, best_on, asked, best, margin) if best.attainment >= goal else None
    if roomier is not None and (roomier is off or throughput.mode == "Off"):
        # Off for headroom is the SLO's reason even where throughput asks for it too: the pool then
        # runs no canaries, which would serve part of its requests with less capacity.
        other = best_on if roomier is off else off
        mode = "Off" if roomier is off else "On"
        why = (
            f"the SLO is met alike (predicted share within it {off.attainment:.3f} off, {best_on.attainment:.3f} "
            f"{_setting_text(best_on)}); {_setting_text(roomier)} serves up to {roomier.capacity:.0f} tokens/s "
            f"per replica, {_setting_text(other)} {other.capacity:.0f}: the headroom keeps it met through more "
            "of the load's swings"
        )
        if mode == state.mode:
            return Wanted(mode, r.SLO_HEADROOM, f"stays {mode}: {why}", numbers)
        return Wanted(mode, r.SLO_HEADROOM, why, numbers, k=roomier.k if mode == "On" else throughput.k)
    if (
        throughput.mode != state.mode
        and asked.attainment - mine.attainment > TIE
        and not _pays(asked, mine, margin)
    ):
        # A flip throughput asks for must pay in the SLO's terms as well, as one only the SLO asks for:
        # a rollout the prediction barely tells from staying (a burst's tail) is not made for the SLO.
        target = _binding(asked, mine)
        reason = r.SLO_TTFT_BOUND if target == TTFT else r.SLO_TPOT_BOUND
        return Wanted(
            state.mode,
            reason,
            f"stays {state.mode}: {throughput.mode} ({throughput.reason}) is predicted to change the share "
            f"of requests within the SLO only from {mine.attainment:.3f} to {asked.attainment:.3f}, within "
            f"the margin ({target} decides)",
            numbers,
        )
    if (
        best.attainment - asked.attainment <= TIE
        or (mode == state.mode and throughput.mode == state.mode)
        # A flip only the SLO asks for must cut the missed share by more than the margin, as Goodput's
        # speedup must pass it: no flapping between settings the prediction barely tells apart.
        or (flip_throughput_skips and not _pays(best, mine, margin))
    ):
        return replace(throughput, numbers=numbers)
    target = _binding(best, asked)
    reason = r.SLO_TTFT_BOUND if target == TTFT else r.SLO_TPOT_BOUND
    why = (
        f"predicted share within the SLO {best.attainment:.3f} {_setting_text(best)} against "
        f"{asked.attainment:.3f} {_setting_text(asked)} ({target} decides)"
    )
    if mode == state.mode:
        return Wanted(mode, reason, f"stays {mode}: {why}", numbers)
    return Wanted(mode, reason, why, numbers, k=best.k if mode == "On" else throughput.k)


def slo_along_path(measured: Wanted, along: Wanted, throughput: Wanted) -> Wanted:
    """What the SLO asks for where the load moves: its ask from the shares at the demand measured
    (`measured`, as `slo_wanted` gives it) where that is throughput's ask (`throughput`), or where its ask
    from the shares along the flip's commit path (`along`) overrides throughput the same way (the same
    mode, by an SLO reason); otherwise throughput's ask, with the SLO's numbers.

    The histograms were measured at the demand measured, but a flip (or the canaries) serves the load
    its path reaches. On a falling load the two part: a TPOT near break-even, where speculation's
    per-token gain turns into a loss as batches grow, is lost by the drafter at the demand measured and
    won along the path down. The sign of such a verdict is the load's to decide, and throughput,
    judged along the same path, decides it. Neither does the SLO act on the path alone: a projection
    can be wrong (a spike's peak that never comes), and the histograms were not measured there."""
    if measured.reason not in r.SLO_REASONS:
        return measured
    if along.reason in r.SLO_REASONS and along.mode == measured.mode:
        return measured
    why = (
        f"{throughput.message}; the SLO defers: it asks {measured.mode} at the load measured "
        f"({measured.reason}) but not along the load's path"
    )
    return replace(throughput, message=why, numbers=measured.numbers)


def _roomier(
    off: SettingShares, on: SettingShares, asked: SettingShares, best: SettingShares, margin: float
) -> SettingShares | None:
    """Where off, the best on-setting and the setting throughput asks for (`asked`) all meet the SLO as
    well as the `best` (within `TIE`), the one of off and `on` that serves more arrivals than the other by
    more than `margin` (None: neither). Meeting a target alike, the setting with more capacity keeps
    meeting it through a rise of the load the other cannot serve (a queue's wait is what misses an SLO
    first), and a pool that flips only once the rise is measured pays a rollout in the middle of it."""
    if any(best.attainment - s.attainment > TIE for s in (asked, off, on)):
        return None
    more = more_capacity(off.capacity, on.capacity, margin)
    return None if more is None else off if more == OFF else on


def more_capacity(off: float, on: float, margin: float) -> str | None:
    """Which of off and speculation (OFF / "On") serves more tokens/s at its largest batch than the other
    by more than `margin` (None: neither): the headroom rule's comparison, also `plan`'s."""
    if off > on * (1 + margin):
        return OFF
    return "On" if on > off * (1 + margin) else None


def slo_retune(
    policy: PolicySpec, state: PoolState, current: str, shares: list[SettingShares], wanted: Wanted
) -> tuple[SettingShares, str, str, float] | None:
    """A better K (or Dynamic SD schedule) by the SLO for a pool that stays On: the on-setting predicted to
    meet it most, its reason (the target that decides), why, and its tokens/s over the current setting's;
    None to keep the setting. As a flip only the SLO asks for (`slo_wanted`), it must beat the current
    setting by more than `TIE` and cut the missed share by more than the Goodput margin."""
    by_name = {s.name: s for s in shares}
    on = [s for s in shares if s.name != OFF]
    if state.mode != "On" or wanted.mode != "On" or current not in by_name or not on:
        return None
    mine = by_name[current]
    best = max(on, key=lambda s: (s.attainment, s.tokens_per_second))
    if (
        best.name == current
        or best.attainment - mine.attainment <= TIE
        or not _pays(best, mine, goodput_margin(policy))
    ):
        return None
    target = _binding(best, mine)
    reason = r.SLO_TTFT_BOUND if target == TTFT else r.SLO_TPOT_BOUND
    why = (
        f"predicted share within the SLO {best.attainment:.3f} {_setting_text(best)} against "
        f"{mine.attainment:.3f} {_setting_text(mine)} ({target} decides)"
    )
    gain = best.tokens_per_second / mine.tokens_per_second if mine.tokens_per_second > 0 else 1.0
    return best, reason, why, gain


def slo_allows(shares: list[SettingShares], current: str, asked: str) -> bool:
    """Whether a retune throughput asks for (to the setting `asked`) keeps the SLO: its predicted share
    within it is not more than `TIE` below the current setting's (unknown: it is). Else throughput would
    undo the SLO's retune at the next evaluation."""
    by_name = {s.name: s for s in shares}
    if current not in by_name or asked not in by_name:
        return True
    return by_name[asked].attainment >= by_name[current].attainment - TIE


def _setting_text(s: SettingShares) -> str:
    if s.name == OFF:
        return "off"
    return f"with K up to {s.k}" if s.name == SCHEDULE else f"at K {s.k}"
