"""The policy's check on its own prediction (pure): does the setting a pool runs deliver what the model
promised?

In each steady window (no queue to speak of, a demand that did not swing, a whole window since the
pool's last rollout settled) the engines' generated tokens per second per replica are set beside what
the pool's model (`policy.predict.throughput`) predicts for the setting they ran, at the running
requests measured, with the acceptance, prompt lengths, prefix hits and memory measured: their ratio
is the model's error for that setting. The engine without the drafter has its own ratio, measured the
last steady window the pool ran off without canaries (1 where never measured: its step time is the
profile's own measurement; the drafter's terms are what a wrong profile gets wrong). A speculating
setting's ratio over the plain engine's is the share of its predicted gain it delivered; an error the
two share (the model's view of prefill, a mean batch standing for a varying one) cancels in it.

Where that share stays below 1 - 2 x margin for `REALIZED_WINDOWS` windows running and the gain it
delivers (predicted x share) is below break-even, the setting does not pay, whatever the prediction
says: the pool turns off with reason RealizedBelowPrediction. The shortfall stays in status
(status.pools.<pool>.realizedCheck): while it is there every predicted gain of speculating is
multiplied by it, so the same wrong prediction cannot turn the pool straight back on; it goes when
the pool speculates again and delivers within the floor, or when the plain engine, measured at last
(the flip goes without canaries, and none start before that window), falls short of the model alike.
Without any plain-engine window to refer to, only windows where decode is most of the predicted engine
time count (`UNREFERENCED_PREFILL`).

A misprofiled pool (a cost profile measured on another GPU, drafter or vLLM version) is what this
catches (benchmarks/misprofiled.py). The floor is twice the margin because a steady window's ratio
strays by up to ~10% with the profile right under open-loop arrivals: an error smaller than that is
the margin's to absorb, as for every other decision, and the guard cannot see it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolObservation, PoolState, RealizedRecord
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.predict.acceptance import Estimate
from specfleet.policy.predict.throughput import OFF, PoolModel
from specfleet.policy.rules.canaries import active_canaries
from specfleet.policy.rules.goodput import GoodputPrediction
from specfleet.policy.rules.results import Wanted
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE

# Windows running a speculating setting must fall short of its prediction before the pool turns off:
# one window can be a burst's transient; three are the setting.
REALIZED_WINDOWS = 3
# A window is compared only near a steady state: its queue at most this share of what runs, and its
# demand's samples within this factor of each other. Elsewhere a window's mean running count does not
# stand for the batch the engines ran (a burst's queue, a ramp), and the ratio swings by tens of percent
# whatever the setting.
QUEUE_SHARE = 0.1
STEADY_SWING = 1.5
# The shortfall that counts: twice the margin. With the profile right, a steady window's ratio still
# strays by up to ~10% from the prediction under open-loop arrivals (the fleet simulator's Azure
# conversation trace); the guard is for a prediction wrong by more than that, not the margin's work.
SHORTFALL_MARGINS = 2.0
# Without a window of the plain engine to refer to, a speculating setting's window is judged only where
# decode is at least two thirds of its predicted engine time: the step table is a measurement, the
# prefill term an estimate (per prompt token, no chunking), and with long prompts it misses for both
# settings alike (by half and more at low load on the simulator's Azure code trace), which only a
# measured plain engine cancels.
UNREFERENCED_PREFILL = 1 / 3


def measured_over_predicted(
    model: PoolModel, name: str, obs: PoolObservation, est: Estimate | None
) -> float | None:
    """Generated tokens per second per replica measured over those `model` predicts for setting `name`
    at the running requests measured (None: not measurable this window)."""
    running = obs.running_per_replica
    tokens = obs.generation_tokens_per_second
    if running is None or running < 1 or not tokens or obs.replicas_reporting < 1:
        return None
    if name != OFF and (est is None or est.source != "pool"):
        return None  # a speculating setting is judged on the acceptance its own engines measured
    per_position = est.per_position if est is not None else ()
    predicted = model.tokens_per_second(name, per_position, running)
    if predicted <= 0 or not math.isfinite(predicted):
        return None
    return tokens / obs.replicas_reporting / predicted


def prefill_share(model: PoolModel, name: str, running: float) -> float:
    """The share of setting `name`'s predicted engine time at `running` requests that is prefill."""
    per_position = PUBLISHED_ACCEPTANCE
    decode_only = replace(model, prompt_per_output=0.0).tokens_per_second(name, per_position, running)
    if decode_only <= 0:
        return 0.0
    return max(0.0, 1 - model.tokens_per_second(name, per_position, running) / decode_only)


def _window_clean(policy: PolicySpec, state: PoolState, obs: PoolObservation, now: datetime) -> bool:
    """The window measured only the setting the pool runs now (its last rollout settled a window ago),
    in something near a steady state: no queue to speak of, and a demand that did not swing."""
    window = timedelta(seconds=policy.window_seconds)
    if not state.settled or obs.running_per_replica is None or obs.running_per_replica < 1:
        return False
    running = obs.running_per_replica
    if (obs.waiting or 0.0) / max(1, obs.replicas_reporting) > max(1.0, QUEUE_SHARE * running):
        return False
    recent = [(t, v) for t, v in state.recent_load if now - t <= window]
    interval = timedelta(seconds=policy.evaluation_interval_seconds)
    if not recent or now - recent[0][0] < window - interval:
        return False  # the pool has not been measured for a whole window yet (its start)
    loads = [v for _, v in recent]
    if max(loads) > STEADY_SWING * max(1.0, min(loads)):
        return False
    rollout = state.rollout
    if rollout is not None and (rollout.settled_at is None or now - rollout.settled_at < window):
        return False
    last = state.last_change
    return last is None or now - last >= window


