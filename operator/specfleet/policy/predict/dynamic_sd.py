"""K inside the engine: the Dynamic SD schedule the Goodput policy gives a speculating pool (pure).

The best K falls as batches grow (verifying K drafts costs more per step once decode is compute-bound),
and a pool's batch size moves within minutes. Changing a pool's K by rendering a new
`num_speculative_tokens` is a surge rollout: a replica's start-up of capacity, and the load has often
moved again by the time it is over. vLLM (>= 0.32) picks K per step from the batch size
(`num_speculative_tokens_per_batch_size`, "Dynamic SD"), at no cost. So a speculating pool drafts up to
the drafter's K, and the policy renders a schedule made from the cost profile and the pool's measured
acceptance: per batch size, the K with the highest goodput. K 0 inside the engine is not free (the
drafter still holds its memory and vLLM pays a fixed per-step cost, measured 6.6-21.6% in vLLM
#49548), so a range drafts 0 only where no K beats no speculation by more than that penalty; a pool
that stays past break-even is turned off by the policy (a flip), which gets the drafter's memory back.

Per-position acceptance under a schedule: vLLM counts every draft in `num_drafts`, but position i is
only accepted in drafts of more than i tokens, so accepted_per_pos[i] / num_drafts understates the
deeper positions by the share of drafts that were shorter. With at most two drafting K values
(a < b) the share is exact from the counters the policy already reads: the mean draft length is
draft tokens / drafts = (acceptanceLength - 1) / draftAcceptanceRate = a + f_b (b - a). So a schedule
uses at most two drafting K values (the best K at batch 1 and the smallest the profile measured),
and `unmix` divides the positions from a on by f_b; with too few long drafts in the window they are
left unmeasured (the memory keeps them, as for a pool drafting a smaller K).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

from specfleet.policy.inputs.observation import PoolObservation, PoolState, Schedule
from specfleet_runtime.cost_profile import StepTimeProfile, end_to_end_speedup, goodput, speedup

# What K 0 inside a speculating engine costs against an engine without the drafter (vLLM #49548
# measured 6.6-21.6%; the fleet simulator's default is the same value).
IN_ENGINE_K0_PENALTY = 0.10
# Batch sizes the schedule is computed for; the last range runs on to the API's largest batch size.
SCHEDULE_BATCHES = 1024
MAX_BATCH = 65536
# Long drafts (of the larger K) a window needs before the deeper positions count as measured.
MIN_LONG_DRAFTS = 200.0


def drafting_ks(profile: StepTimeProfile, per_position: Sequence[float], max_k: int) -> tuple[int, ...]:
    """The (at most two) K values a schedule drafts: the best at batch 1 and the smallest measured."""
    ks = [k for k in profile.speculative_tokens if 1 <= k <= max_k] or [max_k]
    top = max(ks, key=lambda k: (goodput(profile, 1.0, k, list(per_position)), -k))
    return tuple(sorted({min(ks), top}))


@functools.lru_cache(maxsize=512)
def _best(profile: StepTimeProfile, per_position: tuple[float, ...], max_k: int) -> Schedule:
    ks = drafting_ks(profile, per_position, max_k)
    rows: list[tuple[int, int, int]] = []
    for b in range(1, SCHEDULE_BATCHES + 1):
        best = max(ks, key=lambda k: (speedup(profile, b, k, list(per_position)), -k))
        if speedup(profile, b, best, list(per_position)) < 1 - IN_ENGINE_K0_PENALTY:
            best = 0
        if rows:
            best = min(best, rows[-1][2])  # K never rises with the batch: a few ranges, in order
        if rows and rows[-1][2] == best:
            rows[-1] = (rows[-1][0], b, best)
        else:
            rows.append((b, b, best))
    rows[-1] = (rows[-1][0], MAX_BATCH, rows[-1][2])
    return tuple(rows)


def best_schedule(profile: StepTimeProfile, per_position: Sequence[float], max_k: int) -> Schedule:
    """The schedule with the highest predicted goodput at every batch size (acceptance rounded to
    0.01: a schedule that changes with the last digits of a measurement would roll pools out)."""
    rounded = tuple(round(min(1.0, max(0.0, float(p))), 2) for p in per_position)
    return _best(profile, rounded, max_k)


def k_at(schedule: Schedule, batch: float) -> int:
    """The K a schedule drafts at `batch` running requests (vLLM's lookup; the last range beyond)."""
    b = max(1, round(batch))
    for start, end, k in schedule:
        if start <= b <= end:
            return k
    return schedule[-1][2] if schedule else 0


def schedule_speedup(
    profile: StepTimeProfile,
    concurrency: float,
    schedule: Schedule,
    per_position: Sequence[float],
    prompt_per_output: float = 0.0,
) -> float:
    """Predicted speedup over no speculation of an engine following `schedule` at `concurrency`, with
    the prefill of `prompt_per_output` prompt tokens per generated token priced (0: decode only). The
    schedule itself is chosen on decode alone: at K 0 the drafter's prefill is paid all the same."""
    k = k_at(schedule, concurrency)
    c = max(1.0, concurrency)
    decode = 1 - IN_ENGINE_K0_PENALTY if k == 0 else speedup(profile, c, k, list(per_position))
    return end_to_end_speedup(profile, c, decode, prompt_per_output)


def unmix(
    per_position: Sequence[float],
    acceptance_length: float | None,
    draft_acceptance_rate: float | None,
    drafts: float,
    schedule: Schedule,
) -> tuple[float, ...]:
    """Per-position acceptance of a pool following `schedule`, from vLLM's per-draft ratios (see the
    module docstring); positions it cannot tell apart are dropped (unmeasured, not zero)."""
    ks = sorted({k for _, _, k in schedule if k > 0})
    values = list(per_position)
    if not ks or not values:
        return tuple(values)
    if len(ks) > 2:
        return tuple(values[: ks[0]])  # the counters cannot separate three draft lengths
    a, b = ks[0], ks[-1]
    if a == b:
        return tuple(values[:a])
    if acceptance_length is None or not draft_acceptance_rate or draft_acceptance_rate <= 0:
        return tuple(values[:a])
    mean_length = (acceptance_length - 1) / draft_acceptance_rate
    share = min(1.0, max(0.0, (mean_length - a) / (b - a)))
    if share * drafts < MIN_LONG_DRAFTS:
        return tuple(values[:a])
    out = values[:a]
    ceiling = out[-1] if out else 1.0
    for p in values[a:b]:
        out.append(min(ceiling, p / share))
        ceiling = out[-1]
    return tuple(out)


def drafted_by(schedule: Schedule, k: int) -> int:
    """Fewest positions a drafting step of an engine following `schedule` (at most K `k`) drafts."""
    drafting = [min(kk, k) if k else kk for _, _, kk in schedule if kk > 0]
    return min(drafting, default=0)


def observed_under_schedule(obs: PoolObservation, state: PoolState, schedules: bool) -> PoolObservation:
    """The observation with its per-position acceptance unmixed where the pool follows a schedule."""
    if not schedules or state.mode != "On" or not state.schedule or not obs.per_position:
        return obs
    per_position = unmix(
        obs.per_position,
        obs.acceptance_length,
        obs.draft_acceptance_rate,
        obs.drafts_in_window,
        state.schedule,
    )
    return replace(obs, per_position=per_position)
