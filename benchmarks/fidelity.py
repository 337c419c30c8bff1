"""The fleet simulator beside published real-GPU measurements of speculative decoding (docs/benchmarks/fidelity.md).

Every published run is data (`RUNS`): its source, model, GPU, tensor parallel size, drafter, K, the
per-position acceptance the simulator is given (as published, or derived from what was published, and
how), the load (a closed loop of that many clients, which is how `max-concurrency`, `max_num_seqs`
and a paper's batch size run), the prompt and output lengths, the published quantity and its value,
and which inputs the source leaves free with the value assumed here. Each run is simulated twice on
the product's own simulator (`specfleet.sim.simulate`, one replica, a static strategy): speculation
on at the run's K and off (an engine without the drafter), and the published quantity is computed
from the pair the way the source computed it:

- TPOT ratio: the mean time per output token off over on (the speedup a request sees);
- throughput ratio: generated tokens per second on over off.

Nothing is fitted to these rows. The simulator runs on the default cost profile the product picks for
the run's drafter method (`default_profile`: for EAGLE-1 the published H100 / Llama-3.1-8B step-time
table from vLLM's Dynamic SD pull request, with its prefill price; for EAGLE-3 that table plus the
EAGLE-3 drafter's longer step measured at batch 1 in vLLM issue #20780) and only the inputs each source
states or implies change between rows. Where a row is off, the page
says which term of the model is responsible; where a source leaves an input free, it says so.

Runs found that the simulator cannot be run on without inventing a step-time table (another model,
GPU or engine) are listed in `NOT_SIMULATED`, with the reason.

    python benchmarks/fidelity.py [--out docs/benchmarks/fidelity.md] [--duration 600]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

from specfleet.api.validation import SpeculativeDeployment, parse_resource
from specfleet.sim.fleet import RunResult, SimOptions, Strategy, simulate
from specfleet.sim.workload import ClosedLoop
from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    PUBLISHED_H100_LLAMA31_8B_EAGLE,
    VLLM_20780_EAGLE1_AL,
    VLLM_20780_EAGLE1_TPOT_MS,
    VLLM_20780_EAGLE3_AL,
    VLLM_20780_EAGLE3_TPOT_MS,
    VLLM_20780_VANILLA_TPOT_MS,
    StepTimeProfile,
    default_profile,
    validate_acceptance,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "02-two-pools-routing-policy.yaml"
OUT = ROOT / "docs" / "benchmarks" / "fidelity.md"
COMMAND = "python benchmarks/fidelity.py"
# How far the simulated value may be from the published one (issue 47's target): |sim / pub - 1|.
TOLERANCE = 0.15

TPOT_RATIO = "TPOT off / on"
THROUGHPUT_RATIO = "throughput on / off"

DYNAMIC_SD = "https://github.com/vllm-project/vllm/pull/32374"
EAGLE3_PAPER = "https://arxiv.org/abs/2503.01840"
AL_BY_K = "https://github.com/vllm-project/vllm/issues/20780"
EAGLE3_SUPPORT = "https://github.com/vllm-project/vllm/pull/16937"
MT_BENCH_LENGTHS = "https://github.com/vllm-project/vllm/pull/16035"

# MT-bench single-turn requests as vLLM's offline EAGLE example runs them, derived from the log line in
# MT_BENCH_LENGTHS (80 prompts, 1.61 s each, 47.09 input and 128.64 output tokens/s): 47.09 x 1.61 = 76
# prompt tokens and 128.64 x 1.61 = 207 generated tokens per request.
MT_BENCH = (76, 207)


def cumulative_from_lengths(lengths: Mapping[int, float], first: float) -> tuple[float, ...]:
    """Per-position cumulative acceptance from mean acceptance lengths measured at consecutive K
    (AL(K) = 1 + p_0 + ... + p_{K-1}, so p_{K-1} = AL(K) - AL(K-1)); `first` is p_0 where the smallest
    K measured is 2 (AL(2) gives only p_0 + p_1, and a static K >= 2 run depends only on that sum)."""
    ks = sorted(lengths)
    if ks[0] != 2 or ks != list(range(2, ks[-1] + 1)):
        raise ValueError("acceptance lengths must be at K = 2, 3, ... consecutively")
    out = [first, lengths[2] - 1.0 - first]
    out += [lengths[k] - lengths[k - 1] for k in ks[1:]]
    return validate_acceptance(round(p, 4) for p in out)


# Mean acceptance length by K on MT-bench, Llama-3.1-8B-Instruct (AL_BY_K's table; the runtime holds
# it, since the EAGLE-3 default profile is computed from it).
EAGLE1_AL = VLLM_20780_EAGLE1_AL
EAGLE3_AL = VLLM_20780_EAGLE3_AL
# p_0 where only p_0 + p_1 is published: EAGLE-1's from the Dynamic SD profile (0.68); EAGLE-3's in
# the ratio of the EAGLE-3 preset's first two positions (0.75 : 0.55) of AL(2) - 1 = 1.36.
EAGLE1_ACCEPTANCE = cumulative_from_lengths(EAGLE1_AL, PUBLISHED_ACCEPTANCE[0])
EAGLE3_ACCEPTANCE = cumulative_from_lengths(EAGLE3_AL, round(1.36 * 0.75 / 1.30, 3))
SPLIT_NOTE = "the split of p0 + p1 (immaterial: a static K >= 2 run depends on the sum)"
ACCEPTANCE_FROM_AL = "partial differences of the source's acceptance length at K = 2..7"


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and every input the simulator is given for it."""

    group: str
    source: str  # URL
    model: str
    gpu: str
    tp: int
    drafter: str
    k: int
    acceptance: tuple[float, ...]  # per-position cumulative, as given to the simulator
    acceptance_how: str  # as published, or how it was derived
    concurrency: int  # clients of the closed loop (the source's concurrency / batch size)
    lengths: tuple[int, int]  # (prompt tokens, generated tokens) of every request
    lengths_how: str
    quantity: str  # TPOT_RATIO or THROUGHPUT_RATIO
    published: float
    # The measurements the published ratio is the quotient of, (numerator, denominator), where the
    # source gives them; the ratio must agree with them.
    parts: tuple[float, float] | None = None
    free: str = ""  # inputs the source leaves free, and the value assumed here

    @property
    def label(self) -> str:
        return f"{self.drafter} K={self.k} at {self.concurrency}"

    @property
    def method(self) -> str:
        """The vLLM speculative method of the run's drafter, which the resource names and by which the
        product picks its default step-time table."""
        return "eagle3" if self.drafter.startswith("EAGLE-3") else "eagle"


