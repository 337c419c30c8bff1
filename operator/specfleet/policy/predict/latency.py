"""Each setting's latency, priced like the engines (pure): the time per output token (TPOT) and the time to
first token (TTFT) a setting gives the requests of a pool, and the share of them within an SLO's
targets, its tail read from the pool's own measured histograms.

From the same continuous model the throughput prediction uses (`policy.predict.throughput.PoolModel`):

    TPOT = batch / T                    T: the setting's generated tokens per second per replica at the
                                        batch it runs (step time, tokens per step, the prefill of the
                                        prompts arriving meanwhile, the drafter's share of it)
    TTFT = wait + prompt x prefill x (1 + f) + step(batch, K)

with `wait` the queue's: the requests Erlang C puts in the waiting line (`queueing.waiting`, the setting's
batch slots at its utilisation) over the request arrival rate (Little's law). Both are means. The
share within a target comes from the histogram measured for the setting the pool runs now, scaled by
the predicted ratio of the other setting's mean to the current one's: a setting predicted twice as
slow meets a target as often as the current one meets half of it. The two targets' shares are taken
as independent (their product); the SLO's own attainment in status is the smaller of the two, which
only the current setting is measured at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specfleet.api.pools import LatencySlo
from specfleet.policy.inputs.observation import Histogram
from specfleet.policy.inputs.slo_attainment import MILLISECONDS, share_within
from specfleet.policy.predict.dynamic_sd import k_at
from specfleet.policy.predict.queueing import waiting
from specfleet.policy.predict.throughput import SCHEDULE, PoolModel


@dataclass(frozen=True)
class Latency:
    """One setting's predicted mean TTFT and TPOT, in seconds (inf: it cannot serve the arrivals)."""

    ttft: float
    tpot: float


def predict_latency(
    model: PoolModel,
    name: str,
    per_position: Sequence[float],
    rate: float,
    prompt_tokens: float,
    output_tokens: float,
) -> Latency:
    """Setting `name`'s mean TTFT and TPOT when `rate` generated tokens per second per replica arrive at
    random in requests of `prompt_tokens` and `output_tokens` (see the module docstring)."""
    running = model.requests_for(name, per_position, rate)
    if math.isinf(running) or output_tokens <= 0:
        return Latency(math.inf, math.inf)
    batch = max(1.0, running)
    tokens = model.tokens_per_second(name, per_position, batch)
    setting = model.settings[name]
    k = setting.lookahead
    if name == SCHEDULE and model.schedule is not None:
        k = k_at(model.schedule, batch)
    slots = max(1, int(min(model.max_num_seqs, setting.fits)))
    capacity = model.capacity(name, per_position)
    queued = waiting(slots, rate / capacity) if capacity > 0 else math.inf
    requests_per_second = rate / output_tokens
    wait = queued / requests_per_second if requests_per_second > 0 else 0.0
    share = 1.0 + (model.profile.drafter_prefill_fraction if setting.speculative else 0.0)
    own_prompt = prompt_tokens * (1 - model.prefill_hit_share)
    prefill = own_prompt * model.profile.prefill_ms_per_token / 1000.0 * share
    return Latency(
        ttft=wait + prefill + model.profile.step_time_s(batch, k),
        tpot=batch / tokens if tokens > 0 else math.inf,
    )


def scaled_share(histogram: Histogram, target_seconds: float, scale: float) -> float | None:
    """The share of requests within `target_seconds` if every value in the measured `histogram` were
    `scale` times as large (None: nothing measured)."""
    if math.isinf(scale):
        return 0.0 if histogram else None
    return share_within(histogram, target_seconds / max(scale, 1e-9))


def predicted_attainment(
    slo: LatencySlo, ttft: Histogram, tpot: Histogram, now: Latency, other: Latency
) -> float | None:
    """The share of requests that would meet every target of `slo` under a setting predicted at `other`,
    from the histograms measured under the current setting, predicted at `now`. A setting that cannot
    serve the arrivals (an infinite mean) meets none. None: a target's histogram is empty, or the
    current setting cannot serve the arrivals (what it measures is a queue's growth, no scale for
    another setting)."""
    out = 1.0
    for ms, histogram, mean_now, mean_other in (
        (slo.time_to_first_token_milliseconds, ttft, now.ttft, other.ttft),
        (slo.time_per_output_token_milliseconds, tpot, now.tpot, other.tpot),
    ):
        if ms is None:
            continue
        if math.isfinite(mean_other) and not (math.isfinite(mean_now) and mean_now > 0):
            return None
        scale = mean_other / mean_now if math.isfinite(mean_other) else math.inf
        share = scaled_share(histogram, ms / MILLISECONDS, scale)
        if share is None:
            return None
        out *= share
    return out
