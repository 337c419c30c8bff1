"""The paths the router answers: an allow-list checked on the normalized path.

Only the OpenAI routes the product serves (`PROXIED`) and vLLM's tokenizer routes (`TOKENIZER`) reach
an engine, always under their canonical spelling, so no spelling of a path (`..`, `.`, `%2e`, `//`,
encoded slashes) reaches anything else an engine serves (`/metrics`, admin endpoints) or skips the
router's body checks. Everything else is the router's own 404.
"""

from __future__ import annotations

from enum import Enum
from urllib.parse import unquote


class Route(Enum):
    COMPLETIONS = "completions"
    CHAT_COMPLETIONS = "chat_completions"
    MODELS = "models"
    MODEL = "model"
    HEALTHZ = "healthz"
    READYZ = "readyz"
    METRICS = "metrics"
    TOKENIZE = "tokenize"
    DETOKENIZE = "detokenize"

    # Members are singletons: hashed by identity in C instead of Enum's Python-level hash of the name
    # (a route is looked up in PROXIED and METHODS on every request).
    __hash__ = object.__hash__


# Canonical path -> route; inference routes are proxied to an engine, the others answered here.
CHAT_PATH = "/v1/chat/completions"
ROUTES: dict[str, Route] = {
    "/v1/completions": Route.COMPLETIONS,
    CHAT_PATH: Route.CHAT_COMPLETIONS,
    "/v1/models": Route.MODELS,
    "/healthz": Route.HEALTHZ,
    "/readyz": Route.READYZ,
    "/metrics": Route.METRICS,
    "/tokenize": Route.TOKENIZE,
    "/detokenize": Route.DETOKENIZE,
}
PROXIED = frozenset({Route.COMPLETIONS, Route.CHAT_COMPLETIONS})
# vLLM's tokenizer routes (outside /v1, as vLLM serves them): forwarded too, but not inference.
TOKENIZER = frozenset({Route.TOKENIZE, Route.DETOKENIZE})
MODEL_PREFIX = "/v1/models/"
# Methods allowed per route (anything else is a 405 with this Allow header).
METHODS: dict[Route, tuple[str, ...]] = {
    Route.COMPLETIONS: ("POST",),
    Route.CHAT_COMPLETIONS: ("POST",),
    Route.MODELS: ("GET", "HEAD"),
    Route.MODEL: ("GET", "HEAD"),
    Route.HEALTHZ: ("GET", "HEAD"),
    Route.READYZ: ("GET", "HEAD"),
    Route.METRICS: ("GET", "HEAD"),
    Route.TOKENIZE: ("POST",),
    Route.DETOKENIZE: ("POST",),
}


def normalize_path(raw: str) -> str:
    """The path of a raw request target, decoded once, without empty, `.` and `..` segments.

    The query and fragment are cut first; `%2e`, `%2f` and friends are decoded before the segments
    are resolved, so an encoded dot or slash counts as one. `..` never climbs above the root.
    """
    path = raw.partition("?")[0].partition("#")[0]
    if "%" in path:
        path = unquote(path, errors="replace")
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments)


def match(raw: str) -> tuple[Route | None, str]:
    """The route of a raw request target and its normalized path (route None: not served)."""
    path = raw.partition("?")[0]
    route = ROUTES.get(path)
    if route is not None:
        return route, path  # the canonical spelling itself: the common case, no work
    path = normalize_path(raw)
    route = ROUTES.get(path)
    if route is None and path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
        route = Route.MODEL
    return route, path
