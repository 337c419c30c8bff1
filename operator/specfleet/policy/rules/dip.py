"""The capacity dip of a flip (pure): whether a flip may start when the pool rolls within its own GPUs
(`pools.<pool>.rollout.strategy: Replace`) or flips its Standby engines (`rollout.flip: Standby`).

A Replace rollout stops `maxUnavailable` engines before their successors start on the freed GPUs, so
for the rollout's duration the pool serves with `replicas - maxUnavailable` engines. Two questions:

- Can the remaining engines carry the load? The demand measured (running + waiting requests over the
  pool) must fit in what the remaining engines run at once (`--max-num-seqs`, or fewer where the KV
  cache holds fewer). If not, the flip holds (ReplaceWouldOverload): starting it would queue or
  preempt requests on the remaining engines for the whole rollout.
- Does the flip repay its dip? Its predicted throughput gain over the period it is locked in
  (`minDwellSeconds`, at least one window) must exceed the share of capacity it removes times the
  rollout's duration: (gain - 1) x dwell > maxUnavailable / replicas x rollout seconds. Otherwise it
  holds (ReplaceDipNotRepaid). The duration is the pool's rollout (`policy.predict.rollout_time`: batches of
  `maxUnavailable` engines, each restarting in the measured or estimated start-up). Threshold mode
  predicts no gain: only the first question is asked there.

A Standby flip takes one replica at a time out of the Service for its drain + sleep + wake + check
(seconds), so the pool serves with `replicas - 1` engines for the flip's duration, R of those
(`policy.predict.rollout_time`): the same repay question, with that duration. The carry question is
asked only of a pool of one replica (no engine is left to queue on: it flips only while idle): with
engines left, what they cannot carry waits seconds, and the capacity that costs is what the repay
question prices (the whole drain counted as lost, though the draining replica still serves).

A retune (a new K or Dynamic SD schedule) restarts the pool's engines, a Standby pool's too (both of
each pod's: about twice a Restart pod's start-up). Where that rollout is Replace, the retune asks the
same two questions with the restart's duration and the retune's predicted gain over the current
setting's: a retune worth a few percent rarely repays taking an engine out for minutes.

Surge rollouts of Restart pools (the default) never dip capacity: this module answers None for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.predict.rollout_time import RolloutTime


@dataclass(frozen=True)
class Dip:
    """A Replace rollout or a Standby flip of one pool: its engines, those out of service at once, and
    for how long (the whole rollout)."""

    replicas: int
    unavailable: int
    seconds: float
    standby: bool = False

    @property
    def remaining(self) -> int:
        return self.replicas - self.unavailable

    @property
    def share(self) -> float:
        """The share of the pool's engines out of service while the rollout runs."""
        return self.unavailable / self.replicas


def flip_dip(state: PoolState, obs: PoolObservation, rollout: RolloutTime) -> Dip | None:
    """The dip a flip of this pool would cause now (None: a Surge rollout, no dip)."""
    replicas = state.replicas if state.replicas is not None else obs.replicas_reporting
    replicas = max(1, replicas)
    if rollout.standby:
        return Dip(replicas, 1, rollout.seconds, standby=True)
    if state.rollout_strategy != "Replace":
        return None
    unavailable = min(max(1, state.max_unavailable), replicas)
    return Dip(replicas, unavailable, rollout.seconds)


def replace_gate(
    policy: PolicySpec,
    dip: Dip | None,
    demand: float,
    per_engine: float,
    gain: float | None,
    change: str = "flip",
) -> tuple[str, str] | None:
    """The reason and message a flip (or a retune: `change`) holds for, or None when it may start.

    `demand` is running + waiting requests per replica measured, `per_engine` the requests one engine
    runs at once (the current setting's), `gain` the change's predicted throughput over the current
    setting's at the demand it is decided for (None: not predicted, Threshold mode).
    """
    if dip is None:
        return None
    total = demand * dip.replicas
    carried = dip.remaining * per_engine
    if dip.standby:
        what, out = "a Standby flip", f"takes {dip.unavailable} of {dip.replicas} engines out"
        overload, not_repaid = r.STANDBY_WOULD_OVERLOAD, r.STANDBY_DIP_NOT_REPAID
    else:
        what, out = "a Replace rollout", f"stops {dip.unavailable} of {dip.replicas} engines"
        overload, not_repaid = r.REPLACE_WOULD_OVERLOAD, r.REPLACE_DIP_NOT_REPAID
    if total > carried + 1e-9 and (not dip.standby or dip.remaining == 0):
        return (
            overload,
            f"{what} {out}: the {dip.remaining} left would hold {total:.1f} requests, more than the "
            f"{carried:.0f} they run at once",
        )
    if gain is None:
        return None
    dwell = max(policy.min_dwell_seconds, policy.window_seconds)
    payoff = (gain - 1.0) * dwell
    cost = dip.share * dip.seconds
    if payoff <= cost:
        return (
            not_repaid,
            f"the {change}'s {gain:.3f}x over {dwell}s repays {payoff:.0f} engine-seconds per engine, not the "
            f"{dip.share:.0%} of capacity {what} removes for "
            f"{dip.seconds:.0f}s ({cost:.0f})",
        )
    return None
