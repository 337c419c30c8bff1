"""The sandbox's load generator against a real emulator: a closed loop of exactly `concurrency` clients
(what the simulator's ClosedLoop models), following the caller's changes, and paced when it fails."""

from __future__ import annotations

import asyncio
import socket
import time

from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_sandbox.load import LoadGenerator


def _in_flight(engine) -> int:
    return engine.num_running + engine.num_waiting


async def _in_flight_samples(engine, seconds: float) -> list[int]:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(_in_flight(engine))
        await asyncio.sleep(0.005)
    return samples


async def _until(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


async def test_keeps_exactly_its_concurrency_in_flight_and_follows_changes() -> None:
    # Steps of ~7 ms and 8 tokens: a request ends every ~60 ms per slot, so a client that refilled
    # its slots by polling (25 ms on average) left them empty much of the time (2.2 of 4, measured).
    config = EmulatorConfig(served_model_name="m", time_scale=1.0)
    async with serve_emulator(config) as emu:
        load = LoadGenerator(emu.url, "m", max_tokens=8).start(concurrency=4)
        try:
            await _until(lambda: _in_flight(emu.engine) == 4)
            at_four = await _in_flight_samples(emu.engine, 1.0)
            load.set_concurrency(1)
            await _until(lambda: _in_flight(emu.engine) == 1)
            at_one = await _in_flight_samples(emu.engine, 0.5)
            load.set_concurrency(3)
            await _until(lambda: _in_flight(emu.engine) == 3)
        finally:
            stats = await asyncio.to_thread(load.stop)
    assert max(at_four) <= 4
    assert max(at_one) <= 1
    # A request is in flight almost all the time in every slot (the gap is one local HTTP round trip).
    assert sum(at_four) / len(at_four) > 3.0, sum(at_four) / len(at_four)
    assert stats.failed == 0, stats.errors
    assert stats.ok > 20
    assert stats.tokens > 0


def test_a_refused_connection_is_retried_at_a_bounded_pace() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused at once
        load = LoadGenerator(f"http://127.0.0.1:{port}", "m").start(concurrency=4)
        time.sleep(1.0)
        stats = load.stop()
    # At most one try per client every 50 ms (about 80 in the second); a client that retried at once
    # would make thousands.
    assert 4 <= stats.failed <= 4 * (1.0 / 0.05 + 5), stats.failed
    assert stats.ok == 0
