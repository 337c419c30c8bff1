"""Run a `Router` on a socket: start its lifespan, listen, and on exit stop listening and drain."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from specfleet_runtime.router.app import Router
from specfleet_runtime.router.server import HttpServer

log = logging.getLogger("specfleet_runtime.router.app")


@dataclass(frozen=True)
class Listening:
    """Where a router listens (`addresses`: the bound socket addresses)."""

    server: HttpServer
    addresses: list[Any]


@asynccontextmanager
async def serve_router(
    router: Router, host: str, port: int, reuse_port: bool = False
) -> AsyncIterator[Listening]:
    """Serve `router` on host:port until the block exits; then stop listening and drain.

    On exit the listening socket closes at once, in-flight requests (streams included) get up to
    `drain_seconds` to finish, then the lifespan (session, watches, config source) stops.
    """
    await router.start()
    try:
        server = router.make_server()
        try:
            addresses = await server.listen(host, port, reuse_port)
            log.info("router listening on %s:%d", host, addresses[0][1] if addresses else port)
            yield Listening(server, addresses)
        finally:
            router.draining = True
            log.info("draining: %d request(s) in flight", router.in_flight)
            await server.shutdown(router.settings.drain_seconds)
    finally:
        await router.stop()
