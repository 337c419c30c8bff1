"""Check the emulator against its cost model: measured goodput ratios vs the profile's prediction.

`measure_goodput` runs an engine in-process (no HTTP, so 256 concurrent requests stay cheap) under a
constant concurrency and measures, on the wall clock, the generated tokens per second per request.
`calibrate_point` does it without speculation and with K drafts and compares the ratio with
`cost_profile.speedup`. The unit tests and `benchmarks/emulator_calibration.py` both use it.

The measurement window starts and ends right after a step delivered its tokens, so it holds a whole
number of steps; the time is the event loop's monotonic clock at those two moments. A measurement also
records the time the cost model scheduled for those steps: when the wall time strays from it, the
machine could not keep the emulator's pace (a stall, or too little CPU for the batch), the measurement
says nothing about the model, and `calibrate_point` measures again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from specfleet_runtime.cost_profile import speedup
from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.engine import Engine, StepOutput
from specfleet_runtime.emulator.text import Prompt
from specfleet_runtime.vllm_args import SpeculativeConfig


@dataclass(frozen=True)
class GoodputMeasurement:
    """Tokens delivered to `concurrency` requests over `seconds` of wall time (`steps` steps)."""

    concurrency: int
    tokens: int
    seconds: float
    steps: int
    # Time the cost model scheduled for these steps.
    scheduled_s: float

    @property
    def goodput(self) -> float:
        """Generated tokens per second per request."""
        return self.tokens / self.seconds / self.concurrency

    @property
    def pace(self) -> float:
        """Wall time over scheduled time: 1.0 when the engine kept the cost model's pace."""
        return self.seconds / self.scheduled_s if self.scheduled_s > 0 else float("inf")


async def measure_goodput(
    config: EmulatorConfig,
    concurrency: int,
    *,
    min_seconds: float,
    min_steps: int = 1,
    warmup_steps: int = 3,
    max_tokens: int = 10**9,
) -> GoodputMeasurement:
    """Goodput of an engine that always has exactly `concurrency` requests in flight.

    A request that finishes is replaced at once (the default `max_tokens` is large enough that none
    does). Measurement starts after every request is running and `warmup_steps` steps have passed.
    """
    if concurrency > config.max_num_seqs:
        raise ValueError("concurrency beyond max_num_seqs would measure queueing, not steps")
    engine = Engine(config)
    await engine.start()
    delivered = 0
    serial = itertools.count()

    def on_output(out: StepOutput) -> None:
        nonlocal delivered
        delivered += len(out.tokens)
        if out.finish_reason is not None:
            submit_one()

    def submit_one() -> None:
        prompt = Prompt.from_text(f"calibration prompt {next(serial)}")
        engine.submit(prompt, max_tokens, ignore_eos=True, on_output=on_output)

    try:
        for _ in range(concurrency):
            submit_one()
        warm = 0
        while engine.num_running < concurrency or warm < warmup_steps:
            await engine.wait_for_step()
            warm += 1
        tokens0, t0, steps0 = delivered, engine.stats.last_step_end, engine.stats.steps
        scheduled0 = engine.stats.scheduled_s
        while True:
            await engine.wait_for_step()
            s = engine.stats
            if s.last_step_end - t0 >= min_seconds and s.steps - steps0 >= min_steps:
                return GoodputMeasurement(
                    concurrency=concurrency,
                    tokens=delivered - tokens0,
                    seconds=s.last_step_end - t0,
                    steps=s.steps - steps0,
                    scheduled_s=s.scheduled_s - scheduled0,
                )
    finally:
        await engine.stop()


@dataclass(frozen=True)
class CalibrationPoint:
    """Goodput ratio of K drafts vs no speculation at one batch size: predicted and measured."""

    batch: int
    k: int
    predicted: float
    off: GoodputMeasurement
    on: GoodputMeasurement
    attempts: int
    pace_tolerance: float

    @property
    def measured(self) -> float:
        """Measured goodput with speculation over measured goodput without."""
        return self.on.goodput / self.off.goodput

    @property
    def relative_error(self) -> float:
        """measured / predicted - 1."""
        return self.measured / self.predicted - 1.0

    @property
    def kept_pace(self) -> bool:
        """Whether both runs kept the cost model's pace (else the ratio is not about the model)."""
        return all(abs(m.pace - 1.0) <= self.pace_tolerance for m in (self.off, self.on))


async def calibrate_point(
    base: EmulatorConfig,
    batch: int,
    k: int,
    *,
    min_seconds: float,
    min_steps: int = 1,
    pace_tolerance: float = 0.02,
    max_attempts: int = 3,
) -> CalibrationPoint:
    """Measure goodput at `batch` concurrent requests with K=`k` and without speculation.

    Both runs use `base`'s profile, acceptance, seed and time scale; the speculative run is a plain
    K=`k` engine (no Dynamic SD schedule), the other a true non-speculative engine. A pair whose runs
    strayed from the scheduled pace by more than `pace_tolerance` is measured again, up to
    `max_attempts` times; the last pair is returned either way (see `kept_pace`).
    """
    off_config = replace(base, speculative=None, max_num_seqs=max(base.max_num_seqs, batch))
    on_config = replace(
        off_config,
        speculative=SpeculativeConfig(method="eagle3", num_speculative_tokens=k, model="drafter"),
    )
    predicted = speedup(base.profile, batch, k, base.acceptance)
    attempt = 0
    while True:
        attempt += 1
        off = await measure_goodput(off_config, batch, min_seconds=min_seconds, min_steps=min_steps)
        on = await measure_goodput(on_config, batch, min_seconds=min_seconds, min_steps=min_steps)
        point = CalibrationPoint(batch, k, predicted, off, on, attempt, pace_tolerance)
        if point.kept_pace or attempt >= max_attempts:
            return point
