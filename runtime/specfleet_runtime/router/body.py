"""What the router reads of a JSON request body, without building the document (pure).

The router forwards the body bytes it received and needs only a few top-level fields (`model`,
`stream`, `max_tokens`, `max_completion_tokens`, `n`) and how many prompts a completion carries. A full
`json.loads` of a hostile body builds a tree many times its size (an empty object costs ~64 bytes of
Python heap for 3 bytes of JSON; one 4-byte character makes a whole string 4 bytes a character), so
`read_body_fields` parses only small bodies whole and scans larger ones without building them. Either
way it checks that the body is one valid JSON object as an engine would parse it, within `MAX_DEPTH`
and `MAX_VALUES`, refuses what Python's json accepts but no engine should see (`NaN`, `Infinity`,
numbers beyond a double, lone surrogate escapes, UTF-16/32), and keeps only those fields. A scan holds
one Latin-1 copy of the body (a byte a character) and 1 MiB windows while checking its bytes.

Asked for it (`prefix=True`), it also reads the request's leading text for prefix affinity and, for a
chat, each message's leading text (the conversation keys of `affinity.prefix_keys`): the same
`PREFIX_CHARS` of each whichever way the body was read, and never more than a bounded slice of it.
"""

from __future__ import annotations

import codecs
import json
import math
import re
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
_UTF8_WINDOW: Final = 1 << 20

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ESCAPE = re.compile(r"\\(?:[\"\\/bfnrt]|u([0-9a-fA-F]{4}))")
_WHITESPACE = " \t\n\r"
_WS_RUN = re.compile(r"[ \t\n\r]+")

# A JSON string holds at least one character per this many bytes (a surrogate pair escape: 12), so a
# slice this many times PREFIX_CHARS long holds the first PREFIX_CHARS characters of any string.
_BYTES_PER_CHAR: Final = 12
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


# ---- large bodies: scanned, never built -----------------------------------------------------------


# Bytes that JSON allows nowhere unescaped (tab, LF and CR only as whitespace between tokens) -> 0.
_CONTROL = bytes(0 if byte < 0x20 and byte not in (0x09, 0x0A, 0x0D) else 1 for byte in range(256))


