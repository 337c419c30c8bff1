"""The sandbox measures its own engines with `specfleet profile` and gives the policy what it measured.

The engines are emulators that play the device in device-profile.yaml, 10x slower than real time
(`emulator_args`). The policy is not told that file: before the fleet is applied, `measure_profile`
runs the product's own measurement (`specfleet profile`, the command a user runs on a GPU node) with
`emulated_vllm` standing in for vLLM, so each engine it starts is an emulator with the sandbox
engines' flags. The result is the cost-profile ConfigMap (`PROFILE_CONFIG_MAP`) that the fleet names
in `policy.goodput.costProfileConfigMap`.

The measurement is kept short (`SANDBOX`, about a minute on two cores): K 0, 1 and 3 (the drafter's
numSpeculativeTokens; K=2 the profile interpolates), batches of 1, 32 and the engines' cap of 64, runs
of 8 and 16 tokens, one repeat. The emulator keeps its step schedule on the wall clock, so short runs
measure it well. `break_even` says where the policy's own prediction then turns speculation off and on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specfleet.policy.inputs.profile_source import PROFILE_KEY
from specfleet_runtime.cost_profile import StepTimeProfile, break_even_concurrency
from specfleet_sandbox import emulated_vllm

DEVICE_PROFILE = Path(__file__).with_name("device-profile.yaml")
PROFILE_CONFIG_MAP = "sandbox-cost-profile"


@dataclass(frozen=True)
class Measurement:
    """What `specfleet profile` measures, and how slowly the emulated engines run (x the device)."""

    ks: str = "0,1,3"
    batch_sizes: str = "1,32"  # the engines' cap is added
    tokens: int = 8
    time_scale: float = 10
    timeout_seconds: float = 300


# The sandbox's: about a minute on two cores.
SANDBOX = Measurement()


def emulator_args(time_scale: float = SANDBOX.time_scale) -> list[str]:
    """The emulator options of every engine the sandbox runs (its pods' and the measurement's)."""
    return ["--time-scale", f"{time_scale:g}", "--profile", str(DEVICE_PROFILE)]


def profile_command(fleet: dict[str, Any], namespace: str, settings: Measurement = SANDBOX) -> list[str]:
    """`specfleet profile` for the fleet's model, drafter and engine cap, printing the ConfigMap."""
    spec = fleet["spec"]
    engine = spec["engine"]
    max_num_seqs = max(
        int(pool.get("engine", {}).get("maxNumSeqs", engine["maxNumSeqs"])) for pool in spec["pools"].values()
    )
    command = [sys.executable, "-m", "specfleet", "profile", "--vllm-python", sys.executable]
    command += ["--model", spec["model"]["name"], "--method", spec["drafter"]["method"]]
    command += ["--drafter", spec["drafter"]["model"], "--name", "sandbox-measured"]
    command += [
        "--ks",
        settings.ks,
        "--batch-sizes",
        settings.batch_sizes,
        "--max-num-seqs",
        str(max_num_seqs),
    ]
    command += ["--tokens", str(settings.tokens), "--repeats", "1"]
    if engine.get("maxModelLen"):
        command += ["--max-model-len", str(engine["maxModelLen"])]
    return [*command, "--config-map", PROFILE_CONFIG_MAP, "--namespace", namespace]


@dataclass(frozen=True)
class Measured:
    """The ConfigMap `specfleet profile` printed, and the profile it holds."""

    config_map: dict[str, Any]
    profile: StepTimeProfile


def measure_profile(
    work: Path,
    fleet: dict[str, Any],
    namespace: str,
    acceptance: Sequence[float],
    settings: Measurement = SANDBOX,
) -> Measured:
    """Run `specfleet profile` against emulated engines started as the sandbox starts its own."""
    stand_in = emulated_vllm.install(work / "emulated-vllm")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(stand_in), *filter(None, [env.get("PYTHONPATH")])])
    env[emulated_vllm.ARGS_ENV] = json.dumps(
        [*emulator_args(settings.time_scale), "--acceptance", ",".join(str(a) for a in acceptance)]
    )
    # Its own session: on a timeout, its process group (the command, the measurement and the
    # emulators it started) is stopped, and nothing else.
    proc = subprocess.Popen(
        profile_command(fleet, namespace, settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=settings.timeout_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(
            f"`specfleet profile` did not finish within {settings.timeout_seconds:.0f} s"
        ) from None
    (work / "profile.log").write_text(stderr)
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-10:])
        raise RuntimeError(f"`specfleet profile` failed (exit {proc.returncode}):\n{tail}")
    config_map: dict[str, Any] = yaml.safe_load(stdout)
    if config_map.get("kind") == "List":
        config_map = config_map["items"][0]
    profile = StepTimeProfile.from_dict(yaml.safe_load(config_map["data"][PROFILE_KEY]))
    return Measured(config_map, profile)


@dataclass(frozen=True)
class BreakEven:
    """Running requests per replica where the policy predicts speculation stops and starts paying."""

    off_above: float  # the best K predicts less than 1 - margin
    on_below: float  # the best K predicts more than 1 + margin


def break_even(
    profile: StepTimeProfile, acceptance: Sequence[float], max_k: int, margin_percent: int
) -> BreakEven:
    """The policy's break-even function on `profile` for K 1..max_k, with its hysteresis margin."""
    ks = range(1, max_k + 1)
    margin = margin_percent / 100
    return BreakEven(
        off_above=break_even_concurrency(profile, acceptance, ks, target=1 - margin),
        on_below=break_even_concurrency(profile, acceptance, ks, target=1 + margin),
    )
