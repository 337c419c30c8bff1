"""Router overhead: added latency, max requests/s and CPU per request, direct vs specfleet router vs vllm-router.

    python benchmarks/router_bench.py [--backend emulator|fast] [--requests 500] [--concurrency 32]
                                      [--seconds 6] [--rounds 3] [--rate 200] [--cpu-requests 2000]
                                      [--prompts 1]
                                      [--routers uvloop:1,uvloop:1:native,uvloop:2:native[:prefix|:one]]
                                      [--references] [--no-install]
                                      [--vllm-router-policies round_robin,cache_aware]

Starts two backends on 127.0.0.1 (the engine emulator at --time-scale 0, or a trivial aiohttp backend
that answers a fixed completion), the specfleet router over both (one pool, static URLs), and
`vllm-router` from PyPI over the same two (round robin), installed on first use into its own venv
under ${SPECFLEET_CACHE:-~/.cache/specfleet}/bench-vllm-router; one specfleet router per
--routers entry (event loop, worker processes, and source or compiled build), so each lever is a row of the same run. Then: a warm-up; sequential latency,
the targets taking turns request by request (at most --requests each, --seconds per target); and
closed-loop throughput with --concurrency keep-alive connections from a lean client in a process of its
own (_ClosedLoop), in --rounds alternating rounds per target (together --seconds per target, at most
100x --requests a round), reporting the median round and the server's CPU per request meanwhile; in
each round also the server's CPU time per request at concurrency 8 (/proc/PID/stat over --cpu-requests
from aiohttp) and latency under an open-loop pace of --rate req/s with every other request streamed.
Every phase cycles over --prompts distinct prompts (default one: every request the same).
Taking turns keeps the comparison fair on a machine whose load drifts. With --references, two bare
Python proxies (see serve_reference_proxy) are measured alongside as the floor a Python router stands
on. Prints one Markdown table. Load is generated from this process and its closed-loop children only,
to 127.0.0.1 only; every process it starts is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import aiohttp
import httptools
from aiohttp import web

MODEL = "bench"


def prompt_texts(count: int) -> list[str]:
    """The load's `count` prompts (--prompts): "hello", then "h0001", "h0002", ...: each its own leading
    text (a prefix-aware picker places each apart, as it would the conversations of a real mix), all as
    long as "hello", so a request's bytes do not change with their number."""
    if not 1 <= count <= 10_000:
        raise SystemExit(f"--prompts must be 1..10000, not {count}")
    return ["hello", *(f"h{i:04d}" for i in range(1, count))]


def request_body(prompt: str, stream: bool = False) -> bytes:
    """A completion request's body (max_tokens 4), streamed or not."""
    doc: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    if stream:
        doc["stream"] = True
    return json.dumps(doc).encode()


class Bodies:
    """The request bodies every phase cycles over, the n-th request taking prompt n mod --prompts: the
    same prompts in the same turn for every phase and every target."""

    def __init__(self, prompts: int) -> None:
        texts = prompt_texts(prompts)
        self.plain = [request_body(text) for text in texts]
        self.streamed = [request_body(text, stream=True) for text in texts]

    def __len__(self) -> int:
        return len(self.plain)

    def body(self, n: int, stream: bool = False) -> bytes:
        return (self.streamed if stream else self.plain)[n % len(self.plain)]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# What a --routers entry's last field adds to its row's name.
SELECTION_LABELS = {
    "least": "",
    "prefix": ", PrefixAffinity",
    "one": ", LeastOutstanding over backend 1 only",
}
CACHE = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
VLLM_ROUTER_VENV = CACHE / "bench-vllm-router"


# ---- the trivial backend (run as a subprocess of this script) --------------------------------------

FIXED_COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "text": " a b c d", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
    }
).encode()


