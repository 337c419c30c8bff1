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

    With `reuse_port` (a worker beside others on the same port) it listens only once the router is
    warm, or after `warm_timeout`: the kernel hands each listening worker a share of the new
    connections while the readiness probe reaches only one of them, so a worker that listened before
    it had its config and endpoints would answer 503 to clients of a pod already marked Ready. (A lone
    process listens at once: its own /readyz tells the probe the truth.) After the timeout it listens
    anyway, so /healthz answers and /readyz says what is missing.

    On exit the listening socket closes at once, in-flight requests (streams included) get up to
    `drain_seconds` to finish, then the lifespan (session, watches, config source) stops.
    """
    await router.start()
    try:
        if reuse_port and not await router.wait_warm(router.settings.warm_timeout):
            log.warning(
                "not warm after %gs (%s); listening anyway", router.settings.warm_timeout, router.warm()[1]
            )
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
