"""The drafter preflight: which field differs when a drafter does not fit its target."""

from __future__ import annotations

import json

import pytest

from specfleet_runtime.drafter_preflight import check_drafter, main, resolve_checkpoint

# Shapes as in the vLLM tier's tiny models (tests/vllm/tiny_models.py).
TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "vocab_size": 256}
EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 256,
    "target_hidden_size": 256,
    "vocab_size": 256,
    "draft_vocab_size": 256,
}


def test_matching_pair_fits():
    assert check_drafter("eagle3", TARGET, EAGLE3) == []


@pytest.mark.parametrize(
    ("drafter_patch", "expected"),
    [
        (
            {"target_hidden_size": 512},
            "hidden size: the drafter's target_hidden_size is 512, the target's hidden_size is 256",
        ),
        ({"architectures": ["LlamaForCausalLM"]}, "architectures: method eagle3 needs an EAGLE-3 drafter"),
        ({"vocab_size": 32000}, "vocabulary: the drafter's vocab_size is 32000, the target's is 256"),
        ({"draft_vocab_size": 300}, "vocabulary: draft_vocab_size 300 exceeds the target's vocab_size 256"),
    ],
)
def test_each_mismatch_names_its_field(drafter_patch, expected):
    problems = check_drafter("eagle3", TARGET, {**EAGLE3, **drafter_patch})
    assert len(problems) == 1
    assert problems[0].startswith(expected)


def test_hidden_size_without_target_hidden_size_and_multimodal_target():
    drafter = {k: v for k, v in EAGLE3.items() if k != "target_hidden_size"} | {"hidden_size": 4096}
    wrapped = {"architectures": ["X"], "text_config": {"hidden_size": 4096, "vocab_size": 256}}
    assert check_drafter("eagle3", wrapped, drafter) == []
    assert (
        "hidden_size is 4096, the target's hidden_size is 256" in check_drafter("eagle3", TARGET, drafter)[0]
    )


def test_draft_model_may_be_narrower_but_shares_the_vocabulary():
    small = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 256}
    assert check_drafter("draft_model", TARGET, small) == []
    assert check_drafter("draft_model", TARGET, small, 256, 250) == [
        "tokenizer: the drafter's tokenizer.json has 250 tokens, the target's 256"
    ]


def _write(directory, config, tokens=None):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    if tokens is not None:
        vocab = {f"t{i}": i for i in range(tokens)}
        (directory / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))


def test_command_on_directories(tmp_path, capsys):
    _write(tmp_path / "target", TARGET, tokens=256)
    _write(tmp_path / "good", EAGLE3)
    _write(tmp_path / "wide", {**EAGLE3, "target_hidden_size": 512})
    assert (
        main(
            ["--method", "eagle3", "--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "good")]
        )
        == 0
    )
    assert (
        main(
            ["--method", "eagle3", "--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "wide")]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.strip() == (
        "DrafterIncompatible: hidden size: the drafter's target_hidden_size is 512, the target's hidden_size is 256"
    )


def test_command_reports_a_missing_or_broken_checkpoint(tmp_path, capsys):
    _write(tmp_path / "target", TARGET)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert (
        main(
            [
                "--method",
                "eagle3",
                "--target",
                str(tmp_path / "target"),
                "--drafter",
                str(tmp_path / "broken"),
            ]
        )
        == 1
    )
    assert main(["--method", "eagle3", "--target", str(tmp_path / "target"), "--drafter", "org/absent"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("DrafterIncompatible: config: cannot read the drafter's config.json")
    assert err[1] == "DrafterIncompatible: org/absent: not a directory and no cache dir given"


def test_hugging_face_ids_resolve_in_the_cache(tmp_path):
    repo = tmp_path / "hub" / "models--org--drafter"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    assert resolve_checkpoint("org/drafter", tmp_path) == repo / "snapshots" / "abc123"
    with pytest.raises(FileNotFoundError, match="no snapshot"):
        resolve_checkpoint("org/drafter", tmp_path, revision="v2")


def test_skip_missing_passes_a_checkpoint_not_downloaded_yet_but_still_checks_cached_ones(tmp_path, capsys):
    # The init container runs before vLLM has downloaded anything into an empty cache: nothing to check.
    _write(tmp_path / "target", TARGET)
    args = ["--method", "eagle3", "--target", str(tmp_path / "target"), "--cache-dir", str(tmp_path)]
    assert main([*args, "--drafter", "org/absent", "--skip-missing"]) == 0
    assert "not checked: org/absent: no snapshot" in capsys.readouterr().out
    _write(tmp_path / "wide", {**EAGLE3, "target_hidden_size": 512})
    assert main([*args, "--drafter", str(tmp_path / "wide"), "--skip-missing"]) == 1
    assert "DrafterIncompatible: hidden size" in capsys.readouterr().err
