"""The two settings every stage of the policy reads (pure): the Goodput margin and the K a pool
drafts while speculating. The rules are in docs/policy.md.
"""

from __future__ import annotations

from specfleet.api.policy import PolicySpec
from specfleet.policy.inputs.observation import PoolState


def goodput_margin(policy: PolicySpec) -> float:
    """The Goodput margin as a fraction (Threshold derives its unset values with it too)."""
    return policy.goodput.margin_percent / 100


def pool_k(policy: PolicySpec, state: PoolState, k: int) -> int:
    """The K the pool drafts while speculating (Goodput may have chosen one; Threshold runs the drafter's)."""
    if policy.mode == "Goodput" and state.k is not None and 1 <= state.k <= k:
        return state.k
    return k
