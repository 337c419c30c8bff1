"""`specfleet profile` without vLLM: the output it parses, the files it writes, its errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from specfleet.cli import main
from specfleet.profiling import PROFILE_KEY, ProfileError, config_map, parse_output, profile_document
from specfleet_runtime.cost_profile import StepTimeProfile, load_profile

DOC = {
    "name": "x",
    "batchSizes": [1, 4],
    "numSpeculativeTokens": [0, 1],
    "stepTimeMs": [[1.0, 1.5], [2.0, 3.0]],
    "prefillMsPerToken": 0.0,
    "measuredWith": {"model": "m"},
}


def test_parse_output_takes_the_last_json_line_after_vllm_logs():
    profile, doc = parse_output("INFO starting\n" + json.dumps(DOC) + "\n")
    assert profile.step_time_ms(4, 1) == 3.0
    assert doc["measuredWith"] == {"model": "m"}


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("nothing here\n", "printed no profile"),
        (json.dumps({**DOC, "numSpeculativeTokens": [1, 2]}), "invalid profile"),
    ],
)
def test_parse_output_refuses_what_is_not_a_profile(stdout, message):
    with pytest.raises(ProfileError, match=message):
        parse_output(stdout)


def test_documents_round_trip(tmp_path: Path):
    profile = StepTimeProfile.from_dict(DOC)
    text = profile_document(profile, {"model": "m"})
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert load_profile(path) == profile
    cm = config_map("h100-profile", "inference", text)
    assert cm["metadata"]["namespace"] == "inference"
    assert StepTimeProfile.from_dict(yaml.safe_load(cm["data"][PROFILE_KEY])) == profile


def test_cli_reports_a_failed_measurement(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # The current python has no vllm: the measurement fails and says why, nothing is written.
    out = tmp_path / "p.yaml"
    code = main(["profile", "--vllm-python", sys.executable, "--model", "m", "--ks", "0", "-o", str(out)])
    assert code == 1
    assert "the measurement failed" in capsys.readouterr().err
    assert not out.exists()


def test_cli_reports_a_missing_interpreter(capsys: pytest.CaptureFixture[str]):
    assert main(["profile", "--vllm-python", "/nonexistent/python", "--model", "m"]) == 1
    assert "no such interpreter" in capsys.readouterr().err
