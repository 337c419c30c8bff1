"""The reasons of the policy's decisions: the gates that hold a pool (MinDwell, Cooldown, the flip and
retune budgets, rollouts), Threshold mode, probes and canaries, Goodput mode's flips and retunes, the
SLO's choices and the check of realized against predicted speed. `api/reason_docs.py` merges these with
the resource's reasons (`api/reason_docs_resource.py`) into the troubleshooting page's table."""

from __future__ import annotations

from typing import Final

from specfleet.api.reason_docs_base import NOTHING, ReasonDoc
from specfleet.api.reasons import (
    ACCEPTANCE_BELOW_THRESHOLD,
    ACCEPTANCE_STILL_LOW,
    CANARIES_SCALED_DOWN,
    CANARIES_SCALED_UP,
    CONCURRENCY_ABOVE_THRESHOLD,
    CONCURRENCY_STILL_HIGH,
    CONDITIONS_RECOVERED,
    COOLDOWN,
    FLIP_BUDGET_EXHAUSTED,
    GOODPUT_ABOVE_BREAK_EVEN,
    GOODPUT_BELOW_BREAK_EVEN,
    GOODPUT_MEMORY_BOUND,
    GOODPUT_OVERLOADED,
    GOODPUT_RETUNE,
    GOODPUT_WITHIN_MARGIN,
    MIN_DWELL,
    MIN_RETUNE_INTERVAL,
    OTHER_POOL_FLIPPING,
    PROBE_ACCEPTANCE,
    REALIZED_BELOW_PREDICTION,
    REPLACE_DIP_NOT_REPAID,
    REPLACE_WOULD_OVERLOAD,
    RETUNE_BUDGET_EXHAUSTED,
    ROLLOUT_FAILED,
    ROLLOUT_IN_PROGRESS,
    SLO_HEADROOM,
    SLO_TPOT_BOUND,
    SLO_TTFT_BOUND,
    SPECULATION_PAYS,
    STANDBY_DIP_NOT_REPAID,
    STANDBY_WOULD_OVERLOAD,
)

WAIT = "Nothing: the policy decides again once the gate opens."

