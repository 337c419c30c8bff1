"""The adaptive speculation policy: pure functions from observations to per-pool decisions.

Four stages, each a subpackage that imports only the ones before it (an import-linter contract):

    inputs    what the policy reads: Prometheus' answers, status, the cost profile
    predict   what each setting would deliver: acceptance, KV cache, demand, tokens/s, queueing
    rules     what each rule asks for: Goodput, Threshold, retunes, canaries, reverts, gates, drift
    decision  the decision and its record: one pool, one deployment, one evaluation, status

`decision.evaluation.evaluate_policy` is the entry point; docs/policy.md explains the rules.
"""

from specfleet.policy.decision.deployment import decide
from specfleet.policy.inputs.observation import MeasuredAcceptance, PoolObservation, PoolState
from specfleet.policy.rules.goodput import predicted_speedup
from specfleet.policy.rules.results import PoolDecision

__all__ = [
    "MeasuredAcceptance",
    "PoolDecision",
    "PoolObservation",
    "PoolState",
    "decide",
    "predicted_speedup",
]
