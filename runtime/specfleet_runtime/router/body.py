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

This module holds the entry point (`read_body_fields`), the leading text of a parsed body and the whole
parse; `body_scan` holds the scan, and `body_fields` what both share (`BodyFields`, the limits, the
errors, a chat's leading text).
"""

from __future__ import annotations

import json
from json.scanner import make_scanner
from typing import Any, Final

from specfleet_runtime.router.body_fields import (
    FIELDS,
    MAX_DEPTH,
    MAX_FIELD_BYTES,
    MAX_TURNS,
    MAX_VALUES,
    BodyFields,
    chat_prefix,
    finite_float,
    ids_text,
    is_token_id,
    lone_surrogate,
    not_finite,
    too_deep,
)
from specfleet_runtime.router.body_scan import scan_body
from specfleet_runtime.router.classify import InvalidRequest
from specfleet_runtime.routing_config import PREFIX_CHARS, PREFIX_TOKENS

# The public surface of reading a body; `body_fields` and `body_scan` are its parts.
__all__ = [
    "FIELDS",
    "MAX_DEPTH",
    "MAX_FIELD_BYTES",
    "MAX_TURNS",
    "MAX_VALUES",
    "WHOLE_PARSE_MAX",
    "BodyFields",
    "prefix_text",
    "read_body_fields",
]

# Bodies up to this size are parsed whole by json's C parser (fast; at most a few MiB of Python objects);
# larger ones are scanned without building them.
WHOLE_PARSE_MAX: Final = 64 * 1024


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
    return scan_body(body, prefix)


# ---- the leading text, for prefix affinity --------------------------------------------------------


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


def _prefix_fields(doc: dict[str, Any], fields: dict[str, Any] | None = None, prompts: int = 1) -> BodyFields:
    """`fields` and `prompts` with `prefix_text` and, for a chat, its turns (see `BodyFields`): a
    completion's in one object, as the request path builds it on every request."""
    if fields is None:
        fields = {}
    messages = doc.get("messages")
    if isinstance(messages, list):
        read = chat_prefix(_chat_messages(messages))
        return BodyFields(fields, prompts, read.prefix, read.turns, read.first_user)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0] if isinstance(prompt[0], str) else prompt
    if isinstance(prompt, str):
        return BodyFields(fields, prompts, prompt[:PREFIX_CHARS])
    if isinstance(prompt, list):
        ids: list[str] = []
        for item in prompt[:PREFIX_TOKENS]:
            if not is_token_id(item):
                break
            ids.append(str(item))
        return BodyFields(fields, prompts, ids_text(ids) if ids else "")
    return BodyFields(fields, prompts)


# ---- small bodies: json's C parser, with the checks it lacks --------------------------------------

_DECODER = json.JSONDecoder(parse_float=finite_float, parse_constant=not_finite)
# The decoder's scanner (json's C one), called directly for the usual body: `JSONDecoder.decode` wraps
# it in a Python frame and two regular expression matches for the whitespace around the document.
_SCAN = make_scanner(_DECODER)  # type: ignore[arg-type]  # a decoder is the context a scanner reads
# What JSON counts as whitespace (RFC 8259).
_JSON_SPACE: Final = " \t\n\r"


def _decode(text: str) -> Any:
    """`_DECODER.decode(text)`: the same document, or the same error. A text that opens an object is
    scanned directly; anything else, or anything the scan does not take whole, goes through `decode`."""
    if text[:1] == "{":
        try:
            doc, end = _SCAN(text, 0)
        except InvalidRequest:
            raise
        except (ValueError, StopIteration, RecursionError):
            pass  # `decode` raises it again, with its message
        else:
            if end == len(text) or not text[end:].strip(_JSON_SPACE):
                return doc
    return _DECODER.decode(text)


def _parse_whole(body: bytes, prefix: bool) -> BodyFields:
    try:
        text = body.decode()
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"request body is not valid UTF-8: {err.reason} (byte {err.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        doc = _decode(text)
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
            lone_surrogate()
    fields: dict[str, Any] = {}
    for name, value in doc.items():
        if name in FIELDS:
            long = isinstance(value, str) and len(value) > MAX_FIELD_BYTES
            fields[name] = value[:MAX_FIELD_BYTES] + "…" if long else value
    prompts = _prompt_count(doc.get("prompt", ""))
    if not prefix:
        return BodyFields(fields, prompts)
    return _prefix_fields(doc, fields, prompts)


def _check_depth(doc: dict[str, Any]) -> None:
    level: list[Any] = [doc]
    for depth in range(1, MAX_DEPTH + 2):
        if depth > MAX_DEPTH:
            too_deep()
        inner: list[Any] = []
        for value in level:
            children = value.values() if isinstance(value, dict) else value
            inner.extend(c for c in children if isinstance(c, list | dict))
        if not inner:
            return
        level = inner


def _prompt_count(prompt: Any) -> int:
    if not isinstance(prompt, list) or not prompt:
        return 0 if prompt == [] else 1
    if all(isinstance(item, int | float) and not isinstance(item, bool) for item in prompt):
        return 1  # one prompt as token ids
    return len(prompt)
