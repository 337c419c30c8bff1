"""Prefix-aware endpoint choice: five routers over four emulated engines on a shared-prefix workload.

    python benchmarks/prefix_routing.py [--rates 2,4,6] [--seconds 30] [--warmup 10] [--quick]
                                        [--time-scale 4] [--no-install] [--out docs/benchmarks/prefix-routing.md]

The workload is the fleet simulator's rule, `specfleet.sim.workload.shared_prefix_conversations`
(seeded; tenants with 1-4k-token system prompts, multi-turn conversations whose context grows each turn),
turned into chat messages by `live_requests`: a tenant's system prompt is the same text in every one of
its conversations, and each turn repeats the conversation so far word for word, so whatever an engine
cached for one request is a prefix of the next. Four engine emulators (prefix caching on, a KV cache of
`KV_UTILIZATION`'s size, the published profile's prefill cost per prompt token, every step x
--time-scale so that the engines saturate at a request rate two shared CPUs can drive) serve it, behind
each router in turn: the specfleet router with LeastOutstanding, then PrefixAffinity, then vllm-router
(PyPI, installed as benchmarks/router_bench.py installs it) with cache_aware, consistent_hash and
round_robin. Each router sees the same requests at each rate, open loop, streamed (TTFT is the first
content chunk); the first --warmup seconds of each phase fill the engines and are not measured. Every
phase salts its system prompts, so no phase finds another's prefixes cached.

Measured per router and rate: TTFT p50/p99 of requests arriving in the window (a request with no first
token when the phase is cut off counts with the time it waited: a lower bound), output tokens/s streamed
during the window, the prefix cache hit rate (the engines' vllm:prefix_cache_hits / _queries), the load
imbalance (each engine's running + waiting, sampled every 0.25 s: the mean over samples of max/mean,
samples with at least one request per engine on average), and the router's CPU and read/write system
calls per request (/proc, the process and its children). Then the fleet simulator runs the same traces with least outstanding and with
prefix affinity. Prints one Markdown table and writes --out. Every process it starts is stopped by PID;
all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import router_bench as rb
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specfleet.api.validation import parse_resource
from specfleet.policy.predict.kv_cache import profile_capacity
from specfleet.sim.fleet import SimOptions, simulate
from specfleet.sim.options import LEAST_OUTSTANDING, PREFIX_AFFINITY, Strategy
from specfleet.sim.workload import Trace, shared_prefix_conversations
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile
from specfleet_runtime.router.affinity import Affinity, Ring, prefix_keys
from specfleet_runtime.router.body import read_body_fields
from specfleet_runtime.router.conversations import ConversationTable
from specfleet_runtime.router.endpoints import choose_endpoint
from specfleet_runtime.routing_config import DEFAULT_LOAD_BOUND_PERCENT, LOAD_BOUND_SLACK

MODEL = "bench"
ENGINES = 4
SEED = 29
TENANTS = 24
# The rule's defaults except: outputs of 32-256 tokens (fewer stream chunks for two shared CPUs to
# carry) and 4 s of think time (conversations reach their later turns within a phase of seconds).
OUTPUT_TOKENS = (32, 256)
THINK_SECONDS = 4.0
# The KV cache of each engine: what vLLM gives the published profile's model at this GPU memory
# utilisation (the simulator sizes its engines from the same setting), ~90k tokens. Small enough that
# one engine cannot keep every tenant's system prompt and the running requests at once.
KV_UTILIZATION = 0.35
SAMPLE_SECONDS = 0.25
DRAIN_SECONDS = 15.0
REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks" / "prefix-routing.md"


# ---- the workload as chat requests ---------------------------------------------------------------------


@dataclass(frozen=True)
class LiveRequest:
    """One request of the trace as it is sent: when, which conversation, and its chat messages."""

    arrival: float
    conversation: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int

    def body(self, salt: str) -> bytes:
        """The JSON body, the system prompt salted so that no earlier phase's cache entry matches."""
        messages = [{"role": r, "content": f"{salt} {t}" if r == "system" else t} for r, t in self.messages]
        doc = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def words(stem: str, count: int) -> str:
    """`count` distinct words (the emulator's tokenizer counts one token each: no punctuation in them)."""
    stem = stem.replace("/", "_")
    return " ".join(f"{stem}w{i}" for i in range(count))


def live_requests(trace: Trace) -> list[LiveRequest]:
    """The trace's requests as chat turns whose shared prefixes are identical text.

    A request's prefix is (tenant, S) then (conversation, P): the tenant's system prompt of S tokens, and
    P prompt tokens in all. A conversation's rows, in order of arrival, are its turns: turn j's user
    message has P_j - H_j tokens, where H_0 = S and H_j = P_{j-1} + O_{j-1} (the previous prompt and its
    answer, which the next turn repeats). The chat template adds a few tokens per message on top."""
    history: dict[str, list[tuple[str, str]]] = {}
    last: dict[str, tuple[int, int]] = {}  # conversation -> (prompt tokens, output tokens) of its last turn
    system: dict[str, str] = {}
    out: list[LiveRequest] = []
    for req in trace.requests:
        (tenant, system_tokens), (conversation, prompt) = req.prefix
        text = system.setdefault(tenant, words(f"s{tenant}", system_tokens))
        if conversation not in history:
            history[conversation] = [("system", text)]
            context = system_tokens
        else:
            previous_prompt, previous_output = last[conversation]
            turn = len(history[conversation]) // 2
            history[conversation].append(("assistant", words(f"a{conversation}t{turn}", previous_output)))
            context = previous_prompt + previous_output
        turn = len(history[conversation]) // 2
        history[conversation].append(("user", words(f"u{conversation}t{turn}", prompt - context)))
        last[conversation] = (prompt, req.output_tokens)
        out.append(LiveRequest(req.arrival, conversation, tuple(history[conversation]), req.output_tokens))
    return out


