"""The sandbox's load generator against a real emulator: a closed loop of exactly `concurrency` clients
(what the simulator's ClosedLoop models), following the caller's changes, and paced when it fails."""

from __future__ import annotations

import asyncio
import socket
import time

from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_sandbox.load import LoadGenerator
from support.waiting import wait_until


def _in_flight(engine) -> int:
    return engine.num_running + engine.num_waiting


async def _in_flight_samples(engine, seconds: float) -> list[int]:
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(_in_flight(engine))
        await asyncio.sleep(0.005)
    return samples


async def test_keeps_exactly_its_concurrency_in_flight_and_follows_changes() -> None:
    config = EmulatorConfig(served_model_name="m", time_scale=1.0)
    async with serve_emulator(config) as emu:
        load = LoadGenerator(emu.url, "m", max_tokens=8).start(concurrency=4)
        try:
            await wait_until(lambda: _in_flight(emu.engine) == 4)
            at_four = await _in_flight_samples(emu.engine, 1.0)
            load.set_concurrency(1)
            # Wait for the extra clients to leave, not for the engine to show one request: a client
            # that had sent its next request just before the change is on the wire for a moment (CI
            # sampled 2 right after the engine first showed 1).
            await wait_until(lambda: load.clients == 1)
            await wait_until(lambda: _in_flight(emu.engine) == 1)
            at_one = await _in_flight_samples(emu.engine, 0.5)
            load.set_concurrency(3)
            await wait_until(lambda: _in_flight(emu.engine) == 3)
        finally:
            stats = await asyncio.to_thread(load.stop)
    assert max(at_four) <= 4
    assert max(at_one) <= 1
    assert load.clients == 0  # every client left at stop
    assert stats.failed == 0, stats.errors
    assert stats.ok > 20
    assert stats.tokens > 0


async def test_a_client_sends_its_next_request_the_moment_the_last_ends() -> None:
    # Steps that take no time: a request is one local HTTP round trip. A generator that refilled its
    # slots on a 50 ms tick (the one before this) sends at most 21 in the second; one that sends the
    # next request at once is bounded by the round trip only (65 measured with both cores busy with a
    # Go build, so a rate, not the in-flight average, which the same load pulled to 2.5 of 4).
    config = EmulatorConfig(served_model_name="m", time_scale=0.0)
    async with serve_emulator(config) as emu:
        load = LoadGenerator(emu.url, "m", max_tokens=1).start(concurrency=1)
        await asyncio.sleep(1.0)
        stats = await asyncio.to_thread(load.stop)
    assert stats.failed == 0, stats.errors
    assert stats.ok >= 40, stats.ok


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


async def test_whole_answers_are_counted_like_streams() -> None:
    config = EmulatorConfig(served_model_name="m", time_scale=1.0)
    async with serve_emulator(config) as emu:
        load = LoadGenerator(emu.url, "m", max_tokens=8, stream=False).start(concurrency=2)
        try:
            await wait_until(lambda: load.snapshot().ok >= 10)
        finally:
            stats = await asyncio.to_thread(load.stop)
    assert stats.failed == 0, stats.errors
    assert 0 < stats.tokens <= 8 * stats.ok
    assert emu.engine.stats.generation_tokens >= stats.tokens
