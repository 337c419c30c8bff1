"""Specs that pass the schema but cannot work, and the CLI's other commands."""

from __future__ import annotations

import argparse

import pytest

from specfleet import __version__
from specfleet.api.semantics import find_problems, vllm_version_of_image
from specfleet.api.validation import parse_spec
from specfleet.cli.main import main
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
    path.write_text("- just\n- a list\n")
    assert main(["render", "-f", str(path)]) == 1
    assert f"error: {path}: document 1 is a list, not a mapping" in capsys.readouterr().err


def test_render_missing_file(capsys):
    assert main(["render", "-f", "/nonexistent.yaml"]) == 1
    assert "cannot read" in capsys.readouterr().err


def _subcommand_parsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(argv prefix, parser) for a parser and every subcommand below it."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommand_parsers(sub, (*prefix, name))


def _all_parsers():
    from specfleet.cli.main import build_parser
    from specfleet_sandbox.cli import build_parser as sandbox_parser

    found = [(argv, p) for argv, p in _subcommand_parsers(build_parser()) if argv != ("sandbox",)]
    return found + [(("sandbox", *argv), p) for argv, p in _subcommand_parsers(sandbox_parser())]


def _sandbox_execs_in_process(monkeypatch) -> list[list[str]]:
    """`specfleet sandbox` replaces its process with the sandbox's program; run that here instead."""
    from specfleet_sandbox.cli import main as sandbox_main

    calls: list[list[str]] = []

    def execv(path: str, args: list[str]) -> None:
        calls.append([path, *args[1:]])
        raise SystemExit(sandbox_main(args[3:]))

    monkeypatch.setattr("specfleet.cli.main.os.execv", execv)
    return calls


def test_specfleet_sandbox_runs_the_sandbox_program_without_importing_it(monkeypatch, capsys):
    import sys

    calls = _sandbox_execs_in_process(monkeypatch)
    with pytest.raises(SystemExit):
        main(["sandbox", "info", "--help"])
    assert calls == [[sys.executable, "-m", "specfleet_sandbox", "info", "--help"]]
    assert capsys.readouterr().out.startswith("usage: specfleet sandbox info")


@pytest.mark.parametrize("argv", [argv for argv, _ in _all_parsers()], ids=" ".join)
def test_every_command_answers_help(argv, capsys, monkeypatch):
    _sandbox_execs_in_process(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {' '.join(('specfleet', *argv))}")


def test_every_flag_has_help_and_shows_its_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag
    for argv, parser in _all_parsers():
        text = parser.format_help()
        for action in parser._actions:
            if not action.option_strings or isinstance(
                action, (argparse._HelpAction, argparse._VersionAction)
            ):
                continue
            where = f"specfleet {' '.join(argv)} {action.option_strings[-1]}"
            assert action.help, f"{where} has no help"
            if action.default is not None and action.default is not False:
                shown = f"(default: {action.default})" in text or "default" in action.help
                assert shown, f"{where} does not show its default {action.default!r}"


def _example_with(tmp_path, text_after_spec: str = "", **changes) -> str:
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "01-minimal-eagle3.yaml").read_text())
    doc.update(changes)
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(doc) + text_after_spec)
    return str(path)


def _render_error(path: str, capsys) -> str:
    assert main(["render", "-f", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_an_unknown_field_suggests_the_nearest_known_one(tmp_path, capsys):
    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "01-minimal-eagle3.yaml").read_text())
    doc["spec"]["drafter"]["numSpeculativeToken"] = 3
    doc["spec"]["pools"] = {"latency": {"replica": 2}}
    doc["specs"] = {}
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(doc))
    err = _render_error(str(path), capsys)
    assert 'unknown field "specs" (did you mean "spec"?)' in err
    doc.pop("specs")
    path.write_text(yaml.safe_dump(doc))
    err = _render_error(str(path), capsys)
    assert 'unknown field "spec.drafter.numSpeculativeToken" (did you mean "numSpeculativeTokens"?)' in err
    assert 'unknown field "spec.pools.latency.replica" (did you mean "replicas"?)' in err


def test_an_unquoted_off_says_to_quote_it(tmp_path, capsys):
    text = (ROOT / "examples" / "01-minimal-eagle3.yaml").read_text()
    text += "  pools:\n    batch:\n      speculation: Off\n"
    path = tmp_path / "sd.yaml"
    path.write_text(text)
    err = _render_error(str(path), capsys)
    assert (
        'spec.pools.batch.speculation: Unsupported value: false: supported values: "On", "Off", "Auto"' in err
    )
    assert 'quote the value, speculation: "Off"' in err


def test_a_bad_name_names_its_path_and_a_wrong_kind_echoes_what_came(tmp_path, capsys):
    err = _render_error(_example_with(tmp_path, metadata={"name": "1fleet"}), capsys)
    assert 'metadata.name: Invalid value: "1fleet": metadata.name must start with a letter' in err
    assert "<nil>" not in err
    err = _render_error(
        _example_with(tmp_path, apiVersion="specfleet.io/v1", kind="SpeculativeDeploy"), capsys
    )
    assert 'got apiVersion "specfleet.io/v1" and kind "SpeculativeDeploy"' in err


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n---\n"])
def test_an_empty_manifest_is_an_error(tmp_path, capsys, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    err = _render_error(str(path), capsys)
    assert f"error: {path} holds no resources" in err
