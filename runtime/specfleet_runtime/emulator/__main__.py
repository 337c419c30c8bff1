"""Command line: `python -m specfleet_runtime.emulator <vLLM args> [emulator options]`.

Takes the same arguments as `python -m vllm.entrypoints.openai.api_server` (parsed by
`specfleet_runtime.vllm_args.parse_vllm_args`; vLLM flags the emulator has no use for are ignored),
plus its own options, listed by `--help`. As vLLM, it serves the sleep-mode routes (/sleep, /wake_up,
/is_sleeping) only with VLLM_SERVER_DEV_MODE=1 in its environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from aiohttp import web

from specfleet_runtime.cost_profile import load_profile
from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.server import create_app
from specfleet_runtime.sleep_mode import HOST_LINK_BYTES_PER_S
from specfleet_runtime.vllm_args import parse_vllm_args

log = logging.getLogger("specfleet_runtime.emulator")


def _acceptance(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None


def _content_acceptance(text: str) -> tuple[str, tuple[float, ...]]:
    marker, sep, values = text.rpartition("=")
    if not sep or not marker:
        raise argparse.ArgumentTypeError(f"not MARKER=p1,p2,...: {text!r}")
    return marker, _acceptance(values)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specfleet_runtime.emulator",
        description="A vLLM-compatible fake engine. Takes vLLM's arguments (--model, "
        "--served-model-name, --port, --max-num-seqs, --max-model-len, --speculative-config, ...) "
        "plus the options below.",
        allow_abbrev=False,
    )
    p.add_argument("--host", default="0.0.0.0", help="address to bind (vLLM's default: all)")
    p.add_argument("--profile", help="step-time profile file (YAML/JSON); default: published H100")
    p.add_argument(
        "--acceptance",
        type=_acceptance,
        help="per-position cumulative acceptance, e.g. 0.68,0.39,0.2,0.1,0.05 (the default)",
    )
    p.add_argument(
        "--content-acceptance",
        type=_content_acceptance,
        action="append",
        metavar="MARKER=P1,P2,...",
        help="prompts whose text holds MARKER are drafted at this acceptance instead (repeatable; the "
        "first marker found wins): a content shift is traffic, not a setting of the engine",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every step time (0 = no waiting)")
    p.add_argument(
        "--break-losslessness",
        action="store_true",
        help="accepted draft tokens differ from the non-speculative output",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the acceptance sampler")
    p.add_argument(
        "--kv-cache-tokens",
        type=int,
        help="KV cache of the engine started without a drafter, in tokens (default: the profile's "
        "memory.kvCacheTokens, 448304 in the published profile; from --kv-cache-tokens-with-drafter "
        "and the profile's ratio when only that is given)",
    )
    p.add_argument(
        "--kv-cache-tokens-with-drafter",
        type=int,
        help="KV cache of the same engine started with a drafter (--speculative-config naming eagle, "
        "eagle3, draft_model or medusa), in tokens (default: the profile's "
        "memory.kvCacheTokensWithDrafter, 428432 in the published profile; with only "
        "--kv-cache-tokens, that scaled by the profile's kvCacheTokensWithDrafter/kvCacheTokens)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        help="tokens per KV cache block, vLLM's flag (default 16); a step that cannot get the blocks "
        "its running requests need preempts the newest, as vLLM V1 does",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM's flag (on by default in V1): reuse the KV cache of full prompt blocks already "
        "cached (hashed over their token ids, LRU-evicted) instead of prefilling them",
    )
    p.add_argument(
        "--spec-k0-overhead",
        type=float,
        default=0.0,
        help="extra step time (fraction) of a K=0 step in a speculating engine",
    )
    p.add_argument(
        "--weight-bytes",
        type=float,
        help="bytes of weights per GPU that a level-1 sleep copies to host RAM and a wake copies back "
        "(default: Llama-3.1-8B in bf16, 16.06e9, plus 0.85e9 for its EAGLE-3 drafter when started "
        "with a drafter)",
    )
    p.add_argument(
        "--host-link-gib-per-s",
        type=float,
        default=HOST_LINK_BYTES_PER_S / 2**30,
        help="host-link bandwidth of those copies, GiB/s (default %(default).1f: ~3 s to wake 64 GiB, "
        "llm-d fast-model-actuation); the copies take their time x --time-scale",
    )
    return p


# vLLM reads it as bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0"))) (vllm/envs.py).
SERVER_DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


def _server_dev_mode(environ: Mapping[str, str]) -> bool:
    value = environ.get(SERVER_DEV_MODE_ENV, "0")
    try:
        return bool(int(value))
    except ValueError:
        raise ValueError(f"{SERVER_DEV_MODE_ENV} must be an integer, got {value!r}") from None


def config_from_argv(
    argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[EmulatorConfig, str, int]:
    """The emulator config, host and port for a command line and environment (default: os.environ);
    exits with usage on bad flags."""
    parser = _parser()
    ns, rest = parser.parse_known_args(list(argv))
    try:
        engine, ignored = parse_vllm_args(rest)
    except ValueError as err:
        parser.error(str(err))
    if ignored:
        log.info("ignoring vLLM flags the emulator has no use for: %s", " ".join(ignored))
    options: dict[str, object] = {
        "time_scale": ns.time_scale,
        "break_losslessness": ns.break_losslessness,
        "seed": ns.seed,
        "spec_k0_overhead": ns.spec_k0_overhead,
        "enable_prefix_caching": ns.enable_prefix_caching,
        "host_link_bytes_per_s": ns.host_link_gib_per_s * 2**30,
    }
    try:
        options["server_dev_mode"] = _server_dev_mode(os.environ if environ is None else environ)
    except ValueError as err:
        parser.error(str(err))
    if ns.profile:
        options["profile"] = load_profile(ns.profile)
    if ns.acceptance is not None:
        options["acceptance"] = ns.acceptance
    if ns.content_acceptance:
        options["content_acceptance"] = tuple(ns.content_acceptance)
    for name in ("kv_cache_tokens", "kv_cache_tokens_with_drafter", "block_size", "weight_bytes"):
        if getattr(ns, name) is not None:
            options[name] = getattr(ns, name)
    try:
        config = EmulatorConfig.from_engine_args(engine, **options)
    except ValueError as err:
        parser.error(str(err))
    return config, ns.host, engine.port


def main(argv: Sequence[str] | None = None) -> None:
    """Run the emulator until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, host, port = config_from_argv(sys.argv[1:] if argv is None else argv)
    spec = config.speculative
    log.info(
        "emulating %s (served as %s) on %s:%d: max_num_seqs=%d, speculation=%s, profile=%s, "
        "time_scale=%g, acceptance=%s, KV cache: %d blocks of %d tokens, sleep mode: %s%s",
        config.model,
        config.served_model_name,
        host,
        port,
        config.max_num_seqs,
        spec.to_json() if spec else "off",
        config.profile.name,
        config.time_scale,
        list(config.acceptance),
        config.num_gpu_blocks,
        config.block_size,
        "on" if config.enable_sleep_mode else "off",
        " (routes served)" if config.server_dev_mode else " (no routes: VLLM_SERVER_DEV_MODE unset)",
    )
    web.run_app(create_app(config), host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
