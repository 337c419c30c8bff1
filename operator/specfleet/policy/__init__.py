"""The adaptive speculation policy: pure functions from observations to per-pool decisions."""

from specfleet.policy.decide import PoolDecision, decide, predicted_speedup, wanted_mode
from specfleet.policy.observations import MeasuredAcceptance, PoolObservation, PoolState

__all__ = [
    "MeasuredAcceptance",
    "PoolDecision",
    "PoolObservation",
    "PoolState",
    "decide",
    "predicted_speedup",
    "wanted_mode",
]
