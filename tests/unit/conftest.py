"""Unit-tier configuration: the router's hostile-client tests run on both event loops it can use.

The router runs on uvloop in production (`--event-loop auto`) and on asyncio's own loop where uvloop
is missing; their transports differ (uvloop's are not `asyncio.Transport` subclasses, flow control is
its own), so the connection guards are checked on both. Every other test keeps asyncio's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

BOTH_LOOPS_MODULES = frozenset({"test_router_hardening.py"})


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name in BOTH_LOOPS_MODULES:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
