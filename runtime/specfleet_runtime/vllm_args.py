"""The vLLM OpenAI server's command line, built in one place.

The data plane owns its command line: the operator's renderer calls `build_vllm_args`, the real-vLLM
compatibility tests start vLLM with exactly that list, and the engine emulator parses the same list
(`parse_vllm_args`), so a pod template that runs vLLM runs the emulator unchanged.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specfleet_runtime.names import ENGINE_PORT

# The image's entrypoint module; `vllm serve` takes the same flags but the CPU wheel lacks the script.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# vLLM's --gpu-memory-utilization where the engine does not set it.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9

# Methods whose drafter is a separate checkpoint that must be named in the config.
METHODS_WITH_DRAFTER_MODEL = frozenset({"eagle3", "eagle", "draft_model", "medusa"})
# Methods whose proposer keeps K lookahead KV slots per running request: vLLM's scheduler sets
# num_lookahead_tokens = num_speculative_tokens when speculative_config.use_eagle() (eagle, eagle3,
# mtp) or uses_draft_model() (vllm/v1/core/sched/scheduler.py, Scheduler.__init__).
LOOKAHEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "draft_model"})


# Every option string of vLLM 0.32's server parser that sets something the operator owns: the typed
# fields (model, names, port, parallelism, memory, speculation, including the --spec-* shorthands and
# aliases) and --config/--uds, which could set or move any of them. tests/vllm checks this list and
# `operator_owned_option` against vLLM's own parser.
OPERATOR_OWNED_OPTIONS: tuple[str, ...] = (
    "--model",
    "--served-model-name",
    "--revision",
    "--port",
    "--host",
    "--uds",
    "--tensor-parallel-size",
    "-tp",
    "--max-num-seqs",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--device-memory-utilization",
    "--speculative-config",
    "-sc",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
    "--config",
)


def operator_owned_option(arg: str) -> str | None:
    """The operator-owned option that `arg`, as one extra vLLM argument, would set; None if none.

    Follows what vLLM's FlexibleArgumentParser accepts: `_` for `-` in long names, `--flag=value` or a
    separate value, dotted keys (`--speculative-config.method ngram`) that become the JSON option, and
    argparse's unique-prefix abbreviations (`--served`, `--max-model`; vLLM keeps allow_abbrev on).
    Refusing every prefix of an owned option is stricter than argparse (an ambiguous prefix is vLLM's
    error anyway) and never refuses a real vLLM option, which tests/vllm checks.
    """
    if len(arg) < 2 or arg[0] != "-":
        return None
    name = arg.split("=", 1)[0].split(".", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
        if len(name) == 2:
            return None
        candidates = [o for o in OPERATOR_OWNED_OPTIONS if o.startswith("--")]
    else:
        candidates = [o for o in OPERATOR_OWNED_OPTIONS if not o.startswith("--")]
    if name in candidates:
        return name
    prefixed = [o for o in candidates if o.startswith(name)]
    return prefixed[0] if prefixed else None


@dataclass(frozen=True)
class DynamicSpeculationRange:
    """One row of vLLM's Dynamic SD table: batch sizes start..end (inclusive) draft `k` tokens."""

    start: int
    end: int
    k: int


@dataclass(frozen=True)
class SpeculativeConfig:
    """The fields of vLLM's `--speculative-config` JSON that specfleet sets."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    dynamic_schedule: tuple[DynamicSpeculationRange, ...] = ()

    def to_json(self) -> str:
        """Compact, key-sorted JSON so identical configs render byte-identical command lines."""
        doc: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            doc["model"] = self.model
        if self.draft_tensor_parallel_size is not None:
            doc["draft_tensor_parallel_size"] = self.draft_tensor_parallel_size
        if self.prompt_lookup_min is not None:
            doc["prompt_lookup_min"] = self.prompt_lookup_min
        if self.prompt_lookup_max is not None:
            doc["prompt_lookup_max"] = self.prompt_lookup_max
        if self.dynamic_schedule:
            doc["num_speculative_tokens_per_batch_size"] = [
                [r.start, r.end, r.k] for r in self.dynamic_schedule
            ]
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """Inverse of `to_json`; raises ValueError on a document vLLM would refuse."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("--speculative-config must be a JSON object")
        try:
            method = str(doc["method"])
            k = int(doc["num_speculative_tokens"])
        except KeyError as err:
            raise ValueError(f"--speculative-config lacks {err.args[0]!r}") from None
        if k < 1:
            raise ValueError("num_speculative_tokens must be > 0")
        schedule = tuple(
            DynamicSpeculationRange(int(a), int(b), int(c))
            for a, b, c in doc.get("num_speculative_tokens_per_batch_size") or ()
        )
        return cls(
            method=method,
            num_speculative_tokens=k,
            model=doc.get("model"),
            draft_tensor_parallel_size=doc.get("draft_tensor_parallel_size"),
            prompt_lookup_min=doc.get("prompt_lookup_min"),
            prompt_lookup_max=doc.get("prompt_lookup_max"),
            dynamic_schedule=schedule,
        )


@dataclass(frozen=True)
class EngineArgs:
    """Everything that ends up on one vLLM server's command line."""

    model: str
    served_model_name: str
    revision: str | None = None
    port: int = ENGINE_PORT
    tensor_parallel_size: int = 1
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    speculative: SpeculativeConfig | None = None
    # vLLM's --enable-sleep-mode: the weights and KV cache are allocated so that POST /sleep can
    # free them (the /sleep routes themselves exist only with VLLM_SERVER_DEV_MODE=1).
    enable_sleep_mode: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)


def build_vllm_args(engine: EngineArgs) -> list[str]:
    """The argument list after `python3 -m vllm.entrypoints.openai.api_server`.

    `--speculative-config` appears only when speculation is on: a pool without it runs a true
    non-speculative engine (K=0 inside a speculating engine is measurably slower).
    """
    args = ["--model", engine.model, "--served-model-name", engine.served_model_name]
    if engine.revision:
        args += ["--revision", engine.revision]
    args += ["--port", str(engine.port)]
    if engine.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.max_num_seqs is not None:
        args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if engine.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{engine.gpu_memory_utilization:g}"]
    if engine.speculative is not None:
        args += ["--speculative-config", engine.speculative.to_json()]
    if engine.enable_sleep_mode:
        args.append("--enable-sleep-mode")
    args += list(engine.extra_args)
    return args


def parse_vllm_args(argv: Sequence[str]) -> tuple[EngineArgs, list[str]]:
    """Parse the flags `build_vllm_args` emits; returns the engine args and the flags it did not know.

    Unknown flags are returned rather than rejected so that an emulator can run a template that
    carries extra vLLM flags it has no use for.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--revision")
    parser.add_argument("--port", type=int, default=ENGINE_PORT)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--speculative-config")
    # A BooleanOptionalAction in vLLM (bool fields of its EngineArgs), so --no-enable-sleep-mode too.
    parser.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction, default=False)
    ns, rest = parser.parse_known_args(list(argv))
    served = ns.served_model_name[0] if ns.served_model_name else ns.model
    spec = SpeculativeConfig.from_json(ns.speculative_config) if ns.speculative_config else None
    engine = EngineArgs(
        model=ns.model,
        served_model_name=served,
        revision=ns.revision,
        port=ns.port,
        tensor_parallel_size=ns.tensor_parallel_size,
        max_num_seqs=ns.max_num_seqs,
        max_model_len=ns.max_model_len,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        speculative=spec,
        enable_sleep_mode=ns.enable_sleep_mode,
    )
    return engine, rest
