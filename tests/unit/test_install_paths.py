"""Every external program is found through the project's installers, never at an assumed path.

A fresh machine has none of them: a test that starts `/usr/bin/prometheus` directly passes only where
someone installed it by hand (that is how the e2e tier once broke on a clean machine).
"""

from __future__ import annotations

import ast
import re
import stat
from pathlib import Path

import pytest

from specfleet_testbed import ToolError, ensure_prometheus

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("operator", "runtime", "testbed", "tests", "benchmarks")
ABSOLUTE_PROGRAM = re.compile(r"^/(usr/(local/)?)?s?bin/\w")


def _string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_python_code_assumes_a_system_binary_path() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, value in _string_constants(path)
        if ABSOLUTE_PROGRAM.match(value)
    ]
    assert not offenders, "resolve external programs through specfleet_testbed.tools:\n" + "\n".join(
        offenders
    )


def test_prometheus_override_is_checked_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_prometheus.cache_clear()
    monkeypatch.setenv("SPECFLEET_PROMETHEUS_DIR", str(tmp_path))
    (tmp_path / "prometheus").write_text("#!/bin/sh\n")
    (tmp_path / "prometheus").chmod(stat.S_IRWXU)
    try:
        with pytest.raises(ToolError, match="promtool"):
            ensure_prometheus()
        (tmp_path / "promtool").write_text("#!/bin/sh\n")
        (tmp_path / "promtool").chmod(stat.S_IRWXU)
        ensure_prometheus.cache_clear()
        tools = ensure_prometheus()
        assert tools.prometheus == tmp_path / "prometheus"
        assert tools.promtool == tmp_path / "promtool"
    finally:
        ensure_prometheus.cache_clear()


def test_every_installer_the_code_calls_exists() -> None:
    referenced = {
        match
        for path in ROOT.rglob("*.py")
        if not {".git", ".venv"} & set(path.parts)
        for match in re.findall(r"setup-[a-z]+\.sh", path.read_text(errors="replace"))
    }
    assert referenced, "expected the tests to name their installers"
    missing = sorted(name for name in referenced if not (ROOT / "scripts" / name).is_file())
    assert not missing
