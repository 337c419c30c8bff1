"""What every `specfleet` command shares: the help layout (descriptions as written, each flag's default
shown) and reading YAML input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends `(default: X)` where a flag has a default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if unset or not action.option_strings or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser using HelpFormatter; its subcommands' parsers inherit it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def describe_subcommands(subparsers: Any) -> None:
    """Each subcommand's one-line help also heads its own `--help`."""
    for choice in subparsers._choices_actions:
        parser = subparsers.choices[choice.dest]
        parser.description = parser.description or choice.help


def shown(path: str) -> str:
    """A file argument as an error message names it (`-` is standard input)."""
    return "standard input" if path == "-" else path


def load_documents(path: str) -> list[Any]:
    """The YAML documents of a file or of standard input, empty ones dropped."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