DECISION_REASON_DOCS: Final[dict[str, ReasonDoc]] = {
    ROLLOUT_IN_PROGRESS: ReasonDoc(
        "Decision (hold)",
        "The pool's last change is still rolling out. A Standby pool is not held by a retune's or spec "
        "change's rollout (its flips need none), only by its own flip still settling.",
        WAIT,
    ),
    MIN_DWELL: ReasonDoc(
        "Decision (hold)",
        "The pool changed less than `policy.minDwellSeconds` ago; it stays put so it does not flap.",
        WAIT,
    ),
    COOLDOWN: ReasonDoc(
        "Decision (hold)",
        "Another pool of this resource flipped less than `policy.cooldownSeconds` ago (a pool's own flips "
        "are spaced by `policy.minDwellSeconds`).",
        WAIT,
    ),
    FLIP_BUDGET_EXHAUSTED: ReasonDoc(
        "Decision (hold)",
        "The pool flipped `policy.maxFlipsPerHour` times in the last hour.",
        "Nothing, unless it recurs: a pool that wants to flip that often sits near break-even; widen "
        "`policy.goodput.marginPercent` or pin the pool On or Off.",
    ),
    MIN_RETUNE_INTERVAL: ReasonDoc(
        "Decision (hold)",
        "A K change or canary scaling came less than `policy.minRetuneIntervalSeconds` after the last.",
        WAIT,
    ),
    RETUNE_BUDGET_EXHAUSTED: ReasonDoc(
        "Decision (hold)", "The pool used its `policy.maxRetunesPerHour`.", WAIT
    ),
    OTHER_POOL_FLIPPING: ReasonDoc(
        "Decision (hold)",
        "The other pool of this resource is changing; pools change one at a time so capacity never dips "
        "on both.",
        WAIT,
    ),
    ACCEPTANCE_BELOW_THRESHOLD: ReasonDoc(
        "Decision (Threshold mode)",
        "Acceptance length fell below `stopBelowAcceptanceLengthMilli`: speculation turned off.",
        "Nothing; check AcceptanceDrift if it was unexpected.",
    ),
    CONCURRENCY_ABOVE_THRESHOLD: ReasonDoc(
        "Decision (Threshold mode)",
        "Running requests per replica rose above `stopAboveConcurrencyPerReplica`: speculation turned off.",
        NOTHING,
    ),
    CONDITIONS_RECOVERED: ReasonDoc(
        "Decision (Threshold mode)",
        "Acceptance and concurrency are back inside the resume thresholds: speculation turned on.",
        NOTHING,
    ),
    ACCEPTANCE_STILL_LOW: ReasonDoc(
        "Decision (Threshold mode)",
        "Speculation stays off: acceptance is still below the resume threshold.",
        NOTHING,
    ),
    CONCURRENCY_STILL_HIGH: ReasonDoc(
        "Decision (Threshold mode)",
        "Speculation stays off: concurrency is still above the resume threshold.",
        NOTHING,
    ),
    SPECULATION_PAYS: ReasonDoc(
        "Decision (Threshold mode)", "Speculation stays on: both numbers are inside the thresholds.", NOTHING
    ),
    PROBE_ACCEPTANCE: ReasonDoc(
        "Decision",
        "The pool's acceptance is unknown or expired, so speculation runs (on canaries, else the pool) to "
        "measure it.",
        NOTHING,
    ),
    ROLLOUT_FAILED: ReasonDoc(
        "Decision, Event",
        "A change did not finish rolling out within `policy.rolloutDeadlineSeconds` and was undone, "
        "typically because the surge pod found no free GPU.",
        "Free one engine's worth of GPUs per pool for surges, set the pool's `rollout.strategy: "
        "Replace` (rolls within its own GPUs), or raise the deadline.",
    ),
    REPLACE_WOULD_OVERLOAD: ReasonDoc(
        "Decision (hold)",
        "The pool rolls out by `rollout.strategy: Replace`, and the engines left while "
        "`rollout.maxUnavailable` of them restart could not run the requests measured (running + "
        "waiting, against `maxNumSeqs` or what their KV cache holds): the flip waits for the load to fall.",
        "Nothing, if it passes; if the pool never flips under load, lower `rollout.maxUnavailable`, add "
        "replicas, or free one engine's GPUs and use Surge.",
    ),
    REPLACE_DIP_NOT_REPAID: ReasonDoc(
        "Decision (hold)",
        "The pool rolls out by `rollout.strategy: Replace`, and the flip's (or a retune's: it restarts "
        "the engines too) predicted gain over "
        "`policy.minDwellSeconds` (at least one window) is smaller than the capacity share the rollout "
        "removes times its duration (its batches of `maxUnavailable` engines times their start-up: "
        "`status.pools.<pool>.startupSeconds` measured, else an estimate for the model's size).",
        "Nothing: the flip does not pay on this cluster. A longer `minDwellSeconds`, a smaller "
        "`rollout.maxUnavailable` share or faster start-up (weights from a shared cache) lets it pay.",
    ),
    STANDBY_WOULD_OVERLOAD: ReasonDoc(
        "Decision (hold)",
        "The pool flips by `rollout.flip: Standby` and has one replica: while it drains, sleeps and wakes "
        "no engine would serve the requests measured, so the flip waits for the pool to be idle.",
        "Nothing, if it passes; add a replica so the pool keeps serving while one flips.",
    ),
    STANDBY_DIP_NOT_REPAID: ReasonDoc(
        "Decision (hold)",
        "The pool flips by `rollout.flip: Standby`, and the flip's predicted gain over "
        "`policy.minDwellSeconds` (at least one window) is smaller than the capacity it takes out: one "
        "engine at a time for its drain (estimated from the load now) and its sleep, wake and check "
        "(`status.pools.<pool>.standbyFlipSeconds` measured, else an estimate from the weights).",
        "Nothing: the flip does not pay now (usually a near break-even gain, or a long drain).",
    ),
    CANARIES_SCALED_DOWN: ReasonDoc(
        "Decision",
        "A pool that does not speculate removed its canaries: speculation is far from paying at this load.",
        NOTHING,
    ),
    CANARIES_SCALED_UP: ReasonDoc(
        "Decision",
        "A pool that does not speculate started canaries to measure acceptance near break-even.",
        NOTHING,
    ),
    GOODPUT_BELOW_BREAK_EVEN: ReasonDoc(
        "Decision (Goodput mode)",
        "Even the best K predicts less than `1 - marginPercent` of the speed without speculation at the "
        "expected load: speculation turned off.",
        NOTHING,
    ),
    GOODPUT_ABOVE_BREAK_EVEN: ReasonDoc(
        "Decision (Goodput mode)",
        "The best K predicts more than `1 + marginPercent`: speculation turned on at that K.",
        NOTHING,
    ),
    GOODPUT_WITHIN_MARGIN: ReasonDoc(
        "Decision (Goodput mode)",
        "The prediction is within the margin of break-even: the pool keeps its mode.",
        NOTHING,
    ),
    GOODPUT_RETUNE: ReasonDoc(
        "Decision (Goodput mode)",
        "Another K (or a new Dynamic SD schedule) beats the current one by `retuneMarginPercent`.",
        NOTHING,
    ),
    SLO_TTFT_BOUND: ReasonDoc(
        "Decision (Goodput mode)",
        "The pool's SLO chose its setting, and its time-to-first-token target decided: the setting chosen "
        "(off, a K, or a Dynamic SD table) is predicted to have more requests within every target than "
        "the one the throughput rule asks for, mostly by meeting the TTFT target more often (the drafter's "
        "share of the prefill and the queue's wait add to TTFT). Each setting's mean TTFT and TPOT come from "
        "the same model as its tokens per second, the tail from the pool's measured histograms. The "
        "numbers give each mode's predicted share (`predictedSloAttainmentOff`, `predictedSloAttainmentOn` "
        "at `predictedSloAttainmentBestK`). A flip, the SLO's or the throughput rule's, must cut the share "
        "of requests that miss by more than `marginPercent`: where the throughput rule's would not, the pool "
        "stays (the message says 'only from ... within the margin'). Where the load moves, the SLO "
        "overrides the throughput rule only if it predicts the same along the flip's commit path as at the "
        "demand measured; where the two part, the throughput rule decides. A pool the SLO keeps off runs no "
        "canaries.",
        "Nothing if expected. An SLO no setting meets: more replicas, or a looser target.",
    ),
    SLO_HEADROOM: ReasonDoc(
        "Decision (Goodput mode)",
        "The pool's SLO chose its mode by headroom: off and speculation are both predicted to keep the SLO's "
        "promise (a share of at least its percentile) as often as the best setting, and the mode chosen serves "
        "more tokens per second per replica at its largest batch (its capacity) by more than `marginPercent`. Meeting the "
        "targets alike now, the setting with the larger capacity keeps meeting them through a rise of the load "
        "the other cannot serve, where a queue's wait misses the TTFT target first, and a flip made only once "
        "the rise is measured would pay a rollout in the middle of it. Typical for a drafter that costs "
        "capacity (a weak one, or a KV cache it shares) under a loose SLO. A pool it keeps off runs no canaries.",
        "Nothing if expected. To let throughput decide between settings that meet the SLO alike, remove the SLO.",
    ),
    SLO_TPOT_BOUND: ReasonDoc(
        "Decision (Goodput mode)",
        "The pool's SLO chose its setting, and its time-per-output-token target decided: the setting "
        "chosen is predicted to have more requests within every target than the one the throughput rule "
        "asks for, mostly by meeting the TPOT target more often (speculation yields more tokens per step; "
        "at a large batch its steps cost more than they yield). Predicted as for `SloTtftBound`.",
        "Nothing if expected. An SLO no setting meets: more replicas, or a looser target.",
    ),
    REALIZED_BELOW_PREDICTION: ReasonDoc(
        "Decision (Goodput mode)",
        "The policy checks its own predictions: each window a settled pool speculates, its engines' "
        "generated tokens per second per replica are set beside what the model predicts for that "
        "setting at the running requests measured, and likewise for the engine without the drafter "
        "while the pool is off. A speculating setting whose measured-over-predicted ratio, over the "
        "plain engine's, stayed below 1 - policy.goodput.marginPercent for "
        "several windows running does not deliver the gain it was chosen for: the pool turns off, and "
        "until it speculates again and delivers, every prediction that would turn it on is multiplied "
        "by the shortfall measured (status.pools.<pool>.realizedCheck).",
        "The cost profile does not describe these engines (another GPU, drafter or vLLM version): "
        "measure it on them with `specfleet profile` and name it in "
        "policy.goodput.costProfileConfigMap.",
    ),
    GOODPUT_MEMORY_BOUND: ReasonDoc(
        "Decision (Goodput mode)",
        "The pool's demand (running + waiting requests per replica) does not fit the KV cache of an "
        "engine with the drafter (its weights, its KV and K lookahead slots per request take part of "
        'it), or, rising along its trend, would not fit it before a rollout could finish ("memory-bound '
        'ahead"), while it fits better without: the engine without the drafter runs more requests at once '
        "and serves more tokens per second, so speculation is off (or stays off). Also where the engines "
        "queue below the drafter's capacity, or the tokens served rise toward it, and requests arriving "
        "at random would spend longer in them with the drafter (its smaller batch fills sooner; "
        '"... arrive and the engines queue ..." or "... arrive by the time a flip serves ..."). The '
        "numbers give the demand, each setting's KV cache (measured from `vllm:cache_config_info`, else the cost "
        "profile's `memory`), the batch it holds and its predicted tokens per second. The pool turns "
        "back on once the demand fits again (after the usual dwell, cooldown and flip budget).",
        "Nothing if expected. To speculate under this load: more replicas, a larger "
        "`gpuMemoryUtilizationPercent` or more GPUs per replica (`tensorParallelSize`).",
    ),
    GOODPUT_OVERLOADED: ReasonDoc(
        "Decision (Goodput mode)",
        "More tokens arrive per second than the speculating engines can serve at their largest batch "
        "(`maxNumSeqs`, or what their KV cache holds with the drafter), with the policy's margin as "
        "headroom, while the engines without the drafter serve more: requests arriving on their own "
        "schedule (not waiting for each other's answers) would queue without end, so speculation is off "
        "(or stays off) until the arrivals fit again. The arrivals are the generated tokens per second "
        "measured plus the growth of the queue; the numbers give each setting's capacity.",
        "Nothing if expected. To speculate under this load: more replicas, a larger "
        "`gpuMemoryUtilizationPercent` or more GPUs per replica (`tensorParallelSize`).",
    ),
}
