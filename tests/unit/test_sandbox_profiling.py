"""The sandbox measures its engines with `specfleet profile` and runs the Goodput policy on the result.

The measurement test runs the product's command for real against emulator processes (the sandbox's
`vllm` stand-in starts them), at a shorter time scale than the sandbox's (4x, not 10x): predicted
speedup, and so break-even, depends on step-time ratios, which the time scale leaves as they are.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.cli.profile import PROFILE_KEY
from specfleet.policy.inputs.profile_source import profile_from_config_map
from specfleet_runtime.cost_profile import load_profile
from specfleet_runtime.emulator.text import Prompt
from specfleet_sandbox import emulated_vllm
from specfleet_sandbox.fleet import sandbox_fleet
from specfleet_sandbox.load import LoadGenerator
from specfleet_sandbox.profiling import (
    DEVICE_PROFILE,
    PROFILE_CONFIG_MAP,
    SANDBOX,
    Measurement,
    break_even,
    emulator_args,
    measure_profile,
    profile_command,
)
from specfleet_sandbox.scenario import BASELINE_ACCEPTANCE, SCENARIOS, run_scenario

pytestmark = pytest.mark.timeout(180)


def _fleet() -> dict:
    doc = sandbox_fleet("sandbox", "http://127.0.0.1:9090")
    doc["metadata"]["name"] = "assistant"
    return doc


def test_the_sandbox_fleet_runs_goodput_on_the_measured_profile() -> None:
    sd = parse_resource(_fleet())
    assert sd.spec.policy.mode == "Goodput"
    assert sd.spec.policy.goodput.cost_profile_config_map == PROFILE_CONFIG_MAP
    assert sd.spec.policy.goodput.margin_percent == 5  # the example's


def test_every_engine_plays_the_device_profile_at_the_sandbox_time_scale() -> None:
    args = emulator_args()
    assert args[args.index("--time-scale") + 1] == "10"
    assert Path(args[args.index("--profile") + 1]) == DEVICE_PROFILE
    assert load_profile(DEVICE_PROFILE).max_k >= 3


def test_the_profile_command_is_the_products_for_the_fleets_engines() -> None:
    command = profile_command(_fleet(), "sandbox")
    assert command[:4] == [sys.executable, "-m", "specfleet", "profile"]
    assert command[command.index("--max-num-seqs") + 1] == "64"  # the engines' cap, measured
    assert command[command.index("--drafter") + 1] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert command[command.index("--config-map") + 1] == PROFILE_CONFIG_MAP
    assert command[command.index("--ks") + 1] == SANDBOX.ks


def test_the_stand_in_translates_engine_arguments_and_adds_the_sandbox_options(monkeypatch) -> None:
    monkeypatch.setenv(emulated_vllm.ARGS_ENV, '["--time-scale", "10"]')
    argv = emulated_vllm.engine_argv(
        {"model": "m", "max_num_seqs": 64, "speculative_config": {"method": "eagle3", "model": "d"}}, 8000
    )
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "eagle3", "model": "d"}
    assert argv[-2:] == ["--time-scale", "10"]
    assert "--max-model-len" not in argv


def test_a_profile_measured_on_emulators_puts_break_even_inside_the_demo_load(tmp_path: Path) -> None:
    # 8 tokens at 4x (about 30 s): at 4 tokens and 2x, a run's fixed overhead (threads, HTTP) moved a
    # measured step by up to 30% on a loaded 2-core machine.
    fast = Measurement(ks="0,1,3", batch_sizes="1,32", tokens=8, time_scale=4, timeout_seconds=150)
    measured = measure_profile(tmp_path, _fleet(), "sandbox", BASELINE_ACCEPTANCE, fast)
    profile = measured.profile
    assert measured.config_map["metadata"] == {
        "name": PROFILE_CONFIG_MAP,
        "namespace": "sandbox",
        "labels": {"app.kubernetes.io/part-of": "specfleet"},
    }
    # What the policy reads from the ConfigMap is what was measured.
    assert profile_from_config_map(measured.config_map, "sandbox", PROFILE_CONFIG_MAP) == profile
    assert yaml.safe_load(measured.config_map["data"][PROFILE_KEY])["name"] == "sandbox-measured"
    assert profile.batch_sizes == (1, 32, 64)
    # The engines kept the device's pace: each measured step within 15% of the device's x time scale.
    device = load_profile(DEVICE_PROFILE)
    for i, batch in enumerate(profile.batch_sizes):
        for j, k in enumerate(profile.speculative_tokens):
            expected = device.step_time_ms(batch, k) * fast.time_scale
            assert profile.step_ms[i][j] == pytest.approx(expected, rel=0.15), (batch, k)
    # Break-even, as the policy predicts it with its margin, lies between the demo's calm and surge
    # loads on the batch pool (one replica): speculation pays when calm and stops paying in the surge.
    point = break_even(profile, BASELINE_ACCEPTANCE, 3, 5)
    phases = {p.name: p for p in SCENARIOS["demo"].phases}
    assert phases["calm"].batch < point.on_below < point.off_above < phases["batch surge"].batch
    assert point.off_above < 64  # within what one engine runs at once
    # The long-prompt phase: fewer batch streams than the device's break-even (what this short
    # measurement finds varies more), so short prompts would speculate, but more than the KV cache
    # holds with the drafter and no more than it holds without. A request holds its prompt as the
    # engines count it, half its output and K lookahead slots, in whole blocks.
    long = phases["long prompts"]
    assert long.batch < break_even(device, BASELINE_ACCEPTANCE, 3, 5).off_above
    tenant = LoadGenerator("http://127.0.0.1:1", "m", name="batch-tenant")
    tenant.prompt_words = long.batch_prompt_words
    prompt = Prompt.from_chat([("user", tenant.message(1000))]).num_tokens
    output = inspect.signature(run_scenario).parameters["max_tokens"].default
    blocks = math.ceil((prompt + output / 2 + 3) / 16)
    assert profile.memory is not None
    with_drafter = profile.memory.kv_cache_tokens_with_drafter // 16 // blocks
    without = profile.memory.kv_cache_tokens // 16 // blocks
    assert with_drafter < long.batch <= without, (prompt, with_drafter, without)
