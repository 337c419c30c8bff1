"""How far a reader must walk to follow one flip and one request: modules touched, entries, largest units.

    python benchmarks/walks.py

- A flip: `Controller.evaluate_policy` on example 01 with Threshold rules, over the unit tests'
  in-memory cluster and scripted Prometheus, at a load that turns the latency pool off (decide,
  record, render, apply, status).
- A request: one chat completion through the router (started in this process) to a minimal engine.

Each walk is traced with `sys.setprofile`: every call of a function of the product's packages
(`specfleet`, `specfleet_runtime`, less the engine emulator). A module is *touched* when one of its
functions runs; it is *entered* when a product function of another module calls into it (resumptions
of coroutines by the event loop are not entries). A module entered many times is one a reader goes
back to again and again. Then the largest product files and functions (by lines, with `ast`).
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PRODUCT = ("specfleet", "specfleet_runtime")
OUTSIDE = ("specfleet_runtime.emulator",)
PRODUCT_DIRS = ("operator", "runtime")


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    if not isinstance(name, str) or not name.startswith(PRODUCT) or name.startswith(OUTSIDE):
        return None
    if name.split(".")[0] not in PRODUCT:
        return None
    return name


class Walk:
    """Module touches and entries of the product code run while tracing."""

    def __init__(self) -> None:
        self.touched: Counter[str] = Counter()
        self.entries: Counter[str] = Counter()
        self.calls = 0

    def _profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = _module(frame)
        if module is None:
            return
        self.calls += 1
        self.touched[module] += 1
        caller = _module(frame.f_back)
        if caller is not None and caller != module:
            self.entries[module] += 1

    def trace(self, run: Callable[[], Any]) -> Any:
        sys.setprofile(self._profile)
        try:
            return run()
        finally:
            sys.setprofile(None)


def flip_walk() -> Walk:
    """Trace one evaluation that flips the latency pool off (the unit tests' world)."""
    from specfleet.controller.control import Controller
    from specfleet.render import RenderOptions
    from support.fake_cluster import FakeCluster
    from support.fake_prometheus import FakePrometheus
    from support.manifests import CLASSIC_THRESHOLDS, two_pool_example

    cluster = FakeCluster()
    key = ("SpeculativeDeployment", "default", "llama")
    cluster.objects[key] = two_pool_example({"mode": "Threshold", "thresholds": CLASSIC_THRESHOLDS})
    prom = FakePrometheus("default", "llama", 120)
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    controller = Controller(cluster, RenderOptions(), lambda url, timeout: prom, clock=lambda: now)
    controller.reconcile_object("default", "llama")
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[8.0, 4.0, 2.0], running=80.0)
    walk = Walk()
    outcome = walk.trace(lambda: controller.evaluate_policy("default", "llama"))
    if not any(d.flip for d in outcome.decisions):
        raise SystemExit(f"the traced evaluation did not flip: {outcome.decisions}")
    return walk


async def _request_walk() -> Walk:
    from aiohttp import ClientSession, web

    from specfleet_runtime.router.app import Router, RouterSettings
    from specfleet_runtime.router.serving import serve_router
    from specfleet_runtime.router.sources import ConfigFileSource

    async def chat(_request: web.Request) -> web.Response:
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": "tiny",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    engine_port = runner.addresses[0][1]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "routing.json"
        pools = {p: {"staticUrls": [f"http://127.0.0.1:{engine_port}"]} for p in ("latency", "batch")}
        path.write_text(json.dumps({"servedModelName": "tiny", "pools": pools}))
        settings = RouterSettings(connect_timeout=2.0, read_timeout=30.0, drain_seconds=1.0)
        router = Router(settings, ConfigFileSource(path, poll_seconds=0.05))
        async with serve_router(router, "127.0.0.1", 0) as listening, ClientSession() as http:
            url = f"http://127.0.0.1:{listening.addresses[0][1]}/v1/chat/completions"
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
            for _ in range(200):  # warm: config read, engine healthy
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise SystemExit("the router never answered 200")
            walk = Walk()
            sys.setprofile(walk._profile)
            try:
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    status = resp.status
            finally:
                sys.setprofile(None)
            if status != 200:
                raise SystemExit(f"traced request answered {status}")
    await runner.cleanup()
    return walk


def request_walk() -> Walk:
    return asyncio.run(_request_walk())


def largest_units(limit: int = 6) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The largest product files and functions (methods included), by lines."""
    files: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []
    for top in PRODUCT_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text()
            rel = str(path.relative_to(ROOT))
            files.append((text.count("\n"), rel))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                    functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
    return sorted(files, reverse=True)[:limit], sorted(functions, reverse=True)[:limit]


def _walk_table(name: str, walk: Walk) -> list[str]:
    most = ", ".join(f"{m} {n}" for m, n in walk.entries.most_common(5))
    return [
        f"| {name} | {len(walk.touched)} | {sum(walk.entries.values())} | {walk.calls} | {most} |",
    ]


def main() -> None:
    flip, request = flip_walk(), request_walk()
    print("| walk | modules touched | entries | product calls | most entered (entries) |")
    print("|---|---|---|---|---|")
    for line in (*_walk_table("flip", flip), *_walk_table("request", request)):
        print(line)
    files, functions = largest_units()
    print()
    print("| largest files (lines) | largest functions (lines) |")
    print("|---|---|")
    for (fl, fname), (gl, gname) in zip(files, functions, strict=True):
        print(f"| {fname} ({fl}) | {gname} ({gl}) |")
    print()
    for name, walk in (("flip", flip), ("request", request)):
        print(f"{name} modules: " + ", ".join(sorted(walk.touched)))


if __name__ == "__main__":
    main()
