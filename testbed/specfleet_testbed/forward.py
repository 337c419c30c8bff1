"""Forward every connection accepted on one address to another, bytes both ways, unchanged.

`python -m specfleet_testbed.forward LISTEN CONNECT`, each address ``tcp:HOST:PORT`` or ``unix:PATH``.
Prints ``ready`` on stdout once it listens. Two of these, joined by a unix socket (a path in the file
system reaches across network namespaces, a TCP address does not), connect a network namespace's
loopback to the host's (see specfleet_testbed.netns). Bytes pass through untouched, so TLS stays end to
end between the two programs that speak it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

__all__ = ["main", "parse_address"]

_Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def parse_address(text: str) -> tuple[str, str, int]:
    """("tcp", host, port) or ("unix", path, 0)."""
    kind, _, rest = text.partition(":")
    if kind == "unix" and rest:
        return kind, rest, 0
    host, _, port = rest.rpartition(":")
    if kind == "tcp" and host and port.isdigit():
        return kind, host, int(port)
    raise ValueError(f"not tcp:HOST:PORT nor unix:PATH: {text!r}")


async def _open(address: tuple[str, str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    kind, where, port = address
    if kind == "unix":
        return await asyncio.open_unix_connection(where)
    return await asyncio.open_connection(where, port)


async def _listen(address: tuple[str, str, int], handler: _Handler) -> asyncio.Server:
    kind, where, port = address
    if kind == "unix":
        if os.path.exists(where):
            os.unlink(where)  # a stale socket of an earlier run
        return await asyncio.start_unix_server(handler, where)
    return await asyncio.start_server(handler, where, port)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still carry a reply
    except OSError:
        writer.close()


async def _serve(listen: tuple[str, str, int], connect: tuple[str, str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await _open(connect)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        up_writer.close()
        writer.close()

    server = await _listen(listen, handle)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m specfleet_testbed.forward LISTEN CONNECT", file=sys.stderr)
        return 2
    try:
        listen, connect = parse_address(args[0]), parse_address(args[1])
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    asyncio.run(_serve(listen, connect))
    return 0


if __name__ == "__main__":
    sys.exit(main())
