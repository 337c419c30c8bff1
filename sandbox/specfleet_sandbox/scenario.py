"""Scripted traffic for the sandbox: phases of interactive and batch-tenant load, and content shifts.

A scenario is data (`Phase`s); `run_scenario` drives it through the router with one load generator
per kind of client (interactive clients go to the default pool, the batch tenant is sent to the
batch pool by the resource's tenant rule) and records cumulative counters at every phase boundary.
`observe_rollouts` notes, from the resource's status as the scenario polls it, how each change rolls
out (a Standby flip, a restart flip, a retune's restart) and how long it took from the decision to
settled; `summary_lines` turns all that and the resource's decision history into the end-of-run
report (pure).

The default ("demo", about 6 minutes): calm interactive traffic; a batch tenant's surge pushes the
batch pool past the break-even the Goodput policy predicts from the sandbox's measured profile
(speculation Off, GoodputBelowBreakEven); calm again (the batch pool turns speculation back on after
its dwell, GoodputAboveBreakEven); long prompts from the batch tenant, fewer streams than break-even,
but more than the KV cache holds with the drafter's share taken out (speculation Off,
GoodputMemoryBound); then a content shift lowers the latency pool's acceptance until drafting no
longer pays even at its light load (speculation Off there, GoodputBelowBreakEven).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specfleet_sandbox.load import LoadGenerator, LoadStats

# The tenant the sandbox resource routes to the batch pool (its routing.tenantRules). The resource
# trusts the tenant header (tenantHeaderTrust: Trusted); here the load generator plays the gateway.
BATCH_TENANT = "nightly-evals"
TENANT_HEADER = "x-specfleet-tenant"
# Per-position acceptance of the emulated EAGLE-3 drafter (about the published Llama-3.1-8B values),
# and on the content a shift brings (a topic the drafter no longer fits): the engines draft every prompt
# that holds SHIFT_TOPIC at SHIFTED_ACCEPTANCE (`content_shift_args`), the rest as before, so a fixed
# probe (the operator's check of a woken Standby drafter) still sees the drafter's own acceptance.
BASELINE_ACCEPTANCE = (0.68, 0.39, 0.2)
SHIFTED_ACCEPTANCE = (0.05, 0.01, 0.0)
SHIFT_TOPIC = "[topic: maritime salvage law]"
# The batch tenant's long-prompt phase: 20 streams of about 1450-token prompts. Each request then holds
# about 94 KV blocks of 16 tokens; the device's cache (device-profile.yaml) holds 21 of them without
# the drafter and 13 with it, while 20 short ones would still speculate (break-even is 25 to 30).
LONG_PROMPT_STREAMS = 20
LONG_PROMPT_WORDS = 1450


@dataclass(frozen=True)
class Phase:
    """A stretch of steady traffic; a change of the interactive clients' topic applies at its start."""

    name: str
    seconds: float
    interactive: int
    batch: int
    # From this phase on the interactive clients ask about the shifted topic (True), the usual (False),
    # or keep what they asked (None).
    shifted: bool | None = None
    expect: str = ""
    batch_prompt_words: int = 0  # the batch tenant's prompts: 0 short, else about this many tokens


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    phases: tuple[Phase, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


def _demo(scale: float) -> tuple[Phase, ...]:
    return (
        Phase("calm", 45 * scale, 2, 1, False, "both pools speculate"),
        Phase("batch surge", 90 * scale, 2, 40, None, "batch pool: On -> Off (GoodputBelowBreakEven)"),
        Phase(
            "calm again",
            80 * scale,
            2,
            1,
            None,
            "batch pool: Off -> On after its dwell (GoodputAboveBreakEven)",
        ),
        Phase(
            "long prompts",
            80 * scale,
            2,
            LONG_PROMPT_STREAMS,
            None,
            "batch pool: On -> Off, the drafter's KV share binds (GoodputMemoryBound)",
            batch_prompt_words=LONG_PROMPT_WORDS,
        ),
        Phase(
            "content shift",
            70 * scale,
            2,
            1,
            True,
            "latency pool: On -> Off (GoodputBelowBreakEven)",
        ),
    )


SCENARIOS: dict[str, Scenario] = {
    "demo": Scenario(
        "demo", "calm, batch surge, calm, long prompts, content shift (about 6 minutes)", _demo(1.0)
    ),
    "short": Scenario("short", "the demo at about 60% of its length (the e2e tier runs it)", _demo(0.6)),
    "surge": Scenario(
        "surge",
        "a batch surge and its end",
        (
            Phase("calm", 30, 2, 1, False, "both pools speculate"),
            Phase("batch surge", 90, 2, 40, None, "batch pool: On -> Off"),
            Phase("calm again", 80, 2, 1, None, "batch pool: Off -> On after its dwell"),
        ),
    ),
    "shift": Scenario(
        "shift",
        "a content shift on the latency pool, then back",
        (
            Phase("calm", 30, 2, 1, False, "both pools speculate"),
            Phase("content shift", 60, 2, 1, True, "latency pool: On -> Off"),
            Phase("content back", 90, 2, 1, False, "latency pool: Off -> On after its dwell"),
        ),
    ),
}


@dataclass
class PhaseRecord:
    """Counters at the end of a phase (cumulative), and how long it really lasted."""

    phase: Phase
    started: float
    ended: float
    interactive: LoadStats
    batch: LoadStats


@dataclass
class ScenarioResult:
    scenario: Scenario
    started_wall: float
    phases: list[PhaseRecord] = field(default_factory=list)

    @property
    def interactive(self) -> LoadStats:
        return self.phases[-1].interactive if self.phases else LoadStats()

    @property
    def batch(self) -> LoadStats:
        return self.phases[-1].batch if self.phases else LoadStats()

    @property
    def failed(self) -> int:
        return self.interactive.failed + self.batch.failed

    @property
    def served(self) -> int:
        return self.interactive.ok + self.batch.ok


@dataclass(frozen=True)
class Rollout:
    """How one change of a pool rolled out, and its seconds from the decision to settled (None: not
    seen settled)."""

    method: str  # "Standby flip", "restart flip" or "restart" (a retune: new pods either way)
    seconds: float | None = None


RolloutKey = tuple[str, str]  # (pool, the decision's time): status.pools.<pool>.rollout.time


def observe_rollouts(resource: Mapping[str, Any], seen: dict[RolloutKey, Rollout]) -> None:
    """Note each pool's last change from status.pools.<pool>.rollout (the decision's time, and
    settledTime once the policy saw every pod serve it), which keeps only the newest change: the
    scenario calls this on every tick, well within the policy's dwell between two changes. A flip of
    a pool with `rollout.flip: Standby` whose engines can sleep is a Standby flip."""
    spec_pools = resource.get("spec", {}).get("pools", {})
    for pool, status in resource.get("status", {}).get("pools", {}).items():
        rollout = status.get("rollout") or {}
        decided = rollout.get("time")
        if not decided:
            continue
        key = (pool, str(decided))
        known = seen.get(key)
        if known is not None and known.seconds is not None:
            continue
        method = known.method if known is not None else "restart"
        if known is None and rollout.get("fromMode", "On") != status.get("speculation", "On"):
            standby = (spec_pools.get(pool, {}).get("rollout") or {}).get("flip") == "Standby" and (
                (status.get("standby") or {}).get("available", True)
            )
            method = "Standby flip" if standby else "restart flip"
        settled = rollout.get("settledTime")
        seconds = _timestamp(str(settled)) - _timestamp(str(decided)) if settled else None
        seen[key] = Rollout(method, seconds)


Tick = Callable[[Phase, float], None]


def run_scenario(
    scenario: Scenario,
    router_url: str,
    model: str,
    *,
    on_tick: Tick | None = None,
    tick_seconds: float = 2.0,
    max_tokens: int = 48,
) -> ScenarioResult:
    """Drive every phase through the router; bounded by the scenario's length (plus a drain)."""
    bound = scenario.seconds + 120
    interactive = LoadGenerator(
        router_url, model, max_tokens=max_tokens, max_seconds=bound, name="interactive"
    )
    batch = LoadGenerator(
        router_url,
        model,
        max_tokens=max_tokens,
        max_seconds=bound,
        headers={TENANT_HEADER: BATCH_TENANT},
        name="batch-tenant",
        api_key="nightly-evals",
    )
    result = ScenarioResult(scenario, started_wall=time.time())
    first = scenario.phases[0]
    interactive.start(first.interactive)
    batch.start(first.batch)
    try:
        for phase in scenario.phases:
            if phase.shifted is not None:
                interactive.topic = SHIFT_TOPIC if phase.shifted else ""
            interactive.set_concurrency(phase.interactive)
            batch.set_concurrency(phase.batch)
            batch.prompt_words = phase.batch_prompt_words
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < phase.seconds:
                if on_tick is not None:
                    on_tick(phase, elapsed)
                time.sleep(min(tick_seconds, max(0.0, phase.seconds - elapsed)))
            result.phases.append(
                PhaseRecord(phase, started, time.monotonic(), interactive.snapshot(), batch.snapshot())
            )
    finally:
        final_interactive, final_batch = interactive.stop(), batch.stop()
    if result.phases:
        # Requests still in flight at the end finish during the drain: count them in the last phase.
        result.phases[-1].interactive, result.phases[-1].batch = final_interactive, final_batch
    return result


def _tokens(stats: LoadStats, pool: str) -> int:
    return stats.tokens_by_pool.get(pool, 0)


def phase_rows(result: ScenarioResult) -> list[dict[str, Any]]:
    """Per phase: requests served and failed, and generated tokens per second by serving pool."""
    rows = []
    previous_i, previous_b = LoadStats(), LoadStats()
    for record in result.phases:
        seconds = max(1e-9, record.ended - record.started)
        i, b = record.interactive, record.batch
        rows.append(
            {
                "phase": record.phase.name,
                "seconds": round(seconds),
                "served": i.ok + b.ok - previous_i.ok - previous_b.ok,
                "failed": i.failed + b.failed - previous_i.failed - previous_b.failed,
                "latencyTokensPerSecond": (
                    _tokens(i, "latency")
                    + _tokens(b, "latency")
                    - _tokens(previous_i, "latency")
                    - _tokens(previous_b, "latency")
                )
                / seconds,
                "batchTokensPerSecond": (
                    _tokens(i, "batch")
                    + _tokens(b, "batch")
                    - _tokens(previous_i, "batch")
                    - _tokens(previous_b, "batch")
                )
                / seconds,
            }
        )
        previous_i, previous_b = i, b
    return rows


def summary_lines(
    result: ScenarioResult,
    history: Sequence[Mapping[str, Any]],
    rollouts: Mapping[RolloutKey, Rollout] | None = None,
) -> list[str]:
    """The end-of-run report: requests, tokens/s per pool per phase, and every decision with its numbers
    and, where `observe_rollouts` saw it, how it rolled out and how long that took."""
    lines = [
        f"scenario {result.scenario.name}: {result.served} requests served, {result.failed} failed",
        f"  {'phase':<16}{'seconds':>8}{'served':>8}{'failed':>8}{'latency tok/s':>15}{'batch tok/s':>13}",
    ]
    for row in phase_rows(result):
        lines.append(
            f"  {row['phase']:<16}{row['seconds']:>8}{row['served']:>8}{row['failed']:>8}"
            f"{row['latencyTokensPerSecond']:>15.1f}{row['batchTokensPerSecond']:>13.1f}"
        )
    started = time.strftime("%H:%M:%S", time.gmtime(result.started_wall))
    decisions = [h for h in history if _after(h.get("time", ""), result.started_wall)]
    lines.append(f"decisions since {started} UTC: {len(decisions)}")
    for h in decisions:
        numbers = h.get("observations") or {}
        shown = ", ".join(
            f"{k}={numbers[k]}"
            for k in ("runningPerReplica", "acceptanceLength", "numSpeculativeTokens")
            if k in numbers
        )
        rollout = (rollouts or {}).get((str(h.get("pool")), str(h.get("time"))))
        took = ""
        if rollout is not None:
            settled = (
                "not settled by the end" if rollout.seconds is None else f"settled in {rollout.seconds:.0f} s"
            )
            took = f"  ({rollout.method}, {settled})"
        lines.append(
            f"  {h.get('time')}  {h.get('pool'):<8} {h.get('from')} -> {h.get('to')}  {h.get('reason')}"
            + took
            + (f"  [{shown}]" if shown else "")
        )
    for error in (result.interactive.errors + result.batch.errors)[:5]:
        lines.append(f"  error: {error}")
    return lines


def _timestamp(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _after(rfc3339: str, wall: float) -> bool:
    try:
        return _timestamp(rfc3339) >= wall - 1
    except ValueError:
        return False


def content_shift_args() -> list[str]:
    """The emulator options that make SHIFT_TOPIC's prompts draft at SHIFTED_ACCEPTANCE."""
    return ["--content-acceptance", f"{SHIFT_TOPIC}={','.join(map(str, SHIFTED_ACCEPTANCE))}"]
