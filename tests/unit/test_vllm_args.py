"""The data plane's vLLM command line: built and parsed by one module."""

from __future__ import annotations

import pytest

from specfleet_runtime.vllm_args import (
    OPERATOR_OWNED_OPTIONS,
    DynamicSpeculationRange,
    EngineArgs,
    SpeculativeConfig,
    build_vllm_args,
    operator_owned_option,
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


# Spellings of owned flags that vLLM 0.32's parser accepts (seen in tests/vllm against the real parser).
OWNED_SPELLINGS = {
    "--served_model_name=x": "--served-model-name",
    "--served-model-name": "--served-model-name",
    "--served": "--served-model-name",
    "--served_model": "--served-model-name",
    "--speculative_config={}": "--speculative-config",
    "--speculative-config.method": "--speculative-config",
    "--speculative_config.model=x": "--speculative-config",
    "-sc": "-sc",
    "-sc.method=ngram": "-sc",
    "--spec-method=ngram": "--spec-method",
    "--spec_tokens": "--spec-tokens",
    "--max_model_len=1": "--max-model-len",
    "--max-model-l": "--max-model-len",
    "-tp": "-tp",
    "-tp=2": "-tp",
    "-t": "-tp",
    "--tensor_parallel_size=2": "--tensor-parallel-size",
    "--tensor-parallel": "--tensor-parallel-size",
    "--host=0.0.0.0": "--host",
    "--ho": "--host",
    "--rev": "--revision",
    "--gpu-memory": "--gpu-memory-utilization",
    "--device_memory_utilization=0.5": "--device-memory-utilization",
    "--config=x.yaml": "--config",
    "--uds": "--uds",
}
NOT_OWNED = [
    "--enforce-eager",
    "--max-num-batched-tokens=512",
    "--dtype",
    "float32",
    "-1",
    "-",
    "--",
    "-O3",
    "--config-format=hf",
    "--model-impl=vllm",
    "--tokenizer-revision=x",
    "--code_revision",
    "--portx",
    "--enable-prefix-caching",
    "--max-num-batched-tokens",
]


@pytest.mark.parametrize(("arg", "owned"), OWNED_SPELLINGS.items())
def test_owned_flags_in_every_spelling(arg: str, owned: str) -> None:
    assert operator_owned_option(arg) == owned
    assert owned in OPERATOR_OWNED_OPTIONS


@pytest.mark.parametrize("arg", NOT_OWNED)
def test_other_flags_and_values_are_not_owned(arg: str) -> None:
    assert operator_owned_option(arg) is None
