"""What every `specfleet` command shares: the help layout (descriptions as written, each flag's default
shown), reading YAML input, writing output and finding cluster credentials, each failure as one `error:`
line rather than a traceback."""

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


class InputError(Exception):
    """An input file that cannot be read as YAML; the message names the file and why."""


def load_documents(path: str) -> list[Any]:
    """The YAML documents of a UTF-8 file or of standard input, empty ones dropped."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {shown(path)}: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"cannot read {shown(path)}: it is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
            f"{err.start}); Kubernetes manifests are UTF-8, so convert it (e.g. iconv -t UTF-8)"
        ) from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as err:
        raise InputError(f"cannot read {shown(path)}: it is not valid YAML: {err}") from None


def write_output(path: str | None, text: str) -> int:
    """Write to `path` (stdout when None); the exit code, with one `error:` line when it cannot be written."""
    if not path:
        sys.stdout.write(text)
        return 0
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        print(f"error: cannot write {path}: {err.strerror or err}", file=sys.stderr)
        return 1
    return 0


# Where the Kubernetes client looks when neither --kubeconfig nor KUBECONFIG names a file.
DEFAULT_KUBECONFIG = "~/.kube/config"


class CredentialsError(Exception):
    """Neither in-cluster credentials nor a usable kubeconfig; the message says what was tried."""


def credentials_tried(kubeconfig: str | None) -> str:
    """What `cluster_client` tries, as an error message says it."""
    if kubeconfig:
        return f"kubeconfig {kubeconfig}"
    return f"in-cluster, then kubeconfig {Path(DEFAULT_KUBECONFIG).expanduser()}"


def cluster_client(kubeconfig: str | None) -> Any:
    """An API client from in-cluster credentials or the kubeconfig (`--kubeconfig`, else KUBECONFIG)."""
    from kubernetes.config import ConfigException

    from specfleet.controller.kube import load_kube_config

    try:
        return load_kube_config(kubeconfig)
    # A malformed kubeconfig surfaces as whatever its parser trips on, not only as ConfigException.
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as err:
        hint = "" if kubeconfig else "; pass --kubeconfig or set KUBECONFIG"
        raise CredentialsError(
            f"no usable cluster credentials (tried {credentials_tried(kubeconfig)}): "
            f"{str(err).rstrip('.')}{hint}"
        ) from None
