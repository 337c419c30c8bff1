"""Waiting for what a test expects to happen, never for a length of time.

`wait_until` polls a condition from the test's event loop; `loop_caught_up` waits until the loop has
run the callbacks scheduled on it. The blocking form, `wait_for`, lives in `specfleet_sandbox.processes`
(the sandbox waits with it too); waits for the operator's own events (resyncs, policy sweeps) are in
`support.operator_log`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `condition` every 20 ms without blocking the loop; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout}s")
        await asyncio.sleep(0.02)


async def loop_caught_up() -> None:
    """Return once the running loop has run every callback scheduled on it before this call.

    Callbacks run in the order they were scheduled, so this marks the moment a `call_soon_threadsafe`
    from another thread (a watch's publish) has been handled, whatever it did or left undone."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon_threadsafe(done.set_result, None)
    await done
