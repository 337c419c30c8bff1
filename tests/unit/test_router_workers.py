"""Several router worker processes on one port (`--workers`): totals, reloads and shutdown stay right."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from specfleet_runtime.router.__main__ import process_count
from specfleet_runtime.router.affinity import prefix_keys
from specfleet_runtime.router.body import read_body_fields
from specfleet_runtime.router.conversations import (
    PLACEMENTS_FILE,
    ROWS,
    TABLE_FILE,
    ConversationTable,
    PlacedBoard,
)
from specfleet_runtime.router.workers import MULTIPROC_ENV, auto_workers, cpu_count, metrics_dir, worker_argv
from support.ports import free_port, refused
from support.router_harness import GOOD, MODEL, recording_engine, routing, wait_http
from support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


def counter_total(text: str, name: str) -> float:
    """The sum of a counter's samples in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _logged(log_path: Path, text: str) -> int:
    """Lines of the router's log (supervisor and workers together) that contain `text`."""
    return sum(text in line for line in log_path.read_text(errors="replace").splitlines())


def router_command(config: Path, port: int, *extra: str) -> list[str]:
    """The router on 127.0.0.1:`port` (0: the kernel picks) reading `config`, with `extra` arguments."""
    return [
        sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config),
        "--host", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip


async def fresh_post(url: str, body: bytes = GOOD) -> int:
    # A new connection each time, so the kernel spreads them over the workers.
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        await resp.read()
        return resp.status


async def scrape(url: str) -> str:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.get(f"{url}/metrics") as resp,
    ):
        return await resp.text()


async def test_two_workers_share_the_port_and_report_pod_totals(tmp_path: Path) -> None:
    async with recording_engine() as engine:
        config = tmp_path / "routing.json"
        config.write_text(json.dumps(routing([engine.url], [])))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = tmp_path / "router.log"
        cmd = router_command(
            config, port, "--workers", "2", "--poll-seconds", "0.1", "--shutdown-delay-seconds", "0"
        )
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            await wait_http(f"{url}/readyz")
            # One answering worker is not both: wait until each says it listens.
            await wait_until(
                lambda: _logged(log_path, "router listening on") == 2, 20, "both workers listening"
            )
            statuses = await asyncio.gather(*(fresh_post(f"{url}/v1/completions") for _ in range(40)))
            assert statuses == [200] * 40
            # Whichever worker answers the scrape, it reports both workers' requests.
            for _ in range(6):
                text = await scrape(url)
                assert counter_total(text, "specfleet_router_requests_total") == 40
                assert counter_total(text, "specfleet_router_in_flight_requests") == 0

            # A config change reaches every worker: the new model name is served on every connection.
            config.write_text(json.dumps({**routing([engine.url], []), "servedModelName": "renamed"}))
            await wait_until(lambda: _logged(log_path, "(model renamed,") == 2, 20, "both workers reloaded")
            renamed = json.dumps({"model": "renamed", "prompt": "x", "max_tokens": 2}).encode()
            statuses = await asyncio.gather(
                *(fresh_post(f"{url}/v1/completions", renamed) for _ in range(20))
            )
            assert statuses == [200] * 20
            old = await asyncio.gather(*(fresh_post(f"{url}/v1/completions") for _ in range(10)))
            assert old == [404] * 10

            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        log = log_path.read_text()
        assert "router supervisor: 2 worker(s)" in log
        assert log.count("router stopped") == 2
        assert engine.seen.count("/v1/completions") == 60
        assert MODEL != "renamed"


