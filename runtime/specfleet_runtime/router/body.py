"""What the router reads of a JSON request body, without building the document (pure).

The router forwards the body bytes it received and needs only a few top-level fields (`model`,
`stream`, `max_tokens`, `max_completion_tokens`, `n`) and how many prompts a completion carries. A full
`json.loads` of a hostile body builds a tree many times its size (an empty object costs ~64 bytes of
Python heap for 3 bytes of JSON; one 4-byte character makes a whole string 4 bytes a character), so
`read_body_fields` parses only small bodies whole and scans larger ones without building them
(`body_scan`). Either way it checks that the body is one valid JSON object as an engine would parse it,
within `MAX_DEPTH` and `MAX_VALUES`, refuses what Python's json accepts but no engine should see
(`NaN`, `Infinity`, numbers beyond a double, lone surrogate escapes, UTF-16/32), and keeps only those
fields. A scan holds one Latin-1 copy of the body (a byte a character) and 1 MiB windows while checking
its bytes.

Asked for it (`prefix=True`), it also reads the request's leading text for prefix affinity and, for a
chat, each message's leading text (the conversation keys of `affinity.prefix_keys`): the same
`PREFIX_CHARS` of each whichever way the body was read, and never more than a bounded slice of it.

This module holds the entry point (`read_body_fields`, `BodyFields`), the limits and errors both ways
of reading share, the leading text of a parsed body and the whole parse; `body_scan` holds the scan.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from specfleet_runtime.router.classify import InvalidRequest
from specfleet_runtime.routing_config import PREFIX_CHARS, PREFIX_TOKENS

# Nesting deeper than this is refused (json.loads stops near 1,000 with a RecursionError; tool schemas
# in real requests stay far below).
MAX_DEPTH: Final = 64
# JSON values (strings, numbers, literals, containers; in a scanned body also string escapes) a body may
# hold: a 128k-token prompt as token ids is 128k values. Bounds the scan's work, which is per value.
MAX_VALUES: Final = 500_000
# The top-level fields kept; a longer string in one of them is cut (it only ever appears in a message).
FIELDS: Final = frozenset({"model", "stream", "max_tokens", "max_completion_tokens", "n"})
MAX_FIELD_BYTES: Final = 4096

# Bodies up to this size are parsed whole by json's C parser (fast; at most a few MiB of Python objects);
# larger ones are scanned without building them.
WHOLE_PARSE_MAX: Final = 64 * 1024

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
    # The request's leading text for prefix affinity (see `prefix_text`); "" where it has none or
    # it was not asked for.
    prefix: str = ""
    # A chat's messages for the conversation keys, each as `_turn` writes it (at most MAX_TURNS), and the
    # index of the first user message among them (len(turns) where none); empty where not asked for.
    turns: tuple[str, ...] = ()
    first_user: int = 0


def _invalid(message: str, pos: int | None = None) -> NoReturn:
    where = f" (byte {pos})" if pos is not None else ""
    raise InvalidRequest(f"request body is not valid JSON: {message}{where}")


def _not_finite(value: str) -> NoReturn:
    raise InvalidRequest(
        f"request body has a number that is not finite ({value[:40]}); engines cannot take it"
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        _not_finite(text)
    return value


def _lone_surrogate() -> NoReturn:
    raise InvalidRequest("request body has a lone surrogate escape (\\ud800-\\udfff) in a string")


def read_body_fields(body: bytes, whole_parse_max: int = WHOLE_PARSE_MAX, prefix: bool = False) -> BodyFields:
    """Check `body` is one JSON object an engine can take and read the fields the router needs.

    Raises `InvalidRequest` (400) with what is wrong: not UTF-8 (a leading byte order mark is
    ignored, as RFC 8259 allows), not valid JSON, not an object, nested deeper than `MAX_DEPTH`,
    more than `MAX_VALUES` values, a non-finite number or a lone surrogate escape. With `prefix`, the
    result also holds the leading text of its prompt or messages.
    """
    if len(body) >= 2 and body[:4].count(0):
        raise InvalidRequest("request body must be UTF-8 (RFC 8259); it looks like UTF-16 or UTF-32")
    if len(body) <= whole_parse_max:
        return _parse_whole(body, prefix)
    # Imported here: body_scan imports what both ways of reading share from this module.
    from specfleet_runtime.router.body_scan import _Scanner

    return _Scanner(body, prefix).read()


# ---- the leading text, for prefix affinity --------------------------------------------------------


def _turn(role: str, content: str) -> str:
    """A message's part of the leading text: its role and content (each already cut to PREFIX_CHARS)."""
    return role + _ROLE_END + content + _MESSAGE_END


