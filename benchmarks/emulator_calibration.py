"""Does the engine emulator run at the pace of its cost profile? Prints predicted vs measured speedups.

For each batch size and K, runs the emulator in-process at a constant concurrency of `batch` requests,
once with K draft tokens and once without speculation, measures goodput (generated tokens per second
per request, wall clock) and compares the ratio with the one the step-time profile predicts.

    python benchmarks/emulator_calibration.py
    python benchmarks/emulator_calibration.py --batches 1,8,32,64,128,256 --ks 1,3,5 --seconds 2
    python benchmarks/emulator_calibration.py --profile my-gpu.yaml --acceptance 0.75,0.55,0.41

Not a test (tests/unit/test_emulator_calibration.py is): a table for a human. Takes about
2 x seconds per row.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, default_profile, load_profile
from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.calibration import calibrate_point


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def time_scale_for(config: EmulatorConfig, batch: int) -> float:
    """Stretch time so a step lasts at least 1.5 ms and 0.1 ms per request: the loop's own work per
    step (about 10 us per request on a small machine) then stays a small part of every step."""
    shortest_ms = config.profile.step_time_ms(batch, 0)
    return max(1.5, 0.1 * batch) / shortest_ms


async def run(args: argparse.Namespace) -> None:
    profile = load_profile(args.profile) if args.profile else default_profile()
    base = EmulatorConfig(served_model_name="calibration", profile=profile, acceptance=args.acceptance)
    print(f"profile {profile.name}, acceptance {list(base.acceptance)}")
    header = (
        f"{'batch':>5} {'K':>2} {'predicted':>9} {'measured':>8} {'error':>7} "
        f"{'steps off/on':>12} {'pace off/on':>11} {'scale':>5} {'tries':>5}"
    )
    print(header)
    print("-" * len(header))
    started = time.monotonic()
    for batch in args.batches:
        scale = time_scale_for(base, batch)
        for k in args.ks:
            point = await calibrate_point(
                EmulatorConfig(
                    served_model_name="calibration",
                    profile=profile,
                    acceptance=base.acceptance,
                    time_scale=scale,
                    seed=args.seed,
                ),
                batch,
                k,
                min_seconds=args.seconds,
                min_steps=400 if batch == 1 else max(10, 4000 // batch),
                pace_tolerance=0.03,
            )
            flag = "" if point.kept_pace else "  (machine could not keep the pace)"
            print(
                f"{batch:>5} {k:>2} {point.predicted:>8.3f}x {point.measured:>7.3f}x "
                f"{point.relative_error:>+7.1%} {point.off.steps:>5}/{point.on.steps:<6} "
                f"{point.off.pace:>5.3f}/{point.on.pace:<5.3f} {scale:>5.2f} {point.attempts:>5}{flag}",
                flush=True,
            )
    print(f"({time.monotonic() - started:.0f} s)")


def main() -> None:
    """Parse the command line and print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=_ints, default=[1, 16, 64, 128, 256], help="comma-separated")
    p.add_argument("--ks", type=_ints, default=[1, 3, 5], help="comma-separated K values")
    p.add_argument("--seconds", type=float, default=1.0, help="minimum window per run")
    p.add_argument("--profile", help="step-time profile file (default: published H100)")
    p.add_argument("--acceptance", type=_floats, default=PUBLISHED_ACCEPTANCE)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
