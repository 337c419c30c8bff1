"""Latency SLOs in the simulator: the share of requests that meet a TTFT and a TPOT target, for the policy,
every fixed setting, the rollout-paying bound and the per-level oracle of the SLO.

    python benchmarks/slo.py [--out docs/benchmarks] [--scenarios ramp,azure-conv] [--drafters weak]

Runs the fleet simulator (`specfleet.sim.compare`) on benchmarks/policy.py's scenarios (ramp, the two
Azure traces) and the long-context scenario of benchmarks/memory_scenarios.py, for the published and
the weak drafter, plus held-out traces (other seeds), and judges each run's latency pool against three
SLOs (`specfleet.sim.slo`): the share of its requests whose TTFT and TPOT both meet the targets
(attainment), and the per-level oracle's (each window's best fixed setting for that SLO). The policy
steers by throughput (Goodput): it does not act on an SLO yet, so this is the measure a policy that
maximises attainment will be judged by, and where the throughput-best and the SLO-best setting
differ. Writes docs/benchmarks/slo.md.

The SLOs are set from the 8B profile's physics, not from the runs: the TPOT target (12 ms) lies between
its decode step at 64 running requests (7.8 ms) and at 256 (14.5 ms), so which setting meets it depends
on the load and on how many tokens a step yields; the TTFT target (300 ms) is a few times a
2,000-token prompt's prefill (80 ms on the profile), so queueing and the drafter's share of the prefill
decide it; the interactive one (TTFT 1 s, TPOT 50 ms) is missed only where a pool queues.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from specfleet.sim.bound import NAME as BOUND
from specfleet.sim.compare import FIXED_KINDS, Comparison, compare
from specfleet.sim.fleet import SimOptions
from specfleet.sim.slo import Targets, attainment, oracle_attainment
from specfleet.sim.workload import ACCEPTANCE_PROFILES
from specfleet_runtime.cost_profile import default_profile

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


def run_case(name: str, drafter: str, seed: int) -> Comparison:
    """Every strategy and the rollout-paying bound on one scenario, drafter and seed."""
    acceptance = ACCEPTANCE_PROFILES[drafter]
    if name in memory_scenarios.scenarios():
        return memory_scenarios.run(memory_scenarios.scenarios()[name], acceptance, seed=seed)
    sd = bench.resource()
    conv = bench.TRACES / "AzureLLMInferenceTrace_conv.csv.gz"
    code = bench.TRACES / "AzureLLMInferenceTrace_code.csv.gz"
    makers = bench.scenario_makers(sd.spec.pools.latency.replicas, conv, code, bench.sizes(conv))
    options = SimOptions(seed=seed, acceptance=acceptance)
    return compare(sd, makers[name](drafter), options, default_profile())


def fixed(comp: Comparison) -> list[str]:
    """The runs a user could launch every engine with: each static setting and in-engine Dynamic SD."""
    return [n for n, r in comp.runs.items() if r.strategy.kind in FIXED_KINDS]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def rows_for(label: str, comp: Comparison) -> list[tuple[str, bool]]:
    """One table row per SLO: the cells, and whether the targets hold."""
    statics = [n for n, r in comp.runs.items() if r.strategy.kind == "static"]
    out = []
    for slo, targets in SLOS.items():
        policy = attainment(comp.runs["policy"], POOL, targets)
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
        cells = [
            label,
            f"{slo} ({targets.text()})",
            _fmt(policy),
            _fmt(oracle),
            _fmt(share),
            _fmt(bound),
            *(_fmt(each.get(n)) for n in ("alwaysOff", "alwaysOnK1", "alwaysOnK3", "engineDynamicSD")),
            f"{best} {_fmt(known.get(best or ''))}" if best else "-",
            f"{throughput_best} {_fmt(each.get(throughput_best))}",
            "-" if gap is None else f"{gap:+.3f}",
            "unattainable" if unattainable else "yes" if ok else "**no**",
        ]
        out.append(("| " + " | ".join(cells) + " |", ok or unattainable))
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
    lines: list[tuple[str, bool]] = []
    for name, drafter, seed in cases:
        print(
            f"[{time.monotonic() - started:5.0f}s] {name} / {drafter} / seed {seed}",
            file=sys.stderr,
            flush=True,
        )
        label = f"{name} / {drafter}" + (f" (held out: seed {seed})" if seed else "")
        lines += rows_for(label, run_case(name, drafter, seed))
    met = sum(1 for _, ok in lines if ok)
    header = [
        "# Latency SLOs in the simulator",
        "",
        f"Generated by `python benchmarks/slo.py` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC "
        f"({time.monotonic() - started:.0f} s). The share of the latency pool's requests whose TTFT and "
        "TPOT both meet the SLO's targets (attainment), for the policy (Goodput, which steers by "
        "throughput and does not act on an SLO yet), the per-level oracle of the SLO (each window's "
        "best static setting for it, `specfleet.sim.slo`), the rollout-paying bound (the throughput "
        "oracle that pays each rollout), and every fixed setting. 'best fixed' is the fixed setting with "
        "the highest attainment, 'throughput-best' the one with the highest time-weighted throughput "
        "ratio (where they differ, steering by throughput is not steering by the SLO). Targets (issue 48, "
        f"for a policy that maximises attainment): >= {ORACLE_SHARE} of the oracle's and never more "
        f"than {BEHIND} below the best fixed setting's. The oracle counts each window's chosen "
        "setting's own requests, so where the settings finish different numbers of requests in a window "
        "(a closed loop, as on the ramp) its overall share can fall below a fixed setting's. The SLOs "
        "and why they are set where they are: the module docstring of benchmarks/slo.py.",
        "",
        f"Targets met in {met} of {len(lines)} rows (an SLO no fixed setting attains in any window, "
        "such as a TTFT below the prompts' own prefill, counts as met and says unattainable).",
        "",
        "| case | SLO | policy | per-level oracle | policy / oracle | rollout-paying bound | alwaysOff | "
        "alwaysOnK1 | alwaysOnK3 | engineDynamicSD | best fixed | throughput-best | policy minus best fixed | "
        "targets met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    report = "\n".join([*header, *(row for row, _ in lines), ""])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "slo.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