def _chat_prefix(messages: list[tuple[str, str]]) -> BodyFields:
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


def _chat_messages(messages: list[Any]) -> list[tuple[str, str]]:
    """The role and content of a parsed chat's leading messages, each cut to PREFIX_CHARS: up to the first
    that is not an object, at most MAX_TURNS; a role or content that is not a string counts as empty."""
    pairs: list[tuple[str, str]] = []
    for message in messages[:MAX_TURNS]:
        if not isinstance(message, dict):
            break
        role = message.get("role")
        content = message.get("content")
        pairs.append(
            (
                role[:PREFIX_CHARS] if isinstance(role, str) else "",
                content[:PREFIX_CHARS] if isinstance(content, str) else "",
            )
        )
    return pairs


def prefix_text(doc: dict[str, Any]) -> str:
    """The leading text of a request for prefix affinity, from its parsed body; "" if it has none.

    Chat: each message's role and (string) content, in order, up to and including the first user
    message; a content that is not a string counts as empty. Completion: a string prompt, or the first
    of a list of them; a prompt of token ids gives its first `PREFIX_TOKENS` ids as decimal text
    (after a NUL, so ids never collide with text). A list of token-id lists has none. At most
    `PREFIX_CHARS` characters.
    """
    return _prefix_fields(doc).prefix


def _prefix_fields(doc: dict[str, Any]) -> BodyFields:
    """`prefix_text` and, for a chat, its turns (see `BodyFields`)."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        return _chat_prefix(_chat_messages(messages))
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0] if isinstance(prompt[0], str) else prompt
    if isinstance(prompt, str):
        return BodyFields({}, prefix=prompt[:PREFIX_CHARS])
    if isinstance(prompt, list):
        ids: list[str] = []
        for item in prompt[:PREFIX_TOKENS]:
            if not _is_id(item):
                break
            ids.append(str(item))
        return BodyFields({}, prefix=_ids_text(ids) if ids else "")
    return BodyFields({})


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ids_text(ids: list[str]) -> str:
    return "\x00" + ",".join(ids)


# ---- small bodies: json's C parser, with the checks it lacks --------------------------------------

_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_not_finite)


def _parse_whole(body: bytes, prefix: bool) -> BodyFields:
    try:
        text = body.decode()
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"request body is not valid UTF-8: {err.reason} (byte {err.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        doc = _DECODER.decode(text)
    except InvalidRequest:
        raise
    except (ValueError, RecursionError) as err:
        # ValueError covers JSONDecodeError and integers past Python's digit limit.
        raise InvalidRequest(f"request body is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("request body must be a JSON object")
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _check_depth(doc)
    if "\\u" in text:
        try:
            json.dumps(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            _lone_surrogate()
    fields: dict[str, Any] = {}
    for name, value in doc.items():
        if name in FIELDS:
            long = isinstance(value, str) and len(value) > MAX_FIELD_BYTES
            fields[name] = value[:MAX_FIELD_BYTES] + "…" if long else value
    prompts = _prompt_count(doc.get("prompt", ""))
    if not prefix:
        return BodyFields(fields, prompts)
    read = _prefix_fields(doc)
    return BodyFields(fields, prompts, read.prefix, read.turns, read.first_user)


def _check_depth(doc: dict[str, Any]) -> None:
    level: list[Any] = [doc]
    for depth in range(1, MAX_DEPTH + 2):
        if depth > MAX_DEPTH:
            _too_deep()
        inner: list[Any] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else value
            inner.extend(c for c in children if isinstance(c, list | dict))
        if not inner:
            return
        level = inner


def _too_deep() -> NoReturn:
    raise InvalidRequest(f"request body nests deeper than {MAX_DEPTH} levels")


def _prompt_count(prompt: Any) -> int:
    if not isinstance(prompt, list) or not prompt:
        return 0 if prompt == [] else 1
    if all(isinstance(item, int | float) and not isinstance(item, bool) for item in prompt):
        return 1  # one prompt as token ids
    return len(prompt)