def workload(rate: float, seconds: float, warmup: float, seed: int = SEED, hot_share: float = 0.0) -> Trace:
    """The rule's trace over warmup + seconds with about `rate` x `seconds` requests arriving after the
    warm-up: the conversation count is scaled until the count fits (deterministic for the arguments).
    `hot_share`: the share of conversations that belong to one hot tenant (0: none)."""
    duration = warmup + seconds
    want = rate * seconds

    def trace(conversations: int) -> Trace:
        return shared_prefix_conversations(
            tenants=TENANTS,
            conversations=conversations,
            duration=duration,
            seed=seed,
            output_tokens=OUTPUT_TOKENS,
            think_seconds=THINK_SECONDS,
            hot_share=hot_share,
        )

    conversations = max(1, round(want / 3))
    for _ in range(4):
        got = sum(1 for r in trace(conversations).requests if r.arrival >= warmup)
        conversations = max(1, round(conversations * want / max(got, 1)))
    return trace(conversations)


# ---- one phase: one router, one rate ---------------------------------------------------------------------


@dataclass
class Phase:
    """What one router measured at one rate."""

    router: str
    rate: float
    offered: float = 0.0  # requests per second arriving in the window
    ttft: list[float] = field(default_factory=list)
    cut_off: int = 0  # requests with no first token when the phase ended
    errors: int = 0
    tokens_per_s: float = 0.0
    hit_rate: float | None = None
    imbalance: float | None = None  # mean over samples of max / mean outstanding
    cpu_ms: float | None = None  # router CPU per request
    syscalls: float | None = None  # the router's read and write system calls per request
    behind_s: float = 0.0  # how far the emulators fell behind their own clock (CPU-starved)
    hot: bool = False  # the one-hot-tenant workload rather than the uniform one
    trace: int = 0  # which trace of its rate: 0 the main one (seed SEED), n the seed SEED + n
    by_request: dict[int, float] = field(default_factory=dict)  # measured request's index -> its TTFT
    # specfleet PrefixAffinity: requests of the phase by what chose their engine (the router's counter)
    choices: dict[str, float] = field(default_factory=dict)
    skipped: str = ""

    def ttft_ms(self, q: int) -> float | None:
        return percentile(self.ttft, q) * 1000 if self.ttft else None


