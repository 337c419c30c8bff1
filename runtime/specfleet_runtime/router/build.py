"""Which build of the router's request path this process runs: the Python source, or the C extensions
mypyc compiled from it (`scripts/compile-router.sh`; the image ships those). Not compiled itself.

It looks at `reply`, a compiled module that imports no other router module, so that `metrics` (which
reports the build) stays below the request path: `server -> metrics -> build -> reply`, no cycle.
"""

from __future__ import annotations

from specfleet_runtime.router import reply


def router_build() -> str:
    """'compiled' when the request path's modules were imported from mypyc's extensions, else 'source'."""
    path = getattr(reply, "__file__", None) or ""
    return "source" if path.endswith(".py") else "compiled"
