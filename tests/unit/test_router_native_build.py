"""The build of the router's request path that this test run imports: plain Python, or mypyc-compiled.

`make test-router-native` runs the router's unit tests again with `scripts/compile-router.sh`'s folder
first on PYTHONPATH and SPECFLEET_ROUTER_NATIVE=1 (the build the image ships); this test makes sure each
run really imported the build it claims to test, so a compiled module can neither go untested nor
silently shadow an edited source file in the plain run.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compiled_modules() -> list[str]:
    """The module list of scripts/compile-router.sh (one list, read from the script)."""
    script = (ROOT / "scripts" / "compile-router.sh").read_text()
    found = re.search(r"^modules=\(([^)]*)\)", script, re.MULTILINE)
    assert found, "scripts/compile-router.sh has no modules=(...) list"
    return found.group(1).split()


def test_the_compiled_list_names_real_modules() -> None:
    modules = compiled_modules()
    assert "server" in modules
    assert "app" in modules
    for name in modules:
        assert (ROOT / "runtime" / "specfleet_runtime" / "router" / f"{name}.py").is_file(), name


def test_router_modules_are_the_requested_build() -> None:
    native = os.environ.get("SPECFLEET_ROUTER_NATIVE") == "1"
    for name in compiled_modules():
        module = importlib.import_module(f"specfleet_runtime.router.{name}")
        path = str(module.__file__)
        if native:
            assert path.endswith(".so"), f"{name} is not the compiled build: {path}"
        else:
            assert path.endswith(".py"), f"{name} is not the source: {path}"
            assert path.startswith(str(ROOT)), f"{name} does not come from this checkout: {path}"
