"""What Goodput mode asks for (pure): each K's predicted gain from the per-position acceptance and the
pool's model (`policy.predict.throughput`: batch, decode, prefill, memory and preemptions in one formula) at
a demand or averaged over a flip's commit path (`goodput_prediction`), and the mode the prediction
asks for with its margin (`goodput_wanted`). The rules are in docs/policy.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.predict.acceptance import Estimate
from specfleet.policy.predict.demand import measured_load
from specfleet.policy.predict.throughput import PoolModel, setting_name
from specfleet.policy.rules.results import Wanted
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, StepTimeProfile, speedup


def predicted_speedup(
    profile: StepTimeProfile,
    concurrency: float,
    k: int,
    per_position: Sequence[float],
    prompt_per_output: float = 0.0,
) -> float:
    """Goodput with K drafts over no speculation, at `concurrency` running requests per engine, with
    the prefill of `prompt_per_output` prompt tokens per generated token priced (0: decode only)."""
    return speedup(profile, max(1.0, concurrency), k, list(per_position), prompt_per_output)


def candidate_ks(profile: StepTimeProfile, max_k: int) -> list[int]:
    """K values the policy may choose: those the profile measured (interpolation is a guess), <= max_k."""
    return [c for c in profile.speculative_tokens if 1 <= c <= max_k] or [max_k]


def _estimate_numbers(est: Estimate | None) -> dict[str, str]:
    if est is None:
        return {}
    out = {"acceptanceEstimate": ",".join(f"{p:.2f}" for p in est.per_position)}
    if est.extrapolated:
        out["extrapolatedPositions"] = str(est.extrapolated)
    return out


@dataclass(frozen=True)
class GoodputPrediction:
    """Goodput mode's prediction for one pool."""

    per_position: tuple[float, ...]
    source: str
    best: int
    gain_best: float
    gain_now: float | None
    # The workload it was made for: mean prompt tokens per generated token (0: decode only).
    prompt_per_output: float = 0.0


def _acceptance_of(est: Estimate | None) -> tuple[tuple[float, ...], str]:
    """The per-position acceptance to predict with, and where it comes from."""
    if est is None:
        # Prior: the published acceptance profile; a probe measures the real one.
        return tuple(PUBLISHED_ACCEPTANCE), "publishedPrior"
    return est.per_position, est.source


def goodput_prediction(
    model: PoolModel, demands: Sequence[float], est: Estimate | None, max_k: int
) -> GoodputPrediction:
    """Each candidate K's gain (`PoolModel.gain`) averaged over `demands` (one demand: an instant; a
    flip's commit path: the period it locks the pool), the best of them, and the current setting's."""
    per_position, source = _acceptance_of(est)

    def mean(name: str) -> float:
        return sum(model.gain(name, per_position, d) for d in demands) / len(demands)

    ks = candidate_ks(model.profile, max_k)
    gains = {kk: mean(setting_name(kk)) for kk in ks}
    best = max(ks, key=lambda kk: (gains[kk], -kk))  # the smaller K on a tie
    now = None if model.current is None else mean(model.current)
    return GoodputPrediction(per_position, source, best, gains[best], now, model.prompt_per_output)


def goodput_wanted(
    policy: PolicySpec, state: PoolState, obs: PoolObservation, g: GoodputPrediction, est: Estimate | None
) -> Wanted:
    margin = goodput_margin(policy)
    load = measured_load(obs)
    shown = g.gain_now if state.mode == "On" and g.gain_now is not None else g.gain_best
    numbers = {
        "predictedSpeedup": f"{shown:.3f}",
        "bestK": str(g.best),
        "bestKSpeedup": f"{g.gain_best:.3f}",
        "acceptanceSource": g.source,
        **_estimate_numbers(est),
    }
    if g.prompt_per_output > 0:
        numbers["promptTokensPerOutputToken"] = f"{g.prompt_per_output:.3g}"
    if state.mode == "On" and g.gain_best < 1 - margin:
        return Wanted(
            "Off",
            r.GOODPUT_BELOW_BREAK_EVEN,
            f"predicted speedup {g.gain_best:.2f}x at the best K ({g.best}) at {load:.1f} running per "
            f"replica is below {1 - margin:.2f}",
            numbers,
            k=g.best,
        )
    if state.mode == "Off" and g.gain_best > 1 + margin:
        reason = r.PROBE_ACCEPTANCE if g.source == "publishedPrior" else r.GOODPUT_ABOVE_BREAK_EVEN
        return Wanted(
            "On",
            reason,
            f"predicted speedup {g.gain_best:.2f}x at K {g.best} at {load:.1f} running per replica is "
            f"above {1 + margin:.2f}",
            numbers,
            k=g.best,
        )
    return Wanted(
        state.mode,
        r.GOODPUT_WITHIN_MARGIN,
        f"predicted speedup {shown:.2f}x keeps the pool {state.mode} (margin {margin:.0%})",
        numbers,
    )
