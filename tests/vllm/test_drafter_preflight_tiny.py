"""The drafter preflight on the tier's real checkpoints: the constructed EAGLE-3 pair fits; a copy of
the drafter declared for another hidden size (weights untouched) is refused, naming the field."""

from __future__ import annotations

import json
import shutil

import pytest
from tiny_models import TinyModels

from specfleet_runtime.drafter_preflight import check_directories, main

pytestmark = pytest.mark.vllm


def test_tiny_pair_fits(tiny: TinyModels):
    assert check_directories("eagle3", tiny.target, tiny.eagle3) == []
    assert main(["--method", "eagle3", "--target", str(tiny.target), "--drafter", str(tiny.eagle3)]) == 0


def test_drafter_for_another_hidden_size_is_refused(tiny: TinyModels, tmp_path, capsys):
    wide = tmp_path / "eagle3-wide"
    shutil.copytree(tiny.eagle3, wide)
    config = json.loads((wide / "config.json").read_text())
    hidden = json.loads((tiny.target / "config.json").read_text())["hidden_size"]
    config["target_hidden_size"] = hidden * 2
    (wide / "config.json").write_text(json.dumps(config))
    assert main(["--method", "eagle3", "--target", str(tiny.target), "--drafter", str(wide)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"DrafterIncompatible: hidden size: the drafter's target_hidden_size is {hidden * 2}, "
        f"the target's hidden_size is {hidden}"
    )