def percentile(values: Sequence[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def request_floors(trace: Trace, time_scale: float) -> list[tuple[str, float]]:
    """Each request's kind (a tenant's first request, a tenant's new conversation, or a later turn)
    and its TTFT with no queue and every cache in the right place, in seconds: its prompt tokens that
    no earlier request of the phase sent (those past its conversation's previous turn and answer, or
    for a conversation's first turn those past its tenant's system prompt if an earlier request sent
    it, else all) at the engines' prefill cost, plus one decode step at batch 1, both slowed by
    `time_scale`. No router does better: a tenant's first request is a cold prefill wherever it goes.
    (A lower bound: the chat template's few tokens per message are not counted.)"""
    profile = default_profile()
    seen: set[str] = set()
    context: dict[str, int] = {}  # conversation -> the tokens its next turn repeats
    out: list[tuple[str, float]] = []
    for req in trace.requests:
        (tenant, system), (conversation, prompt) = req.prefix
        if conversation in context:
            kind, cached = "turn", context[conversation]
        elif tenant in seen:
            kind, cached = "new conversation", system
        else:
            kind, cached = "new tenant", 0
        seen.add(tenant)
        context[conversation] = prompt + req.output_tokens
        ms = (prompt - cached) * profile.prefill_ms_per_token + profile.step_ms[0][0]
        out.append((kind, ms * time_scale / 1000))
    return out


def ttft_floor(trace: Trace, warmup: float, seconds: float, time_scale: float) -> list[float]:
    """`request_floors` of the requests arriving in the measured window [warmup, warmup + seconds)."""
    return [
        floor
        for req, (_, floor) in zip(trace.requests, request_floors(trace, time_scale), strict=True)
        if warmup <= req.arrival < warmup + seconds
    ]


async def engine_counters(http: aiohttp.ClientSession, engines: Sequence[str]) -> tuple[float, float]:
    """(queried, hit) prompt tokens summed over the engines' /metrics."""
    queried = hit = 0.0
    for url in engines:
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == vm.PREFIX_CACHE_QUERIES:
                    queried += sample.value
                elif sample.name == vm.PREFIX_CACHE_HITS:
                    hit += sample.value
    return queried, hit


async def prefix_choices(http: aiohttp.ClientSession, router: str) -> dict[str, float]:
    """The specfleet router's `specfleet_router_prefix_affinity_choices_total` by choice (empty for a
    router that has none): where prefix affinity sent each request."""
    counts: dict[str, float] = {}
    async with http.get(f"{router}/metrics") as resp:
        if resp.status != 200 or not resp.content_type.startswith("text/plain"):
            return counts  # vllm-router serves its metrics on another port
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "specfleet_router_prefix_affinity_choices":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    choice = sample.labels["choice"]
                    counts[choice] = counts.get(choice, 0.0) + sample.value
    return counts


async def engine_states(http: aiohttp.ClientSession, engines: Sequence[str]) -> list[dict[str, Any]]:
    states = []
    for url in engines:
        async with http.get(f"{url}/admin/state") as resp:
            states.append(await resp.json())
    return states


async def wait_idle(http: aiohttp.ClientSession, engines: Sequence[str], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(s["running"] + s["waiting"] == 0 for s in await engine_states(http, engines)):
            return True
        await asyncio.sleep(0.5)
    return False


async def run_phase(
    name: str,
    url: str,
    pid: int,
    engines: Sequence[str],
    requests: Sequence[LiveRequest],
    rate: float,
    seconds: float,
    warmup: float,
    salt: str,
) -> Phase:
    """Send `requests` open loop at their arrival times to `url`, measure the window [warmup, warmup +
    seconds), then cut off whatever still runs DRAIN_SECONDS after the last arrival."""
    phase = Phase(name, rate)
    bodies = [r.body(salt) for r in requests]
    window_tokens = 0
    samples: list[list[int]] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http,
        aiohttp.ClientSession() as admin,
    ):
        start = time.monotonic()
        in_window = False

        async def send(index: int, req: LiveRequest, body: bytes) -> None:
            nonlocal window_tokens
            measured = warmup <= req.arrival < warmup + seconds
            sent = time.monotonic()
            first: float | None = None
            headers = {"Content-Type": "application/json", "X-Session-ID": req.conversation}
            try:
                async with http.post(f"{url}/v1/chat/completions", data=body, headers=headers) as resp:
                    if resp.status != 200:
                        await resp.read()
                        phase.errors += measured
                        return
                    async for line in resp.content:
                        if not line.startswith(b"data: {"):
                            continue
                        choices = json.loads(line[6:]).get("choices") or []
                        if not choices or not choices[0].get("delta", {}).get("content"):
                            continue
                        if first is None:
                            first = time.monotonic() - sent
                        if in_window:
                            window_tokens += 1
            except asyncio.CancelledError:
                if measured and first is None:
                    phase.cut_off += 1
                    phase.ttft.append(time.monotonic() - sent)
                    phase.by_request[index] = phase.ttft[-1]
                raise
            except aiohttp.ClientError:
                phase.errors += measured
                return
            if measured and first is not None:
                phase.ttft.append(first)
                phase.by_request[index] = first
            elif measured:
                phase.errors += 1

        async def sample() -> None:
            while True:
                states = await engine_states(admin, engines)
                if in_window:
                    samples.append([s["running"] + s["waiting"] for s in states])
                await asyncio.sleep(SAMPLE_SECONDS)

        async def window_marks() -> None:
            nonlocal in_window
            await asyncio.sleep(max(0.0, start + warmup - time.monotonic()))
            marks["counters0"] = await engine_counters(admin, engines)
            marks["behind0"] = sum(s["behindSeconds"] for s in await engine_states(admin, engines))
            in_window = True
            await asyncio.sleep(max(0.0, start + warmup + seconds - time.monotonic()))
            in_window = False

        marks: dict[str, Any] = {}
        choices_before = await prefix_choices(admin, url)
        cpu_before, calls_before = rb.cpu_seconds(pid), syscalls(pid)
        sampler = asyncio.create_task(sample())
        marker = asyncio.create_task(window_marks())
        tasks = []
        for index, (req, body) in enumerate(zip(requests, bodies, strict=True)):
            delay = start + req.arrival - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(index, req, body)))
        await marker
        _, pending = await asyncio.wait(
            tasks, timeout=max(0.0, start + requests[-1].arrival + DRAIN_SECONDS - time.monotonic())
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        cpu_after, calls_after = rb.cpu_seconds(pid), syscalls(pid)
        choices_after = await prefix_choices(admin, url)
        phase.choices = {
            c: n - choices_before.get(c, 0.0)
            for c, n in choices_after.items()
            if n > choices_before.get(c, 0.0)
        }
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        if not await wait_idle(admin, engines):
            phase.skipped = "engines still busy 30 s after the cut-off"
        queried0, hit0 = marks["counters0"]
        queried1, hit1 = await engine_counters(admin, engines)
        phase.behind_s = (
            sum(s["behindSeconds"] for s in await engine_states(admin, engines)) - marks["behind0"]
        )
    phase.offered = sum(1 for r in requests if warmup <= r.arrival < warmup + seconds) / seconds
    phase.tokens_per_s = window_tokens / seconds
    phase.hit_rate = (hit1 - hit0) / (queried1 - queried0) if queried1 > queried0 else None
    phase.imbalance = imbalance(samples)
    phase.cpu_ms = (cpu_after - cpu_before) * 1000 / len(requests)
    if calls_before is not None and calls_after is not None:
        phase.syscalls = (calls_after - calls_before) / len(requests)
    return phase


def choice_cost(requests: Sequence[LiveRequest], repeats: int = 5) -> tuple[float, float]:
    """CPU microseconds per request of what each strategy does before forwarding, in this process on
    the same bodies (no I/O, so the same work for both): least outstanding reads the body's fields and
    takes the least loaded endpoint; prefix affinity also reads the leading text and message keys,
    looks them up in the table, walks the ring and records the choice. The best of `repeats` passes."""
    bodies = [r.body("cost") for r in requests]
    endpoints = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(ENGINES))
    outstanding = {url: 3 + i for i, url in enumerate(endpoints)}  # a loaded pool, unequal

    def least() -> None:
        for body in bodies:
            read_body_fields(body)
            choose_endpoint(endpoints, outstanding)

    def affinity() -> None:
        ring, chooser = Ring(endpoints), Affinity(ConversationTable())
        for body in bodies:
            read = read_body_fields(body, prefix=True)
            keys = prefix_keys(read.prefix, read.turns, read.first_user)
            assert keys is not None
            assert chooser.pick(ring, keys, outstanding, (), DEFAULT_LOAD_BOUND_PERCENT) is not None

    def best(run: Callable[[], None]) -> float:
        times = []
        for _ in range(repeats):
            start = time.process_time()
            run()
            times.append(time.process_time() - start)
        return min(times) * 1e6 / len(bodies)

    return best(least), best(affinity)


def syscalls(pid: int) -> int | None:
    """Read and write system calls of a process and its children so far (/proc/PID/io: syscr, syscw);
    None where /proc does not let this user read them."""
    total = 0
    for member in rb.process_tree(pid):
        try:
            lines = Path(f"/proc/{member}/io").read_text().splitlines()
        except OSError:
            return None
        counts = dict(line.split(": ") for line in lines if ": " in line)
        total += int(counts["syscr"]) + int(counts["syscw"])
    return total


def imbalance(samples: Sequence[Sequence[int]]) -> float | None:
    """Mean over samples of max / mean outstanding per engine, over samples with at least one request
    per engine on average (below that one request more or less swings the ratio by a whole engine)."""
    ratios = [max(s) / (sum(s) / len(s)) for s in samples if sum(s) >= len(s)]
    return statistics.fmean(ratios) if ratios else None


# ---- the processes -------------------------------------------------------------------------------------


def kv_cache_tokens() -> int:
    """Each engine's KV cache: the simulator's for the published profile at KV_UTILIZATION."""
    memory = default_profile().memory
    assert memory is not None
    model = profile_capacity(memory)
    assert model is not None, "the published profile names a model and GPU the table knows"
    return model.kv_tokens(KV_UTILIZATION, 1, False)


async def start_engines(procs: rb.Processes, time_scale: float) -> tuple[list[str], list[int]]:
    urls, pids = [], []
    for i in range(ENGINES):
        port = rb.free_port()
        proc = procs.start(
            f"engine-{i}",
            [
                sys.executable, "-m", "specfleet_runtime.emulator", "--model", "m",
                "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
                "--time-scale", str(time_scale), "--enable-prefix-caching",
                "--kv-cache-tokens", str(kv_cache_tokens()), "--max-model-len", "32768", "--seed", str(i),
            ],
        )  # fmt: skip
        urls.append(f"http://127.0.0.1:{port}")
        pids.append(proc.pid)
    for url, proc in zip(urls, procs.procs[-ENGINES:], strict=True):
        await rb.wait_healthy(f"{url}/health", proc)
    return urls, pids


