"""Specs that pass the schema but cannot work, and the CLI's other commands."""

from __future__ import annotations

import pytest

from specfleet import __version__
from specfleet.api.semantics import find_problems, vllm_version_of_image
from specfleet.api.validation import parse_spec
from specfleet.cli import main
from support.manifests import ROOT


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.32.0", (0, 32, 0)),
        ("registry.example.com/vllm/vllm-openai:0.9.2-cu128", (0, 9, 2)),
        ("vllm/vllm-openai:latest", None),
        ("my/engine:v0.1.0", None),
        ("localhost:5000/vllm-openai", None),
    ],
)
def test_image_versions(image, version):
    assert vllm_version_of_image(image) == version


def _spec(**extra):
    return parse_spec({"model": {"name": "m"}, "drafter": {"model": "d"}, **extra})


def test_good_spec_has_no_problems():
    assert find_problems(_spec()) == []


def test_dynamic_schedule_needs_new_vllm():
    spec = parse_spec(
        {
            "model": {"name": "m"},
            "drafter": {
                "model": "d",
                "dynamicSchedule": [{"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 2}],
            },
            "engine": {"image": "vllm/vllm-openai:v0.10.0"},
        }
    )
    assert any("Dynamic SD" in p for p in find_problems(spec))


def test_draft_tp_must_match():
    spec = parse_spec(
        {
            "model": {"name": "m"},
            "drafter": {"model": "d", "draftTensorParallelSize": 2},
            "engine": {"tensorParallelSize": 4, "resources": {"gpus": 4}},
        }
    )
    assert any("draftTensorParallelSize" in p for p in find_problems(spec))


def test_owned_flags_refused_in_any_spelling():
    spec = _spec(
        engine={"extraArgs": ["--served_model_name=x", "--enforce-eager", "--max-model", "1"]},
        pools={"batch": {"engine": {"extraArgs": ["--speculative-config.method", "ngram"]}}},
    )
    problems = find_problems(spec)
    assert any("latency: extraArgs sets --served-model-name (as --served_model_name)" in p for p in problems)
    assert any("latency: extraArgs sets --max-model-len (as --max-model)" in p for p in problems)
    assert any(
        "batch: extraArgs sets --speculative-config (as --speculative-config.method)" in p for p in problems
    )
    assert not any("enforce" in p for p in problems)


def test_crd_command_prints_the_committed_file(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == (ROOT / "crds" / "specfleet.io_speculativedeployments.yaml").read_text()


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


def test_render_reports_unrunnable_spec(capsys):
    assert main(["render", "-f", str(ROOT / "examples" / "05-degraded-old-image.yaml")]) == 1
    assert "needs vLLM >= 0.8.5" in capsys.readouterr().err


def test_render_survives_garbage(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text("- just\n- a list\n---\n: : :\n")
    assert main(["render", "-f", str(path)]) == 1
    assert "error" in capsys.readouterr().err


def test_render_missing_file(capsys):
    assert main(["render", "-f", "/nonexistent.yaml"]) == 1
    assert "cannot read" in capsys.readouterr().err
