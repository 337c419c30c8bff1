"""The operator-owned flag check against vLLM's own parser (no server: only its argument parser).

Every spelling of an owned option that vLLM accepts as setting something the operator owns must be
refused by `operator_owned_option`; everything it refuses must be something vLLM reads as an owned
option (or rejects outright); no other real vLLM option is refused.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specfleet_runtime.vllm_args import OPERATOR_OWNED_OPTIONS, operator_owned_option

pytestmark = pytest.mark.vllm

BASE = ["--model", "base-model"]
# A value each owned option's type accepts.
VALUES = {
    "--model": "other-model",
    "--served-model-name": "other-name",
    "--revision": "other-rev",
    "--port": "9999",
    "--host": "10.1.2.3",
    "--uds": "/tmp/x.sock",
    "--tensor-parallel-size": "2",
    "-tp": "2",
    "--max-num-seqs": "3",
    "--max-model-len": "7",
    "--gpu-memory-utilization": "0.5",
    "--device-memory-utilization": "0.5",
    "--speculative-config": '{"method": "ngram", "num_speculative_tokens": 2}',
    "-sc": '{"method": "ngram", "num_speculative_tokens": 2}',
    "--spec-method": "ngram",
    "--spec-model": "other-drafter",
    "--spec-tokens": "2",
    "--config": "/nonexistent.yaml",
}
DOTTED = {"--speculative-config", "-sc"}


def probe(vllm_python: Path, cases: list[list[str]]) -> dict[str, Any]:
    out = subprocess.run(
        [str(vllm_python), str(Path(__file__).with_name("vllm_parser_probe.py"))],
        input=json.dumps({"base": BASE, "cases": cases}),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def spellings(option: str, value: str) -> list[list[str]]:
    """The ways one could write `option value` for vLLM: - or _, = or apart, abbreviated, dotted."""
    names = {option}
    if option.startswith("--"):
        names.add("--" + option[2:].replace("-", "_"))
        names.update(option[:n] for n in range(4, len(option)))
    else:
        names.update(option[:n] for n in range(2, len(option)))
    cases = []
    for name in sorted(names):
        cases += [[name, value], [f"{name}={value}"]]
        if option in DOTTED:
            cases += [[f"{name}.method", "ngram"], [f"{name}.num_speculative_tokens=2"]]
    return cases


def test_every_spelling_vllm_reads_as_an_owned_option_is_refused(vllm_python: Path) -> None:
    cases = [case for option, value in VALUES.items() for case in spellings(option, value)]
    got = probe(vllm_python, cases)
    options: dict[str, str] = got["options"]
    owned_dests = {options[o] for o in OPERATOR_OWNED_OPTIONS}
    # The list names real options of this vLLM, and VALUES covers it.
    assert set(OPERATOR_OWNED_OPTIONS) <= set(options)
    assert set(VALUES) == set(OPERATOR_OWNED_OPTIONS)
    # Every option vLLM has for an owned setting is in the list (no alias left out).
    assert {o for o, dest in options.items() if dest in owned_dests} == set(OPERATOR_OWNED_OPTIONS)

    overrides = 0
    for case, result in zip(cases, got["results"], strict=True):
        refused = any(operator_owned_option(arg) is not None for arg in case)
        if isinstance(result, dict) and set(result) & owned_dests:
            overrides += 1
            assert refused, f"{case} sets {sorted(set(result) & owned_dests)} in vLLM but is not refused"
        if refused:
            # Refused only what vLLM reads as an owned option, refuses itself (an ambiguous prefix), or
            # takes for the positional model tag (argparse's reading of "-s=<text with spaces>").
            assert isinstance(result, str) or set(result) & owned_dests or set(result) <= {"model_tag"}, (
                case,
                result,
            )
    assert overrides > len(VALUES)  # the spellings did reach vLLM's parser as overrides

    # No other real vLLM option is refused, however it is written.
    for option, dest in options.items():
        if dest not in owned_dests and option.startswith("-"):
            assert operator_owned_option(option) is None, option
            assert operator_owned_option(f"{option}=1") is None, option
            if option.startswith("--"):
                assert operator_owned_option("--" + option[2:].replace("-", "_")) is None, option
