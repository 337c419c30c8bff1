"""The bounded incremental scan of a large request body: `read_body_fields` (in `body`) hands it bodies
over `WHOLE_PARSE_MAX` bytes (`scan_body`).

The scan checks the same things as the whole parse, with the same limits and errors, and keeps the
same fields, prompt count and leading text, but never builds the document: it holds one Latin-1 copy
of the body (a byte a character) and checks UTF-8 and control bytes in 1 MiB windows. What both ways
of reading share (`BodyFields`, the limits, the errors, the chat's leading text) is in `body_fields`.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, Final, NoReturn

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
    invalid_json,
    is_token_id,
    lone_surrogate,
    not_finite,
    too_deep,
)
from specfleet_runtime.router.classify import InvalidRequest
from specfleet_runtime.routing_config import PREFIX_CHARS, PREFIX_TOKENS

# The window a scan checks the body's bytes in (UTF-8, control characters): the most it copies at once.
_UTF8_WINDOW: Final = 1 << 20

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ESCAPE = re.compile(r"\\(?:[\"\\/bfnrt]|u([0-9a-fA-F]{4}))")
_WHITESPACE = " \t\n\r"
_WS_RUN = re.compile(r"[ \t\n\r]+")

# A JSON string holds at least one character per this many bytes (a surrogate pair escape: 12), so a
# slice this many times PREFIX_CHARS long holds the first PREFIX_CHARS characters of any string.
_BYTES_PER_CHAR: Final = 12

# Bytes that JSON allows nowhere unescaped (tab, LF and CR only as whitespace between tokens) -> 0.
_CONTROL = bytes(0 if byte < 0x20 and byte not in (0x09, 0x0A, 0x0D) else 1 for byte in range(256))


def scan_body(body: bytes, prefix: bool = False) -> BodyFields:
    """`read_body_fields` for a large body, scanned without building it (see the module docstring)."""
    return _Scanner(body, prefix).read()


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
            invalid_json("control character", start + control)
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
                invalid_json("extra data", end)
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
                    invalid_json("expecting ',' or '}'", pos)
                pos = self.ws(pos + 1)
        end = self.ws(pos)
        if end != self.size:
            invalid_json("extra data", end)
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
            invalid_json(f"expecting {what}, found the end", pos)
        return self.text[pos]

    def string(self, pos: int) -> int:
        """The end of the string whose opening quote is at `pos`."""
        text = self.text
        high = -1  # where an unpaired high surrogate escape ended
        p = pos + 1
        while True:
            quote = text.find('"', p)
            if quote < 0:
                invalid_json("unterminated string", pos)
            escape = text.find("\\", p, quote)
            if escape < 0:
                if high >= 0:
                    lone_surrogate()
                if (
                    text.find("\n", p, quote) >= 0
                    or text.find("\r", p, quote) >= 0
                    or text.find("\t", p, quote) >= 0
                ):
                    invalid_json("control character in a string", pos)
                return quote + 1
            match = _ESCAPE.match(text, escape)
            if match is None:
                invalid_json("invalid escape in a string", escape)
            self.count()
            code = match.group(1)
            value = int(code, 16) if code is not None else -1
            if high >= 0:
                if escape != high or not 0xDC00 <= value <= 0xDFFF:
                    lone_surrogate()
                high = -1
            elif 0xD800 <= value <= 0xDBFF:
                high = match.end()
            elif 0xDC00 <= value <= 0xDFFF:
                lone_surrogate()
            p = match.end()

    def number(self, pos: int) -> int:
        match = _NUMBER.match(self.text, pos)
        if match is None:
            self.not_a_value(pos)
        token = match.group()
        if len(token) > 300 or "e" in token or "E" in token:
            if len(token) > 4300 and "." not in token and "e" not in token and "E" not in token:
                invalid_json("integer with more than 4300 digits", pos)
            finite_float(token)
        return match.end()

    def not_a_value(self, pos: int) -> NoReturn:
        for constant in ("NaN", "Infinity", "-Infinity"):
            if self.text.startswith(constant, pos):
                not_finite(constant)
        invalid_json("expecting a value", pos)

    def key(self, pos: int) -> tuple[str | None, int]:
        """An object's key and the position after its colon; None for a key no kept field can have."""
        if self.at(pos, "a property name in double quotes") != '"':
            invalid_json("expecting a property name in double quotes", pos)
        end = self.string(pos)
        name: str | None = None
        if end - pos <= 256:
            name = self.decode(pos, end)
        colon = self.ws(end)
        if self.at(colon, "':' delimiter") != ":":
            invalid_json("expecting ':' delimiter", colon)
        return name, self.ws(colon + 1)

    def open_container(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            too_deep()

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
                    invalid_json(f"expecting ',' or '{closers[-1]}'", pos)
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
            invalid_json(str(err), pos)

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
                collecting = is_token_id(value) and len(ids) < PREFIX_TOKENS
                if collecting:
                    ids.append(str(value))
            pos = self.ws(end)
            count += 1
            c = self.at(pos, "',' or ']'")
            if c == "]":
                return (1 if numbers else count), (ids_text(ids) if ids else text), pos + 1
            if c != ",":
                invalid_json("expecting ',' or ']'", pos)
            pos = self.ws(pos + 1)

    def messages_prefix(self, pos: int) -> tuple[BodyFields | None, int]:
        """The leading text and turns of a `messages` value (None if it is not a list; see
        `chat_prefix`), and its end."""
        if self.at(pos, "a value") != "[":
            return None, self.skip(pos, 1)
        self.count()
        pos = self.ws(pos + 1)
        if self.at(pos, "a value or ']'") == "]":
            return chat_prefix([]), pos + 1
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
                return chat_prefix(pairs), pos + 1
            if c != ",":
                invalid_json("expecting ',' or ']'", pos)
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
                invalid_json("expecting ',' or '}'", pos)
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
