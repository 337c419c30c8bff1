"""The real promtool (Debian's prometheus package, installed by `ensure_prometheus()`) for tests of
rules and queries: `promtool(...)` runs it, `assert_rule_tests_pass` runs a `promtool test rules` file."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from specfleet_testbed import ensure_prometheus


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ensure_prometheus().promtool), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_rule_tests_pass(directory: Path, doc: dict[str, Any]) -> None:
    """Write `doc` (a promtool rule-test file) into `directory` and assert `promtool test rules` passes."""
    path = directory / "tests.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
