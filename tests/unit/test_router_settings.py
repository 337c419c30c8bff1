"""The router's command line is built from `RouterSettings`: every flag field, with its type, default and help."""

from __future__ import annotations

import dataclasses

import pytest

from specfleet_runtime.router.__main__ import build_router, parse_args, settings_flags
from specfleet_runtime.router.app import RouterSettings


def test_every_settings_flag_reaches_the_settings(tmp_path) -> None:
    flags = settings_flags()
    assert {f.name for f in flags} >= {"connect_timeout", "read_timeout", "max_in_flight", "warm_timeout"}
    changed = {f.name: f.default + 1 for f in flags}
    argv = ["--config-file", str(tmp_path / "routing.json")]
    for name, value in changed.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    settings = build_router(parse_args(argv)).settings
    assert {name: getattr(settings, name) for name in changed} == changed
    assert [type(getattr(settings, name)) for name in changed] == [type(f.default) for f in flags]


def test_defaults_are_the_settings_defaults(tmp_path) -> None:
    settings = build_router(parse_args(["--config-file", str(tmp_path / "routing.json")])).settings
    assert dataclasses.replace(settings, namespace="default") == RouterSettings()


def test_every_settings_flag_has_help_showing_its_default(capsys) -> None:
    text = " ".join(_help(capsys).split())
    for f in settings_flags():
        assert f"--{f.name.replace('_', '-')} " in text
        assert f"{' '.join(f.metadata['help'].split())} (default: {f.default})" in text


def _help(capsys) -> str:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    return capsys.readouterr().out
