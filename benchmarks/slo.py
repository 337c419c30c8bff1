"""Latency SLOs in the simulator: the share of requests that meet a TTFT and a TPOT target, for the policy,
every fixed setting, the rollout-paying bound and the per-level oracle of the SLO.

    python benchmarks/slo.py [--out docs/benchmarks] [--scenarios ramp,azure-conv] [--drafters weak]

Runs the fleet simulator (`specfleet.sim.compare`) on benchmarks/policy.py's scenarios (ramp, the two
Azure traces) and the long-context scenario of benchmarks/memory_scenarios.py, for the published and
the weak drafter, plus held-out traces (other seeds), and judges each run's latency pool against three
SLOs (`specfleet.sim.slo`): the share of its requests whose TTFT and TPOT both meet the targets
(attainment), and the per-level oracle's (each window's best fixed setting for that SLO). The policy runs
once with each SLO on the latency pool (it then picks the setting predicted to meet it most,
`specfleet.policy.rules.slo`) and once without (Goodput by throughput), the fixed settings once. Writes docs/benchmarks/slo.md.

The SLOs are set from the 8B profile's physics, not from the runs: the TPOT target (12 ms) lies between
its decode step at 64 running requests (7.8 ms) and at 256 (14.5 ms), so which setting meets it depends
on the load and on how many tokens a step yields; the TTFT target (300 ms) is a few times a
2,000-token prompt's prefill (80 ms on the profile), so queueing and the drafter's share of the prefill
decide it; the interactive one (TTFT 1 s, TPOT 50 ms) is missed only where a pool queues.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from specfleet.api.pools import LatencySlo
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.predict.dynamic_sd import best_schedule
from specfleet.sim.bound import NAME as BOUND
from specfleet.sim.compare import FIXED_KINDS, Comparison, compare
from specfleet.sim.fleet import RunResult, SimOptions, simulate
from specfleet.sim.options import Strategy
from specfleet.sim.slo import Targets, attainment, oracle_attainment, start_paying_bound
from specfleet.sim.workload import ACCEPTANCE_PROFILES, ClosedLoop, Trace
from specfleet_runtime.cost_profile import PUBLISHED_H100_LLAMA31_8B_EAGLE

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_scenarios
import policy as bench

ROOT = Path(__file__).resolve().parents[1]
POOL = "latency"
SLOS = {
    "interactive": Targets(1.0, 0.050),
    "tpot-tight": Targets(5.0, 0.012),
    "ttft-tight": Targets(0.300, 0.100),
}
SCENARIOS = ("ramp", "azure-conv", "azure-code", "long-context-8b")
DRAFTERS = ("published", "weak")
# Held-out traces: other seeds of two scenarios, drawn before any was run.
HELD_OUT = (("ramp", "published", 7), ("azure-conv", "weak", 7))
# The targets a policy that maximises attainment is held to (issue 48).
ORACLE_SHARE = 0.97
BEHIND = 0.01


def _with_slo(sd: SpeculativeDeployment, targets: Targets) -> SpeculativeDeployment:
    """`sd` with the SLO `targets` on its latency pool, for the policy to steer by."""
    ms = {
        "timeToFirstTokenMilliseconds": None if targets.ttft_s is None else round(targets.ttft_s * 1000),
        "timePerOutputTokenMilliseconds": None if targets.tpot_s is None else round(targets.tpot_s * 1000),
    }
    slo = LatencySlo.model_validate({k: v for k, v in ms.items() if v is not None})
    latency = sd.spec.pools.latency.model_copy(update={"slo": slo})
    pools = sd.spec.pools.model_copy(update={"latency": latency})
    return dataclasses.replace(sd, spec=sd.spec.model_copy(update={"pools": pools}))


def run_case(
    name: str, drafter: str, seed: int
) -> tuple[Comparison, dict[str, RunResult], Callable[[Targets], RunResult]]:
    """Every strategy and the rollout-paying bound on one scenario, drafter and seed (the policy without
    an SLO: it steers by throughput), the policy steering by each SLO, and the start-paying bound of an
    SLO (`specfleet.sim.slo.start_paying_bound`, run where a row asks for it)."""
    acceptance = ACCEPTANCE_PROFILES[drafter]
    workload: Trace | ClosedLoop
    if name in memory_scenarios.scenarios():
        scenario = memory_scenarios.scenarios()[name]
        sd, profile = scenario.sd, scenario.profile
        options = SimOptions(seed=seed, acceptance=acceptance, startup_seconds=scenario.startup_seconds)
        workload = scenario.trace(acceptance, seed)
    else:
        # The EAGLE-1 table, explicitly: example 02 names an eagle3 drafter, whose default table adds EAGLE-3's
        # longer step, but these scenarios pair the published acceptance (EAGLE-1's, sim/workload.py) with
        # the table measured with that same drafter; engines and policy both run on it, as the report's figures do.
        sd, profile = bench.resource(), PUBLISHED_H100_LLAMA31_8B_EAGLE
        conv = bench.TRACES / "AzureLLMInferenceTrace_conv.csv.gz"
        code = bench.TRACES / "AzureLLMInferenceTrace_code.csv.gz"
        makers = bench.scenario_makers(sd.spec.pools.latency.replicas, conv, code, bench.sizes(conv))
        options = SimOptions(seed=seed, acceptance=acceptance)
        workload = makers[name](drafter)
    comp = compare(sd, workload, options, profile)
    resolved = options.resolved(sd.spec)
    schedule = best_schedule(profile, resolved.acceptance, sd.spec.drafter.num_speculative_tokens)
    steered = {
        slo: simulate(
            _with_slo(sd, targets), workload, Strategy("policy", "policy"), resolved, profile, schedule
        )
        for slo, targets in SLOS.items()
    }
    statics = {n: r for n, r in comp.runs.items() if r.strategy.kind == "static"}

    def bound_for(targets: Targets) -> RunResult:
        return start_paying_bound(sd, workload, statics, resolved, profile, POOL, targets)

    return comp, steered, bound_for


def fixed(comp: Comparison) -> list[str]:
    """The runs a user could launch every engine with: each static setting and in-engine Dynamic SD."""
    return [n for n, r in comp.runs.items() if r.strategy.kind in FIXED_KINDS]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def rows_for(
    label: str, comp: Comparison, steered: dict[str, RunResult], bound_for: Callable[[Targets], RunResult]
) -> list[tuple[str, str]]:
    """One table row per SLO: the cells, and its verdict: "met", "unattainable", "bound" (the start-paying
    bound misses each target the policy misses: no policy that starts in the declared setting and
    reacts meets it) or "missed"."""
    statics = [n for n, r in comp.runs.items() if r.strategy.kind == "static"]
    out = []
    for slo, targets in SLOS.items():
        policy = attainment(steered[slo], POOL, targets)
        by_throughput = attainment(comp.runs["policy"], POOL, targets)
        oracle = oracle_attainment(comp.runs, statics, POOL, targets).attainment
        each = {n: attainment(comp.runs[n], POOL, targets) for n in fixed(comp)}
        known = {n: v for n, v in each.items() if v is not None}
        best = max(known, key=lambda n: known[n]) if known else None
        throughput_best = max(fixed(comp), key=lambda n: comp.ratio(n) or 0.0)
        share = policy / oracle if policy is not None and oracle else None
        gap = policy - known[best] if policy is not None and best is not None else None
        ok = share is not None and share >= ORACLE_SHARE and gap is not None and gap >= -BEHIND
        # No setting attains it in any window (e.g. a TTFT below the prompts' own prefill): no target.
        unattainable = not oracle
        bound = attainment(comp.runs[BOUND], POOL, targets) if BOUND in comp.runs else None
        start_paying = None
        if not ok and not unattainable and policy is not None and oracle and best is not None:
            # Could any policy that starts in the declared setting and reacts reach the targets missed?
            start_paying = attainment(bound_for(targets), POOL, targets)
        bounded = (
            start_paying is not None
            and oracle is not None
            and best is not None
            and (share is None or share >= ORACLE_SHARE or start_paying / oracle < ORACLE_SHARE)
            and (gap is None or gap >= -BEHIND or start_paying - known[best] < -BEHIND)
        )
        verdict = "unattainable" if unattainable else "met" if ok else "bound" if bounded else "missed"
        text = {"unattainable": "unattainable", "met": "yes", "missed": "**no**"}.get(verdict, "")
        if verdict == "bound" and policy is not None and start_paying is not None:
            text = f"bound (policy {policy - start_paying:+.3f} against it)"
        cells = [
            label,
            f"{slo} ({targets.text()})",
            _fmt(policy),
            _fmt(by_throughput),
            _fmt(oracle),
            _fmt(share),
            _fmt(bound),
            _fmt(start_paying),
            *(_fmt(each.get(n)) for n in ("alwaysOff", "alwaysOnK1", "alwaysOnK3", "engineDynamicSD")),
            f"{best} {_fmt(known.get(best or ''))}" if best else "-",
            f"{throughput_best} {_fmt(each.get(throughput_best))}",
            "-" if gap is None else f"{gap:+.3f}",
            text,
        ]
        out.append(("| " + " | ".join(cells) + " |", verdict))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--drafters", default=",".join(DRAFTERS))
    parser.add_argument("--no-held-out", action="store_true", help="skip the held-out traces")
    args = parser.parse_args()
    started = time.monotonic()
    cases = [(s, d, 0) for s in args.scenarios.split(",") if s for d in args.drafters.split(",") if d]
    if not args.no_held_out:
        cases += list(HELD_OUT)
    lines: list[tuple[str, str]] = []
    for name, drafter, seed in cases:
        print(
            f"[{time.monotonic() - started:5.0f}s] {name} / {drafter} / seed {seed}",
            file=sys.stderr,
            flush=True,
        )
        label = f"{name} / {drafter}" + (f" (held out: seed {seed})" if seed else "")
        lines += rows_for(label, *run_case(name, drafter, seed))
    met = sum(1 for _, v in lines if v in ("met", "unattainable"))
    bounded = sum(1 for _, v in lines if v == "bound")
    header = [
        "# Latency SLOs in the simulator",
        "",
        f"Generated by `python benchmarks/slo.py` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC "
        f"({time.monotonic() - started:.0f} s). The share of the latency pool's requests whose TTFT and "
        "TPOT both meet the SLO's targets (attainment), for the policy steering by the SLO (set on "
        "the latency pool as `slo`: `policy.rules.slo`), the same policy without it (Goodput by throughput), "
        "the per-level oracle of the SLO (each window's "
        "best static setting for it, `specfleet.sim.slo`), the rollout-paying bound (the throughput "
        "oracle that pays each rollout), and every fixed setting. 'best fixed' is the fixed setting with "
        "the highest attainment, 'throughput-best' the one with the highest time-weighted throughput "
        "ratio (where they differ, steering by throughput is not steering by the SLO). Targets (issue 48, "
        f"for a policy that maximises attainment): >= {ORACLE_SHARE} of the oracle's and never more "
        f"than {BEHIND} below the best fixed setting's. The oracle counts each window's chosen "
        "setting's own requests, so where the settings finish different numbers of requests in a window "
        "(a closed loop, as on the ramp) its overall share can fall below a fixed setting's. Where the "
        "policy misses a target, the start-paying bound "
        "(`specfleet.sim.slo.start_paying_bound`) is run: the best hindsight schedule of static settings "
        "for the SLO's met requests that starts in the declared setting (every engine, the policy's "
        "too, starts there), changes nothing before the first evaluation and pays each rollout, "
        "simulated. Where it misses each target the policy misses too, the row says 'bound': no policy "
        "that starts as declared and reacts meets that target there, and the cell gives the policy "
        "against the bound. The SLOs "
        "and why they are set where they are: the module docstring of benchmarks/slo.py.",
        "",
        f"Targets met in {met} of {len(lines)} rows (an SLO no fixed setting attains in any window, "
        "such as a TTFT below the prompts' own prefill, counts as met and says unattainable); "
        f"{bounded} more miss them where the start-paying bound misses them too (counted as not met).",
        "",
        "| case | SLO | policy | policy without the SLO | per-level oracle | policy / oracle | rollout-paying bound | "
        "start-paying bound | alwaysOff | "
        "alwaysOnK1 | alwaysOnK3 | engineDynamicSD | best fixed | throughput-best | policy minus best fixed | "
        "targets met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    report = "\n".join([*header, *(row for row, _ in lines), ""])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "slo.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
