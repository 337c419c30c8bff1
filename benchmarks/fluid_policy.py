"""The default policy on the issue-12 ramp and under stationary noisy load, in the fluid pool model.

Drives the operator's own decide/record (and the renderer, for what the engines run) over one Auto
pool of example 02 (3 replicas, one canary, evaluate every 30 s, window 120 s, dwell 300 s, cooldown
600 s, 4 flips/h), with 60 s rollouts and load given as running requests per replica
(tests/support/policy_harness.py). Not the fleet simulator: no queueing, no KV capacity, no
start-up; it isolates the policy's decisions. Prints, per drafter, the time-weighted ratio to the
per-level oracle and the worst minute after the first reaction, next to the static settings; then
flips and adjustments per hour at stationary loads with Poisson-like noise (Goodput: 3 seeds x 2 h
each; Threshold: 1 seed).

    python benchmarks/fluid_policy.py            # about a minute on one core
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.policy_harness import (
    PUBLISHED,
    STRONG,
    WEAK,
    example_spec,
    issue_ramp,
    poisson_noise,
    simulate,
)

DRAFTERS = {"published": PUBLISHED, "weak": WEAK, "strong": STRONG}
LOADS = (16, 32, 48, 64, 73, 96, 128, 169, 200, 256)


def ramp_table() -> None:
    load, duration = issue_ramp()
    print(
        "Ramp 2 -> 200 -> 2 running per replica (10 min each way, 10 min holds): ratio to the per-level oracle"
    )
    print(
        f"{'drafter':10} {'mode':10} {'time-weighted':>13} {'worst minute':>12} {'flips':>5} {'changes':>7}   static settings"
    )
    for name, acceptance in DRAFTERS.items():
        for mode in ("Goodput", "Threshold"):
            r = simulate(example_spec(mode=mode), load, duration, acceptance)
            statics = " ".join(f"{s}={r.static_ratio(s):.3f}" for s in r.static_tokens)
            print(
                f"{name:10} {mode:10} {r.ratio:13.3f} {r.worst_minute():12.3f} {len(r.flips):5d} "
                f"{len(r.changes):7d}   {statics}"
            )


def stationary_table(mode: str = "Goodput", seeds: int = 3, hours: float = 2.0) -> None:
    duration = hours * 3600
    print(
        f"\nStationary load with noise ({mode}): flips/h and adjustments/h after the first 10 min, worst ratio"
    )
    print(f"{'drafter':10} " + " ".join(f"{'c=' + str(c):>16}" for c in LOADS))
    for name, acceptance in DRAFTERS.items():
        cells = []
        for c in LOADS:
            flips = adjust = 0
            worst = 1.0
            for seed in range(seeds):
                r = simulate(
                    example_spec(mode=mode),
                    lambda t, c=c: c,
                    duration,
                    acceptance,
                    noise=poisson_noise(c, duration, seed),
                )
                flips += sum(1 for x in r.changes if x.kind == "flip" and x.at > 600)
                adjust += sum(1 for x in r.changes if x.kind != "flip" and x.at > 600)
                worst = min(worst, r.ratio)
            hours_counted = seeds * (duration - 600) / 3600
            cells.append(f"{flips / hours_counted:4.1f}/{adjust / hours_counted:4.1f}/{worst:.3f}")
        print(f"{name:10} " + " ".join(f"{cell:>16}" for cell in cells))


if __name__ == "__main__":
    ramp_table()
    stationary_table()
    stationary_table("Threshold", seeds=1)
