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
    """Whether a connection to the loopback port is refused (nothing listens there now). A connection
    reset while connecting means a listening socket closed with the connection in its backlog, or
    one of several workers' sockets did while another still listens; one that times out, a socket
    that still listens but answers no handshake within the second (its backlog full as it closes, or a
    busy machine): not yet refused either, ask again."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except (ConnectionResetError, TimeoutError):
        return False
    return False
