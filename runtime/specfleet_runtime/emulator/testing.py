"""Run an emulator inside a test: `async with serve_emulator(config) as emu: ... emu.base_url ...`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.engine import Engine
from specfleet_runtime.emulator.server import ENGINE_KEY, SLEEP_KEY, create_app
from specfleet_runtime.emulator.sleep import SleepMode


@dataclass(frozen=True)
class RunningEmulator:
    """An emulator serving on a free port of 127.0.0.1."""

    url: str  # http://127.0.0.1:PORT
    engine: Engine
    sleep_mode: SleepMode

    @property
    def base_url(self) -> str:
        """The OpenAI client's base URL (…/v1)."""
        return f"{self.url}/v1"


@asynccontextmanager
async def serve_emulator(
    config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RunningEmulator]:
    """Serve `config` on `port` (0: a free one) for the duration of the block."""
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        port = runner.addresses[0][1]
        yield RunningEmulator(url=f"http://{host}:{port}", engine=app[ENGINE_KEY], sleep_mode=app[SLEEP_KEY])
    finally:
        await runner.cleanup()