ROUTERS = (
    ("specfleet LeastOutstanding", "specfleet", "LeastOutstanding"),
    ("specfleet PrefixAffinity", "specfleet", "PrefixAffinity"),
    ("vllm-router cache_aware", "vllm-router", "cache_aware"),
    ("vllm-router consistent_hash", "vllm-router", "consistent_hash"),
    ("vllm-router round_robin", "vllm-router", "round_robin"),
)

# The routers the TTFT p99 target compares, which run the middle rate's extra traces.
P99_ROUTERS = (ROUTERS[1][0], ROUTERS[2][0])


async def start_router(
    procs: rb.Processes,
    kind: str,
    policy: str,
    engines: list[str],
    log_dir: Path,
    binary: Path | None,
    bound_percent: int | None = None,
) -> tuple[str, int]:
    port = rb.free_port()
    url = f"http://127.0.0.1:{port}"
    if kind == "specfleet":
        config = log_dir / f"routing-{policy}.json"
        selection: dict[str, Any] = {"strategy": policy}
        if bound_percent is not None and policy == "PrefixAffinity":
            selection["loadBoundPercent"] = bound_percent
        config.write_text(
            json.dumps(
                {
                    "servedModelName": MODEL,
                    "pools": {"latency": {"staticUrls": engines}},
                    # One client sends everything here: no auto-segmentation into a batch pool.
                    "autoSegmentation": {"enabled": False},
                    "endpointSelection": {"latency": selection},
                }
            )
        )
        proc = procs.start(
            f"specfleet-{policy}",
            [
                sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(config),
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--event-loop", "uvloop",
            ],
        )  # fmt: skip
        await rb.wait_healthy(f"{url}/readyz", proc)
    else:
        assert binary is not None
        proc = procs.start(
            f"vllm-router-{policy}",
            [
                str(binary), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
                "--policy", policy, "--prometheus-port", str(rb.free_port()), "--log-level", "warning",
            ],
        )  # fmt: skip
        await rb.wait_healthy(f"{url}/health", proc)
    return url, proc.pid


def stop(procs: rb.Processes, pid: int) -> None:
    """Stop the one process `pid` of `procs` (a router between runs)."""
    for proc in procs.procs:
        if proc.pid == pid and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# ---- the simulator ---------------------------------------------------------------------------------------


@dataclass
class SimRow:
    routing: str
    rate: float
    hit_rate: float | None
    tokens_per_request_second: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None


SIM_RESOURCE = f"""
apiVersion: specfleet.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: bench, namespace: default}}
spec:
  model: {{name: meta-llama/Llama-3.1-8B-Instruct, servedModelName: {MODEL}}}
  drafter: {{method: eagle3, model: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, numSpeculativeTokens: 3}}
  engine: {{maxModelLen: 32768, gpuMemoryUtilizationPercent: {round(KV_UTILIZATION * 100)}}}
  pools:
    latency: {{replicas: {ENGINES}, speculation: "Off"}}
    batch: {{replicas: 0, speculation: "Off"}}
  routing: {{autoSegmentation: {{enabled: false}}}}
"""


def scaled(profile: StepTimeProfile, time_scale: float) -> StepTimeProfile:
    """`profile` with every step and the prefill x time_scale, as the emulators run it."""
    return dataclasses.replace(
        profile,
        step_ms=tuple(tuple(ms * time_scale for ms in row) for row in profile.step_ms),
        prefill_ms_per_token=profile.prefill_ms_per_token * time_scale,
    )


def simulate_routing(
    trace: Trace,
    rate: float,
    routing: str,
    warmup: float,
    time_scale: float,
    bound_percent: int | None = None,
) -> SimRow:
    """`trace` through the simulator's four engines with `routing`; `bound_percent`: the pool's
    loadBoundPercent (None: the default)."""
    doc = yaml.safe_load(SIM_RESOURCE)
    if bound_percent is not None:
        selection = {"strategy": "PrefixAffinity", "loadBoundPercent": bound_percent}
        doc["spec"]["routing"]["endpointSelection"] = {"latency": selection}
    sd = parse_resource(doc)
    result = simulate(
        sd,
        trace,
        strategy=Strategy("off", "static", mode="Off"),
        options=SimOptions(startup_seconds=1.0, routing=routing, scrape_interval=1.0, bin_seconds=warmup),
        profile=scaled(default_profile(), time_scale),
    )
    # The hit rate after the warm-up, as the live phases measure it: a bin ends at the warm-up's end.
    start = min(result.timeline, key=lambda row: abs(row["t"] - warmup))["latency"]
    end = result.timeline[-1]["latency"]
    queries = end["prefixQueries"] - start["prefixQueries"]
    hit_rate = (end["prefixHits"] - start["prefixHits"]) / queries if queries else None
    tokens = float(sum(result.bin_tokens["latency"]))
    reqsec = float(sum(result.bin_request_seconds["latency"]))
    ttft = result.pools["latency"].ttft
    return SimRow(
        routing,
        rate,
        hit_rate,
        tokens / reqsec if reqsec else 0.0,
        percentile(ttft, 50) * 1000 if ttft else None,
        percentile(ttft, 99) * 1000 if ttft else None,
    )


