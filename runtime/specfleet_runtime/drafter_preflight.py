"""Does a drafter fit its target? Checked from the checkpoints' config files before vLLM loads them.

A pure check (`check_drafter`) over the two `config.json` documents (and `tokenizer.json` where both
have one), plus a command an engine pod's init container can run against the model cache:

    python -m specfleet_runtime.drafter_preflight --method eagle3 --target DIR_OR_ID --drafter DIR_OR_ID

It exits 0 when they fit and 1 with one line per mismatch (`DrafterIncompatible: ...`) naming the
field that differs, so a mismatch stops the rollout with a message instead of a crash-looping engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REASON = "DrafterIncompatible"
# Methods whose drafter reads the target's hidden states, so its input width must be the target's.
HIDDEN_STATE_METHODS = ("eagle3", "eagle", "medusa")


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal wrappers keep the language model's sizes under text_config."""
    inner = config.get("text_config")
    return inner if "hidden_size" not in config and isinstance(inner, Mapping) else config


def check_drafter(
    method: str,
    target: Mapping[str, Any],
    drafter: Mapping[str, Any],
    target_tokenizer_vocab: int | None = None,
    drafter_tokenizer_vocab: int | None = None,
) -> list[str]:
    """Every way the drafter does not fit the target, one human-readable line each (empty: it fits)."""
    problems: list[str] = []
    t, d = _text_config(target), _text_config(drafter)
    if method == "eagle3":
        architectures = [str(a) for a in d.get("architectures") or []]
        if not any("eagle3" in a.lower() for a in architectures):
            problems.append(
                f"architectures: method eagle3 needs an EAGLE-3 drafter, the drafter declares {architectures or 'none'}"
            )
    if method in HIDDEN_STATE_METHODS:
        field = "target_hidden_size" if d.get("target_hidden_size") is not None else "hidden_size"
        if d.get(field) != t.get("hidden_size"):
            problems.append(
                f"hidden size: the drafter's {field} is {d.get(field)}, the target's hidden_size is {t.get('hidden_size')}"
            )
    if d.get("vocab_size") != t.get("vocab_size"):
        problems.append(
            f"vocabulary: the drafter's vocab_size is {d.get('vocab_size')}, the target's is {t.get('vocab_size')}"
        )
    draft_vocab = d.get("draft_vocab_size")
    if (
        isinstance(draft_vocab, int)
        and isinstance(t.get("vocab_size"), int)
        and draft_vocab > t["vocab_size"]
    ):
        problems.append(
            f"vocabulary: draft_vocab_size {draft_vocab} exceeds the target's vocab_size {t['vocab_size']}"
        )
    if (
        None not in (target_tokenizer_vocab, drafter_tokenizer_vocab)
        and target_tokenizer_vocab != drafter_tokenizer_vocab
    ):
        problems.append(
            f"tokenizer: the drafter's tokenizer.json has {drafter_tokenizer_vocab} tokens, the target's {target_tokenizer_vocab}"
        )
    return problems


def resolve_checkpoint(name: str, cache_dir: Path | None, revision: str | None = None) -> Path:
    """A local directory as given, or a Hugging Face id's snapshot inside the cache (hub layout)."""
    path = Path(name)
    if path.is_dir():
        return path
    if cache_dir is None:
        raise FileNotFoundError(f"{name}: not a directory and no cache dir given")
    repo = cache_dir / "hub" / ("models--" + name.replace("/", "--"))
    ref = repo / "refs" / (revision or "main")
    snapshot = ref.read_text().strip() if ref.is_file() else (revision or "")
    found = repo / "snapshots" / snapshot
    if not snapshot or not found.is_dir():
        raise FileNotFoundError(f"{name}: no snapshot in {repo}")
    return found


def _tokenizer_vocab(directory: Path) -> int | None:
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    vocab = (doc.get("model") or {}).get("vocab")
    added = doc.get("added_tokens") or []
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab or [])))
    ids.update(t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int))
    return len(ids)


def check_directories(method: str, target_dir: Path, drafter_dir: Path) -> list[str]:
    """check_drafter over two checkpoint directories (a missing or unreadable config is a problem too)."""
    configs: dict[str, dict[str, Any]] = {}
    for role, directory in (("target", target_dir), ("drafter", drafter_dir)):
        try:
            configs[role] = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError) as err:
            return [f"config: cannot read the {role}'s config.json in {directory}: {err}"]
    return check_drafter(
        method,
        configs["target"],
        configs["drafter"],
        _tokenizer_vocab(target_dir),
        _tokenizer_vocab(drafter_dir),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check that a drafter fits its target before vLLM loads them."
    )
    parser.add_argument(
        "--method", required=True, help="vLLM speculative method (eagle3, eagle, draft_model, ...)"
    )
    parser.add_argument("--target", required=True, help="target checkpoint: directory or Hugging Face id")
    parser.add_argument("--drafter", required=True, help="drafter checkpoint: directory or Hugging Face id")
    parser.add_argument("--cache-dir", type=Path, default=None, help="Hugging Face cache (HF_HOME) for ids")
    parser.add_argument("--target-revision", default=None)
    parser.add_argument("--drafter-revision", default=None)
    parser.add_argument(
        "--skip-missing",
        action="store_true",
        help="exit 0 when a checkpoint is not in the cache yet (vLLM downloads it at start; nothing to check)",
    )
    args = parser.parse_args(argv)
    try:
        target = resolve_checkpoint(args.target, args.cache_dir, args.target_revision)
        drafter = resolve_checkpoint(args.drafter, args.cache_dir, args.drafter_revision)
    except FileNotFoundError as err:
        if args.skip_missing:
            print(f"not checked: {err} (not downloaded yet)")
            return 0
        print(f"{REASON}: {err}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"{REASON}: {err}", file=sys.stderr)
        return 1
    problems = check_directories(args.method, target, drafter)
    for problem in problems:
        print(f"{REASON}: {problem}", file=sys.stderr)
    if not problems:
        print(f"drafter {args.drafter} fits target {args.target} (method {args.method})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
