"""Loopback ports for the servers tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on (bound, read, released): connecting to it is refused until a
    server the test starts binds it, which it does right away (a race with another process is unlikely)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused(port: int) -> bool:
    """Whether a connection to the loopback port is refused (nothing listens there now)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False
