"""Locate (and if needed build) the pinned test bed binaries by running ``testbed/build.sh``.

The build script is the single source of truth: it knows the pinned versions, the cache layout and
how to check that a cached binary is the right one. A warm call takes about a second.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = [
    "BUILD_SCRIPT",
    "REQUIRED_BINARIES",
    "BinariesError",
    "ensure_binaries",
    "kwok_stages_file",
]

# testbed/specfleet_testbed/binaries.py -> testbed/
TESTBED_DIR = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = TESTBED_DIR / "build.sh"
REQUIRED_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)


class BinariesError(RuntimeError):
    """The binaries could not be built or found."""


def kwok_stages_file(bin_dir: Path) -> Path:
    """The kwok stage configuration build.sh assembles next to the bin dir."""
    return bin_dir.parent / "share" / "kwok-stages.yaml"


def _check(bin_dir: Path) -> Path:
    missing = [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if not kwok_stages_file(bin_dir).is_file():
        missing.append(str(kwok_stages_file(bin_dir)))
    if missing:
        raise BinariesError(f"{bin_dir} lacks: {', '.join(missing)}")
    return bin_dir


def ensure_binaries() -> Path:
    """Return the bin dir holding every test bed binary, building them first if needed.

    ``SPECFLEET_TESTBED_BIN`` may point at an existing bin dir to skip the build script entirely
    (it is still checked). Build progress goes to this process's stderr; a cold build takes 20-35
    minutes on 2 cores.
    """
    override = os.environ.get("SPECFLEET_TESTBED_BIN")
    if override:
        return _check(Path(override).resolve())
    if not BUILD_SCRIPT.is_file():
        raise BinariesError(f"build script not found: {BUILD_SCRIPT}")
    # stderr (file descriptor 2) is inherited so a long cold build shows its progress.
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}; see its log above")
    return _check(Path(lines[-1]))
