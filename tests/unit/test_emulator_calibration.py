"""Calibration: the emulator's measured speedup of speculation matches what its profile predicts.

At a constant concurrency of 1, 64 and 256 requests, goodput (generated tokens per second per request,
on the wall clock) is measured once with K=3 and once without speculation, in this run, and the ratio
is compared with `cost_profile.speedup`. The published profile predicts 1.67x, 1.31x and 0.79x: the
emulator must show speculation winning at low load and losing at high load, by the right amount.

Robust on a small, busy machine: time scales keep every step well above the loop's own work, windows
hold hundreds of steps (batch 1: acceptance is sampled per step) or hundreds of requests per step,
the acceptance sampler is seeded, and a pair of runs during which the machine could not keep the
emulator's pace (wall time off the scheduled time) is measured again. Wrong models still fail: e.g.
sampling each position's acceptance independently (12% fewer tokens at K=3), or a step time that
ignores K or batch size.
"""

from __future__ import annotations

import pytest

from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE
from specfleet_runtime.emulator import EmulatorConfig
from specfleet_runtime.emulator.calibration import calibrate_point

TOLERANCE = 0.10


@pytest.mark.parametrize(
    ("batch", "time_scale", "min_steps", "predicted"),
    [
        # Batch 1: 1.6-2.2 ms steps, >= 400 steps for the acceptance sampling to settle.
        (1, 0.25, 400, 1.67),
        # Batch 64: 3.9-6.8 ms steps; 64 requests per step average the sampling out quickly.
        (64, 0.5, 60, 1.31),
        # Batch 256: 29-84 ms steps, so that emitting 256 requests' tokens stays a small part of a step.
        (256, 2.0, 10, 0.79),
    ],
)
async def test_measured_speedup_matches_the_profile(
    batch: int, time_scale: float, min_steps: int, predicted: float
) -> None:
    base = EmulatorConfig(served_model_name="calibration", time_scale=time_scale, seed=1)
    assert base.acceptance == PUBLISHED_ACCEPTANCE
    point = await calibrate_point(base, batch, 3, min_seconds=0.8, min_steps=min_steps, pace_tolerance=0.03)
    assert point.predicted == pytest.approx(predicted, abs=0.01)
    assert point.kept_pace, (
        f"the machine could not keep the emulator's pace in {point.attempts} attempts: "
        f"wall/scheduled {point.off.pace:.3f} (off), {point.on.pace:.3f} (K=3)"
    )
    assert abs(point.relative_error) <= TOLERANCE, (
        f"batch {batch}: measured {point.measured:.3f}x, predicted {point.predicted:.3f}x "
        f"(off {point.off.goodput:.1f} tok/s/req over {point.off.steps} steps, "
        f"K=3 {point.on.goodput:.1f} tok/s/req over {point.on.steps} steps)"
    )