async def test_the_workers_record_conversations_in_one_shared_table(tmp_path: Path) -> None:
    """Prefix affinity's conversation table is shared by the workers (a file in their shared
    directory): 16 conversations' first turns, each on a new connection (the kernel spreads them over
    both workers), are all found in the one table, each under the engine that served it. A table of
    each worker's own leaves the file empty or missing and fails this. The workers' placements of the
    leading texts (here each conversation's own: the system prompt through the first user message) are
    on their shared board, each by its request's size, whichever worker placed it."""
    async with contextlib.AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(recording_engine()) for _ in range(4)]
        urls = [e.url for e in engines]
        config = tmp_path / "routing.json"
        selection = {"latency": {"strategy": "PrefixAffinity"}}
        config.write_text(json.dumps(routing(urls, [], endpointSelection=selection)))
        shared = tmp_path / "shared"
        shared.mkdir()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = tmp_path / "router.log"
        cmd = router_command(config, port, "--workers", "2", "--shutdown-delay-seconds", "0")
        env = {**os.environ, MULTIPROC_ENV: str(shared)}
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            await wait_http(f"{url}/readyz")
            await wait_until(
                lambda: _logged(log_path, "router listening on") == 2, 20, "both workers listening"
            )
            served: dict[tuple[int, ...], str] = {}
            sizes: list[int] = []
            for n in range(16):
                messages = [
                    {"role": "system", "content": f"tenant {n % 3} system prompt"},
                    {"role": "user", "content": f"conversation {n}: hello"},
                ]
                body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 2}).encode()
                sizes.append(len(body))
                before = [len(e.seen) for e in engines]
                assert await fresh_post(f"{url}/v1/chat/completions", body) == 200
                (engine,) = [e.url for e, b in zip(engines, before, strict=True) if len(e.seen) > b]
                read = read_body_fields(body, prefix=True)
                keys = prefix_keys(read.prefix, read.turns, read.first_user)
                assert keys is not None
                served[keys.conversation] = engine
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
        table = ConversationTable(str(shared / TABLE_FILE))
        found = {keys: table.endpoint(keys[-1], urls) for keys in served}
        assert found == served
        placed = PlacedBoard(str(shared / PLACEMENTS_FILE), ROWS - 1).others(urls)
        assert sum(placed.values()) == sum(sizes)


def test_worker_command_divides_the_caps_and_reads_the_cgroup_limit(tmp_path: Path) -> None:
    argv = worker_argv(["--config-file", "r.json"], 3, {"--max-connections": 4096, "--max-in-flight": 0})
    assert (
        argv[-6:]
        == ["--workers", "1", "--reuse-port", "--max-connections", "1365", "--max-in-flight", "0"][-6:]
    )
    assert "--reuse-port" in argv
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert cpu_count(cpu_max) == min(2, cpu_count(tmp_path / "absent"))
    cpu_max.write_text("max 100000\n")
    assert cpu_count(cpu_max) == cpu_count(tmp_path / "absent")


async def test_workers_leave_with_a_killed_supervisor(tmp_path: Path) -> None:
    async with recording_engine() as engine:
        config = tmp_path / "routing.json"
        config.write_text(json.dumps(routing([engine.url], [])))
        port = free_port()
        log_path = tmp_path / "router.log"
        cmd = router_command(config, port, "--workers", "2")
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            await wait_http(f"http://127.0.0.1:{port}/readyz")
            await wait_until(
                lambda: _logged(log_path, "router listening on") == 2, 20, "both workers listening"
            )
            proc.kill()  # no chance to stop its workers itself
            proc.wait(10)
            await wait_until(
                lambda: refused(port), 10, "the port closed: no worker outlives its killed supervisor"
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


# ---- the one-process fallbacks -----------------------------------------------------------------------


def test_process_count_is_one_on_a_kernel_picked_port() -> None:
    assert process_count(None, 0) == 1
    assert process_count(None, 8000) == auto_workers()
    assert process_count(3, 8000) == 3
    assert process_count(1, 0) == 1
    with pytest.raises(SystemExit, match="needs a fixed --port"):
        process_count(2, 0)


def test_no_metrics_dir_means_one_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)

    def full(*args: object, **kwargs: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    # A full /dev/shm and temp dir cannot be made here (root may write anywhere): the failure is injected.
    monkeypatch.setattr("tempfile.mkdtemp", full)
    with caplog.at_level(logging.WARNING, logger="specfleet_runtime.router"):
        assert metrics_dir() is None
    assert "running one router process" in caplog.text
    monkeypatch.setenv(MULTIPROC_ENV, "/somewhere/given")
    assert metrics_dir() == "/somewhere/given"


async def test_a_kernel_picked_port_serves_from_one_process(tmp_path: Path) -> None:
    async with recording_engine() as engine:
        config = tmp_path / "routing.json"
        config.write_text(json.dumps(routing([engine.url], [])))
        log_path = tmp_path / "router.log"
        cmd = router_command(config, 0, "--log-level", "info", "--shutdown-delay-seconds", "0")
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            for _ in range(200):
                found = re.search(r"router listening on 127\.0\.0\.1:(\d+)", log_path.read_text())
                if found or proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            assert found, log_path.read_text()
            url = f"http://127.0.0.1:{found.group(1)}"
            await wait_http(f"{url}/readyz")
            assert await fresh_post(f"{url}/v1/completions") == 200
            # No supervisor, no workers: the process serving is the one started.
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            assert children == []
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert "router supervisor" not in log_path.read_text()
