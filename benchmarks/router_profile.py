"""The router's own CPU per request, split into user and system time, for profiling work on its hot path.

    python benchmarks/router_profile.py [--target router|reference] [--seconds 4] [--rounds 3]
                                        [--concurrency 8] [--cprofile FILE] [--native]
                                        [--endpoint-selection LeastOutstanding|PrefixAffinity] [--workers 1]

Starts two fast backends (`router_bench.py --serve-fast-backend`) and one target over both on
127.0.0.1: the specfleet router (uvloop, --workers worker processes) or the bare httptools reference
proxy of `router_bench.py --references` (the floor). Then --rounds closed-loop rounds of --seconds at
--concurrency, each printing requests/s and the target's user and system CPU time per request
(/proc/PID/stat; a router's supervisor and workers together), and the median. The router picks
endpoints by least outstanding requests, as `router_bench.py` measures the proxy alone, or with
`--endpoint-selection PrefixAffinity` by the product's default (its prefix keys and shared placements
on top). User time is the Python work per request, the part the router's own code decides; system
time is mostly the socket calls both targets make. With --cprofile FILE the router runs under
cProfile (much slower; for where the time goes, not for how much; with several workers it profiles
only the supervisor, so use one) and the top functions by own time are printed per request. Every
process it starts is stopped by PID. Not a comparison with vllm-router: that is `router_bench.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from router_bench import free_port, process_tree, router_env, wait_healthy

HERE = Path(__file__).resolve().parent
BODY = json.dumps({"model": "bench", "prompt": "hello", "max_tokens": 4}).encode()
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """User and system CPU ticks of a process and its children (a router's supervisor and workers)."""
    user = system = 0
    for member in process_tree(pid):
        fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    return user, system


async def closed_loop(url: str, pid: int, seconds: float, concurrency: int) -> tuple[float, float, float]:
    done = 0
    start_cpu = cpu_ticks(pid)
    started = time.monotonic()

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.monotonic() - started < seconds:
            async with http.post(url, data=BODY, headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                if resp.status != 200:
                    raise SystemExit(f"status {resp.status}")
            done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    end_cpu = cpu_ticks(pid)
    user = (end_cpu[0] - start_cpu[0]) / TICKS * 1000 / done
    system = (end_cpu[1] - start_cpu[1]) / TICKS * 1000 / done
    return done / elapsed, user, system


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="router-profile-"))
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (work / f"{len(procs)}.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        return proc

    try:
        backends = []
        for _ in range(2):
            port = free_port()
            proc = start([sys.executable, str(HERE / "router_bench.py"), "--serve-fast-backend", str(port)])
            backends.append(f"http://127.0.0.1:{port}")
            await wait_healthy(backends[-1] + "/health", proc)
        port = free_port()
        if args.target == "reference":
            cmd = [sys.executable, str(HERE / "router_bench.py"), "--serve-reference", "httptools", str(port)]
            proc = start(cmd + backends)
            await wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        else:
            config = work / "routing.json"
            config.write_text(
                json.dumps(
                    {
                        "servedModelName": "bench",
                        "pools": {"latency": {"staticUrls": backends}},
                        "endpointSelection": {"latency": {"strategy": args.endpoint_selection}},
                    }
                )
            )
            profiler = ["-m", "cProfile", "-o", str(args.cprofile)] if args.cprofile else []
            proc = start(
                [
                    sys.executable, *profiler, "-m", "specfleet_runtime.router", "--config-file", str(config),
                    "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                    "--event-loop", "uvloop", "--workers", str(args.workers),
                ],
                env=router_env("native" if args.native else ""),
            )  # fmt: skip
            await wait_healthy(f"http://127.0.0.1:{port}/readyz", proc)
        url = f"http://127.0.0.1:{port}/v1/completions"
        await closed_loop(url, proc.pid, 1.0, args.concurrency)  # warm-up
        rounds = []
        for _ in range(args.rounds):
            rps, user, system = await closed_loop(url, proc.pid, args.seconds, args.concurrency)
            rounds.append((rps, user, system))
            print(
                f"{args.target}: {rps:.0f} req/s, CPU ms/req {user + system:.3f} (user {user:.3f}, system {system:.3f})"
            )
        median = statistics.median(r[1] + r[2] for r in rounds)
        user_median = statistics.median(r[1] for r in rounds)
        print(
            f"{args.target}: median CPU ms/req {median:.3f}, median user ms/req {user_median:.3f}, load average {os.getloadavg()[0]:.1f}"
        )
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.cprofile and args.target == "router":
        stats = pstats.Stats(str(args.cprofile))
        requests = next(
            (s[1] for (f, _, n), s in stats.stats.items() if n == "on_headers_complete" and "server" in f),
            1,  # type: ignore[attr-defined]
        )
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[: args.top]  # type: ignore[attr-defined]
        total_calls = sum(s[1] for s in stats.stats.values())  # type: ignore[attr-defined]
        print(f"\ncProfile: {total_calls / requests:.0f} function calls per request (start-up included)")
        print(f"per request ({requests} requests), by own time:")
        for (file, line, name), (_, calls, own, cumulative, _) in rows:
            print(
                f"{calls / requests:6.1f} calls {own / requests * 1e6:8.2f} us own {cumulative / requests * 1e6:9.2f} us cum  {Path(file).name}:{line} {name}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=["router", "reference"], default="router")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cprofile", type=Path, help="run the router under cProfile, stats to this file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--native", action="store_true", help="the mypyc-compiled router (scripts/compile-router.sh)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="router worker processes (CPU summed with the supervisor's)"
    )
    parser.add_argument(
        "--endpoint-selection",
        choices=["LeastOutstanding", "PrefixAffinity"],
        default="LeastOutstanding",
        help="the router's strategy: the proxy alone, or the product's default on top of it",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
