"""Run the Argo CD health script (deploy/argocd/health.lua) as Argo CD does, with Lua 5.1 (lupa)."""

from __future__ import annotations

from typing import Any

from lupa.lua51 import LuaRuntime

from support.manifests import ROOT

HEALTH_SCRIPT = ROOT / "deploy" / "argocd" / "health.lua"


def argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    """The object as global `obj`, the script's table {status, message} back."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_SCRIPT.read_text())
    return str(result["status"]), str(result["message"] or "")
