"""A model's architecture for the CLI: the shipped table first, else the checkpoint's own files on this
machine (the one module that reads them; never the network).

Where it looks for a model id `org/name`: the local Hugging Face cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), in
`models--org--name/snapshots/<revision>/`, the revision `refs/main` names, else the newest snapshot; a
model given as a directory path is read from that directory. In either, `config.json` and, where
present, `model.safetensors.index.json` (`policy.predict.model_architecture` parses them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from specfleet.policy.predict.known_models import known_architecture
from specfleet.policy.predict.model_architecture import ModelArchitecture, parse_model_config

CONFIG = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "huggingface") / "hub"


def model_directory(model: str, cache_dir: Path | None = None) -> Path | None:
    """The directory holding `model`'s config.json: the path itself, or its snapshot in the hub cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path if (path / CONFIG).is_file() else None
    repo = (cache_dir or hub_cache_dir()) / f"models--{model.strip().replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text(encoding="utf-8").strip()
        if (pinned / CONFIG).is_file():
            return pinned
    found = (
        sorted(snapshots.glob(f"*/{CONFIG}"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    )
    return found[-1].parent if found else None


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def local_architecture(model: str, cache_dir: Path | None = None) -> ModelArchitecture | None:
    """`model`'s architecture from its files on this machine; None where they are absent or unreadable."""
    directory = model_directory(model, cache_dir)
    if directory is None:
        return None
    try:
        config = _json(directory / CONFIG)
        index = _json(directory / SAFETENSORS_INDEX)
        if not isinstance(config, dict):
            return None
        return parse_model_config(config, index if isinstance(index, dict) else None)
    except (OSError, ValueError):  # unreadable, not JSON, or a ModelConfigError
        return None


def architecture_of(model: str | None) -> ModelArchitecture | None:
    """The shipped table's architecture for `model`, else its local files', else None (unknown)."""
    if not model:
        return None
    return known_architecture(model) or local_architecture(model)
