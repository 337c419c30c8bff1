"""Generate the command outputs the README and the guide show, from the current code.

A figure is the part of a Markdown file between a marker line naming the command and `<!-- /figure -->`:

    <!-- figure: $ specfleet plan -f examples/02-two-pools-routing-policy.yaml ... | keep policy.thresholds -->
    ```
    (generated)
    ```
    <!-- /figure -->

The command runs in this process from the repository's root (`plan` and `simulate` are seeded, so one
code, one output), and its standard output becomes a fenced block. A leading `$ ` shows the command in
the block, wrapped at its options. After a `|`, `keep KEY.PATH ...` shortens a YAML output to those keys
(each with everything under it, in the output's order), prints mappings and lists of plain values on one
line, and ends such a mapping with `...` where keys were left out. A path that is not in the output is
an error, so a renamed key fails the check instead of silently shrinking the figure.

`make docs-figures` rewrites every figure in README.md and docs/; a unit test fails when one is stale.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# This generator runs from a checkout: the commands' example paths are relative to its root.
ROOT = Path(__file__).resolve().parents[3]

FIGURE = re.compile(
    r"^<!-- figure: (?P<spec>.+?) -->\n(?P<body>.*?)^<!-- /figure -->$", re.MULTILINE | re.DOTALL
)
_WIDTH = 100  # the guide's code blocks show about this many columns without scrolling
_ELIDED = "__elided__"  # a stand-in key for the `...` of a shortened one-line mapping


class FigureError(Exception):
    """A figure marker that cannot be generated: a bad rule, a failing command, a missing key."""


@dataclass(frozen=True)
class Figure:
    """One marker's declaration: the command, whether the block shows it, the keys it keeps."""

    command: str
    show_command: bool = False
    keep: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> Figure:
        command, *rules = (part.strip() for part in spec.split("|"))
        show = command.startswith("$ ")
        command = command.removeprefix("$ ")
        if shlex.split(command)[:1] != ["specfleet"]:
            raise FigureError(f"{spec!r}: a figure runs a `specfleet` command")
        keep: tuple[str, ...] = ()
        for rule in rules:
            name, *args = rule.split()
            if name != "keep" or not args:
                raise FigureError(f"{spec!r}: unknown rule {rule!r} (the one rule is `keep KEY.PATH ...`)")
            keep += tuple(args)
        return cls(command, show, keep)


@functools.cache
def command_output(command: str) -> str:
    """What `command` prints on stdout, run in this process from the repository root (cached: the
    commands are deterministic, and `plan`/`simulate` over the hour-long trace take seconds)."""
    from specfleet.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(shlex.split(command)[1:])
    if code != 0:
        raise FigureError(f"`{command}` exited with {code}: {err.getvalue().strip()}")
    return out.getvalue()


def _kept(node: Any, paths: list[list[str]], where: str) -> Any:
    """The parts of `node` the paths name; a mapping of plain values that lost keys gets the marker."""
    if any(not path for path in paths):
        return node
    if not isinstance(node, dict):
        raise FigureError(f"{where or 'the output'} is not a mapping: cannot keep {paths}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        below = [path[1:] for path in paths if path[0] == key]
        if below:
            out[key] = _kept(value, below, f"{where}.{key}".lstrip("."))
    missing = sorted({path[0] for path in paths} - set(node))
    if missing:
        raise FigureError(f"{where or 'the output'} has no key {', '.join(missing)}")
    if len(out) < len(node) and all(not isinstance(v, dict | list) for v in out.values()):
        out[_ELIDED] = None
    return out


class _Flow(list[Any]):
    """A mapping's items or a list to print on one line (`{a: 1, b: 2}`, `[1, 2]`)."""

    def __init__(self, items: list[Any], mapping: bool) -> None:
        super().__init__(items)
        self.mapping = mapping


class _FigureDumper(yaml.SafeDumper):
    pass


def _represent_flow(dumper: yaml.SafeDumper, data: _Flow) -> yaml.Node:
    if data.mapping:
        return dumper.represent_mapping("tag:yaml.org,2002:map", list(data), flow_style=True)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", list(data), flow_style=True)


_FigureDumper.add_representer(_Flow, _represent_flow)


def _one_line(node: Any) -> str:
    text = yaml.dump(node, Dumper=_FigureDumper, default_flow_style=True, width=1 << 20)
    return text.strip().replace(f"{_ELIDED}: null", "...")


def _is_leaf(node: Any) -> bool:
    return (
        isinstance(node, dict | list)
        and bool(node)
        and not any(isinstance(v, dict | list) for v in (node.values() if isinstance(node, dict) else node))
    )


def _compact(node: Any, indent: int, start: int) -> Any:
    """`node` with each mapping or list of plain values that fits in the width on one line. `start`: the
    column it begins at on one line; `indent`: the column of its keys or dashes as a block."""
    if _is_leaf(node) and start + len(_one_line(node)) <= _WIDTH:
        return _Flow(list(node.items()) if isinstance(node, dict) else node, mapping=isinstance(node, dict))
    if isinstance(node, dict):
        # PyYAML indents a mapping under its key by 2, and a list's dashes not at all
        return {
            key: _compact(value, indent + (2 if isinstance(value, dict) else 0), indent + len(str(key)) + 2)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_compact(value, indent + 2, indent + 2) for value in node]
    return node


def shortened(output: str, keep: Sequence[str]) -> str:
    """A YAML output cut down to the `keep` paths, plain mappings and lists on one line where they fit."""
    doc = _compact(_kept(yaml.safe_load(output), [path.split(".") for path in keep], ""), 0, 0)
    text = yaml.dump(doc, Dumper=_FigureDumper, sort_keys=False, default_flow_style=False, width=1 << 20)
    return text.replace(f"{_ELIDED}: null", "...")


def _command_lines(command: str) -> str:
    """`$ command`, continued with ` \\` before an option that would pass the width."""
    words = [shlex.quote(word) for word in shlex.split(command)]
    groups = [" ".join(words[:2])]  # `specfleet COMMAND`, then each option with its values
    for word in words[2:]:
        if word.startswith("-") or len(groups) == 1:
            groups.append(word)
        else:
            groups[-1] += " " + word
    lines = ["$ " + groups[0]]
    for group in groups[1:]:
        if len(lines[-1]) + 1 + len(group) + 2 > _WIDTH:
            lines[-1] += " \\"
            lines.append("    " + group)
        else:
            lines[-1] += " " + group
    return "\n".join(lines) + "\n"


def figure_body(figure: Figure) -> str:
    """The fenced block a figure's marker stands for."""
    output = command_output(figure.command)
    if figure.keep:
        output = shortened(output, figure.keep)
    shown = (_command_lines(figure.command) if figure.show_command else "") + output
    return "```\n" + shown.rstrip("\n") + "\n```\n"


def regenerate(text: str) -> str:
    """`text` with each figure's block generated afresh."""

    def block(match: re.Match[str]) -> str:
        spec = match["spec"]
        body = figure_body(Figure.parse(spec))
        return f"<!-- figure: {spec} -->\n{body}<!-- /figure -->"

    return FIGURE.sub(block, text)


def pages() -> list[Path]:
    """README.md and the guide's pages that hold at least one figure."""
    candidates = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [path for path in candidates if FIGURE.search(path.read_text(encoding="utf-8"))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specfleet.cli.docs_figures", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; fail when a figure is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in pages():
        text = path.read_text(encoding="utf-8")
        fresh = regenerate(text)
        if fresh != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(fresh, encoding="utf-8")
    for name in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {name}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