def serve_fast_backend(port: int) -> None:
    """A backend that costs as little as aiohttp allows: the fixed completion for every request."""

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=FIXED_COMPLETION, content_type="application/json")

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", ok)
    app.router.add_get("/v1/models", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# ---- reference proxies (run as subprocesses of this script) --------------------------------------------
#
# Not routers: what a Python proxy costs with nothing but forwarding, to show how much of the specfleet
# router's CPU per request is the floor of Python + uvloop + the engine-leg client, and how much is
# aiohttp's server (the client-facing leg) on top of that floor. Both use the router's own engine-leg
# client (`upstream.Client`), alternate over the two backends, parse the JSON body (as any classifying
# router must) and answer with the whole body (streams are read to their end first: these rows are
# for max req/s and CPU, not for streaming latency). No allow-list, no limits, no timeouts, no metrics.

REFERENCE_DROPPED = frozenset({"host", "content-length", "connection", "transfer-encoding", "date", "server"})


def serve_reference_proxy(kind: str, port: int, backends: list[str]) -> None:
    import gc

    import httptools
    import uvloop

    from specfleet_runtime.router.upstream import Client

    client = Client(5.0, 600.0)
    turn = [0]

    async def forward(
        target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        json.loads(body)
        turn[0] += 1
        sent = [(n, v) for n, v in headers if n.lower() not in REFERENCE_DROPPED]
        upstream = await client.request("POST", backends[turn[0] % len(backends)], target, sent, body)
        data = await upstream.read_all()
        kept = [(n, v) for n, v in upstream.headers if n.lower() not in REFERENCE_DROPPED]
        upstream.release()
        return upstream.status, upstream.reason, kept, data

    class Connection(asyncio.Protocol):
        """A bare HTTP/1.1 server connection on httptools: parse, forward, answer; nothing else."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.parser = httptools.HttpRequestParser(self)
            self.url = b""
            self.headers: list[tuple[str, str]] = []
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            headers, body = self.headers, b"".join(self.body)
            self.headers, self.body = [], []
            asyncio.get_running_loop().create_task(self.answer(self.url.decode("latin-1"), headers, body))

        async def answer(self, target: str, headers: list[tuple[str, str]], body: bytes) -> None:
            if target == "/health":
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                return
            status, reason, kept, data = await forward(target, headers, body)
            head = "".join(f"{n}: {v}\r\n" for n, v in kept)
            self.transport.write(
                f"HTTP/1.1 {status} {reason}\r\n{head}Content-Length: {len(data)}\r\n\r\n".encode() + data
            )

    async def aiohttp_handler(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(text="ok")
        status, reason, kept, data = await forward(
            request.raw_path, list(request.headers.items()), await request.read()
        )
        return web.Response(body=data, status=status, reason=reason, headers=kept)

    async def serve() -> None:
        if kind == "httptools":
            await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", port)
        else:
            runner = web.ServerRunner(web.Server(aiohttp_handler, handler_cancellation=True, access_log=None))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    gc.freeze()
    uvloop.run(serve())


# ---- processes ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def router_env(build: str) -> dict[str, str] | None:
    """The environment of a router of this build: '' runs the source, 'native' the mypyc-compiled build
    of its request path (scripts/compile-router.sh, as the image ships it; built once, then cached)."""
    if not build:
        return None
    if build != "native":
        raise SystemExit(f"unknown router build {build!r} (known: native)")
    script = Path(__file__).resolve().parents[1] / "scripts" / "compile-router.sh"
    native = (
        subprocess.run(
            ["bash", str(script), "--python", sys.executable], check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [native, os.environ.get("PYTHONPATH")]))}


class Processes:
    """Every process this benchmark starts, stopped by PID at the end (SIGTERM, then SIGKILL)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not healthy after {timeout:g}s")


def vllm_router_binary(install: bool) -> tuple[Path | None, str]:
    """The vllm-router executable, installing it into its own venv if allowed; else None and why."""
    binary = VLLM_ROUTER_VENV / "bin" / "vllm-router"
    if binary.exists():
        return binary, "installed"
    if not install:
        return None, f"not installed at {binary} (--no-install)"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VLLM_ROUTER_VENV)], check=True)
        subprocess.run([str(VLLM_ROUTER_VENV / "bin" / "pip"), "install", "-q", "vllm-router"], check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        return None, f"pip install vllm-router failed: {err}"
    return (binary, "installed now") if binary.exists() else (None, "vllm-router has no CLI after install")


# ---- load --------------------------------------------------------------------------------------------


@dataclass
class Result:
    target: str
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    rps_rounds: list[float]
    cpu_ms: float | None
    max_cpu_ms: float
    max_cpu_rounds: list[float]
    client_cpu_ms: float
    paced_p50_ms: float
    paced_p99_ms: float


def paired_ratio(ours: list[float], theirs: list[float] | None) -> str:
    """One round's figure over vllm-router's in the same round, round by round (the rounds alternate,
    so each pair ran minutes apart at most): the median and range of the per-round ratios. On a
    shared machine one round's rate moves by 10% or more, and its CPU per request by 5%, so the
    spread says how far a ratio of medians can be trusted."""
    if theirs is None or ours is theirs or not theirs:
        return "-"
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def thread_count(pid: int) -> int:
    """Threads of a process now (vllm-router runs a worker thread per core; ours one event loop)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def process_tree(pid: int) -> list[int]:
    """`pid` and its child processes (a router's supervisor and its workers)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return [pid, *sorted(children)]


def process_shape(pid: int) -> str:
    """ "processes x threads": the serving processes (a supervisor's workers) and threads of each."""
    tree = process_tree(pid)
    workers = tree[1:] or tree
    shape = f"{len(workers)} x {thread_count(workers[0])}"
    return shape + " (+ supervisor)" if len(tree) > 1 else shape


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children (all threads) so far, from /proc."""
    total = 0
    for member in process_tree(pid):
        fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


async def one_request(http: aiohttp.ClientSession, url: str, body: bytes) -> bool:
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        return resp.status == 200


async def interleaved_latencies(
    urls: list[str], count: int, seconds: float, bodies: Bodies
) -> tuple[list[list[float]], list[int]]:
    """Sequential requests taking turns over the targets, so drift in machine load hits all alike."""
    latencies: list[list[float]] = [[] for _ in urls]
    errors = [0 for _ in urls]
    deadline = time.monotonic() + seconds
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in urls]
    try:
        for http, url in zip(sessions, urls, strict=True):
            for n in range(max(20, len(bodies))):  # warm-up: connections, caches, every prompt placed
                await one_request(http, url, bodies.body(n))
        for n in range(count):
            if time.monotonic() > deadline:
                break
            for i, (http, url) in enumerate(zip(sessions, urls, strict=True)):
                started = time.perf_counter()
                if await one_request(http, url, bodies.body(n)):
                    latencies[i].append(time.perf_counter() - started)
                else:
                    errors[i] += 1
    finally:
        for http in sessions:
            await http.close()
    return latencies, errors


async def paced_latencies(url: str, rate: float, seconds: float, bodies: Bodies) -> tuple[list[float], int]:
    """Open loop at a fixed `rate`: latencies of requests started on a schedule, every other one streamed
    (requests 2k and 2k + 1 take the same prompt, so each prompt is sent both ways)."""
    latencies: list[float] = []
    errors = 0

    async def send(http: aiohttp.ClientSession, body: bytes) -> None:
        nonlocal errors
        started = time.perf_counter()
        try:
            ok = await one_request(http, url, body)
        except aiohttp.ClientError:
            ok = False
        if ok:
            latencies.append(time.perf_counter() - started)
        else:
            errors += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = []
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(http, bodies.body(i // 2, stream=i % 2 == 1))))
        await asyncio.gather(*tasks)
    return latencies, errors


class _LoadConnection(asyncio.Protocol):
    """One keep-alive connection of the closed loop: sends the next request when a response completes."""

    def __init__(self, loop: _ClosedLoop) -> None:
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed_here = False  # closed by this client (done), not lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()  # counted as an error in connection_lost

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() == 200:
            self.loop.done += 1
        else:
            self.loop.errors += 1
        self.send()

    def send(self) -> None:
        if self.transport is not None and self.loop.more():
            self.transport.write(self.loop.next_request())
        else:
            self.close()

    def close(self) -> None:
        self.closed_here = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.loop.lost(self)


class _ClosedLoop:
    """`concurrency` connections, each sending its next request the moment a response completes; pre-built
    request bytes and httptools' C parser keep the client's own CPU per request to a fraction of a
    router's (it shares the machine with what it measures). The requests cycle over `prompts` prompts,
    in the order they are sent."""

    def __init__(
        self, url: str, concurrency: int, seconds: float, max_requests: int, prompts: int = 1
    ) -> None:
        parsed = urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        head = f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Type: application/json\r\n"
        self.requests = [
            f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body for body in Bodies(prompts).plain
        ]
        self.sent = 0
        self.concurrency, self.seconds, self.max_requests = concurrency, seconds, max_requests
        self.done = self.errors = 0
        self.deadline = 0.0
        self.open: set[_LoadConnection] = set()
        self.finished: asyncio.Future[None] | None = None

    def more(self) -> bool:
        return time.monotonic() < self.deadline and self.done + self.errors < self.max_requests

    def next_request(self) -> bytes:
        request = self.requests[self.sent % len(self.requests)]
        self.sent += 1
        return request

    def lost(self, connection: _LoadConnection) -> None:
        self.open.discard(connection)
        if self.more() and not connection.closed_here:
            # Lost mid-loop (closed by the server, or a bad response): an error, and a fresh connection
            # keeps the concurrency.
            self.errors += 1
            asyncio.get_running_loop().create_task(self.connect(start=True))
        else:
            self.finish_if_idle()

    def finish_if_idle(self) -> None:
        if not self.open and self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    async def connect(self, start: bool) -> None:
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: _LoadConnection(self), self.host, self.port
            )
        except OSError:
            self.errors += 1
            self.finish_if_idle()
            return
        self.open.add(conn)
        if start:
            conn.send()

    async def run(self) -> dict[str, float]:
        self.finished = asyncio.get_running_loop().create_future()
        for _ in range(self.concurrency):
            await self.connect(start=False)
        cpu = os.times()
        started = time.monotonic()
        self.deadline = started + self.seconds
        for conn in list(self.open):
            conn.send()
        await self.finished
        elapsed = time.monotonic() - started
        used = os.times()
        cpu_s = used.user - cpu.user + used.system - cpu.system
        return {"done": self.done, "errors": self.errors, "seconds": elapsed, "cpu_seconds": cpu_s}


def run_closed_loop(url: str, concurrency: int, seconds: float, max_requests: int, prompts: int) -> None:
    """The closed loop in a process of its own (run by closed_loop_rps), on uvloop; prints one JSON line."""
    import uvloop

    print(json.dumps(uvloop.run(_ClosedLoop(url, concurrency, seconds, max_requests, prompts).run())))


@dataclass
class Throughput:
    rps: float
    errors: int
    server_cpu_ms: float  # the target's CPU per request during the loop
    client_cpu_ms: float  # the load generator's own


async def closed_loop_rps(
    url: str, pid: int, concurrency: int, seconds: float, max_requests: int, prompts: int
) -> Throughput:
    """Max requests per second with `concurrency` connections in a closed loop, from a lean client in a
    process of its own (a Python HTTP client such as aiohttp spends ~0.2 ms of CPU a request, as much as
    two routers, on the same two CPUs: the routers would be measured through the client's share)."""
    before = cpu_seconds(pid)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--closed-loop", url, str(concurrency), str(seconds), str(max_requests),
        str(prompts), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    after = cpu_seconds(pid)
    if proc.returncode != 0:
        raise RuntimeError(f"closed loop against {url} exited with {proc.returncode}")
    got = json.loads(out.decode().splitlines()[-1])
    done = max(1, int(got["done"]))
    return Throughput(
        rps=got["done"] / got["seconds"],
        errors=int(got["errors"]),
        server_cpu_ms=(after - before) * 1000 / done,
        client_cpu_ms=got["cpu_seconds"] * 1000 / done,
    )


async def cpu_per_request(url: str, pid: int, requests: int, concurrency: int, bodies: Bodies) -> float:
    """CPU milliseconds the process at `pid` spends per request, over `requests` at `concurrency`."""
    left = requests

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one_request(http, url, bodies.body(left))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        for n in range(50):
            await one_request(http, url, bodies.body(n))
        before = cpu_seconds(pid)
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        after = cpu_seconds(pid)
    return (after - before) * 1000 / requests


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (1..99) of `values`."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def measure(targets: list[tuple[str, str, int]], args: argparse.Namespace) -> list[Result]:
    """Latency interleaved over all targets; throughput and paced latency in `--rounds` alternating
    rounds (median kept), each round starting at the next target (no target always runs first or
    last); CPU per request from /proc in the same rounds (median kept)."""
    urls = [f"{base}/v1/completions" for _, base, _ in targets]
    bodies = Bodies(args.prompts)
    latencies, errors = await interleaved_latencies(urls, args.requests, args.seconds * len(urls), bodies)
    rates: list[list[float]] = [[] for _ in urls]
    cpu: list[list[float]] = [[] for _ in urls]
    max_cpu: list[list[float]] = [[] for _ in urls]
    client_cpu: list[list[float]] = [[] for _ in urls]
    paced: list[list[float]] = [[] for _ in urls]
    for round_ in range(args.rounds):
        # Each round starts at the next target, so none always runs first or last in a round.
        for i in [(round_ + j) % len(urls) for j in range(len(urls))]:
            url = urls[i]
            loop = await closed_loop_rps(
                url,
                targets[i][2],
                args.concurrency,
                args.seconds / args.rounds,
                args.requests * 100,
                args.prompts,
            )
            rates[i].append(loop.rps)
            max_cpu[i].append(loop.server_cpu_ms)
            client_cpu[i].append(loop.client_cpu_ms)
            errors[i] += loop.errors
            cpu[i].append(await cpu_per_request(url, targets[i][2], args.cpu_requests, 8, bodies))
            got, failed = await paced_latencies(url, args.rate, args.seconds / args.rounds, bodies)
            paced[i] += got
            errors[i] += failed
    return [
        Result(
            name,
            p50_ms=percentile(latencies[i], 50) * 1000,
            p99_ms=percentile(latencies[i], 99) * 1000,
            rps=statistics.median(rates[i]),
            rps_rounds=rates[i],
            errors=errors[i],
            cpu_ms=statistics.median(cpu[i]),
            max_cpu_ms=statistics.median(max_cpu[i]),
            max_cpu_rounds=max_cpu[i],
            client_cpu_ms=statistics.median(client_cpu[i]),
            paced_p50_ms=percentile(paced[i], 50) * 1000,
            paced_p99_ms=percentile(paced[i], 99) * 1000,
        )
        for i, (name, _, _) in enumerate(targets)
    ]


# ---- main --------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    # Other work on the machine skews every number: the load average is printed with the table.
    load_before = os.getloadavg()[0]
    log_dir = Path(tempfile.mkdtemp(prefix="router-bench-"))
    procs = Processes(log_dir)
    skipped: dict[str, str] = {}
    try:
        backends: list[str] = []
        backend_pids: list[int] = []
        for i in range(2):
            port = free_port()
            if args.backend == "emulator":
                cmd = [
                    sys.executable, "-m", "specfleet_runtime.emulator", "--model", "m",
                    "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
                    "--time-scale", "0",
                ]  # fmt: skip
            else:
                cmd = [sys.executable, __file__, "--serve-fast-backend", str(port)]
            proc = procs.start(f"backend-{i}", cmd)
            backend_pids.append(proc.pid)
            backends.append(f"http://127.0.0.1:{port}")
            await wait_healthy(f"{backends[-1]}/health", proc)

        # Least outstanding by default: it measures the proxy alone. A target ending in ":prefix" runs the
        # product's default, PrefixAffinity, on top (its prefix keys and shared placements; with
        # --prompts 1 identical requests share a prefix, and its load bound stays above what 32
        # connections keep outstanding on a worker, so nearly all of them go to one backend; with more
        # prompts it places each apart). One ending in ":one" is least outstanding over backend 1
        # alone: the one-prompt placement without PrefixAffinity's picker, to tell apart what the
        # picker costs from what sending everything to one backend costs the machine.
        configs = {}
        for selection, endpoint_selection, urls in (
            ("least", {"latency": {"strategy": "LeastOutstanding"}}, backends),
            ("prefix", {"latency": {"strategy": "PrefixAffinity"}}, backends),
            ("one", {"latency": {"strategy": "LeastOutstanding"}}, backends[:1]),
        ):
            configs[selection] = log_dir / f"routing-{selection}.json"
            configs[selection].write_text(
                json.dumps(
                    {
                        "servedModelName": MODEL,
                        "pools": {"latency": {"staticUrls": urls}},
                        "endpointSelection": endpoint_selection,
                    }
                )
            )
        targets = [("direct (backend 1)", backends[0], backend_pids[0])]
        for variant in args.routers.split(","):
            loop, _, rest = variant.partition(":")
            workers, _, rest = rest.partition(":")
            build, _, selection = rest.partition(":")
            workers = workers or "1"
            selection = selection or "least"
            if selection not in configs:
                raise SystemExit(
                    f"unknown endpoint selection {selection!r} in {variant!r} (known: {', '.join(configs)})"
                )
            config = configs[selection]
            ours = f"http://127.0.0.1:{free_port()}"
            proc = procs.start(
                f"specfleet-router-{loop}-{workers}-{build or 'python'}-{selection}",
                [
                    sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config),
                    "--host", "127.0.0.1", "--port", ours.rsplit(":", 1)[1], "--log-level", "warning",
                    "--event-loop", loop, "--workers", workers,
                ],
                env=router_env(build),
            )  # fmt: skip
            await wait_healthy(f"{ours}/readyz", proc)
            if int(workers) > 1:
                await asyncio.sleep(1.0)  # every worker listening
            targets.append(
                (
                    f"specfleet-router ({loop}, {workers} worker{'s' if workers != '1' else ''}"
                    f"{', compiled' if build == 'native' else ''}"
                    f"{SELECTION_LABELS[selection]})",
                    ours,
                    proc.pid,
                )
            )
        if args.references:
            for kind in ("httptools", "aiohttp"):
                ref_port = free_port()
                proc = procs.start(
                    f"reference-{kind}",
                    [sys.executable, __file__, "--serve-reference", kind, str(ref_port), *backends],
                )
                ref_url = f"http://127.0.0.1:{ref_port}"
                await wait_healthy(f"{ref_url}/health", proc)
                targets.append(
                    (f"reference: bare Python proxy, {kind} server (no guards)", ref_url, proc.pid)
                )
        binary, why = vllm_router_binary(not args.no_install)
        for policy in args.vllm_router_policies.split(","):
            # round_robin is the reference the ratios divide by; cache_aware is its prefix-aware
            # selection, like for like with PrefixAffinity (both read the prompt of every request).
            name = "vllm-router" if policy == "round_robin" else f"vllm-router ({policy})"
            if binary is None:
                skipped[name] = why
                continue
            theirs = f"http://127.0.0.1:{free_port()}"
            proc = procs.start(
                name.replace(" ", "-").replace("(", "").replace(")", ""),
                [
                    str(binary), "--host", "127.0.0.1", "--port", theirs.rsplit(":", 1)[1],
                    "--worker-urls", *backends, "--policy", policy,
                    "--prometheus-port", str(free_port()), "--log-level", "warning",
                ],
            )  # fmt: skip
            try:
                await wait_healthy(f"{theirs}/health", proc)
                targets.append((name, theirs, proc.pid))
            except RuntimeError as err:
                skipped[name] = f"did not start: {err} (log: {log_dir})"

        results = await measure(targets, args)
        shape = {name: process_shape(pid) for name, _, pid in targets}
    finally:
        procs.stop_all()

    direct = results[0]
    client_cpu = statistics.median(r.client_cpu_ms for r in results)
    print(
        f"\nRouter overhead, {args.backend} backend x2, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node()} ({os.cpu_count()} CPUs, {platform.python_implementation()} "
        f"{platform.python_version()}), load average {load_before:.1f} before / "
        f"{os.getloadavg()[0]:.1f} after, {args.prompts} prompt{'s' if args.prompts != 1 else ''}"
    )
    print(
        f"latency: {args.requests} sequential non-streaming completions (max_tokens 4) per target, "
        f"targets taking turns; throughput: closed loop, {args.concurrency} keep-alive connections from a "
        f"lean client in its own process (its CPU: median {client_cpu:.3f} ms/req), median of "
        f"{args.rounds} alternating rounds of {args.seconds / args.rounds:g}s; CPU ms/req: the server "
        f"processes' (a supervisor and its workers together) user+system time from /proc, at max req/s "
        f"and over {args.cpu_requests} requests at concurrency 8 from aiohttp, "
        f"median of {args.rounds} rounds; paced: open loop at {args.rate:g} req/s, every other request "
        "streamed (to the end of the stream), all rounds pooled\n"
    )
    theirs = next((r for r in results if r.target == "vllm-router"), None)
    print(
        "| target | processes x threads | p50 ms | p99 ms | added p50 ms | added p99 ms | max req/s "
        "| max req/s / vllm-router's, per round: median (range) "
        "| CPU ms/req at max req/s | its / vllm-router's, per round: median (range) "
        "| CPU ms/req at concurrency 8 "
        f"| at {args.rate:g} req/s: p50 ms | p99 ms | added p99 ms | errors |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        added = "-" if r is direct else f"{r.p50_ms - direct.p50_ms:+.2f}"
        added99 = "-" if r is direct else f"{r.p99_ms - direct.p99_ms:+.2f}"
        paced99 = "-" if r is direct else f"{r.paced_p99_ms - direct.paced_p99_ms:+.2f}"
        print(
            f"| {r.target} | {shape[r.target]} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {added} | {added99} | {r.rps:.0f} "
            f"| {paired_ratio(r.rps_rounds, None if r is direct or theirs is None else theirs.rps_rounds)} "
            f"| {r.max_cpu_ms:.3f} "
            f"| {paired_ratio(r.max_cpu_rounds, None if r is direct or theirs is None else theirs.max_cpu_rounds)} "
            f"| {r.cpu_ms:.3f} | {r.paced_p50_ms:.2f} | {r.paced_p99_ms:.2f} | {paced99} | {r.errors} |"
        )
    for name, why in skipped.items():
        print(f"| {name} | not run: {why} | | | | | | |")
    print(f"\nlogs: {log_dir}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["emulator", "fast"], default="emulator")
    parser.add_argument("--requests", type=int, default=500, help="sequential requests per target")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=18.0, help="time bound of each phase, per target")
    parser.add_argument("--rounds", type=int, default=9, help="alternating throughput rounds per target")
    parser.add_argument("--rate", type=float, default=200.0, help="paced phase: requests per second")
    parser.add_argument(
        "--prompts",
        type=int,
        default=1,
        help="distinct prompts the load cycles over, each with its own leading text and all as long as the "
        "one prompt of --prompts 1 (every phase alike; with one, a prefix-aware selection sends nearly "
        "everything to one backend: its worst case)",
    )
    parser.add_argument(
        "--cpu-requests", type=int, default=2000, help="requests per CPU-per-request round (concurrency 8)"
    )
    parser.add_argument(
        "--routers",
        default="uvloop:1,uvloop:1:native,uvloop:2:native",
        help="specfleet-router targets as EVENT_LOOP:WORKERS[:BUILD[:prefix|one]], comma-separated "
        "(--event-loop, --workers; BUILD native: the mypyc-compiled build of scripts/compile-router.sh, as the "
        "image ships it, or empty for Python; prefix: PrefixAffinity, the default endpoint selection, instead "
        "of LeastOutstanding; one: LeastOutstanding over backend 1 alone, where PrefixAffinity sends this "
        "benchmark's requests)",
    )
    parser.add_argument("--no-install", action="store_true", help="do not pip install vllm-router")
    parser.add_argument(
        "--vllm-router-policies",
        default="round_robin",
        help="vllm-router rows, one per --policy, comma-separated; round_robin is the reference of the ratio "
        "column (cache_aware: its prefix-aware selection, to compare with PrefixAffinity)",
    )
    parser.add_argument(
        "--references",
        action="store_true",
        help="also measure two bare Python proxies (httptools / aiohttp server, no guards): the floor",
    )
    parser.add_argument("--serve-fast-backend", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-reference", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--closed-loop", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    prompt_texts(args.prompts)  # checks its range before anything starts
    if args.closed_loop:
        url, concurrency, seconds, max_requests, prompts = args.closed_loop
        run_closed_loop(url, int(concurrency), float(seconds), int(max_requests), int(prompts))
        return
    if args.serve_fast_backend:
        serve_fast_backend(args.serve_fast_backend)
        return
    if args.serve_reference:
        kind, port, *backends = args.serve_reference
        serve_reference_proxy(kind, int(port), backends)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
