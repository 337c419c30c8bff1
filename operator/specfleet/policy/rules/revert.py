"""Reverts (pure): a change whose rollout has not settled after `rolloutDeadlineSeconds` is undone
with reason RolloutFailed, whatever the gates say, back to the mode, K, canaries and schedule the pool
had before it; a revert that misses the deadline too is held, never reverted again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from specfleet.api import reasons as r
from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolState
from specfleet.policy.inputs.settings import pool_k
from specfleet.policy.rules.results import PoolDecision


def revert_missed_rollout(
    policy: PolicySpec, pool: str, state: PoolState, now: datetime, k: int, numbers: dict[str, str]
) -> PoolDecision | None:
    """Undo the policy's last change when its rollout missed the deadline (None: no revert due)."""
    rollout = state.rollout
    if state.settled or rollout is None or rollout.settled_at is not None:
        return None
    if now - rollout.at <= timedelta(seconds=policy.rollout_deadline_seconds):
        return None
    if rollout.reason == r.ROLLOUT_FAILED:
        return None  # a revert that does not settle either: hold (RolloutInProgress), never ping-pong
    current_k = pool_k(policy, state, k)
    target_k = rollout.from_k if rollout.from_k is not None else k
    canaries = rollout.from_canaries
    if canaries is None and state.canary_replicas is not None:
        canaries = policy.reentry.canary_replicas
    flip = rollout.from_mode != state.mode
    schedule = rollout.from_schedule if rollout.from_mode == "On" else None
    waited = int((now - rollout.at).total_seconds())
    message = (
        f"the change at {rollout.at:%H:%M:%S} ({rollout.reason or 'policy'}) has not finished rolling out "
        f"after {waited}s (deadline {policy.rollout_deadline_seconds}s): back to {rollout.from_mode}"
        + (f" at K {target_k}" if rollout.from_mode == "On" else "")
    )
    return PoolDecision(
        pool,
        state.mode,
        rollout.from_mode,
        flip,
        r.ROLLOUT_FAILED,
        message,
        numbers,
        current_k,
        target_k if (target_k != current_k or flip) else None,
        canaries if canaries != state.canary_replicas else None,
        target_schedule=(schedule or ()) if schedule != state.schedule else None,
    )
