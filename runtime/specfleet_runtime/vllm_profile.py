"""Measure a step-time profile (batch sizes x K) with vLLM itself, offline.

Runs with the Python of a vLLM installation (it imports vllm and the standard library only, so it can
run inside the vLLM image or venv without specfleet installed); `specfleet profile` launches it and
writes the result in the profile format `StepTimeProfile.from_dict` reads::

    python vllm_profile.py --model M [--method eagle3 --drafter D] --ks 0,1,3 --batch-sizes 1,8,32 \
        --max-num-seqs 256

The batches measured reach the largest the engine admits (`--max-num-seqs`, the serving engines'
--max-num-seqs, which every engine here starts with): it is added to `--batch-sizes`, and sizes above
it are left out (the engine would queue them, not run them at once). A profile measured so covers
every batch its engines run, and the step-time model never extrapolates for them.

For each K one engine is started (K=0: no --speculative-config, a true non-speculative engine, as the
operator runs a pool that is off). For each batch size it generates `--tokens` and `2 x --tokens`
tokens for `batch` requests at once (ignore_eos, so every request runs to the end) and takes the
difference: prefill and start-up cancel, and the time per decode step is

    step_ms = (t_long - t_short) / (steps_long - steps_short)

where steps are counted, not assumed: without speculation one per generated token, with speculation
the engine's own `spec_decode_num_drafts` counter divided by the batch (each running request drafts
once per step). Dummy weights (`--load-format dummy`) are enough: step time depends on shapes, not
on values. Prints one JSON document on stdout (progress on stderr).

The profile's `memory` section comes from the same engines: the KV cache of the K=0 engine (started
without the drafter) and of the first K > 0 engine (with it), as each reports it in
`vllm:cache_config_info` (label `kv_cache_size_tokens`, else `num_gpu_blocks` x `block_size`), the
gauge a served engine exports at /metrics. Without a K > 0 there is no drafter engine and no section.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

DRAFTS_METRIC = "vllm:spec_decode_num_drafts"
CACHE_INFO_METRIC = "vllm:cache_config_info"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _log(message: str) -> None:
    print(f"vllm_profile: {message}", file=sys.stderr, flush=True)


def _drafts(llm: Any) -> float:
    total = 0.0
    for metric in llm.get_metrics():
        if metric.name == DRAFTS_METRIC:
            total += float(getattr(metric, "value", 0.0))
    return total


def _cache_info(llm: Any) -> dict[str, str]:
    """The labels of the engine's `vllm:cache_config_info` gauge (engine 0)."""
    for metric in llm.get_metrics():
        if metric.name == CACHE_INFO_METRIC and getattr(metric, "labels", {}).get("engine", "0") == "0":
            return dict(metric.labels)
    raise SystemExit(f"the engine exported no {CACHE_INFO_METRIC}; is disable_log_stats off?")