def realized_sample(
    policy: PolicySpec,
    state: PoolState,
    obs: PoolObservation,
    model: PoolModel,
    est: Estimate | None,
    now: datetime,
) -> RealizedRecord | None:
    """The pool's check after this evaluation (None: unchanged): one sample per window, taken where the
    window measured only the setting the pool runs."""
    before = state.realized
    if before is not None and now - before.sampled_at < timedelta(seconds=policy.window_seconds):
        return None
    if not _window_clean(policy, state, obs, now):
        return None
    if state.mode == "On":
        name = model.current
        if name is None:
            return None
        ratio = measured_over_predicted(model, name, obs, est)
        if ratio is None:
            return None
        off_ratio = before.off_ratio if before is not None else None
        if (
            off_ratio is None
            and prefill_share(model, name, obs.running_per_replica or 0.0) > UNREFERENCED_PREFILL
        ):
            return None  # no plain-engine window to refer to, and the model's prefill term decides
        realized = ratio / (off_ratio or 1.0)
        short = realized < 1 - SHORTFALL_MARGINS * goodput_margin(policy)
        # A streak counts windows of one setting: a change since the last sample starts it again.
        same = before is not None and (state.last_change is None or state.last_change <= before.sampled_at)
        streak = before.below_windows if before is not None and same else 0
        below = streak + 1 if short else 0
        kept = before.shortfall if before is not None else None
        shortfall = realized if below >= REALIZED_WINDOWS else (kept if short else None)
        return RealizedRecord(now, off_ratio, ratio, below, shortfall)
    if active_canaries(policy, state) > 0:
        return None  # the canaries' speculating engines are in the pool's numbers
    ratio = measured_over_predicted(model, OFF, obs, est)
    if ratio is None:
        return None
    if before is None:
        return RealizedRecord(now, off_ratio=ratio)
    shortfall = before.shortfall
    if shortfall is not None and before.on_ratio is not None:
        # The plain engine measured at last: a shortfall it shares (the model wrong for this workload,
        # not for the drafter) is no shortfall of speculating.
        realized = before.on_ratio / ratio
        shortfall = None if realized >= 1 - SHORTFALL_MARGINS * goodput_margin(policy) else realized
    return replace(before, sampled_at=now, off_ratio=ratio, below_windows=0, shortfall=shortfall)


def awaiting_reference(state: PoolState) -> bool:
    """The pool turned off on a shortfall measured against no plain-engine window of its own: until
    one is measured (without canaries, whose speculating engines would mix in) the shortfall is not
    confirmed."""
    check = state.realized
    if state.mode != "Off" or check is None or check.shortfall is None:
        return False
    last = state.last_transition
    return last is None or check.sampled_at <= last or check.off_ratio is None


def guard_wanted(
    policy: PolicySpec, state: PoolState, check: RealizedRecord | None, wanted: Wanted, g: GoodputPrediction
) -> Wanted:
    """Off (RealizedBelowPrediction) for a speculating pool whose setting fell short of its prediction by
    more than twice the margin for `REALIZED_WINDOWS` windows running, where the gain it delivers (the
    predicted one times the share delivered) is below break-even; else `wanted` unchanged."""
    if state.mode != "On" or wanted.mode != "On" or check is None or check.below_windows < REALIZED_WINDOWS:
        return wanted
    if state.last_change is not None and check.sampled_at < state.last_change:
        return wanted  # the streak measured a setting the pool no longer runs
    realized = check.realized_over_predicted or 0.0
    predicted = g.gain_now if g.gain_now is not None else g.gain_best
    delivered = predicted * realized
    if delivered >= 1:
        return wanted  # short of its promise, yet still faster than the engine without the drafter
    floor = 1 - SHORTFALL_MARGINS * goodput_margin(policy)
    numbers = {
        **wanted.numbers,
        "realizedOverPredicted": f"{realized:.3f}",
        "realizedBelowWindows": str(check.below_windows),
    }
    message = (
        f"the setting delivered {realized:.2f} of its predicted gain over the engine without the drafter "
        f"for {check.below_windows} steady windows (below {floor:.2f}): {predicted:.2f}x predicted, "
        f"~{delivered:.2f}x delivered"
    )
    return Wanted(
        "Off", r.REALIZED_BELOW_PREDICTION, message, numbers, gain=1 / delivered if delivered > 0 else None
    )


def with_shortfall(state: PoolState, g: GoodputPrediction) -> GoodputPrediction:
    """`g` as an off pool judges turning on: every speculating gain times the shortfall its last
    speculating setting measured (unchanged without one)."""
    check = state.realized
    if state.mode != "Off" or check is None or check.shortfall is None:
        return g
    s = check.shortfall
    return replace(g, gain_best=g.gain_best * s, gain_now=None if g.gain_now is None else g.gain_now * s)
