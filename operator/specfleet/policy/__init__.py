"""The adaptive speculation policy: pure functions from observations to per-pool decisions."""

from specfleet.policy.decide import decide
from specfleet.policy.decision import PoolDecision
from specfleet.policy.goodput import predicted_speedup
from specfleet.policy.observations import MeasuredAcceptance, PoolObservation, PoolState

__all__ = [
    "MeasuredAcceptance",
    "PoolDecision",
    "PoolObservation",
    "PoolState",
    "decide",
    "predicted_speedup",
]