# The Dynamic SD profile's conclusions, as the reference quotes them from its table (best K per batch
# and its per-request goodput over K=0). They are the default profile's own numbers: a check that the
# simulated engine reproduces its table's speedups with scheduling and prefill, not an independent test.
_DSD_LENGTHS = "not stated; MT-bench (76 / 207) assumed"


def _dsd(k: int, c: int, value: float) -> PublishedRun:
    return PublishedRun(
        "Dynamic SD profile (circular: the simulator's own table)",
        DYNAMIC_SD,
        "Llama-3.1-8B-Instruct",
        "H100 80GB",
        1,
        "EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B)",
        k,
        PUBLISHED_ACCEPTANCE,
        "as published (0.68, 0.39, 0.20, 0.10, 0.05)",
        c,
        MT_BENCH,
        _DSD_LENGTHS,
        TPOT_RATIO,
        value,
        free="prompt and output lengths (MT-bench assumed); the ratio is decode-only goodput",
    )


_E3_PAPER_FREE = (
    "acceptance (not given for this table: the same drafter's vLLM AL on MT-bench assumed); the engine "
    "(SGLang: the simulator's step table is vLLM's); the EAGLE-3 drafter's extra step above batch 1 "
    "(the batch-1 one assumed)"
)


def _eagle3_paper(c: int, value: float) -> PublishedRun:
    return PublishedRun(
        "EAGLE-3 paper, SGLang throughput by batch size",
        EAGLE3_PAPER,
        "Llama-3.1-8B-Instruct",
        "H100",
        1,
        "EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B), chain",
        3,
        EAGLE3_ACCEPTANCE,
        f"derived from {AL_BY_K}: {ACCEPTANCE_FROM_AL}",
        c,
        MT_BENCH,
        f"MT-bench; lengths derived from {MT_BENCH_LENGTHS}",
        THROUGHPUT_RATIO,
        value,
        free=_E3_PAPER_FREE,
    )


# TPOT at batch 1 (ms) by K, MT-bench, from AL_BY_K; vanilla (no drafter) 7.07 ms.
VANILLA_TPOT_MS = VLLM_20780_VANILLA_TPOT_MS
EAGLE1_TPOT_MS = VLLM_20780_EAGLE1_TPOT_MS
EAGLE3_TPOT_MS = VLLM_20780_EAGLE3_TPOT_MS
_AL_FREE = "the GPU (not stated; the author's H100 assumed); " + SPLIT_NOTE


