"""The data plane's vLLM command line: built and parsed by one module."""

from __future__ import annotations

import pytest

from specfleet_runtime.vllm_args import (
    DynamicSpeculationRange,
    EngineArgs,
    SpeculativeConfig,
    build_vllm_args,
    parse_vllm_args,
)


def test_round_trip_with_everything():
    engine = EngineArgs(
        model="m",
        served_model_name="served",
        revision="main",
        tensor_parallel_size=2,
        max_num_seqs=64,
        max_model_len=4096,
        gpu_memory_utilization=0.9,
        speculative=SpeculativeConfig(
            method="eagle3",
            num_speculative_tokens=3,
            model="d",
            dynamic_schedule=(DynamicSpeculationRange(1, 8, 3), DynamicSpeculationRange(9, 64, 1)),
        ),
    )
    parsed, rest = parse_vllm_args([*build_vllm_args(engine), "--enforce-eager"])
    assert parsed == engine
    assert rest == ["--enforce-eager"]


def test_no_speculation_flag_when_off():
    args = build_vllm_args(EngineArgs(model="m", served_model_name="s"))
    assert args == ["--model", "m", "--served-model-name", "s", "--port", "8000"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "must be a JSON object"),
        ('{"method": "eagle3"}', "lacks 'num_speculative_tokens'"),
        ('{"method": "eagle3", "num_speculative_tokens": 0}', "must be > 0"),
    ],
)
def test_bad_speculative_config(text, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_json(text)
