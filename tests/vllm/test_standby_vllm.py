"""Real vLLM on CPU cannot sleep: the Standby supervisor says so in the container's termination message
with its own exit code, and the operator reads that as StandbyUnavailable (the pool then flips by
restart) instead of a crash loop. vLLM's sleep mode is CUDA and ROCm only."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from tiny_models import TinyModels
from vllm_harness import K, engine_args, server_env

from specfleet.api import reasons
from specfleet.reconcile.pod_failures import pool_failure
from specfleet_runtime import standby
from specfleet_runtime.vllm_args import SpeculativeConfig, build_vllm_args

pytestmark = pytest.mark.vllm


def test_real_vllm_on_cpu_cannot_sleep_and_the_operator_says_so(
    vllm_python: Path, tiny: TinyModels, tmp_path: Path
) -> None:
    spec = SpeculativeConfig(method="eagle3", model=str(tiny.eagle3), num_speculative_tokens=K)
    speculative = dataclasses.replace(engine_args(tiny.target, spec), enable_sleep_mode=True)
    plain = dataclasses.replace(engine_args(tiny.target, None), enable_sleep_mode=True)
    ready, log = tmp_path / "ready", tmp_path / "termination-log"
    args = standby.StandbyArgs(
        speculative=tuple(build_vllm_args(speculative)),
        plain=tuple(build_vllm_args(plain)),
        ready_file=str(ready),
        termination_log=str(log),
        startup_timeout_seconds=600,
    )
    # The supervisor as the pod runs it: the installed file, under the engine image's python.
    script = tmp_path / "standby.py"
    standby.install(str(script))
    done = subprocess.run(
        [str(vllm_python), str(script), *standby.build_standby_args(args)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == standby.CANNOT_SLEEP_EXIT_CODE, output
    message = log.read_text()
    assert message.startswith(standby.CANNOT_SLEEP), message
    assert not ready.exists()
    print(f"supervisor over vLLM on CPU: exit {done.returncode}, termination message: {message.strip()}")
    # What the kubelet would report, read by the operator.
    pod = {
        "metadata": {"name": "llama-latency-0"},
        "status": {
            "containerStatuses": [
                {
                    "name": "engine",
                    "ready": False,
                    "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {
                        "terminated": {"exitCode": done.returncode, "reason": "Error", "message": message}
                    },
                }
            ]
        },
    }
    failure = pool_failure([pod], [])
    assert failure is not None
    assert failure.reason == reasons.STANDBY_UNAVAILABLE
    assert "cannot sleep" in failure.message
