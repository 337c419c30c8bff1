"""What both ways of reading a request body share (pure): the result, its limits, its errors, the
chat's leading text.

`body.read_body_fields` parses a small body whole and hands a large one to `body_scan`; both give the
same `BodyFields` under the same limits and refuse a body with the same `InvalidRequest`, so those live
here, below both, and neither imports the other's internals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from specfleet_runtime.router.classify import InvalidRequest
from specfleet_runtime.routing_config import PREFIX_CHARS

# Nesting deeper than this is refused (json.loads stops near 1,000 with a RecursionError; tool schemas
# in real requests stay far below).
MAX_DEPTH: Final = 64
# JSON values (strings, numbers, literals, containers; in a scanned body also string escapes) a body may
# hold: a 128k-token prompt as token ids is 128k values. Bounds the scan's work, which is per value.
MAX_VALUES: Final = 500_000
# The top-level fields kept; a longer string in one of them is cut (it only ever appears in a message).
FIELDS: Final = frozenset({"model", "stream", "max_tokens", "max_completion_tokens", "n"})
MAX_FIELD_BYTES: Final = 4096

# Between a message's role and content, and after each message, in the prefix text.
_ROLE_END: Final = "\x1f"
_MESSAGE_END: Final = "\x1e"
# Chat messages whose leading text is read for the conversation keys: a longer conversation keys on its
# first MAX_TURNS messages (which still tell it from others), so a request decodes at most MAX_TURNS
# slices of 2 * PREFIX_CHARS characters.
MAX_TURNS: Final = 64


@dataclass(frozen=True, slots=True)
class BodyFields:
    """The top-level fields the router reads, as `json.loads` would give them, and the prompt count.

    `fields` holds only names in `FIELDS` that the body has; in a scanned body a container there is an
    empty `list` or `dict` (its type is all the checks need); a string over `MAX_FIELD_BYTES` is cut
    and ends in "…". `prompts` counts the prompts of a completion: a list of strings or of token-id
    lists is several, a string or one list of token ids is one; 1 where the body has no `prompt`.
    """

    fields: dict[str, Any]
    prompts: int = 1
    # The request's leading text for prefix affinity (see `body.prefix_text`); "" where it has none or
    # it was not asked for.
    prefix: str = ""
    # A chat's messages for the conversation keys, each as `_turn` writes it (at most MAX_TURNS), and the
    # index of the first user message among them (len(turns) where none); empty where not asked for.
    turns: tuple[str, ...] = ()
    first_user: int = 0

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(
        self,
        fields: dict[str, Any],
        prompts: int = 1,
        prefix: str = "",
        turns: tuple[str, ...] = (),
        first_user: int = 0,
    ) -> None:
        object.__setattr__(self, "fields", fields)
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "turns", turns)
        object.__setattr__(self, "first_user", first_user)


# ---- the errors ---------------------------------------------------------------------------------------


def invalid_json(message: str, pos: int | None = None) -> NoReturn:
    where = f" (byte {pos})" if pos is not None else ""
    raise InvalidRequest(f"request body is not valid JSON: {message}{where}")


def not_finite(value: str) -> NoReturn:
    raise InvalidRequest(
        f"request body has a number that is not finite ({value[:40]}); engines cannot take it"
    )


def finite_float(text: str) -> float:
    """A JSON number as json gives it; `InvalidRequest` beyond a double."""
    value = float(text)
    if not math.isfinite(value):
        not_finite(text)
    return value


def lone_surrogate() -> NoReturn:
    raise InvalidRequest("request body has a lone surrogate escape (\\ud800-\\udfff) in a string")


def too_deep() -> NoReturn:
    raise InvalidRequest(f"request body nests deeper than {MAX_DEPTH} levels")


# ---- the leading text, for prefix affinity --------------------------------------------------------


def _turn(role: str, content: str) -> str:
    """A message's part of the leading text: its role and content (each already cut to PREFIX_CHARS)."""
    return role + _ROLE_END + content + _MESSAGE_END


def chat_prefix(messages: list[tuple[str, str]]) -> BodyFields:
    """The leading text and turns of a chat's messages (role and content pairs, each cut to PREFIX_CHARS,
    at most MAX_TURNS): the text is the turns up to and including the first user message, at most
    PREFIX_CHARS characters."""
    turns = tuple(_turn(role, content) for role, content in messages)
    first_user = len(turns)
    for i, (role, _) in enumerate(messages):
        if role == "user":
            first_user = i
            break
    parts: list[str] = []
    size = 0
    for i, part in enumerate(turns):
        parts.append(part)
        size += len(part)
        if i == first_user or size >= PREFIX_CHARS:
            break
    return BodyFields({}, prefix="".join(parts)[:PREFIX_CHARS], turns=turns, first_user=first_user)


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def ids_text(ids: list[str]) -> str:
    """The leading text of a prompt of token ids (decimal text): after a NUL, so ids never collide with
    text."""
    return "\x00" + ",".join(ids)
