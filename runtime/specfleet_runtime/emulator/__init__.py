"""A vLLM-compatible fake engine for tests, the sandbox and benchmarks, where GPUs cannot run.

It takes vLLM's command line (`python -m specfleet_runtime.emulator <vLLM args>`), serves vLLM's
OpenAI-compatible API and Prometheus metrics, and paces a continuous-batching step loop with a
calibrated step-time profile (`specfleet_runtime.cost_profile`), so that speculation pays or loses
exactly where the profile says it does.

Where to start reading: `engine.py` (the step loop), then `server.py` (the HTTP surface).

    config.py       EmulatorConfig: vLLM's engine args + the emulator's knobs
    engine.py       the step loop: batching, preemption, K per step, acceptance sampling, metrics
    kv_cache.py     the paged KV cache's block accounting and prefix cache (vLLM V1's BlockPool)
    text.py         deterministic output text (identical with and without speculation)
    metrics.py      vLLM's metric families on a per-engine registry
    protocol.py     OpenAI request/response/error bodies
    server.py       the aiohttp app (`create_app`)
    sleep.py        vLLM's sleep mode (/sleep, /wake_up, /is_sleeping): what it does, where it departs
    testing.py      run an emulator on 127.0.0.1 inside a test
    calibration.py  measure goodput under constant concurrency and compare with the profile
    __main__.py     the command line
"""

from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.engine import Completion, Engine, EngineRequest, StepOutput
from specfleet_runtime.emulator.server import ENGINE_KEY, create_app

__all__ = [
    "ENGINE_KEY",
    "Completion",
    "EmulatorConfig",
    "Engine",
    "EngineRequest",
    "StepOutput",
    "create_app",
]