def _al_by_k(drafter: str, acceptance: tuple[float, ...], tpot: Mapping[int, float]) -> list[PublishedRun]:
    return [
        PublishedRun(
            f"vLLM TPOT by K at batch 1, {drafter.split(' ', maxsplit=1)[0]}",
            AL_BY_K,
            "Llama-3.1-8B-Instruct",
            "not stated (H100 assumed)",
            1,
            drafter,
            k,
            acceptance,
            ACCEPTANCE_FROM_AL,
            1,
            MT_BENCH,
            f"MT-bench; lengths derived from {MT_BENCH_LENGTHS}",
            TPOT_RATIO,
            round(VANILLA_TPOT_MS / on, 3),
            parts=(VANILLA_TPOT_MS, on),
            free=_AL_FREE,
        )
        for k, on in tpot.items()
    ]


# Output tokens/s at max_num_seqs 1 (offline, so prefill is inside), MT-bench, 80 prompts; vanilla 133.
def _eagle1_offline(k: int, tokens_per_s: float) -> PublishedRun:
    return PublishedRun(
        "vLLM offline output tokens/s at batch 1, EAGLE-1",
        EAGLE3_SUPPORT,
        "Llama-3.1-8B-Instruct",
        "H100",
        1,
        "EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B)",
        k,
        EAGLE1_ACCEPTANCE,
        f"derived from {AL_BY_K} (same model, drafter and dataset): {ACCEPTANCE_FROM_AL}",
        1,
        MT_BENCH,
        f"MT-bench; lengths derived from {MT_BENCH_LENGTHS}",
        THROUGHPUT_RATIO,
        round(tokens_per_s / 133.0, 3),
        parts=(tokens_per_s, 133.0),
        free="acceptance (from another run of the same setup); " + SPLIT_NOTE,
    )


EAGLE1 = "EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B)"
EAGLE3 = "EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)"

RUNS: tuple[PublishedRun, ...] = (
    _dsd(3, 1, 1.65),
    _dsd(3, 16, 1.65),
    _dsd(1, 64, 1.35),
    _dsd(1, 256, 0.90),
    _dsd(3, 256, 0.79),
    *_al_by_k(EAGLE1, EAGLE1_ACCEPTANCE, EAGLE1_TPOT_MS),
    *_al_by_k(EAGLE3, EAGLE3_ACCEPTANCE, EAGLE3_TPOT_MS),
    _eagle1_offline(2, 201.69),
    _eagle1_offline(4, 198.0),
    _eagle1_offline(7, 169.92),
    _eagle3_paper(2, 1.81),
    _eagle3_paper(4, 1.82),
    _eagle3_paper(8, 1.62),
    _eagle3_paper(16, 1.48),
    _eagle3_paper(32, 1.32),
    _eagle3_paper(64, 1.38),
)


@dataclass(frozen=True)
class NotSimulated:
    """A published run found but not simulated, and why."""

    source: str
    what: str
    why: str


_NO_TABLE = "no measured step-time table for this model and GPU; deriving one would fit the row"
NOT_SIMULATED: tuple[NotSimulated, ...] = (
    NotSimulated(
        'shared/reference/seed-article.txt ("Speculative Decoding in Production: When EAGLE-3 Pays '
        "Off\", quoting vLLM's AMD Instinct benchmark)",
        "MiniMax-M2.5, EAGLE-3, AMD Instinct: throughput 1.79x at concurrency 4, 1.38x at 64",
        f"{_NO_TABLE} (a mixture-of-experts model; GPU model, TP and lengths not stated)",
    ),
    NotSimulated(
        "https://github.com/vllm-project/vllm/pull/24243",
        "MiniCPM3, EAGLE-3, one RTX 4090: 1.71x at concurrency 1, 1.62x at 10 (acceptance per position given)",
        _NO_TABLE,
    ),
    NotSimulated(
        "https://github.com/sgl-project/sglang/pull/4716",
        "Llama-3.3-70B, EAGLE-3, H100 TP 8, SGLang: 88.61 -> 234.54 tokens/s at batch 1, AL 5.88",
        f"{_NO_TABLE}; tree drafting (top-k 8, 64 draft tokens), which the simulator does not model",
    ),
)


