"""The router's per-request selection path in process: LeastOutstanding against PrefixAffinity.

    python benchmarks/router_selection.py [--prompts 64] [--rounds 8] [--build NAME=DIR ...]

What one request of `router_bench.py`'s load (its bodies, cycling over `--prompts` prompts) costs a
router worker from its body to its endpoint, with no I/O: `Admission.facts` (the body's fields and its
prefix keys) then `Backends.pick`, and `acquire`, with a window of 16 requests outstanding (what each of
two workers holds under router_bench's 32 connections), the oldest released as each new one is sent.
Two `Backends` side by side, one a selection (the pool `latency` by LeastOutstanding, or by
PrefixAffinity: the configs of router_bench's `uvloop:2:native` and `uvloop:2:native:prefix`), each with
the workers' shared conversation table and placements board on /dev/shm and prometheus_client in
multiprocess mode, as a worker of `--workers 2` runs. The robust number on a shared machine is the
difference between the two selections within one process, which share whatever the neighbours leave.

Each `--build` (a folder put first on PYTHONPATH: `NAME=DIR`; default the compiled build of this
checkout, `scripts/compile-router.sh`, as the image ships it) is measured in `--rounds` processes, the
builds taking turns; each process runs 15 alternating repetitions of 5000 requests per selection and
reports its fastest (the least disturbed), and the table gives the median over processes in microseconds
per request: `pick` with the facts read beforehand, `facts+pick` with them read per request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from router_bench import Bodies

HERE = Path(__file__).resolve().parent
SELECTIONS = ("LeastOutstanding", "PrefixAffinity")
URLS = ["http://127.0.0.1:40001", "http://127.0.0.1:40002"]
WINDOW = 16  # requests one of two workers holds outstanding under 32 connections
REPETITIONS = 15
REQUESTS = 5000


def _selection_path(selection: str, shared: Path) -> tuple[Any, Any, Any]:
    """A worker's config, Backends and Admission for `selection` (imported here: after the metrics'
    multiprocess directory is set, which prometheus_client reads on import)."""
    from specfleet_runtime.router.admission import Admission
    from specfleet_runtime.router.backends import Backends
    from specfleet_runtime.router.conversations import (
        PLACEMENTS_FILE,
        TABLE_FILE,
        ConversationTable,
        PlacedBoard,
    )
    from specfleet_runtime.router.metrics import RouterMetrics
    from specfleet_runtime.routing_config import RoutingConfig

    config = RoutingConfig.from_json(
        json.dumps(
            {
                "servedModelName": "bench",
                "pools": {"latency": {"staticUrls": URLS}},
                "endpointSelection": {"latency": {"strategy": selection}},
            }
        )
    )
    table = ConversationTable(str(shared / TABLE_FILE))
    board = PlacedBoard(str(shared / PLACEMENTS_FILE), 0)
    backends = Backends("ns", 10.0, (), RouterMetrics(), time.monotonic, None, table, board)
    backends.apply_config(config)
    return config, backends, Admission(backends.metrics, time.monotonic)


def _requests(path: tuple[Any, Any, Any], bodies: list[bytes], count: int, read_facts: bool) -> float:
    """Nanoseconds a request over `count` requests cycling over `bodies`."""
    config, backends, admission = path
    headers = {"content-type": "application/json"}
    read = [admission.facts(config, headers, body, "127.0.0.1") for body in bodies]
    outstanding: deque[str] = deque()
    tried: set[str] = set()
    started = time.perf_counter_ns()
    for i in range(count):
        body = bodies[i % len(bodies)]
        facts = admission.facts(config, headers, body, "127.0.0.1") if read_facts else read[i % len(bodies)]
        url = backends.pick("latency", tried | tried, facts.prefix)  # the proxy's `tried | dropped`
        backends.acquire(url)
        outstanding.append(url)
        if len(outstanding) > WINDOW:
            backends.release(outstanding.popleft())
    elapsed = time.perf_counter_ns() - started
    for url in outstanding:
        backends.release(url)
    return elapsed / count


def measure_here(prompts: int) -> dict[str, float]:
    """One process's fastest repetition per selection and way, in ns a request."""
    bodies = Bodies(prompts).plain
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="router-selection-") as shared:
        metrics_dir = Path(shared, "metrics")
        metrics_dir.mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        paths = {}
        for selection in SELECTIONS:
            (Path(shared) / selection).mkdir()
            paths[selection] = _selection_path(selection, Path(shared) / selection)
            _requests(paths[selection], bodies, REQUESTS, True)  # places the prompts; warms up
        best: dict[str, float] = {}
        for repetition in range(REPETITIONS):
            order = SELECTIONS if repetition % 2 == 0 else SELECTIONS[::-1]
            for read_facts in (False, True):
                for selection in order:
                    key = f"{selection} {'facts+pick' if read_facts else 'pick'}"
                    took = _requests(paths[selection], bodies, REQUESTS, read_facts)
                    best[key] = min(best.get(key, took), took)
        return best


def compiled_build() -> str:
    script = HERE.parent / "scripts" / "compile-router.sh"
    done = subprocess.run(
        ["bash", str(script), "--python", sys.executable], check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"compile-router.sh failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--prompts", type=int, default=64, help="prompts the load cycles over (router_bench's)"
    )
    parser.add_argument("--rounds", type=int, default=8, help="processes per build, builds taking turns")
    parser.add_argument(
        "--build", action="append", metavar="NAME=DIR", help="a build to measure (repeatable)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_here(args.prompts)))
        return
    builds = dict(entry.split("=", 1) for entry in args.build or [f"compiled={compiled_build()}"])
    results: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    for round_ in range(args.rounds):
        for name in list(builds) if round_ % 2 == 0 else list(builds)[::-1]:
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [builds[name], os.environ.get("PYTHONPATH")])),
            }
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--prompts", str(args.prompts)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            results[name].append(json.loads(done.stdout.splitlines()[-1]))
    print(
        f"Selection path in process, {args.prompts} prompts, us a request (median over {args.rounds} processes "
        f"of each one's fastest of {REPETITIONS} x {REQUESTS}), load average {os.getloadavg()[0]:.1f}"
    )
    print("| build | way | LeastOutstanding | PrefixAffinity | PrefixAffinity - LeastOutstanding |")
    print("|---|---|---:|---:|---:|")
    for name, rows in results.items():
        for way in ("pick", "facts+pick"):
            least, prefix = (statistics.median(row[f"{s} {way}"] for row in rows) / 1000 for s in SELECTIONS)
            print(f"| {name} | {way} | {least:.3f} | {prefix:.3f} | {prefix - least:+.3f} |")


if __name__ == "__main__":
    main()