# ---- the table ---------------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def render_table(phases: Sequence[Phase]) -> str:
    """One row per router and rate; each ratio against specfleet LeastOutstanding at the same rate."""
    base = {p.rate: p for p in phases if p.router == ROUTERS[0][0]}
    lines = [
        "| rate req/s (offered) | router | TTFT p50 ms | p50 / LO | TTFT p99 ms | p99 / LO | tokens/s "
        "| tokens/s / LO | prefix hit rate | max/mean outstanding | router CPU ms/req | CPU / LO "
        "| router syscalls/req | cut off | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(phases, key=lambda p: p.rate):
        if p.skipped and not p.ttft:
            lines.append(f"| {p.rate:g} | {p.router} | not run: {p.skipped} | | | | | | | | | | | | |")
            continue
        b = base.get(p.rate)
        lines.append(
            f"| {p.rate:g} ({p.offered:.1f}) | {p.router} | {fmt(p.ttft_ms(50))} "
            f"| {ratio(p.ttft_ms(50), b.ttft_ms(50) if b else None)} | {fmt(p.ttft_ms(99))} "
            f"| {ratio(p.ttft_ms(99), b.ttft_ms(99) if b else None)} | {p.tokens_per_s:.0f} "
            f"| {ratio(p.tokens_per_s, b.tokens_per_s if b else None)} | {fmt(p.hit_rate, '.2f')} "
            f"| {fmt(p.imbalance, '.2f')} | {fmt(p.cpu_ms, '.2f')} "
            f"| {ratio(p.cpu_ms, b.cpu_ms if b else None)} | {fmt(p.syscalls)} | {p.cut_off} | {p.errors} |"
        )
    return "\n".join(lines)


def pooled_p99(phases: Sequence[Phase], router: str, rate: float) -> tuple[float | None, int]:
    """The TTFT p99 in ms of `router`'s requests at `rate` over all its traces pooled, and the count of
    traces."""
    runs = [p for p in phases if p.router == router and p.rate == rate and p.ttft and not p.hot]
    pooled = [t for p in runs for t in p.ttft]
    return (percentile(pooled, 99) * 1000 if pooled else None), len(runs)


def slowest(phase: Phase, floors: Sequence[tuple[str, float]], count: int = 5) -> str:
    """The phase's `count` slowest measured requests: TTFT, kind and floor (`request_floors`), to tell
    a cold prefill (TTFT near its floor) from a request that queued behind one."""
    top = sorted(phase.by_request.items(), key=lambda item: -item[1])[:count]
    return ", ".join(
        f"{ttft * 1000:.0f} ms ({floors[i][0]}, floor {floors[i][1] * 1000:.0f})" for i, ttft in top
    )


def render_p99(phases: Sequence[Phase], floors: dict[tuple[float, int], list[float]], rate: float) -> str:
    """TTFT p99 at `rate` per trace and pooled for the target's two routers, beside each trace's floor
    (`ttft_floor`). One trace's p99 is its 2nd or 3rd slowest request of ~200: which engine a handful
    of cold first turns met decides it; pooled over the traces, ~6 requests do."""
    traces = sorted(k for r, k in floors if r == rate)
    if len(traces) < 2:
        return ""
    head = " | ".join(f"trace {k + 1} (seed {SEED + k})" for k in traces)
    lines = [
        f"| TTFT p99 ms at {rate:g} req/s | {head} | pooled |",
        "|---|" + "---:|" * (len(traces) + 1),
    ]
    for router in P99_ROUTERS:
        by = {p.trace: p for p in phases if p.router == router and p.rate == rate and not p.hot}
        cells = [fmt(by[k].ttft_ms(99)) if k in by else "-" for k in traces]
        lines.append(
            f"| {router} | " + " | ".join(cells) + f" | {fmt(pooled_p99(phases, router, rate)[0])} |"
        )
    cells = [fmt(percentile(floors[(rate, k)], 99) * 1000) for k in traces]
    pooled = [t for k in traces for t in floors[(rate, k)]]
    lines.append(
        "| floor (no queue, every cache in place) | "
        + " | ".join(cells)
        + f" | {fmt(percentile(pooled, 99) * 1000)} |"
    )
    return "\n".join(lines)


CHOICES = ("conversation", "home", "placed", "spilled", "moved")


def render_choices(phases: Sequence[Phase]) -> str:
    """One row per phase that counted its prefix-affinity choices: the requests of each choice."""
    lines = [
        "| rate req/s | workload | " + " | ".join(CHOICES) + " |",
        "|---|---|" + "---:|" * len(CHOICES),
    ]
    for p in sorted(phases, key=lambda p: (p.hot, p.rate)):
        counts = " | ".join(f"{p.choices.get(c, 0.0):.0f}" for c in CHOICES)
        lines.append(f"| {p.rate:g} | {'one hot tenant' if p.hot else 'uniform'} | {counts} |")
    return "\n".join(lines)


def render_sim_table(rows: Sequence[SimRow]) -> str:
    lines = [
        "| rate req/s | routing | prefix hit rate | tokens per request-second | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r.rate, r.routing != LEAST_OUTSTANDING)):
        lines.append(
            f"| {r.rate:g} | {r.routing} | {fmt(r.hit_rate, '.2f')} | {r.tokens_per_request_second:.1f} "
            f"| {fmt(r.ttft_p50_ms)} | {fmt(r.ttft_p99_ms)} |"
        )
    return "\n".join(lines)


def targets(
    phases: Sequence[Phase],
    choice: tuple[float, float] | None = None,
    floors: dict[tuple[float, int], list[float]] | None = None,
) -> list[tuple[str, bool | None, str]]:
    """The issue's targets for PrefixAffinity: (target, met (None: not measurable), the numbers);
    `choice` is `choice_cost`'s (least outstanding, prefix affinity) microseconds per request; `floors`
    each trace's `ttft_floor` by (rate, trace). TTFT p99 at a rate with several traces is compared
    pooled over them (`render_p99`)."""
    by = {(p.router, p.rate): p for p in phases if p.ttft and not p.trace}
    floors = floors or {}
    rates = sorted({p.rate for p in phases})
    lo, pa, ca = (ROUTERS[0][0], ROUTERS[1][0], ROUTERS[2][0])
    out: list[tuple[str, bool | None, str]] = []

    def get(router: str, rate: float) -> Phase | None:
        return by.get((router, rate))

    mid = rates[len(rates) // 2]
    top = rates[-1]
    a, b = get(pa, mid), get(lo, mid)
    if a and b:
        pa50, lo50 = a.ttft_ms(50) or 0.0, b.ttft_ms(50) or 0.0
        out.append(
            (f"TTFT p50 <= 0.5x least-outstanding's at {mid:g} req/s", pa50 <= 0.5 * lo50,
             f"{pa50:.0f} vs {lo50:.0f} ms ({pa50 / lo50:.2f}x)")
        )  # fmt: skip
    tok = [(r, get(pa, r), get(lo, r)) for r in rates]
    pairs = [(r, x.tokens_per_s, y.tokens_per_s) for r, x, y in tok if x and y]
    if pairs:
        out.append(
            ("tokens/s >= least-outstanding's at every rate", all(x >= y for _, x, y in pairs),
             ", ".join(f"{r:g}: {x:.0f} vs {y:.0f}" for r, x, y in pairs))
        )  # fmt: skip
    hits = [(r, get(pa, r), get(ca, r)) for r in rates]
    hp = [
        (r, x.hit_rate, y.hit_rate)
        for r, x, y in hits
        if x and y and x.hit_rate is not None and y.hit_rate is not None
    ]
    if hp:
        out.append(
            ("hit rate >= vllm-router cache_aware's", all(x >= y for _, x, y in hp),
             ", ".join(f"{r:g}: {x:.2f} vs {y:.2f}" for r, x, y in hp))
        )  # fmt: skip
    p99: list[tuple[bool, str]] = []
    for r in rates:
        x, y = get(pa, r), get(ca, r)
        if not (x and y):
            continue
        a99, c99 = x.ttft_ms(99) or 0.0, y.ttft_ms(99) or 0.0
        (ap, an), (cp, cn) = pooled_p99(phases, pa, r), pooled_p99(phases, ca, r)
        pooled = an > 1 and cn > 1 and ap is not None and cp is not None
        runs = [v for (fr, k), v in floors.items() if fr == r and (pooled or not k)]
        floor = f", floor {percentile([t for v in runs for t in v], 99) * 1000:.0f}" if runs else ""
        if pooled and ap is not None and cp is not None:
            p99.append(
                (
                    ap <= cp,
                    f"{r:g}: {ap:.0f} vs {cp:.0f} ms pooled over {an} traces{floor} (main trace {a99:.0f} vs {c99:.0f})",
                )
            )
        else:
            p99.append((a99 <= c99, f"{r:g}: {a99:.0f} vs {c99:.0f} ms{floor}"))
    if p99:
        out.append(
            ("TTFT p99 <= vllm-router cache_aware's", all(ok for ok, _ in p99), ", ".join(t for _, t in p99))
        )  # fmt: skip
    a = get(pa, top)
    if a:
        out.append(
            (f"max/mean outstanding <= 1.5 at saturation ({top:g} req/s)",
             None if a.imbalance is None else a.imbalance <= 1.5, fmt(a.imbalance, ".2f"))
        )  # fmt: skip
    a, b = get(pa, top), get(lo, top)
    if a and b and a.cpu_ms and b.cpu_ms:
        calls = ""
        if a.syscalls and b.syscalls:
            calls = f"; system calls {a.syscalls:.0f} vs {b.syscalls:.0f} per request"
        if choice:
            calls += f"; the choice itself {choice[1]:.0f} vs {choice[0]:.0f} µs per request"
        out.append(
            (f"router CPU per request at max load within 10% of least-outstanding's ({top:g} req/s)",
             a.cpu_ms <= 1.1 * b.cpu_ms,
             f"{a.cpu_ms:.2f} vs {b.cpu_ms:.2f} ms ({a.cpu_ms / b.cpu_ms:.2f}x){calls}")
        )  # fmt: skip
    return out


def render_targets(rows: Sequence[tuple[str, bool | None, str]]) -> str:
    lines = ["| target (PrefixAffinity) | met | measured |", "|---|---|---|"]
    for target, met, numbers in rows:
        lines.append(f"| {target} | {'-' if met is None else 'met' if met else 'not met'} | {numbers} |")
    return "\n".join(lines)


# ---- main ------------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> Report:
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    rates = [float(r) for r in args.rates.split(",")]
    log_dir = Path(tempfile.mkdtemp(prefix="prefix-routing-"))
    procs = rb.Processes(log_dir)
    traces = {rate: workload(rate, args.seconds, args.warmup) for rate in rates}
    requests = {rate: live_requests(trace) for rate, trace in traces.items()}
    hot_rate = rates[-1]
    hot_trace = workload(hot_rate, args.seconds, args.warmup, hot_share=args.hot_share)
    hot = live_requests(hot_trace)
    # More traces of the middle rate for the TTFT p99 target's two routers (see `render_p99`).
    mid = rates[len(rates) // 2]
    more_traces = {
        k: workload(mid, args.seconds, args.warmup, seed=SEED + k) for k in range(1, args.p99_traces)
    }
    more = {k: live_requests(trace) for k, trace in more_traces.items()}
    floors = {
        (rate, 0): ttft_floor(trace, args.warmup, args.seconds, args.time_scale)
        for rate, trace in traces.items()
    }
    floors.update(
        {
            (mid, k): ttft_floor(trace, args.warmup, args.seconds, args.time_scale)
            for k, trace in more_traces.items()
        }
    )
    phases: list[Phase] = []
    binary, why = rb.vllm_router_binary(not args.no_install)
    try:
        engines, _ = await start_engines(procs, args.time_scale)
        for n, (name, kind, policy) in enumerate(ROUTERS):
            if args.routers and not any(part in name for part in args.routers.split(",")):
                continue
            if kind == "vllm-router" and binary is None:
                phases += [Phase(name, rate, skipped=why) for rate in rates]
                continue
            try:
                url, pid = await start_router(
                    procs, kind, policy, engines, log_dir, binary, args.bound_percent
                )
            except RuntimeError as err:
                phases += [Phase(name, rate, skipped=f"did not start: {err}") for rate in rates]
                continue
            # (rate, the trace, its requests, salt, hot, which trace of the rate)
            runs = [
                (rate, traces[rate], requests[rate], f"run{n}x{m}", False, 0) for m, rate in enumerate(rates)
            ]
            if args.hot_share > 0:
                runs.append((hot_rate, hot_trace, hot, f"run{n}hot", True, 0))
            if name in P99_ROUTERS:
                runs += [(mid, more_traces[k], sent, f"run{n}t{k}", False, k) for k, sent in more.items()]
            for rate, trace, sent, salt, is_hot, k in runs:
                phase = await run_phase(name, url, pid, engines, sent, rate, args.seconds, args.warmup, salt)
                phase.hot, phase.trace = is_hot, k
                print(
                    f"{name} @ {rate:g} req/s{' (hot tenant)' if phase.hot else ''}: TTFT p50 {fmt(phase.ttft_ms(50))} ms, p99 "
                    f"{fmt(phase.ttft_ms(99))} ms{f' (trace {phase.trace})' if phase.trace else ''}, {phase.tokens_per_s:.0f} tokens/s, hit rate "
                    f"{fmt(phase.hit_rate, '.2f')}, max/mean {fmt(phase.imbalance, '.2f')}, CPU "
                    f"{fmt(phase.cpu_ms, '.2f')} ms/req, cut off {phase.cut_off}, errors {phase.errors}, "
                    f"emulators behind {phase.behind_s:.1f} s"
                    + "".join(f", {c} {n:.0f}" for c, n in sorted(phase.choices.items()))
                    + "; slowest: "
                    + slowest(phase, request_floors(trace, args.time_scale)),
                    file=sys.stderr,
                    flush=True,
                )
                phases.append(phase)
            stop(procs, pid)
    finally:
        procs.stop_all()
    live_s = time.monotonic() - started
    choice = choice_cost(requests[rates[-1]])
    sims = [
        simulate_routing(traces[rate], rate, routing, args.warmup, args.time_scale)
        for rate in rates
        for routing in (LEAST_OUTSTANDING, PREFIX_AFFINITY)
    ]
    header = (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} ({os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}), load average "
        f"{load_before:.1f} before / {os.getloadavg()[0]:.1f} after; {ENGINES} emulated engines at "
        f"--time-scale {args.time_scale:g}, KV cache {kv_cache_tokens()} tokens each; phases of "
        f"{args.warmup:g} s warm-up + {args.seconds:g} s measured; live part {live_s:.0f} s"
    )
    uniform = [p for p in phases if not p.hot]
    main_trace = [p for p in uniform if not p.trace]
    return Report(
        header,
        render_table(main_trace),
        render_choices([p for p in phases if p.choices and not p.trace]),
        render_sim_table(sims),
        render_targets(targets(uniform, choice, floors)),
        log_dir,
        render_table([p for p in phases if p.hot]),
        hot_rate,
        args.hot_share,
        render_p99(uniform, floors, mid),
    )


@dataclass
class Report:
    header: str
    table: str
    choices_table: str
    sim_table: str
    targets: str
    log_dir: Path
    hot_table: str = ""
    hot_rate: float = 0.0
    hot_share: float = 0.0
    p99_table: str = ""

    def text(self) -> str:
        return "\n\n".join(
            [self.header, self.table, self.choices_table, f"One hot tenant ({self.hot_share:.0%} of conversations):",
             self.hot_table, self.p99_table, "Fleet simulator, same traces:", self.sim_table, self.targets,
             f"logs: {self.log_dir}"]
        )  # fmt: skip

    def page(self, command: str) -> str:
        """docs/benchmarks/prefix-routing.md: the rule, the command, the machine, the tables, the targets."""
        return PAGE.format(
            command=command,
            header=self.header,
            table=self.table,
            choices_table=self.choices_table,
            sim_table=self.sim_table,
            targets=self.targets,
            tenants=TENANTS,
            outputs=f"{OUTPUT_TOKENS[0]}-{OUTPUT_TOKENS[1]}",
            think=f"{THINK_SECONDS:g}",
            seed=SEED,
            engines=ENGINES,
            kv=kv_cache_tokens(),
            utilization=round(KV_UTILIZATION * 100),
            drain=f"{DRAIN_SECONDS:g}",
            bound=DEFAULT_LOAD_BOUND_PERCENT,
            slack=LOAD_BOUND_SLACK,
            hot_table=self.hot_table or "(not run: --hot-share 0)",
            hot_rate=self.hot_rate,
            hot_pct=f"{self.hot_share:.0%}",
            hot_share=self.hot_share,
            p99_table=self.p99_table or "(not run: --p99-traces 1)",
        )


PAGE = """# Prefix-aware endpoint choice

Written by `{command}` (`make bench-prefix`); a lab record of one run, with the targets it was held to
(issue 29). Rerun it to refresh every figure on this page.

## What runs

- **Workload**: the fleet simulator's rule `shared_prefix_conversations` (`specfleet/sim/workload.py`,
  seed {seed}): {tenants} tenants, each with a system prompt of 1024-4096 tokens; conversations of a
  tenant drawn uniformly, starting uniformly in the phase, of 1-8 turns; each turn sends the system
  prompt, the conversation so far and a new user message of 32-512 tokens, and asks for {outputs}
  tokens (`ignore_eos`); the next turn comes when the answer would have streamed plus a think time,
  exponential with mean {think} s. The conversation count is scaled so that the measured window sees
  the rate asked for. `live_requests` turns each request into chat messages: the system prompt is the same
  words in every conversation of its tenant, and each turn repeats the earlier ones word for word, so a
  request's cached prefix is byte-identical text (the chat template adds ~6 tokens per message).
  Each phase salts the system prompts, so no phase finds another's prefixes cached.
- **Engines**: {engines} engine emulators (`specfleet_runtime.emulator`) with prefix caching on
  (block-hashed, LRU; cached prompt blocks skip their prefill), a KV cache of {kv} tokens each (what vLLM
  leaves the published Llama-3.1-8B profile at {utilization}% GPU memory: too small to keep every
  tenant's system prompt and the running requests on every engine), the published profile's prefill of
  0.04 ms per uncached prompt token, and every step slowed by the time scale so that the engines
  saturate at a request rate two shared CPUs can drive.
- **Routers**, one at a time over the same four engines: the specfleet router (source build, uvloop, its
  default workers: one per CPU, their conversation table and placements shared) with `endpointSelection` LeastOutstanding and PrefixAffinity (default load bound {bound}%: a
  turn goes to the engine that last served the longest of its conversation's message-boundary keys while
  that engine holds fewer than twice {bound}% of the mean or the mean plus {slack} requests; else to the
  engine its leading text (the first 2 KiB of its messages, here the tenant's system prompt) was placed
  on while that one holds fewer than {bound}% of the mean or the mean plus {slack}; else the next on the
  ring from the leading text under {bound}% of the mean; a new leading text is placed on the engine
  holding the least of them, by size);
  vllm-router from PyPI (as `benchmarks/router_bench.py` installs it) with `--policy cache_aware`,
  `consistent_hash` and `round_robin`, its defaults otherwise (cache_aware turns to the least loaded
  engine only past an absolute and a relative imbalance, `--balance-abs-threshold` 64 and
  `--balance-rel-threshold` 1.5 by default in vllm-router 0.1.17, so at these loads it never does). Every request carries `X-Session-ID: <conversation>`, the key
  vllm-router's consistent_hash reads first (without it, it hashes the whole body, which changes every
  turn); the specfleet router ignores it.
- **Load**: open loop at the trace's arrival times, every request streamed; the first warm-up seconds of
  a phase are not measured; {drain} s after the last arrival whatever still runs is cut off.
- **Measured**: TTFT (first content chunk) p50/p99 of the requests arriving in the window (a request cut
  off before its first token counts with the time it waited, a lower bound); output tokens/s streamed
  in the window; the prefix cache hit rate (the engines' `vllm:prefix_cache_hits_total` over
  `vllm:prefix_cache_queries_total`, from the window's start until the engines are idle); max/mean
  outstanding (each engine's running + waiting every 0.25 s, the mean over samples of max over mean,
  counting samples with at least one request per engine on average); the router's CPU per request
  (user + system time of the process and its children from /proc over the phase, per request sent)
  and its read and write system calls per request (`syscr` + `syscw` of /proc/PID/io): the same
  answers relayed in more, smaller reads cost more CPU for the same requests, whatever chose the
  engine. Ratios are against specfleet LeastOutstanding at the same rate. Beside it, the CPU of the
  choice itself, in the benchmark's own process on the top rate's bodies (`choice_cost`: reading the
  body and picking the endpoint, the same work for both strategies, best of five passes).
- **Simulator**: the same traces through `specfleet.sim.simulate` with `SimOptions(routing=...)`
  leastOutstanding and prefixAffinity, on four engines of the same KV cache and the published profile
  slowed by the same time scale: hit rate after the warm-up, generated tokens per request-second in the
  system, TTFT. Its affinity is the router's own choice (`affinity.Affinity`, the pool's load bound),
  on the simulator's clock: where it differs from the live router, it is in the outstanding counts it
  sees (one router process rather than one per CPU). Its engines share a common prefix's KV blocks
  among the running requests, as vLLM and the emulator do (by prefix segment rather than by content).

## Result

{header}

The load average is the machine's, printed before and after the run: on a machine shared with other
work (a load above its CPU count) every router's phases compete for CPU with it, unevenly over the run,
so TTFT p99 and the comparisons with vllm-router's cache_aware at one rate are noisy: a phase that met
a burst of other work can lose by a wide margin in one run and win in the next.

{table}

Where specfleet PrefixAffinity sent the requests of each phase (warm-up included; the router's
`specfleet_router_prefix_affinity_choices_total`): back to the conversation's engine, to the engine its
leading text was placed on (home), a new leading text placed, spilled past its engine at the bound to
the ring's next, or a conversation moved off its engine:

{choices_table}

### One hot tenant

What the load bound is for: the same rule at {hot_rate:g} req/s with {hot_pct} of the conversations
belonging to one tenant (`shared_prefix_conversations(hot_share={hot_share:g})`; the others' spread
uniformly over all tenants), so one system prompt carries about half the traffic, more than one engine
of four serves. A router that keeps a prefix on one engine whatever its load puts that half there
(max/mean outstanding shows it); what that costs in TTFT depends on how far past its capacity that
engine runs, which prefix cache hits on the hot tenant's own requests lower.

{hot_table}

### TTFT p99 over more traces

One trace's TTFT p99 at a rate is its 2nd or 3rd slowest request of a few hundred, and at the middle
rate those are tenants' first requests, cold prefills of 1-4k-token system prompts that no router can
skip, or a request that reached an engine while it prefilled one (the emulator prefills a request's
uncached prompt within one step, and everything in that step waits for it). So whether one request
met another tenant's cold prefill decides the figure, and a rerun of the same trace can move it by
more than 100 ms (the benchmark logs each phase's five slowest requests, their kind and their floor).
PrefixAffinity and cache_aware therefore also run more traces of the middle rate (the same rule, the
next seeds), and the p99 target at that rate compares all their requests pooled. The floor is what no
router beats on that trace (`ttft_floor`): each request's tokens that no earlier request of the phase
sent, at the engines' prefill cost, plus one decode step, no queueing.

{p99_table}

Fleet simulator, same traces (uniform tenants):

{sim_table}

The load bound on shared-prefix workloads this page does not run live (8 and 96 tenants, system
prompts of 128-1024 tokens, one hot tenant; each bound from 100% to 200% beside least outstanding),
and how evenly placing new leading texts spreads the tenants against hashing them: `python
benchmarks/prefix_bounds.py` (the simulator, seconds).

## Targets

{targets}
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--rates", default="4,8,14", help="request rates, comma-separated; the last at saturation"
    )
    parser.add_argument("--seconds", type=float, default=25.0, help="measured window of each phase")
    parser.add_argument("--warmup", type=float, default=8.0, help="unmeasured start of each phase")
    parser.add_argument("--time-scale", type=float, default=4.0, help="the emulators' --time-scale")
    parser.add_argument(
        "--routers", default="", help="only the routers whose names contain one of these (comma-separated)"
    )
    parser.add_argument(
        "--hot-share", type=float, default=0.5,
        help="one more phase at the top rate with this share of conversations on one tenant (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--bound-percent", type=int, help="PrefixAffinity's loadBoundPercent (default: the router's)"
    )
    parser.add_argument(
        "--p99-traces", type=int, default=3,
        help="traces of the middle rate that PrefixAffinity and cache_aware run, for the TTFT p99 target",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a smoke run: one rate, short phases")
    parser.add_argument("--no-install", action="store_true", help="do not pip install vllm-router")
    parser.add_argument("--out", type=Path, help="also write the Markdown page here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rates, args.seconds, args.warmup = args.rates.split(",")[0], 5.0, 2.0
        args.p99_traces = 1
    report = asyncio.run(run(args))
    print(report.text())
    if args.out:
        command = "python benchmarks/prefix_routing.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
        args.out.write_text(report.page(command.replace(f" --out {args.out}", "")))


if __name__ == "__main__":
    main()