def resource(method: str = "eagle3") -> SpeculativeDeployment:
    """Example 02 as one replica of the latency pool (batch pool empty), its speculation set by the
    static strategy of each run; no canary replica (one replica cannot hold one back); its drafter's
    method the run's (which picks the simulator's default step-time table, as in the product)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["drafter"]["method"] = method
    doc["spec"]["pools"]["latency"]["replicas"] = 1
    doc["spec"]["pools"]["batch"]["replicas"] = 0
    doc["spec"]["pools"]["batch"]["speculation"] = "Off"
    doc["spec"]["policy"]["reentry"]["canaryReplicas"] = 0
    return parse_resource(doc)


@dataclass(frozen=True)
class Simulated:
    """One run's pair of simulations and the quantity computed from them."""

    run: PublishedRun
    value: float
    tpot_on_ms: float
    tpot_off_ms: float
    tokens_on: float
    tokens_off: float

    @property
    def ratio(self) -> float:
        return self.value / self.run.published

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE


def _closed_loop(
    run: PublishedRun,
    duration: float,
    strategy: Strategy,
    profile: StepTimeProfile | None,
    prefill: float | None,
) -> RunResult:
    workload = ClosedLoop(
        ((0.0, run.concurrency), (duration, run.concurrency)), (run.lengths,), name="fidelity"
    )
    options = SimOptions(seed=0, acceptance=run.acceptance, prefill_ms_per_token=prefill)
    return simulate(resource(run.method), workload, strategy, options, profile)


def simulate_run(
    run: PublishedRun,
    duration: float = 600.0,
    profile: StepTimeProfile | None = None,
    prefill_ms_per_token: float | None = None,
) -> Simulated:
    """Simulate `run` with speculation on (its K) and off, and compute its published quantity (on the
    default profile of its drafter's method, which the simulator picks from the resource, and its
    prefill price, unless a diagnostic asks for another)."""
    on = _closed_loop(run, duration, Strategy("on", "static", "On", run.k), profile, prefill_ms_per_token)
    off = _closed_loop(run, duration, Strategy("off", "static", "Off"), profile, prefill_ms_per_token)
    tpot_on = float(np.mean(on.pools["latency"].tpot))
    tpot_off = float(np.mean(off.pools["latency"].tpot))
    if run.quantity == TPOT_RATIO:
        value = tpot_off / tpot_on
    elif run.quantity == THROUGHPUT_RATIO:
        value = on.tokens_per_second / off.tokens_per_second
    else:
        raise ValueError(f"unknown quantity {run.quantity!r}")
    return Simulated(run, value, tpot_on * 1e3, tpot_off * 1e3, on.tokens_per_second, off.tokens_per_second)


@dataclass(frozen=True)
class Diagnostic:
    """A row simulated again with one term of the model changed, to show how much of its gap it explains."""

    index: int  # the row's number in the results table
    change: str
    headline: Simulated
    changed: Simulated


def diagnostics(results: list[Simulated], duration: float) -> list[Diagnostic]:
    """Prefill free for the Dynamic SD rows (their published ratio is decode-only goodput); every
    EAGLE-3 row on the EAGLE-1 table (the one default before the default was per drafter method), to
    show what the EAGLE-3 drafter's measured extra step time changes."""
    out = []
    for i, s in enumerate(results, 1):
        if s.run.source == DYNAMIC_SD:
            changed = simulate_run(s.run, duration, prefill_ms_per_token=0.0)
            out.append(Diagnostic(i, "prefill free (decode only, as the published ratio)", s, changed))
        elif s.run.drafter.startswith("EAGLE-3"):
            changed = simulate_run(s.run, duration, profile=PUBLISHED_H100_LLAMA31_8B_EAGLE)
            out.append(
                Diagnostic(i, "EAGLE-1 table (no EAGLE-3 drafter extra; the former default)", s, changed)
            )
    return out


