"""The stability gates (pure): when a flip may proceed (rollout finished, minimum dwell, the
deployment's cooldown, the hourly flip budget, no other pool changing) and when an adjustment may
(its own lighter interval and budget), each answered with the first closed gate's reason and message.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolState


def flips_during_restart(state: PoolState) -> bool:
    """Whether a Standby pool's rollout in progress is a restart (a retune or spec change: its last
    change came after its last flip). Its flips need no rollout: the template is the same whatever the
    mode, the flip driver switches the engines of the pods that are Ready, and a pod still starting
    comes up and is switched in turn. For a restart of a large model that takes minutes per pod, holding
    the flip would hold it for the whole rollout."""
    if state.flip != "Standby" or state.last_change is None:
        return False
    return state.last_transition is None or state.last_change > state.last_transition


def flip_gate(
    policy: PolicySpec,
    state: PoolState,
    now: datetime,
    last_flip_other: datetime | None,
    other_pool_busy: bool,
) -> tuple[str, str] | None:
    """The first closed gate for a flip (reason, message), or None when it may proceed. The pool's own
    last flip is spaced by `minDwellSeconds`; `last_flip_other`, the last flip of another pool of the
    deployment, by `cooldownSeconds`. A Standby pool may flip while a retune or spec change rolls out
    (`flips_during_restart`)."""
    if not state.settled and not flips_during_restart(state):
        return r.ROLLOUT_IN_PROGRESS, "the pool's last rollout has not finished"
    if state.last_transition is not None:
        dwell = timedelta(seconds=policy.min_dwell_seconds)
        if now - state.last_transition < dwell:
            return r.MIN_DWELL, f"the pool flipped less than {policy.min_dwell_seconds}s ago"
    if last_flip_other is not None and now - last_flip_other < timedelta(seconds=policy.cooldown_seconds):
        return r.COOLDOWN, f"another pool of this deployment flipped less than {policy.cooldown_seconds}s ago"
    hour_ago = now - timedelta(hours=1)
    if sum(1 for t in state.recent_flips if t > hour_ago) >= policy.max_flips_per_hour:
        return r.FLIP_BUDGET_EXHAUSTED, f"already {policy.max_flips_per_hour} flips in the last hour"
    if other_pool_busy:
        return r.OTHER_POOL_FLIPPING, "another pool of this deployment is changing"
    return None


def adjust_gate(
    policy: PolicySpec, state: PoolState, now: datetime, other_pool_busy: bool
) -> tuple[str, str] | None:
    """The first closed gate for an adjustment (new K, canaries), or None when it may proceed."""
    if not state.settled:
        return r.ROLLOUT_IN_PROGRESS, "the pool's last rollout has not finished"
    last = state.last_change
    interval = policy.min_retune_interval_seconds
    if last is not None and now - last < timedelta(seconds=interval):
        return r.MIN_RETUNE_INTERVAL, f"the pool changed less than {interval}s ago"
    hour_ago = now - timedelta(hours=1)
    if sum(1 for t in state.recent_retunes if t > hour_ago) >= policy.max_retunes_per_hour:
        return (
            r.RETUNE_BUDGET_EXHAUSTED,
            f"already {policy.max_retunes_per_hour} adjustments in the last hour",
        )
    if other_pool_busy:
        return r.OTHER_POOL_FLIPPING, "another pool of this deployment is changing"
    return None
