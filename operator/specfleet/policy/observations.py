"""What the policy sees of a pool: plain data, produced by specfleet.metrics from Prometheus.

Missing data is explicit: a value of None means "not measured", never zero, and `problem` says why a
whole observation cannot be trusted (Prometheus down, a query error, no samples, stale samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class PoolObservation:
    """One pool's metrics over the policy window."""

    pool: str
    at: datetime
    # Why the observation cannot be used (None when it can).
    problem: str | None = None
    # Mean acceptance length, 1 + accepted / drafts (None: no drafts in the window, e.g. speculation off).
    acceptance_length: float | None = None
    # Cumulative per-position acceptance p_i = accepted_per_pos[i] / drafts.
    per_position: tuple[float, ...] = ()
    # accepted / draft tokens.
    draft_acceptance_rate: float | None = None
    # Where the acceptance numbers came from: "pool" (the pool's own engines) or "canary".
    acceptance_source: str | None = None
    running_per_replica: float | None = None
    waiting: float | None = None
    generation_tokens_per_second: float | None = None
    itl_p50_seconds: float | None = None
    itl_p99_seconds: float | None = None
    replicas_reporting: int = 0
    # Drafts counted in the window; acceptance is only reported when there were enough of them.
    drafts_in_window: float = 0.0

    @property
    def usable(self) -> bool:
        return self.problem is None

    def as_text(self) -> dict[str, str]:
        """The numbers as strings, for status history and Events."""
        out: dict[str, str] = {}
        for name, value in (
            ("acceptanceLength", self.acceptance_length),
            ("draftAcceptanceRate", self.draft_acceptance_rate),
            ("runningPerReplica", self.running_per_replica),
            ("waiting", self.waiting),
            ("generationTokensPerSecond", self.generation_tokens_per_second),
            ("itlP99Seconds", self.itl_p99_seconds),
        ):
            if value is not None:
                out[name] = f"{value:.3g}"
        if self.per_position:
            out["perPosition"] = ",".join(f"{p:.2f}" for p in self.per_position)
        if self.acceptance_source:
            out["acceptanceSource"] = self.acceptance_source
        out["replicasReporting"] = str(self.replicas_reporting)
        out["draftsInWindow"] = f"{self.drafts_in_window:.0f}"
        return out


@dataclass(frozen=True)
class MeasuredAcceptance:
    """The last acceptance measured while a pool speculated (kept for re-entry decisions)."""

    acceptance_length: float
    per_position: tuple[float, ...]
    at: datetime


@dataclass(frozen=True)
class PoolState:
    """The policy-relevant part of a pool's status."""

    mode: str  # "On" or "Off"
    last_transition: datetime | None = None
    recent_flips: tuple[datetime, ...] = field(default_factory=tuple)
    settled: bool = True
    last_acceptance: MeasuredAcceptance | None = None
    # K the pool drafts while speculating, if the policy chose one (None: the drafter's K).
    k: int | None = None