def _diagnostics_table(rows: list[Diagnostic]) -> list[str]:
    lines = [
        "| # | run | changed term | published | simulated | simulated / published | with the term changed "
        "| changed / published | within 15% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in rows:
        r = d.headline.run
        ratio = d.changed.value / r.published
        lines.append(
            f"| {d.index} | {r.label} | {d.change} | {r.published:.3f} | {d.headline.value:.3f} | "
            f"{d.headline.ratio:.3f} | {d.changed.value:.3f} | {ratio:.3f} | "
            f"{'yes' if abs(ratio - 1) <= TOLERANCE else '**no**'} |"
        )
    return lines


def _inputs_table() -> list[str]:
    lines = [
        "| # | source | model | GPU | TP | drafter | K | acceptance p0..p(K-1) (how) | load | "
        "prompt / output (how) | published quantity | value | free inputs (value assumed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(RUNS, 1):
        acc = ", ".join(f"{p:.3g}" for p in r.acceptance[: r.k])
        parts = f" ({r.parts[0]:g} / {r.parts[1]:g})" if r.parts else ""
        lines.append(
            f"| {i} | <{r.source}> | {r.model} | {r.gpu} | {r.tp} | {r.drafter} | {r.k} | {acc} "
            f"({r.acceptance_how}) | {r.concurrency} clients | {r.lengths[0]} / {r.lengths[1]} "
            f"({r.lengths_how}) | {r.quantity} | {r.published:g}{parts} | {r.free} |"
        )
    return lines


def _results_table(results: list[Simulated]) -> list[str]:
    lines = [
        "| # | group | run | quantity | published | simulated | simulated / published | within 15% | "
        "simulated TPOT on / off (ms) | free inputs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, s in enumerate(results, 1):
        r = s.run
        lines.append(
            f"| {i} | {r.group} | {r.label} | {r.quantity} | {r.published:.3f} | {s.value:.3f} | {s.ratio:.3f} | "
            f"{'yes' if s.within else '**no**'} | {s.tpot_on_ms:.2f} / {s.tpot_off_ms:.2f} | {r.free} |"
        )
    return lines


def _step_table() -> list[str]:
    """The batch-1 step time each source implies (TPOT x acceptance length) beside the simulator's (the
    default table of the drafter's method)."""
    profile = default_profile()
    lines = [
        "| drafter | K | published TPOT (ms) | x AL | = published step (ms) | simulator's step at batch 1 (ms) "
        "| simulator / published |",
        "|---|---|---|---|---|---|---|",
        f"| none | 0 | {VANILLA_TPOT_MS} | 1 | {VANILLA_TPOT_MS:.2f} | {profile.step_time_ms(1, 0):.2f} | "
        f"{profile.step_time_ms(1, 0) / VANILLA_TPOT_MS:.3f} |",
    ]
    for name, method, tpot, lengths in (
        ("EAGLE-1", "eagle", EAGLE1_TPOT_MS, EAGLE1_AL),
        ("EAGLE-3", "eagle3", EAGLE3_TPOT_MS, EAGLE3_AL),
    ):
        for k, t in tpot.items():
            step = t * lengths[k]
            sim = default_profile(method).step_time_ms(1, k)
            lines.append(f"| {name} | {k} | {t} | {lengths[k]} | {step:.2f} | {sim:.2f} | {sim / step:.3f} |")
    return lines


def render(results: list[Simulated], checks: list[Diagnostic], duration: float, seconds: float) -> str:
    within = sum(s.within for s in results)
    independent = [s for s in results if not s.run.group.startswith("Dynamic SD")]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Fidelity: the simulator beside published GPU measurements",
        "",
        f"Generated by `{COMMAND}` on {now} ({platform.machine()}, Python {platform.python_version()}, "
        f"{len(results)} runs x 2 simulations of {duration:.0f} s each, {seconds:.0f} s of wall time). "
        "Do not edit by hand.",
        "",
        "Each published run below states (or lets one derive) its model, GPU, tensor parallel size, "
        "drafter, K, acceptance and load. The simulator (`specfleet.sim.simulate`, one replica, a closed "
        "loop of the run's concurrency, speculation on at the run's K and off) runs on the default cost "
        "profile of the run's drafter method; only the inputs the source gives change between rows, and nothing is fitted to them. "
        f"Target: every ratio the inputs fully determine within {TOLERANCE:.0%}.",
        "",
        f"**{within} of {len(results)} rows within {TOLERANCE:.0%}; "
        f"{sum(s.within for s in independent)} of {len(independent)} of the rows that are not the "
        "simulator's own table.**",
        "",
        "## Simulated against published",
        "",
        *_results_table(results),
        "",
        "## Where the simulator is off, and why",
        "",
        *WHY,
        "",
        "The batch-1 step time each published TPOT implies (TPOT x the acceptance length at that K, the "
        "tokens a step yields) beside the simulator's step time (the default profile of the drafter's "
        "method; K 2 and 4 interpolate the table, K 6 and 7 past it follow the roofline's drafter cost "
        "per draft):",
        "",
        *_step_table(),
        "",
        "The EAGLE-3 rows and the Dynamic SD rows simulated again with one term changed (not the "
        "headline): the EAGLE-3 rows on the EAGLE-1 table, as before the default was per drafter "
        "method; the Dynamic SD rows with prefill free, as the published quantity's own definition "
        "(not in the product):",
        "",
        *_diagnostics_table(checks),
        "",
        "## The published runs (inputs)",
        "",
        *_inputs_table(),
        "",
        "Runs found but not simulated:",
        "",
        "| source | what | why not |",
        "|---|---|---|",
        *(f"| {n.source} | {n.what} | {n.why} |" for n in NOT_SIMULATED),
        "",
    ]
    return "\n".join(out)


# Why the rows that miss do, read off the tables this script prints (row numbers as in the results).
WHY: list[str] = [
    "- **The drafter's cost (rows 12-17, 21-26): what the per-drafter default changed.** The published "
    "step table was measured with the EAGLE-1 drafter; the source of rows 6-17 "
    f"({AL_BY_K}) measured the step with the EAGLE-3 drafter 1.0-2.4 ms longer than with EAGLE-1 at "
    "batch 1 (the step table below). On the EAGLE-1 table, the one default before, the simulator "
    "credited EAGLE-3's longer acceptance without its longer step and over-predicted its speedup by "
    "15-22% at batch 1 and by up to 26% in the EAGLE-3 paper's rows (the EAGLE-1-table rows below). "
    "The product's default for `method: eagle3` is now that table plus the measured extra per K at "
    "every batch (`default_profile`), and every EAGLE-3 row is within 15%: rows 12-15, at the K the "
    "table holds or interpolates, within 3% (in part circular: the term comes from these rows' own "
    "source); the EAGLE-3 paper's rows, which did not supply it, 8% under to 12% over. A measured "
    "profile (`specfleet profile`) still replaces it for other hardware.",
    "- **Past the table's K (rows 16-17).** The table stops at K 5; K 6 and 7 follow the roofline fitted "
    "to it, whose cost per draft on the EAGLE-3 table (the extra grows 0.34 ms a draft from K 3 to 5) "
    "is more than the source measured past K 5 (its extra stays at 2.3-2.4 ms from K 5 to 7). The "
    "simulated step there is 0.95-0.99 of the published one where the other K are 0.90-0.92, so the "
    "ratio is 4-8% under.",
    "- **Between the table's batches (rows 21-26).** The default table has no point between batch 1 "
    "and 64, so the step is linear in between; the EAGLE-3 paper's ratio falls faster from 8 to 32 "
    "and rises again from 32 (1.32) to 64 (1.38), a shape no step time monotone in batch gives: its "
    "rows are 6-8% under at 2 and 4, 1-12% over from 8 to 32, 3% under at 64. The EAGLE-3 drafter's "
    "extra above batch 1 is not measured (the default carries the batch-1 term to every batch, a free "
    "input); the engine is SGLang and the acceptance is not published with the table (the same "
    "drafter's vLLM acceptance is assumed): all free.",
    "- **Prefill (rows 2-5).** The Dynamic SD ratios are decode-only goodput from the simulator's own "
    "table; the simulator prices each prompt's prefill, which speculation does not speed up, so its "
    "ratio is lower where requests turn over often (row 3: 0.928 of the published value, 0.998 with "
    "prefill free). The quoted 1.65 at batch 16 is rounded: the table itself gives 1.548 there "
    "(row 2, prefill free).",
    "- **Per-request overhead (rows 18-20).** Offline output tokens/s at one request include each "
    "request's start and the engine's per-request work, which the simulator prices only as prefill; "
    "it is 5-10% high there, while the TPOT ratios of the same setup (rows 6-11) are within 4%.",
    "- **Absolute step time.** The simulator's step without a drafter is 0.92 of the vanilla TPOT "
    "published in rows 6-17 (another vLLM version; the GPU is not stated); the ratios cancel it.",
    "- **Crossing point.** The only published loss (speculation slower than none, at batch 256) is the "
    "simulator's own table (rows 4-5); no independent source here measured a crossing, so none is "
    "checked against one.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds simulated per run")
    args = parser.parse_args(argv)
    start = time.monotonic()
    results = []
    for i, run in enumerate(RUNS, 1):
        print(f"[{i}/{len(RUNS)}] {run.group}: {run.label}", file=sys.stderr)
        results.append(simulate_run(run, args.duration))
    print("diagnostics", file=sys.stderr)
    checks = diagnostics(results, args.duration)
    report = render(results, checks, args.duration, time.monotonic() - start)
    args.out.write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
