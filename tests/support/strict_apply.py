"""A rendered manifest checked by the real apiserver against its kind's schema, writing nothing."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml


def strict_dry_run(
    cluster: Any, namespace: str, manifest: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """Server-side apply with strict field validation and `--dry-run=server` (owner references dropped:
    the owner does not exist in the test namespace); the caller reads returncode and stderr."""
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    manifest["metadata"].pop("ownerReferences", None)
    result: subprocess.CompletedProcess[str] = cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=specfleet-tests",
        "--dry-run=server",
        "--validate=strict",
        "-o",
        "json",
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )
    return result


def stored_as_rendered(stored: object, rendered: object) -> bool:
    """Whether the apiserver kept every rendered field as written (nothing pruned); it may add defaults."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(
            k in stored and stored_as_rendered(stored[k], v) for k, v in rendered.items()
        )
    if isinstance(rendered, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(rendered)
            and all(map(stored_as_rendered, stored, rendered))
        )
    return stored == rendered
