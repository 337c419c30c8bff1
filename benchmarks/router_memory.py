"""Peak memory of the router under the worst request bodies at the body limit, for each worker count.

For every worker count and body kind, eight clients send the same body (just under the 32 MiB body
limit, so together they fill the 256 MiB byte budget) at once to a router process started with its
defaults over one static backend on 127.0.0.1. The table shows the router's peak memory: the sum over
its processes (supervisor and workers) of their resident set, sampled every 10 ms, and the sum of their
kernel-recorded peaks (VmHWM, an upper bound), next to the memory limit the chart renders (1 Gi).
`--before REF` adds the same rows for the router at a git ref (a worktree of it, run from source), so
both stand side by side in one run.

    python benchmarks/router_memory.py [--workers 1,2,4] [--before 607204a] [--native]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 1024  # the router Deployment's memory limit (operator/specfleet/render/router.py)
BODY_BYTES = 32 * 1024 * 1024 - 64 * 1024
CLIENTS = 8
MODEL = "bench-model"


def _fill(head: bytes, unit: bytes, tail: bytes) -> bytes:
    return head + unit * ((BODY_BYTES - len(head) - len(tail)) // len(unit)) + tail


def _wide_char_body() -> bytes:
    head = b'{"model": "%s", "max_tokens": 1, "prompt": "\xf0\x9f\x98\x80' % MODEL.encode()
    return _fill(head, b"x", b'"}')


BODIES: dict[str, Callable[[], bytes]] = {
    "empty objects": lambda: _fill(
        b'{"model": "%s", "prompt": "x", "x": [' % MODEL.encode(), b"{},", b"{}]}"
    ),
    "empty arrays": lambda: _fill(b'{"model": "%s", "prompt": "x", "x": [' % MODEL.encode(), b"[],", b"[]]}"),
    "short strings": lambda: _fill(
        b'{"model": "%s", "prompt": "x", "x": [' % MODEL.encode(), b'"",', b'""]}'
    ),
    "one wide character": _wide_char_body,
}


@dataclass
class Row:
    target: str
    workers: int
    body: str
    answers: dict[int, int]
    peak_rss_mib: float
    peak_hwm_mib: float
    seconds: float


def _status(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return pids
    for child in children:
        pids.extend(_tree(int(child)))
    return pids


async def _backend() -> tuple[web.AppRunner, int]:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [{"text": "ok"}]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def _send(port: int, body: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: router\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout=120)
        return int(line.split()[1]) if line else 0
    except (ConnectionError, asyncio.IncompleteReadError):
        return 0
    finally:
        writer.close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _measure(pythonpath: str, target: str, workers: int, kind: str, backend_port: int) -> Row:
    body = BODIES[kind]()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "routing.json"
        config.write_text(
            json.dumps(
                {
                    "servedModelName": MODEL,
                    "pools": {"latency": {"staticUrls": [f"http://127.0.0.1:{backend_port}"]}},
                }
            )
        )
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": pythonpath}
        proc = subprocess.Popen(
            [sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config), "--host",
             "127.0.0.1", "--port", str(port), "--workers", str(workers), "--log-level", "error"],
            env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    w.close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"router ({target}, {workers} workers) did not start") from None
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # every worker listening
            peak = 0
            done = asyncio.Event()

            async def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, sum(_status(pid, "VmRSS") for pid in _tree(proc.pid)))
                    await asyncio.sleep(0.01)

            sampler = asyncio.create_task(sample())
            started = time.monotonic()
            answers = await asyncio.gather(*(_send(port, body) for _ in range(CLIENTS)))
            seconds = time.monotonic() - started
            hwm = sum(_status(pid, "VmHWM") for pid in _tree(proc.pid))
            done.set()
            await sampler
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    counts: dict[int, int] = {}
    for status in answers:
        counts[status] = counts.get(status, 0) + 1
    return Row(target, workers, kind, counts, peak / 2**20, hwm / 2**20, seconds)


def _worktree(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="router-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True,
                   capture_output=True)  # fmt: skip
    return path


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--before", help="also measure the router at this git ref")
    parser.add_argument(
        "--native", action="store_true", help="the mypyc-compiled router (scripts/compile-router.sh)"
    )
    parser.add_argument("--bodies", default=",".join(BODIES))
    args = parser.parse_args()
    targets: list[tuple[str, str]] = []
    before: Path | None = None
    if args.before:
        before = _worktree(args.before)
        targets.append((f"before ({args.before})", str(before / "runtime")))
    now = str(ROOT / "runtime")
    if args.native:
        built = subprocess.run(
            ["bash", str(ROOT / "scripts/compile-router.sh"), "--python", sys.executable],
            check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        now = f"{built}:{now}"
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    )
    targets.append((f"now ({head.stdout.strip()}{', native' if args.native else ''})", now))
    runner, backend_port = await _backend()
    rows: list[Row] = []
    try:
        for workers in (int(w) for w in args.workers.split(",")):
            for kind in args.bodies.split(","):
                for target, pythonpath in targets:
                    rows.append(await _measure(pythonpath, target, workers, kind, backend_port))
                    print(f"  measured {target} x{workers} {kind}", file=sys.stderr, flush=True)
    finally:
        await runner.cleanup()
        if before is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False
            )
    print(f"{CLIENTS} clients at once, each a {BODY_BYTES / 2**20:.1f} MiB body; limit {LIMIT_MIB} MiB; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'router':<28} {'workers':>7} {'body':<20} {'peak RSS MiB':>12} {'sum VmHWM MiB':>13} "
          f"{'of limit':>8} {'seconds':>7}  answers")  # fmt: skip
    for row in rows:
        answers = ", ".join(f"{n}x{status}" for status, n in sorted(row.answers.items()))
        print(f"{row.target:<28} {row.workers:>7} {row.body:<20} {row.peak_rss_mib:>12.0f} "
              f"{row.peak_hwm_mib:>13.0f} {row.peak_hwm_mib / LIMIT_MIB:>8.2f} {row.seconds:>7.1f}  {answers}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