def _number(labels: dict[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):  # absent, or "None"
        return None


def kv_cache_tokens(labels: dict[str, str]) -> int:
    """Tokens of KV cache in `vllm:cache_config_info`'s labels."""
    tokens = _number(labels, "kv_cache_size_tokens")
    if tokens is None:
        blocks, block_size = _number(labels, "num_gpu_blocks"), _number(labels, "block_size")
        if blocks is None or block_size is None:
            raise SystemExit(f"{CACHE_INFO_METRIC} has neither kv_cache_size_tokens nor num_gpu_blocks")
        tokens = blocks * block_size
    return int(tokens)


def _device_name() -> str:
    try:
        torch = importlib.import_module("torch")  # vLLM's dependency, not specfleet's
        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except Exception:  # no torch.cuda on this build: the device is the CPU
        pass
    return "cpu"


def batch_sizes(requested: Sequence[int], max_num_seqs: int | None) -> list[int]:
    """The batches to measure: those of `requested` the engine admits at once (at most
    `max_num_seqs`) and `max_num_seqs` itself, increasing; without a cap, `requested` (the largest of
    it is then the engine's cap)."""
    if max_num_seqs is None:
        return sorted(set(requested))
    if max_num_seqs < 1:
        raise SystemExit(f"--max-num-seqs must be >= 1, got {max_num_seqs}")
    return sorted({b for b in requested if 1 <= b <= max_num_seqs} | {max_num_seqs})


def _generate(llm: Any, batch: int, tokens: int, prompt_len: int) -> tuple[float, float]:
    """Seconds to generate `tokens` for `batch` requests at once, and the drafts the engine counted."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0)
    # Distinct prompts (no prefix sharing), token ids from a small range every vocabulary has.
    prompts = [{"prompt_token_ids": [10 + (i * 7 + j) % 90 for j in range(prompt_len)]} for i in range(batch)]
    before = _drafts(llm)
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return elapsed, _drafts(llm) - before


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM

    ks, batches = sorted(set(args.ks)), batch_sizes(args.batch_sizes, args.max_num_seqs)
    left_out = sorted(b for b in set(args.batch_sizes) if b not in batches)
    if left_out:
        _log(f"batch sizes {left_out} left out: above --max-num-seqs {args.max_num_seqs}")
    if not ks or ks[0] != 0:
        raise SystemExit("--ks must include 0 (the non-speculative baseline)")
    if (
        any(k > 0 for k in ks)
        and args.method in ("eagle3", "eagle", "draft_model", "medusa")
        and not args.drafter
    ):
        raise SystemExit(f"--drafter is required for method {args.method}")
    table: dict[int, dict[int, float]] = {}
    kv_tokens: dict[bool, int] = {}  # with the drafter -> KV cache tokens
    cache: dict[str, str] = {}
    max_model_len = tp = None
    for k in ks:
        speculative = None
        if k > 0:
            speculative = {"method": args.method, "num_speculative_tokens": k}
            if args.drafter:
                speculative["model"] = args.drafter
            if args.method == "ngram":
                speculative.update(prompt_lookup_min=2, prompt_lookup_max=4)
        _log(f"starting an engine with K={k}")
        engine: dict[str, Any] = {
            "model": args.model,
            "max_num_seqs": max(batches),
            "load_format": args.load_format,
            "enforce_eager": args.enforce_eager,
            "disable_log_stats": False,
            "seed": 0,
            **json.loads(args.engine_args),
        }
        if args.dtype:
            engine["dtype"] = args.dtype
        if args.max_model_len:
            engine["max_model_len"] = args.max_model_len
        if speculative is not None:
            engine["speculative_config"] = speculative
        llm = LLM(**engine)
        if (k > 0) not in kv_tokens:  # the engine without the drafter, then the first with it
            cache = _cache_info(llm)
            kv_tokens[k > 0] = kv_cache_tokens(cache)
            _log(f"K={k}: KV cache of {kv_tokens[k > 0]} tokens")
            config = llm.llm_engine.vllm_config
            max_model_len = config.model_config.max_model_len
            tp = config.parallel_config.tensor_parallel_size
        _generate(llm, 1, 4, args.prompt_len)  # warm-up
        table[k] = {}
        for batch in batches:
            samples = []
            for _ in range(args.repeats):
                t1, d1 = _generate(llm, batch, args.tokens, args.prompt_len)
                t2, d2 = _generate(llm, batch, 2 * args.tokens, args.prompt_len)
                steps = float(args.tokens) if k == 0 else (d2 - d1) / batch
                if steps <= 0:
                    raise SystemExit(f"K={k} batch={batch}: the engine counted no drafts; is speculation on?")
                samples.append(max(t2 - t1, 1e-6) / steps * 1000.0)
            table[k][batch] = statistics.median(samples)
            _log(f"K={k} batch={batch}: {table[k][batch]:.3f} ms per step")
        del llm
        gc.collect()
    memory: dict[str, Any] | None = None
    if True in kv_tokens:
        util = _number(cache, "gpu_memory_utilization")
        memory = {
            "kvCacheTokens": kv_tokens[False],
            "kvCacheTokensWithDrafter": kv_tokens[True],
            "model": args.model,
            "drafter": args.drafter,
            "gpu": _device_name(),
            "tensorParallelSize": tp,
            "maxModelLen": max_model_len,
            "gpuMemoryUtilization": util,
            "blockSize": int(_number(cache, "block_size") or 0) or None,
        }
        memory = {key: value for key, value in memory.items() if value is not None}
    return {
        "name": args.name,
        "batchSizes": batches,
        "numSpeculativeTokens": ks,
        "stepTimeMs": [[round(table[k][b], 4) for k in ks] for b in batches],
        "prefillMsPerToken": 0.0,
        **({"memory": memory} if memory is not None else {}),
        "measuredWith": {
            "model": args.model,
            "method": args.method,
            "drafter": args.drafter,
            "tokens": args.tokens,
            "repeats": args.repeats,
            "loadFormat": args.load_format,
        },
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="target model (HF id or local folder)")
    parser.add_argument("--method", default="eagle3", help="vLLM speculative method")
    parser.add_argument("--drafter", default=None, help="drafter model (eagle3, eagle, draft_model, medusa)")
    parser.add_argument("--ks", type=_ints, default=[0, 1, 3, 5], help="K values, comma-separated (0 first)")
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 8, 32, 64, 128, 256])
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="the engines' --max-num-seqs: measured too, the largest batch (default: the largest batch size)",
    )
    parser.add_argument("--tokens", type=int, default=32, help="decode steps of the short run")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per point (median)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    parser.add_argument("--load-format", default="dummy", help="'dummy' (random weights) or 'auto'")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile")
    parser.add_argument("--engine-args", default="{}", help="more vllm.LLM keyword arguments, as JSON")
    parser.add_argument("--name", default="measured", help="profile name")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # One line of JSON, last on stdout (vLLM may log to stdout before it).
    print(json.dumps(measure(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
