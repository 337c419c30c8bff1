"""Which build of the router's request path this process runs: the Python source, or the C extensions
mypyc compiled from it (`scripts/compile-router.sh`; the image ships those). Not compiled itself."""

from __future__ import annotations

import importlib


def router_build() -> str:
    """'compiled' when the request path's modules were imported from mypyc's extensions, else 'source'."""
    server = importlib.import_module("specfleet_runtime.router.server")
    path = getattr(server, "__file__", None) or ""
    return "source" if path.endswith(".py") else "compiled"
