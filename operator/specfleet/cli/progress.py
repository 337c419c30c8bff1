"""A progress line for long CLI runs (`plan`, `simulate`): drawn on a terminal only, and only once a
run has taken a few seconds, so that short runs, pipes and CI logs stay quiet."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO


class TerminalProgress:
    """Call it with each step's name; while it is open, a thread redraws `<what> <step> (step N), T s`."""

    def __init__(
        self,
        stream: TextIO,
        what: str,
        *,
        after_seconds: float = 2.0,
        every_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream, self._what, self._after, self._every, self._clock = (
            stream,
            what,
            after_seconds,
            every_seconds,
            clock,
        )
        self._start = clock()
        self._step, self._count, self._drawn = "", 0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __call__(self, step: str) -> None:
        self._step, self._count = step, self._count + 1

    def tick(self) -> None:
        """Redraw the line if the run has taken long enough (the thread calls this)."""
        elapsed = self._clock() - self._start
        if elapsed < self._after or not self._step:
            return
        line = f"{self._what} {self._step} (step {self._count}), {elapsed:.0f} s"
        self._stream.write(f"\r\x1b[K{line}")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Stop redrawing and erase the line, leaving the terminal as it was."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._drawn:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.tick()

    def __enter__(self) -> TerminalProgress:
        self._start = self._clock()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
