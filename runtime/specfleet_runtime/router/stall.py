"""Stall watches: an engine that sends no byte for `stall_seconds` is probed, and its request cancelled
if the probe fails too (`proxy.Proxy` then retries it elsewhere).

A busy engine still answers its health probe, a frozen or wedged one does not. Every running watch
shares one timer (`StallWatches`), so a request enters and leaves its watch with a dict insert and
delete rather than a timer created and cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class StallWatch:
    """Probes an engine that has not answered for `stall_seconds`; cancels the waiting task if it fails.

    No timer of its own: the watch is entered in its `StallWatches` with its deadline, and the probe
    task exists only once a wait got long.
    """

    __slots__ = ("_probe", "stalled", "task", "url", "watches")

    def __init__(self, watches: StallWatches, url: str, task: asyncio.Task[None] | None) -> None:
        self.watches = watches
        self.url = url
        self.task = task
        self.stalled = False
        self._probe: asyncio.Task[None] | None = None
        watches.add(self)

    def _fire(self) -> None:
        self._probe = self.watches.loop.create_task(self._run_probe())

    async def _run_probe(self) -> None:
        healthy = await self.watches.probe(self.url)
        self._probe = None
        if healthy:
            self.watches.add(self)
        elif self.task is not None:
            self.stalled = True
            self.task.cancel()

    def stop(self) -> None:
        self.watches.discard(self)
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None


class StallWatches:
    """Every running stall watch with its deadline, under one timer for the earliest of them.

    All deadlines are `seconds` from when a watch was (re-)entered, so insertion order is deadline
    order: the timer is armed for the first entry's deadline; when it fires, every watch whose
    deadline passed fires (`probe`, whether the engine at a URL answers its health check), and the
    timer is re-armed for the next one.
    """

    def __init__(self, seconds: float, probe: Callable[[str], Awaitable[bool]]) -> None:
        self.seconds = seconds
        self.probe = probe
        self._deadlines: dict[StallWatch, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def add(self, watch: StallWatch) -> None:
        loop = self.loop
        deadline = loop.time() + self.seconds
        self._deadlines.pop(watch, None)
        self._deadlines[watch] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)

    def discard(self, watch: StallWatch) -> None:
        self._deadlines.pop(watch, None)

    def _check(self) -> None:
        self._timer = None
        deadlines = self._deadlines
        now = self.loop.time()
        due = []
        for watch, deadline in deadlines.items():
            if deadline > now:
                self._timer = self.loop.call_at(deadline, self._check)
                break
            due.append(watch)
        for watch in due:
            del deadlines[watch]
            watch._fire()

    def close(self) -> None:
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop = None
