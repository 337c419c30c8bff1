"""A bounded load generator for the e2e tier: the official `openai` client, streaming chat
completions through the router at a concurrency the test changes as it goes. Loopback only."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import openai


@dataclass
class LoadStats:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    pools: dict[str, int] = field(default_factory=dict)


class LoadGenerator:
    """Keeps `concurrency` streaming requests in flight until stopped (or `max_seconds` pass)."""

    def __init__(
        self, base_url: str, model: str, *, max_tokens: int = 64, max_seconds: float = 600.0
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.max_seconds = max_seconds
        self.stats = LoadStats()
        self._concurrency = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="load", daemon=True)

    def start(self, concurrency: int) -> LoadGenerator:
        self._concurrency = concurrency
        self._thread.start()
        return self

    def set_concurrency(self, concurrency: int) -> None:
        self._concurrency = concurrency

    def stop(self) -> LoadStats:
        self._stop.set()
        self._thread.join(120)
        return self.stats

    async def _main(self) -> None:
        client = openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="e2e", max_retries=0, timeout=60)
        deadline = time.monotonic() + self.max_seconds
        workers: list[asyncio.Task[None]] = []
        counter = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            workers = [w for w in workers if not w.done()]
            while len(workers) < self._concurrency:
                counter += 1
                workers.append(asyncio.create_task(self._one(client, counter)))
            await asyncio.sleep(0.05)
        await asyncio.gather(*workers, return_exceptions=True)
        await client.close()

    async def _one(self, client: openai.AsyncOpenAI, n: int) -> None:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=self.model,
                messages=[{"role": "user", "content": f"request {n}: tell me a story"}],
                max_tokens=self.max_tokens,
                stream=True,
            )
            pool = raw.headers.get("x-specfleet-served-pool", "?")
            stream = raw.parse()
            chunks = 0
            async for chunk in stream:
                if chunk.choices:
                    chunks += 1
            if chunks == 0:
                raise RuntimeError("stream ended without a token")
            self.stats.ok += 1
            self.stats.pools[pool] = self.stats.pools.get(pool, 0) + 1
        except Exception as err:
            self.stats.failed += 1
            if len(self.stats.errors) < 20:
                self.stats.errors.append(f"{type(err).__name__}: {err}")
