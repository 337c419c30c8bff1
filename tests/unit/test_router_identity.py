"""Identity trust through the real router process: a client's own tenant and client headers count
only where the routing config trusts them (a gateway in front sets them), whatever the client claims.

The router runs as `python -m specfleet_runtime.router` over two engine emulators; requests come from
the official `openai` client.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet_runtime.emulator.testing import serve_emulator
from specfleet_runtime.router.classify import sha256_hex
from support.ports import free_port
from support.router_harness import MODEL, emulator_config, routing, wait_http

pytestmark = pytest.mark.timeout(90)

VIP_KEY = "sk-vip"
ATTACKER_KEY = "sk-attacker"
VICTIM_KEY = "sk-victim"
# What the attacker sends on every request: a tenant whose rule comes first and the victim's identity.
CLAIMS = {"x-specfleet-tenant": "etl", "x-specfleet-client": "victim"}


@asynccontextmanager
async def router_process(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[str]:
    """The router as it runs in a pod, on a config file; yields its URL."""
    config_path = tmp_path / "routing.json"
    config_path.write_text(json.dumps(config))
    port = free_port()
    cmd = [
        sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config_path),
        "--host", "127.0.0.1", "--port", str(port), "--drain-seconds", "1",
        "--workers", "1",  # in-flight counts are per worker: one, so both streams count together
    ]  # fmt: skip
    with (tmp_path / "router.log").open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_http(f"{url}/readyz")
        yield url
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def to_batch_transitions(url: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "specfleet_router_segment_transitions_total" and sample.labels == {
                "direction": "to_batch"
            }:
                return sample.value
    return 0.0


async def wait_for_segmentation(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while await to_batch_transitions(url) < 1:
        if time.monotonic() > deadline:
            raise AssertionError("no client was segmented")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("trust", "vip_claiming_etl", "victim_while_flooded"),
    [
        # The default: the claims are ignored; the VIP's key rule holds and the victim is its own key.
        ({}, ("latency", "api_key"), ("latency", "default")),
        # A gateway in front sets both headers: they are the identity.
        (
            {"tenantHeaderTrust": "Trusted", "clientHeaderTrust": "Trusted"},
            ("batch", "tenant"),
            ("batch", "auto_segmentation"),
        ),
    ],
    ids=["untrusted", "trusted"],
)
async def test_claimed_identity_counts_only_where_trusted(
    tmp_path: Path,
    trust: dict[str, str],
    vip_claiming_etl: tuple[str, str],
    victim_while_flooded: tuple[str, str],
) -> None:
    # Slow engines (10x the cost model), so the attacker's long streams stay in flight until closed.
    async with (
        serve_emulator(emulator_config(time_scale=10.0)) as lat,
        serve_emulator(emulator_config(time_scale=10.0)) as bat,
    ):
        config = routing(
            [lat.url],
            [bat.url],
            tenantRules=[
                {"pool": "batch", "tenants": ["etl"]},
                {"pool": "latency", "apiKeySha256": [sha256_hex(VIP_KEY)]},
            ],
            autoSegmentation={"enabled": True, "inFlightThreshold": 1, "calmSeconds": 600},
            **trust,
        )
        async with router_process(tmp_path, config) as url:
            clients: list[openai.AsyncOpenAI] = []

            def client(key: str) -> openai.AsyncOpenAI:
                made = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
                clients.append(made)
                return made

            async def served(key: str, headers: dict[str, str]) -> tuple[str, str]:
                raw = await client(key).completions.with_raw_response.create(
                    model=MODEL, prompt="p", max_tokens=1, extra_headers=headers
                )
                return raw.headers["x-specfleet-served-pool"], raw.headers["x-specfleet-reason"]

            streams = []
            try:
                assert await served(VIP_KEY, CLAIMS) == vip_claiming_etl
                # Two long streams in flight (threshold 1) segment whichever client they count against.
                attacker = client(ATTACKER_KEY)
                for _ in range(2):
                    stream = await attacker.completions.create(
                        model=MODEL,
                        prompt="p",
                        max_tokens=2000,
                        stream=True,
                        extra_body={"ignore_eos": True},
                        extra_headers={"x-specfleet-client": "victim"},
                    )
                    streams.append(stream)
                await wait_for_segmentation(url)
                # The gateway (where there is one) names the victim by the header the attacker sent.
                assert await served(VICTIM_KEY, {"x-specfleet-client": "victim"}) == victim_while_flooded
            finally:
                for stream in streams:
                    await stream.close()
                for made in clients:
                    await made.close()