def _check_bytes(body: bytes) -> None:
    """UTF-8, and no control character but whitespace, checked a window at a time (bounded copies)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    size = len(body)
    ascii_only = body.isascii()
    for start in range(0, size, _UTF8_WINDOW):
        window = bytes(view[start : start + _UTF8_WINDOW])
        control = window.translate(_CONTROL).find(0)
        if control >= 0:
            _invalid("control character", start + control)
        if not ascii_only:
            try:
                decoder.decode(window, start + _UTF8_WINDOW >= size)
            except UnicodeDecodeError as err:
                raise InvalidRequest(
                    f"request body is not valid UTF-8: {err.reason} (byte {start + err.start})"
                ) from None


class _Scanner:
    """One large body, walked value by value; methods take a position and return the one after.

    The body is read as Latin-1 text: one character a byte, no copy wider than the body, and every
    JSON delimiter is ASCII, so positions are byte offsets (UTF-8 is checked separately). A string
    is found with `str.find`; only its escapes are looked at one by one (each counts as a value).
    """

    def __init__(self, body: bytes, want_prefix: bool = False) -> None:
        self.body = body
        self.want_prefix = want_prefix
        self.text = body.decode("latin-1")
        self.size = len(body)
        self.values = 0

    def read(self) -> BodyFields:
        _check_bytes(self.body)
        pos = self.ws(3 if self.body.startswith(codecs.BOM_UTF8) else 0)
        if self.at(pos, "a value") != "{":
            end = self.ws(self.skip(pos, 0))
            if end != self.size:
                _invalid("extra data", end)
            raise InvalidRequest("request body must be a JSON object")
        self.count()
        fields: dict[str, Any] = {}
        prompts = 1
        prompt_prefix = ""
        chat: BodyFields | None = None
        pos = self.ws(pos + 1)
        if self.at(pos, "a property name or '}'") == "}":
            pos += 1
        else:
            while True:
                name, pos = self.key(pos)
                if name is not None and name in FIELDS:
                    fields[name], pos = self.field(pos)
                elif name == "prompt":
                    prompts, prompt_prefix, pos = self.prompt(pos)
                elif name == "messages" and self.want_prefix:
                    chat, pos = self.messages_prefix(pos)
                else:
                    pos = self.skip(pos, 1)
                pos = self.ws(pos)
                c = self.at(pos, "',' or '}'")
                if c == "}":
                    pos += 1
                    break
                if c != ",":
                    _invalid("expecting ',' or '}'", pos)
                pos = self.ws(pos + 1)
        end = self.ws(pos)
        if end != self.size:
            _invalid("extra data", end)
        if chat is None:
            return BodyFields(fields, prompts, prompt_prefix)
        return BodyFields(fields, prompts, chat.prefix, chat.turns, chat.first_user)

    def ws(self, pos: int) -> int:
        if pos >= self.size or self.text[pos] not in _WHITESPACE:
            return pos
        match = _WS_RUN.match(self.text, pos)
        return match.end() if match is not None else pos

    def count(self) -> None:
        self.values += 1
        if self.values > MAX_VALUES:
            raise InvalidRequest(f"request body holds more than {MAX_VALUES} JSON values")

    def at(self, pos: int, what: str) -> str:
        if pos >= self.size:
            _invalid(f"expecting {what}, found the end", pos)
        return self.text[pos]

    def string(self, pos: int) -> int:
        """The end of the string whose opening quote is at `pos`."""
        text = self.text
        high = -1  # where an unpaired high surrogate escape ended
        p = pos + 1
        while True:
            quote = text.find('"', p)
            if quote < 0:
                _invalid("unterminated string", pos)
            escape = text.find("\\", p, quote)
            if escape < 0:
                if high >= 0:
                    _lone_surrogate()
                if (
                    text.find("\n", p, quote) >= 0
                    or text.find("\r", p, quote) >= 0
                    or text.find("\t", p, quote) >= 0
                ):
                    _invalid("control character in a string", pos)
                return quote + 1
            match = _ESCAPE.match(text, escape)
            if match is None:
                _invalid("invalid escape in a string", escape)
            self.count()
            code = match.group(1)
            value = int(code, 16) if code is not None else -1
            if high >= 0:
                if escape != high or not 0xDC00 <= value <= 0xDFFF:
                    _lone_surrogate()
                high = -1
            elif 0xD800 <= value <= 0xDBFF:
                high = match.end()
            elif 0xDC00 <= value <= 0xDFFF:
                _lone_surrogate()
            p = match.end()

    def number(self, pos: int) -> int:
        match = _NUMBER.match(self.text, pos)
        if match is None:
            self.not_a_value(pos)
        token = match.group()
        if len(token) > 300 or "e" in token or "E" in token:
            if len(token) > 4300 and "." not in token and "e" not in token and "E" not in token:
                _invalid("integer with more than 4300 digits", pos)
            _finite_float(token)
        return match.end()

    def not_a_value(self, pos: int) -> NoReturn:
        for constant in ("NaN", "Infinity", "-Infinity"):
            if self.text.startswith(constant, pos):
                _not_finite(constant)
        _invalid("expecting a value", pos)

    def key(self, pos: int) -> tuple[str | None, int]:
        """An object's key and the position after its colon; None for a key no kept field can have."""
        if self.at(pos, "a property name in double quotes") != '"':
            _invalid("expecting a property name in double quotes", pos)
        end = self.string(pos)
        name: str | None = None
        if end - pos <= 256:
            name = self.decode(pos, end)
        colon = self.ws(end)
        if self.at(colon, "':' delimiter") != ":":
            _invalid("expecting ':' delimiter", colon)
        return name, self.ws(colon + 1)

    def open_container(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            _too_deep()

    def skip(self, pos: int, depth: int) -> int:
        """Check one value starting at `pos` (whitespace skipped) nested `depth` deep; its end."""
        text = self.text
        closers: list[str] = []  # the closing bracket of each container still open
        while True:
            pos = self.ws(pos)
            c = self.at(pos, "a value")
            self.count()
            if c == '"':
                pos = self.string(pos)
            elif c == "[":
                self.open_container(depth + len(closers) + 1)
                pos = self.ws(pos + 1)
                if self.at(pos, "a value or ']'") == "]":
                    pos += 1
                else:
                    closers.append("]")
                    continue
            elif c == "{":
                self.open_container(depth + len(closers) + 1)
                pos = self.ws(pos + 1)
                if self.at(pos, "a property name or '}'") == "}":
                    pos += 1
                else:
                    closers.append("}")
                    pos = self.key(pos)[1]
                    continue
            elif c == "-" or "0" <= c <= "9":
                pos = self.number(pos)
            elif text.startswith("true", pos) or text.startswith("null", pos):
                pos += 4
            elif text.startswith("false", pos):
                pos += 5
            else:
                self.not_a_value(pos)
            # After a value: close what ends here, up to the next comma.
            while closers:
                pos = self.ws(pos)
                c = self.at(pos, "',' or a closing bracket")
                if c == ",":
                    pos = self.ws(pos + 1)
                    if closers[-1] == "}":
                        pos = self.key(pos)[1]
                    break
                if c != closers[-1]:
                    _invalid(f"expecting ',' or '{closers[-1]}'", pos)
                closers.pop()
                pos += 1
            else:
                return pos

    def field(self, pos: int) -> tuple[Any, int]:
        """A kept field's value (containers as an empty one of their type) and its end."""
        c = self.at(pos, "a value")
        end = self.skip(pos, 1)
        if c == "[":
            return [], end
        if c == "{":
            return {}, end
        if c == '"' and end - pos > MAX_FIELD_BYTES:
            return self.body[pos + 1 : pos + 1 + MAX_FIELD_BYTES].decode(errors="replace") + "…", end
        return self.decode(pos, end), end

    def decode(self, pos: int, end: int) -> Any:
        """A short scalar as json gives it."""
        try:
            return json.loads(self.body[pos:end])
        except ValueError as err:
            _invalid(str(err), pos)

    def prompt(self, pos: int) -> tuple[int, str, int]:
        """How many prompts a `prompt` value holds, its prefix text (if asked for) and its end."""
        want = self.want_prefix
        c = self.at(pos, "a value")
        if c != "[":
            end = self.skip(pos, 1)
            return 1, (self.string_prefix(pos, end) if want and c == '"' else ""), end
        self.count()
        pos = self.ws(pos + 1)
        if self.at(pos, "a value or ']'") == "]":
            return 0, "", pos + 1
        count = 0
        numbers = True
        text = ""
        ids: list[str] = []
        collecting = want  # the leading token ids, while they are ids
        while True:
            c = self.at(pos, "a value")
            numbers = numbers and (c == "-" or "0" <= c <= "9")
            end = self.skip(pos, 2)
            if want and count == 0 and c == '"':
                text = self.string_prefix(pos, end)
            if collecting:
                value = self.decode(pos, end) if numbers else None
                collecting = _is_id(value) and len(ids) < PREFIX_TOKENS
                if collecting:
                    ids.append(str(value))
            pos = self.ws(end)
            count += 1
            c = self.at(pos, "',' or ']'")
            if c == "]":
                return (1 if numbers else count), (_ids_text(ids) if ids else text), pos + 1
            if c != ",":
                _invalid("expecting ',' or ']'", pos)
            pos = self.ws(pos + 1)

    def messages_prefix(self, pos: int) -> tuple[BodyFields | None, int]:
        """The leading text and turns of a `messages` value (None if it is not a list; see
        `_chat_prefix`), and its end."""
        if self.at(pos, "a value") != "[":
            return None, self.skip(pos, 1)
        self.count()
        pos = self.ws(pos + 1)
        if self.at(pos, "a value or ']'") == "]":
            return _chat_prefix([]), pos + 1
        pairs: list[tuple[str, str]] = []
        done = False
        while True:
            if not done and self.at(pos, "a value") == "{":
                role, content, pos = self.message(pos)
                pairs.append((role, content))
                done = len(pairs) >= MAX_TURNS
            else:
                done = True  # the rest is only checked
                pos = self.skip(pos, 2)
            pos = self.ws(pos)
            c = self.at(pos, "',' or ']'")
            if c == "]":
                return _chat_prefix(pairs), pos + 1
            if c != ",":
                _invalid("expecting ',' or ']'", pos)
            pos = self.ws(pos + 1)

    def message(self, pos: int) -> tuple[str, str, int]:
        """A chat message's role and content (their leading text; "" where not a string), and its end."""
        self.count()
        role = ""
        content = ""
        pos = self.ws(pos + 1)
        if self.at(pos, "a property name or '}'") == "}":
            return role, content, pos + 1
        while True:
            name, pos = self.key(pos)
            c = self.at(pos, "a value")
            end = self.skip(pos, 3)
            if name == "role":
                role = self.string_prefix(pos, end) if c == '"' else ""
            elif name == "content":
                content = self.string_prefix(pos, end) if c == '"' else ""
            pos = self.ws(end)
            c = self.at(pos, "',' or '}'")
            if c == "}":
                return role, content, pos + 1
            if c != ",":
                _invalid("expecting ',' or '}'", pos)
            pos = self.ws(pos + 1)

    def string_prefix(self, pos: int, end: int) -> str:
        """The first PREFIX_CHARS characters of the (checked) string from `pos` to `end`, quotes included,
        decoded from a slice of at most PREFIX_CHARS * _BYTES_PER_CHAR bytes."""
        stop = pos + 1 + PREFIX_CHARS * _BYTES_PER_CHAR
        if stop >= end - 1:
            value = self.decode(pos, end)
            return value[:PREFIX_CHARS] if isinstance(value, str) else ""
        # Cut inside the string: drop a UTF-8 character or an escape the cut split (an escape is at most
        # 6 bytes, so one of the first 6 shorter cuts decodes).
        text = self.body[pos + 1 : stop].decode(errors="ignore")
        for cut in range(7):
            try:
                value = json.loads('"' + text[: len(text) - cut] + '"')
            except ValueError:
                continue
            return value[:PREFIX_CHARS] if isinstance(value, str) else ""
        return ""
