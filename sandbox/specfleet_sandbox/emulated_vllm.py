"""The part of vLLM's offline API that `specfleet profile`'s measurement uses, played by engine emulators.

`specfleet profile` runs `specfleet_runtime/vllm_profile.py` with "the Python of a vLLM installation";
the sandbox has none, so `install(folder)` writes a `vllm` package under `folder` that re-exports this
module, and the sandbox puts `folder` first on the measurement's PYTHONPATH. The product's own
measurement then runs unchanged against the sandbox's engines:

- `LLM(**engine_kwargs)` starts one emulator process (`python -m specfleet_runtime.emulator`) with the
  vLLM flags those keyword arguments stand for (model, max_num_seqs, max_model_len,
  speculative_config) plus the options in SPECFLEET_EMULATOR_ARGS (a JSON list: the sandbox's time
  scale, device profile and acceptance, as its pods get them), on a free loopback port;
- `generate` sends one /v1/completions request per prompt, all at once, and waits for every one, as
  vLLM's offline `generate` runs a batch to the end;
- `get_metrics` reads the engine's /metrics, with counters named without `_total` as vLLM reports them;
- deleting the object (the measurement does, before it starts the next K) stops exactly that process.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ARGS_ENV = "SPECFLEET_EMULATOR_ARGS"
START_TIMEOUT_S = 60.0
# What `install` writes: the package that makes `import vllm` this module.
STAND_IN = """# vLLM's offline API, played by the engine emulator (written by specfleet_sandbox.emulated_vllm).
from specfleet_sandbox.emulated_vllm import LLM, SamplingParams

__all__ = ["LLM", "SamplingParams"]
"""


def install(folder: Path) -> Path:
    """Write the `vllm` stand-in package under `folder` (put `folder` first on PYTHONPATH)."""
    package = folder / "vllm"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(STAND_IN)
    return folder


@dataclass(frozen=True)
class SamplingParams:
    """The sampling settings the measurement sets; the emulator honours max_tokens and ignore_eos."""

    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0


@dataclass(frozen=True)
class Metric:
    """One sample, shaped like vLLM's `vllm.v1.metrics.reader` metrics (name, value, labels)."""

    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_argv(kwargs: dict[str, Any], port: int) -> list[str]:
    """The emulator's command line for vLLM's `LLM(**kwargs)` on `port` (loopback only)."""
    argv = ["--model", str(kwargs["model"]), "--host", "127.0.0.1", "--port", str(port)]
    for key, flag in (("max_num_seqs", "--max-num-seqs"), ("max_model_len", "--max-model-len")):
        if kwargs.get(key) is not None:
            argv += [flag, str(kwargs[key])]
    if kwargs.get("speculative_config"):
        argv += ["--speculative-config", json.dumps(kwargs["speculative_config"])]
    return argv + list(json.loads(os.environ.get(ARGS_ENV, "[]")))


class LLM:
    """One emulated engine, started for the life of this object."""

    def __init__(self, **kwargs: Any) -> None:
        self.model = str(kwargs["model"])
        port = _free_port()
        self._url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "specfleet_runtime.emulator", *engine_argv(kwargs, port)]
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(
                model_config=SimpleNamespace(max_model_len=kwargs.get("max_model_len")),
                parallel_config=SimpleNamespace(tensor_parallel_size=1),
            )
        )
        atexit.register(self.shutdown)  # a measurement that exits on an error stops its engine too
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"the emulated engine exited with {self._proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self._url}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.shutdown()
        raise RuntimeError(f"the emulated engine did not answer within {START_TIMEOUT_S:.0f} s")

    def _complete(self, prompt: dict[str, Any], params: SamplingParams) -> None:
        body = {
            "model": self.model,
            "prompt": prompt["prompt_token_ids"],
            "max_tokens": params.max_tokens,
            "ignore_eos": params.ignore_eos,
            "temperature": params.temperature,
        }
        request = urllib.request.Request(
            f"{self._url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()

    def generate(self, prompts: list[dict[str, Any]], params: SamplingParams, use_tqdm: bool = True) -> None:
        """Run every prompt at once, to the end (one request each, as a batch arrives in vLLM)."""
        del use_tqdm
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            for done in [pool.submit(self._complete, p, params) for p in prompts]:
                done.result()

    def get_metrics(self) -> list[Metric]:
        with urllib.request.urlopen(f"{self._url}/metrics", timeout=5) as response:
            text = response.read().decode()
        return [
            Metric(family.name, float(sample.value), dict(sample.labels))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in (family.name, f"{family.name}_total")
        ]

    def shutdown(self) -> None:
        """Stop the emulator this object started (by its own process handle)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __del__(self) -> None:
        self.shutdown()
