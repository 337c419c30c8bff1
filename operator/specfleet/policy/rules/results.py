"""What the rules return for one pool (pure): `Wanted`, what a mode's rule asks for before the
stability gates, and `PoolDecision`, the outcome after them. The rules are in docs/policy.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specfleet.policy.inputs.observation import MeasuredAcceptance, RealizedRecord, Schedule


@dataclass(frozen=True)
class Wanted:
    """What the numbers ask for, before the stability gates."""

    mode: str
    reason: str
    message: str
    numbers: dict[str, str] = field(default_factory=dict)
    # K to run after a flip (Goodput: the best K; None keeps the pool's).
    k: int | None = None
    # The flip's throughput over the current setting's where the ask prices it itself (an overload:
    # the capacities' ratio, as the engines serve at their capacity); None: the prediction's at the
    # demand.
    gain: float | None = None


@dataclass(frozen=True)
class PoolDecision:
    """The outcome for one pool: flip (to `target`), adjust (K, canaries), revert, or hold; and why."""

    pool: str
    current: str
    target: str
    flip: bool
    reason: str
    message: str
    observations: dict[str, str] = field(default_factory=dict)
    current_k: int | None = None
    target_k: int | None = None
    # Canary replicas the pool runs while off after this decision (None: unchanged).
    canary_replicas: int | None = None
    # The acceptance to remember (None: nothing new was measured in a window the policy trusts).
    acceptance: MeasuredAcceptance | None = None
    # The pool's Dynamic SD schedule after this decision (None: unchanged; empty: none).
    target_schedule: Schedule | None = None
    # Goodput: the pool's new check of its prediction against what it delivered (None: unchanged).
    realized: RealizedRecord | None = None
    # A Standby pool's flip: its pods switch engines in place, so the speculating engine keeps its K and
    # schedule (a new one is a new template: every pod restarted). Off keeps them for the way back.
    in_place: bool = False

    @property
    def changes(self) -> bool:
        """The decision rolls the pool out (a flip, a new K, canaries scaled, or a revert)."""
        return (
            self.flip
            or self.target_k is not None
            or self.canary_replicas is not None
            or self.target_schedule is not None
        )

    @property
    def adjusts(self) -> bool:
        """A change that keeps the mode (spends the adjustment budget, not a flip)."""
        return self.changes and not self.flip
