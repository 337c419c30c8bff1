"""A bounded load generator: the official `openai` client, chat completions (streamed unless asked
otherwise) through the router, at a concurrency the caller changes as it goes. Loopback only; stops by
itself after `max_seconds`.

Each generator plays one kind of client (headers such as the tenant header decide where the router
sends it). It counts requests and completion tokens (from the stream's usage chunk) per pool that
served them, as the router reports in `x-specfleet-served-pool`; `snapshot()` gives cumulative
counters so a caller can compute per-phase rates.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the sandbox extra: imported when a generator runs, so `sandbox --help` works without it
    import openai
    from openai.types.chat import ChatCompletionMessageParam

SERVED_POOL_HEADER = "x-specfleet-served-pool"


@dataclass
class LoadStats:
    """Cumulative counters of one generator."""

    ok: int = 0
    failed: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    pools: dict[str, int] = field(default_factory=dict)
    tokens_by_pool: dict[str, int] = field(default_factory=dict)

    def copy(self) -> LoadStats:
        return LoadStats(
            self.ok, self.failed, self.tokens, list(self.errors), dict(self.pools), dict(self.tokens_by_pool)
        )


class LoadGenerator:
    """Keeps `concurrency` requests in flight until stopped (or `max_seconds` pass)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_tokens: int = 64,
        max_seconds: float = 600.0,
        headers: Mapping[str, str] | None = None,
        name: str = "load",
        api_key: str = "load",
        stream: bool = True,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.max_seconds = max_seconds
        self.headers = dict(headers or {})
        self.name = name
        # The router tells clients apart by API key (auto-segmentation counts in-flight per client).
        self.api_key = api_key
        # False: whole answers (nothing reaches the client before the engine finishes, so a router may
        # send the request again elsewhere when an engine goes away).
        self.stream = stream
        self.stats = LoadStats()
        # Words of filler after each request's own opening (one token each to the emulator's tokenizer):
        # 0 for a short question; the opening differs per request, so no two share a KV block.
        self.prompt_words = 0
        # What the requests are about: words every message opens with from now on ("" for none). The
        # emulated engines draft some topics worse (a content shift, specfleet_sandbox.scenario).
        self.topic = ""
        self._concurrency = 0
        self._clients = 0  # client loops running now; changed only on the generator's event loop
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=name, daemon=True)

    def start(self, concurrency: int) -> LoadGenerator:
        self._concurrency = concurrency
        self._thread.start()
        return self

    def set_concurrency(self, concurrency: int) -> None:
        self._concurrency = concurrency

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @property
    def clients(self) -> int:
        """Clients running now: after a lower `set_concurrency` the extra ones leave as their request
        ends, so this follows `concurrency` with a lag of up to one request."""
        return self._clients

    def message(self, n: int) -> str:
        """The user message of this generator's request number `n` (from 1), `prompt_words` long plus
        its opening."""
        opening = f"{self.topic} {self.name} request {n}: tell me a story".lstrip()
        words = self.prompt_words
        return opening if words <= 0 else opening + " about" + " the long document" * (words // 3)

    def snapshot(self) -> LoadStats:
        """A consistent copy of the counters so far."""
        with self._lock:
            return self.stats.copy()

    def stop(self) -> LoadStats:
        self._stop.set()
        self._thread.join(120)
        return self.snapshot()

    async def _main(self) -> None:
        import openai

        client = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1",
            api_key=self.api_key,
            max_retries=0,
            timeout=60,
            default_headers=self.headers,
        )
        deadline = time.monotonic() + self.max_seconds
        counter = itertools.count(1)

        def running() -> bool:
            return not self._stop.is_set() and time.monotonic() < deadline

        async def client_slot(index: int) -> None:
            # One client: its next request the moment the last one ends, as the simulator's closed loop
            # has it (polling for free slots left each one empty for 25 ms on average); a pause only
            # after a failure, so a router that refuses connections is not hammered.
            self._clients += 1
            try:
                while index < self._concurrency and running():
                    if not await self._one(client, next(counter)):
                        await asyncio.sleep(0.05)
            finally:
                self._clients -= 1

        slots: dict[int, asyncio.Task[None]] = {}
        while running():
            for index in range(self._concurrency):
                if index not in slots or slots[index].done():
                    slots[index] = asyncio.create_task(client_slot(index))
            await asyncio.sleep(0.05)
        await asyncio.gather(*slots.values(), return_exceptions=True)
        await client.close()

    async def _one(self, client: openai.AsyncOpenAI, n: int) -> bool:
        """One request; whether it succeeded."""
        try:
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": self.message(n)}]
            if self.stream:
                pool, tokens = await self._streamed(client, messages)
            else:
                raw = await client.chat.completions.with_raw_response.create(
                    model=self.model, messages=messages, max_tokens=self.max_tokens
                )
                pool = raw.headers.get(SERVED_POOL_HEADER, "?")
                answer = raw.parse()
                if not answer.choices or answer.usage is None:
                    raise RuntimeError("an answer without a choice or usage")
                tokens = answer.usage.completion_tokens
            with self._lock:
                self.stats.ok += 1
                self.stats.tokens += tokens
                self.stats.pools[pool] = self.stats.pools.get(pool, 0) + 1
                self.stats.tokens_by_pool[pool] = self.stats.tokens_by_pool.get(pool, 0) + tokens
        except Exception as err:
            with self._lock:
                self.stats.failed += 1
                if len(self.stats.errors) < 20:
                    self.stats.errors.append(f"{type(err).__name__}: {err}")
            return False
        return True

    async def _streamed(
        self, client: openai.AsyncOpenAI, messages: list[ChatCompletionMessageParam]
    ) -> tuple[str, int]:
        """One streamed request: the pool that served it and its completion tokens."""
        raw = await client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        pool = raw.headers.get(SERVED_POOL_HEADER, "?")
        stream = raw.parse()
        chunks = 0
        tokens = 0
        async for chunk in stream:
            if chunk.choices:
                chunks += 1
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        if chunks == 0:
            raise RuntimeError("stream ended without a token")
        return pool, tokens
