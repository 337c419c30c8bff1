"""The command line: vLLM's arguments plus the emulator's own; and a real process on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, PUBLISHED_H100_LLAMA31_8B_EAGLE
from specfleet_runtime.emulator.__main__ import config_from_argv
from specfleet_runtime.emulator.config import DEFAULT_MAX_NUM_SEQS
from specfleet_runtime.vllm_args import (
    DynamicSpeculationRange,
    EngineArgs,
    SpeculativeConfig,
    build_vllm_args,
)
from support.ports import free_port

SPEC = SpeculativeConfig(
    method="eagle3",
    num_speculative_tokens=3,
    model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    dynamic_schedule=(DynamicSpeculationRange(1, 16, 3), DynamicSpeculationRange(17, 512, 1)),
)
ENGINE = EngineArgs(
    model="meta-llama/Llama-3.1-8B-Instruct",
    served_model_name="llama",
    port=8123,
    max_num_seqs=64,
    max_model_len=4096,
    speculative=SPEC,
    extra_args=("--dtype", "bfloat16"),
)


def test_the_operators_vllm_command_line_configures_the_emulator() -> None:
    config, host, port = config_from_argv(build_vllm_args(ENGINE))
    assert (host, port) == ("0.0.0.0", 8123)
    assert config.served_model_name == "llama"
    assert config.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert config.max_num_seqs == 64
    assert config.max_model_len == 4096
    assert config.speculative == SPEC
    assert config.k_for_batch(20) == 1
    assert config.profile == PUBLISHED_H100_LLAMA31_8B_EAGLE
    assert config.acceptance == PUBLISHED_ACCEPTANCE
    assert config.time_scale == 1.0


def test_emulator_options(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps(
            {"name": "tiny", "batchSizes": [1], "numSpeculativeTokens": [0, 1], "stepTimeMs": [[1, 2]]}
        )
    )
    argv = [
        "--model", "m", "--host", "127.0.0.1", "--profile", str(profile), "--acceptance", "0.5,0.25",
        "--time-scale", "0.1", "--break-losslessness", "--seed", "9", "--kv-cache-tokens", "1000",
        "--kv-cache-tokens-with-drafter", "800", "--block-size", "8", "--max-model-len", "512",
        "--spec-k0-overhead", "0.2",
    ]  # fmt: skip
    config, host, port = config_from_argv(argv)
    assert (host, port) == ("127.0.0.1", 8000)
    assert config.served_model_name == "m"  # defaults to --model, as vLLM
    assert config.speculative is None
    assert config.max_num_seqs == DEFAULT_MAX_NUM_SEQS
    assert config.profile.name == "tiny"
    assert config.acceptance == (0.5, 0.25)
    assert config.time_scale == 0.1
    assert config.break_losslessness
    assert config.seed == 9
    assert config.kv_cache_tokens == 1000
    assert config.kv_cache_tokens_with_drafter == 800
    assert config.block_size == 8
    assert config.num_gpu_blocks == 1000 // 8  # no drafter: the cache without one
    assert config.spec_k0_overhead == 0.2


@pytest.mark.parametrize(
    "argv",
    [
        [],  # --model is required
        ["--model", "m", "--acceptance", "0.2,0.5"],  # increasing
        ["--model", "m", "--acceptance", "high"],
        ["--model", "m", "--time-scale", "-1"],
        ["--model", "m", "--speculative-config", '{"method": "eagle3"}'],
    ],
)
def test_bad_command_lines_exit_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        config_from_argv(argv)
    assert caught.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.fixture
def emulator_process() -> Iterator[str]:
    """`python -m specfleet_runtime.emulator` started with the operator's vLLM command line."""
    port = free_port()
    engine = EngineArgs(model="m", served_model_name="llama", port=port, speculative=SPEC)
    argv = [sys.executable, "-m", "specfleet_runtime.emulator", *build_vllm_args(engine)]
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--time-scale", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.stdout else ""
                    pytest.fail(f"emulator did not become healthy:\n{out}")
                time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # only the process this fixture started
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_runs_as_a_process(emulator_process: str) -> None:
    body = json.dumps({"model": "llama", "prompt": "hello", "max_tokens": 5}).encode()
    request = urllib.request.Request(
        f"{emulator_process}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        out = json.loads(r.read())
    assert out["usage"]["completion_tokens"] == 5
    with urllib.request.urlopen(f"{emulator_process}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'vllm:generation_tokens_total{engine="0",model_name="llama"} 5.0' in metrics
    assert "vllm:spec_decode_num_drafts_total" in metrics
