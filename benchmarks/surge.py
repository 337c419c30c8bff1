"""What the surge pods of a change add: Threshold mode against Goodput, Restart against Standby flips
(docs/benchmarks/surge.md).

The policy benchmark (benchmarks/policy.py) shows the same resource in Threshold mode ahead of Goodput
in some cells of the 8B scenarios, a few of them above the per-level oracle. The oracle and every
fixed setting serve with the pool's declared replicas; a policy's change of a Restart pool is a surge
rollout, whose new pods serve beside the old ones until these drain, and a re-entry canary is one more
pod: for those windows the pool runs more engines than it declares, so each request shares its engine
with fewer others and is served faster, a gain of GPUs rather than of a decision. A policy that changes
more often (Threshold mode flips on each crossing of its thresholds) collects more of it.

Per scenario and drafter, both modes' ratio to the per-level oracle (time-weighted, as the policy
benchmark's tables) over every window, then over the windows where neither ran more ready latency
engines than declared at the window's start or end, and each mode's count of windows with more. Then
the memory-bound scenarios' Restart flips (surge rollouts) against their Standby flips (which take one
engine out at a time and add none) over the windows where the Restart pool ran no extra engines.

    python benchmarks/surge.py [--out docs/benchmarks/surge.md] [--scenarios ramp,azure-code]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_scenarios
import policy as bench

from specfleet.sim.accounts import RunResult
from specfleet.sim.compare import Comparison, compare
from specfleet.sim.compare import extra_engines as compare_extra_engines
from specfleet.sim.fleet import SimOptions, simulate
from specfleet.sim.workload import ACCEPTANCE_PROFILES

THRESHOLD = "policyThreshold"


def extra_engines(run: RunResult, declared: int, bins: int) -> np.ndarray:
    """Per window: whether the latency pool had more ready engines than `declared` at the window's
    start or end (`specfleet.sim.compare.extra_engines` for that pool)."""
    return compare_extra_engines(run, {"latency": declared}, bins)


def row(comp: Comparison, declared: int) -> dict[str, float | int]:
    """Both modes over every window and over the windows where neither ran extra engines."""
    goodput, threshold = comp.bin_ratio("policy"), comp.bin_ratio(THRESHOLD)
    bins = len(goodput)
    extra_g = extra_engines(comp.runs["policy"], declared, bins)
    extra_t = extra_engines(comp.runs[THRESHOLD], declared, bins)
    plain = ~(extra_g | extra_t) & ~np.isnan(goodput) & ~np.isnan(threshold)

    def mean(values: np.ndarray, mask: np.ndarray) -> float:
        return float(values[mask].mean()) if mask.any() else float("nan")

    known = ~np.isnan(goodput) & ~np.isnan(threshold)
    return {
        "goodput": mean(goodput, known),
        "threshold": mean(threshold, known),
        "goodputPlain": mean(goodput, plain),
        "thresholdPlain": mean(threshold, plain),
        "extraGoodput": int(extra_g.sum()),
        "extraThreshold": int(extra_t.sum()),
        "windows": int(known.sum()),
        "plainWindows": int(plain.sum()),
    }


def standby_lines(names: str) -> list[str]:
    """Restart flips (surge rollouts) against Standby flips (no extra engines) on the memory-bound
    scenarios, over every window and over the windows where the Restart pool ran no extra engines."""
    scenarios = memory_scenarios.scenarios()
    lines = [
        "",
        "## Restart against Standby flips",
        "",
        "The memory-bound scenarios of the policy benchmark (benchmarks/memory_scenarios.py, seed 0) with "
        "Restart flips and with Standby flips (which take one engine out at a time and add none). The "
        "policy's ratio to the per-level oracle (time-weighted), over every window and over the windows "
        "where the Restart pool ran no more ready engines than declared.",
        "",
        "| scenario / drafter | Restart | Standby | windows with extra engines (Restart) | Restart, plain "
        "windows | Standby, the same windows | Standby minus Restart, plain windows |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in (n.strip() for n in names.split(",") if n.strip()):
        for drafter in bench.DRAFTERS:
            acceptance = ACCEPTANCE_PROFILES[drafter]
            restart = memory_scenarios.run(scenarios[name], acceptance, only=("policy",))
            standby = memory_scenarios.run(scenarios[f"{name}-standby"], acceptance, only=("policy",))
            declared = scenarios[name].sd.spec.pools.latency.replicas
            r_ratio = restart.bin_ratio("policy")
            s_ratio = standby.bin_ratio("policy")
            extra = extra_engines(restart.runs["policy"], declared, len(r_ratio))
            plain = ~extra & ~np.isnan(r_ratio) & ~np.isnan(s_ratio)
            r_all, s_all = restart.ratio("policy"), standby.ratio("policy")
            r_plain = float(r_ratio[plain].mean()) if plain.any() else float("nan")
            s_plain = float(s_ratio[plain].mean()) if plain.any() else float("nan")
            lines.append(
                f"| {name} / {drafter} | {r_all:.3f} | {s_all:.3f} | {int(extra.sum())} of {len(r_ratio)} | "
                f"{r_plain:.3f} | {s_plain:.3f} | {s_plain - r_plain:+.3f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="write the report here (default: print it)")
    parser.add_argument("--scenarios", default="ramp,azure-conv,azure-code,acceptance-shift")
    parser.add_argument(
        "--memory",
        default="long-context-8b,70b-one-gpu,70b-two-gpus",
        help="memory-bound scenarios whose Restart and Standby rows are set side by side",
    )
    args = parser.parse_args()
    started = time.monotonic()
    sd = bench.resource()
    threshold_sd = dataclasses.replace(
        sd,
        spec=sd.spec.model_copy(update={"policy": sd.spec.policy.model_copy(update={"mode": "Threshold"})}),
    )
    declared = sd.spec.pools.latency.replicas
    conv = bench.TRACES / "AzureLLMInferenceTrace_conv.csv.gz"
    code = bench.TRACES / "AzureLLMInferenceTrace_code.csv.gz"
    makers = bench.scenario_makers(declared, conv, code, bench.sizes(conv))
    profile = bench.PUBLISHED_H100_LLAMA31_8B_EAGLE
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    lines = [
        "# Threshold mode against Goodput: the surge pods of a change",
        "",
        f"Generated by `python benchmarks/surge.py` on {datetime.now(UTC):%Y-%m-%d} "
        f"({platform.machine()}, Python {platform.python_version()}), seed 0, the policy benchmark's "
        "resource, scenarios and profile. Every number below comes from that one run.",
        "",
        (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "",
        "Ratios to the per-level oracle (time-weighted). `plain windows`: those where neither mode ran "
        f"more ready latency engines than the {declared} declared at the window's start or end; "
        "`windows with extra engines`: each mode's count of the others.",
        "",
        "| scenario / drafter | Goodput | Threshold | Threshold minus Goodput | windows with extra engines "
        "(Goodput / Threshold) | plain windows | Goodput, plain windows | Threshold, plain windows | "
        "Threshold minus Goodput, plain windows |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for drafter in bench.DRAFTERS:
            workload = makers[name](drafter)
            options = SimOptions(seed=0, acceptance=ACCEPTANCE_PROFILES[drafter])
            comp = compare(sd, workload, options, profile, only=("policy",))
            comp.runs[THRESHOLD] = simulate(threshold_sd, workload, options=options, profile=profile)
            r = row(comp, declared)
            lines.append(
                f"| {name} / {drafter} | {r['goodput']:.3f} | {r['threshold']:.3f} | "
                f"{r['threshold'] - r['goodput']:+.3f} | {r['extraGoodput']} / {r['extraThreshold']} of "
                f"{r['windows']} | {r['plainWindows']} | {r['goodputPlain']:.3f} | {r['thresholdPlain']:.3f} | "
                f"{r['thresholdPlain'] - r['goodputPlain']:+.3f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    lines += standby_lines(args.memory)
    lines += ["", f"Run time: {time.monotonic() - started:.0f} s.", ""]
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
