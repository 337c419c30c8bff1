"""The replicas a pool needs to meet its latency SLO at the trace's p95 load, per setting (pure but for
the simulated samples it is given): `plan`'s capacity answer.

For off, each K and the Dynamic SD table: the smallest replica count N (1 up to `MAX_REPLICAS`) whose
predicted share of requests within every target reaches the SLO's percentile when the pool's p95 load is
spread over N replicas. The load is generated tokens per second over the whole pool in its 95th-percentile
window of the simulation (the most any fixed setting served there, the closest to what arrived).

Each setting's mean TTFT and TPOT at N come from the policy's model (`policy.predict.latency`: step time
at the batch, tokens per step, prefill with the drafter's share, Erlang C's queue over the batch slots).
The tail comes from the simulation: the requests the pool finished in that setting's own fixed run (the
off run where a setting has none), each one's TTFT and TPOT scaled by the predicted mean over the run's
mean. The shape of each distribution is the simulated one, its mean the model's at N; a request meets
the SLO when it meets both targets (joint, not the product of two marginals). A run measured under heavy
queueing keeps its long tail when scaled down, so the answer errs towards more replicas.

The setting the policy would run is the SLO rule's criterion (`policy.rules.slo`) at the fewest replicas
any setting needs: the highest predicted share; where off and speculation tie (within `TIE`), the one
with more capacity by the Goodput margin (the rule's headroom), else the most tokens per second per
replica. Only the latency pool is steered by its SLO; the batch pool's is measured, so it gets no
such setting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specfleet.api.pools import LatencySlo
from specfleet.policy.predict.latency import predict_latency
from specfleet.policy.predict.throughput import OFF, PoolModel
from specfleet.policy.rules.slo import TIE, more_capacity

# The most replicas searched: past it the SLO is reported unreachable (a pool of 128 engines is a fleet
# of its own; a target that needs more is usually below what one request's prefill or step allows).
MAX_REPLICAS = 128
OFF_KEY = "off"  # the candidate without the drafter


@dataclass(frozen=True)
class SloCandidate:
    """One setting the pool could run: its key in the output, the model and setting name it is predicted
    with, and the (TTFT, TPOT or None) of each request the pool finished in its simulated run."""

    key: str
    model: PoolModel
    setting: str
    samples: Sequence[tuple[float, float | None]]


@dataclass(frozen=True)
class SloLoad:
    """The load a pool must serve: generated tokens per second over all its replicas, in requests of
    `prompt_tokens` and `output_tokens` (means)."""

    tokens_per_second: float
    prompt_tokens: float
    output_tokens: float


class _Tail:
    """A setting's simulated TTFT and TPOT, kept as arrays, and their means (the scale's reference)."""

    def __init__(self, samples: Sequence[tuple[float, float | None]]) -> None:
        self.ttft = np.array([t for t, _ in samples], dtype=float)
        self.tpot = np.array([math.nan if p is None else p for _, p in samples], dtype=float)
        self.ttft_mean = float(self.ttft.mean()) if len(self.ttft) else math.nan
        has = ~np.isnan(self.tpot)
        self.tpot_mean = float(self.tpot[has].mean()) if has.any() else math.nan

    def share(self, slo: LatencySlo, ttft_mean: float, tpot_mean: float) -> float:
        """The share of the requests within every target were their means `ttft_mean` and `tpot_mean`."""
        met = np.ones(len(self.ttft), dtype=bool)
        ttft_ms, tpot_ms = slo.time_to_first_token_milliseconds, slo.time_per_output_token_milliseconds
        if ttft_ms is not None:
            if not math.isfinite(ttft_mean):
                return 0.0
            scale = ttft_mean / self.ttft_mean if self.ttft_mean > 0 else 1.0
            met &= self.ttft * scale <= ttft_ms / 1000
        if tpot_ms is not None and not math.isnan(self.tpot_mean):
            if not math.isfinite(tpot_mean):
                return 0.0
            scale = tpot_mean / self.tpot_mean if self.tpot_mean > 0 else 1.0
            # A request of one output token has no TPOT: its TTFT judges it alone.
            met &= np.isnan(self.tpot) | (self.tpot * scale <= tpot_ms / 1000)
        return float(met.mean()) if len(met) else 0.0


def predicted_share(
    slo: LatencySlo, candidate: SloCandidate, acceptance: Sequence[float], load: SloLoad, replicas: int
) -> float:
    """The share of requests within every target of `slo` with `load` spread over `replicas` replicas
    running `candidate` (see the module docstring)."""
    return _share(slo, candidate, _Tail(candidate.samples), acceptance, load, replicas)


def _share(
    slo: LatencySlo,
    candidate: SloCandidate,
    tail: _Tail,
    acceptance: Sequence[float],
    load: SloLoad,
    replicas: int,
) -> float:
    latency = predict_latency(
        candidate.model,
        candidate.setting,
        acceptance,
        load.tokens_per_second / replicas,
        load.prompt_tokens,
        load.output_tokens,
    )
    return tail.share(slo, latency.ttft, latency.tpot)


def _roomier(
    tied: Sequence[SloCandidate], shares: dict[str, float], acceptance: Sequence[float], margin: float
) -> SloCandidate | None:
    """As the rule's headroom (`policy.rules.slo.more_capacity`): where off and a speculating setting both tie,
    the one of off and the best speculating one that serves more tokens per second at its largest batch
    than the other by more than `margin` (None: neither, or one mode does not tie)."""
    off = next((c for c in tied if c.key == OFF_KEY), None)
    on = [c for c in tied if c.key != OFF_KEY]
    if off is None or not on:
        return None
    best_on = max(on, key=lambda c: shares[c.key])
    off_capacity = off.model.capacity(off.setting, acceptance)
    more = more_capacity(off_capacity, best_on.model.capacity(best_on.setting, acceptance), margin)
    return None if more is None else off if more == OFF else best_on


def slo_replicas(
    slo: LatencySlo,
    candidates: Sequence[SloCandidate],
    acceptance: Sequence[float],
    load: SloLoad,
    gpus_per_replica: int,
    steered: bool = True,
    max_replicas: int = MAX_REPLICAS,
    margin: float = 0.05,
) -> dict[str, Any]:
    """The plan's SLO fields for one pool: `replicasForSlo` (per setting; None where not reachable up to
    `max_replicas`, with the reason in `unreachable`), `gpusSavedBySpeculation` (off's GPUs minus the
    best speculating setting's; negative: speculation costs GPUs) and, where the pool is `steered` by its
    SLO, the setting the policy would run at the fewest replicas any setting needs."""
    goal = slo.percentile / 100
    needed: dict[str, int | None] = {}
    unreachable: dict[str, str] = {}
    tails = {c.key: _Tail(c.samples) for c in candidates}
    for c in candidates:
        if not len(tails[c.key].ttft):
            needed[c.key] = None
            unreachable[c.key] = "no request of the pool finished in its simulated run"
            continue
        best = 0.0
        needed[c.key] = None
        for n in range(1, max_replicas + 1):
            share = _share(slo, c, tails[c.key], acceptance, load, n)
            best = max(best, share)
            if share >= goal:
                needed[c.key] = n
                break
        else:
            unreachable[c.key] = (
                f"at most {best:.3f} of requests predicted within the targets up to {max_replicas} "
                f"replicas, short of {goal:.2f}"
            )
    doc: dict[str, Any] = {"replicasForSlo": needed}
    off = needed.get(candidates[0].key)
    speculating = [needed[c.key] or 0 for c in candidates[1:] if needed[c.key] is not None]
    if off is not None and speculating:
        doc["gpusSavedBySpeculation"] = (off - min(speculating)) * gpus_per_replica
    else:
        doc["gpusSavedBySpeculation"] = None
        unreachable["gpusSavedBySpeculation"] = (
            "no setting meets the SLO"
            if off is None and not speculating
            else "off cannot meet the SLO, speculation can"
            if off is None
            else "no speculating setting meets the SLO"
        )
    if unreachable:
        doc["unreachable"] = unreachable
    reachable = [n for n in needed.values() if n is not None]
    if steered and reachable:
        at = min(reachable)
        shares = {
            c.key: _share(slo, c, tails[c.key], acceptance, load, at)
            for c in candidates
            if len(tails[c.key].ttft)
        }
        top = max(shares.values())
        tied = [c for c in candidates if c.key in shares and shares[c.key] >= top - TIE]
        # Throughput breaks the tie, as in the rule: tokens per second at the requests per replica the
        # engine without the drafter runs for this load (its most where it cannot serve it).
        off_model = candidates[0].model
        demand = off_model.requests_for(candidates[0].setting, acceptance, load.tokens_per_second / at)
        demand = max(1.0, min(float(off_model.max_num_seqs), demand))
        chosen = max(tied, key=lambda c: c.model.tokens_per_second(c.setting, acceptance, demand))
        roomier = _roomier(tied, shares, acceptance, margin) if top >= goal else None
        if roomier is not None and OFF_KEY in (roomier.key, chosen.key):
            chosen = roomier
        doc["policySetting"] = {
            "replicas": at,
            "setting": chosen.key,
            "predictedAttainment": round(shares[chosen.key], 3),
        }
    return doc
