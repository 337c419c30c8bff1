"""Parse a SpeculativeDeployment and report errors the way the apiserver does.

`specfleet render` and the operator reject a bad resource with the same wording `kubectl apply` shows
(`spec.drafter: Invalid value: "object": <rule message>`), so a user sees one message wherever the
check fires first. Where the apiserver's wording leaves a user guessing, a hint follows it: the nearest
known field for an unknown one, quotes for a YAML boolean where `On`/`Off` is expected, the field path
where the apiserver says `<nil>`, the apiVersion and kind received.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from specfleet.api.base import Rule
from specfleet.api.constants import API_VERSION, KIND
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import SpeculativeDeploymentStatus

# The longest child name is "<name>-latency-canary" (15 more characters), and a Service name is a
# DNS-1035 label of at most 63: so the resource's own name is one, of at most 48.
MAX_NAME_LENGTH = 63 - len("-latency-canary")
_DNS_1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Rules on the whole object (CEL at the schema's root may read metadata.name), checked here too.
NAME_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        message=f"metadata.name must be at most {MAX_NAME_LENGTH} characters: children are named "
        "<name>-latency-canary and Service names are limited to 63",
        check=lambda name: len(name) <= MAX_NAME_LENGTH,
    ),
    Rule(
        cel=f"self.metadata.name.matches('{_DNS_1035}')",
        message="metadata.name must start with a letter and hold only lowercase letters, digits and '-': "
        "it names the fleet's Services (DNS-1035 labels)",
        check=lambda name: re.fullmatch(_DNS_1035, name) is not None,
    ),
)


class InvalidResourceError(ValueError):
    """A resource the schema or a rule rejects; `messages` holds one line per problem."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = list(messages)
        super().__init__("; ".join(self.messages))


@dataclass(frozen=True)
class SpeculativeDeployment:
    """A parsed resource: identity from metadata, validated spec, leniently read status."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: SpeculativeDeploymentSpec
    status: SpeculativeDeploymentStatus

    @property
    def served_model_name(self) -> str:
        return self.spec.model.served_model_name or self.name


def parse_spec(spec: Mapping[str, Any]) -> SpeculativeDeploymentSpec:
    """Validate a spec dict; raises InvalidResourceError with apiserver-style messages."""
    try:
        return SpeculativeDeploymentSpec.model_validate(dict(spec))
    except ValidationError as err:
        raise InvalidResourceError([format_error(e) for e in err.errors()]) from None


def parse_status(status: Mapping[str, Any] | None) -> SpeculativeDeploymentStatus:
    """Read status leniently: a damaged status is replaced, never fatal (the operator rewrites it)."""
    try:
        return SpeculativeDeploymentStatus.model_validate(dict(status or {}))
    except ValidationError:
        return SpeculativeDeploymentStatus()


# The fields of an object as the apiserver stores it; others are unknown (kubectl's strict validation).
_TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


def _received(value: Any) -> str:
    return "none" if value is None else f'"{value}"'


def parse_resource(body: Mapping[str, Any]) -> SpeculativeDeployment:
    """Parse a whole object (as read from the API or a file)."""
    problems: list[str] = []
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        problems.append(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got apiVersion "
            f"{_received(body.get('apiVersion'))} and kind {_received(body.get('kind'))}"
        )
    problems += [
        f'unknown field "{key}"{_did_you_mean(str(key), _TOP_LEVEL_FIELDS)}'
        for key in body
        if key not in _TOP_LEVEL_FIELDS
    ]
    meta = body.get("metadata") or {}
    if not isinstance(meta, Mapping) or not meta.get("name"):
        problems.append("metadata.name: Required value")
        meta = {}
    else:
        name = str(meta["name"])
        # The apiserver words these `<nil>: Invalid value: "object": ...` (a rule at the schema's root).
        problems += [
            f'metadata.name: Invalid value: "{name}": {r.message}' for r in NAME_RULES if not r.check(name)
        ]
    spec_doc = body.get("spec")
    if not isinstance(spec_doc, Mapping):
        problems.append("spec: Required value")
    if problems:
        raise InvalidResourceError(problems)
    assert isinstance(spec_doc, Mapping)
    return SpeculativeDeployment(
        name=str(meta["name"]),
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 0),
        spec=parse_spec(spec_doc),
        status=parse_status(body.get("status")),
    )


_JSON_TYPES = {"int": "integer", "string": "string", "bool": "boolean", "dict": "object", "list": "array"}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number" if isinstance(value, float) else "integer"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return "null"


def _path(loc: Sequence[int | str]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as the apiserver (JSON) writes it
    return f'"{value}"' if isinstance(value, str) else str(value)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None`, `list[X]` or `dict[str, X]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _fields_beside(loc: Sequence[int | str]) -> list[str]:
    """The known fields of the object holding the last element of `loc` (a spec path)."""
    model: type[BaseModel] = SpeculativeDeploymentSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        found = _model_in(field.annotation) if field is not None else None
        if found is None:
            return []
        model = found
    return [f.alias or n for n, f in model.model_fields.items()]


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if not close:
        close = [k for k in known if k.lower() == name.lower()]
    return f' (did you mean "{close[0]}"?)' if close else ""


def _boolean_hint(loc: Sequence[int | str], value: Any, expected: str) -> str:
    """YAML 1.1 reads unquoted On/Off/Yes/No as booleans: say so where a word was expected."""
    if not isinstance(value, bool) or '"' not in expected:
        return ""
    words = re.findall(r'"([^"]*)"', expected)
    meant = next(
        (w for w in words if w.lower() in (("on", "yes", "true") if value else ("off", "no", "false"))), None
    )
    example = f'{loc[-1]}: "{meant}"' if meant and loc else 'quotes, e.g. "Off"'
    return f" (YAML reads an unquoted On/Off/Yes/No as a boolean: quote the value, {example})"


def format_error(err: Mapping[str, Any]) -> str:
    """One pydantic error as the apiserver would word it."""
    kind = str(err["type"])
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-after"))]
    path = _path(loc)
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return f"{path}: Required value"
    if kind == "extra_forbidden":
        hint = _did_you_mean(str(loc[-1]), _fields_beside(loc)) if loc else ""
        return f'unknown field "{path}"{hint}'
    if kind in ("literal_error", "enum"):
        expected = str(ctx.get("expected", "")).replace("'", '"').replace(" or ", ", ")
        return f"{path}: Unsupported value: {_literal(value)}: supported values: {expected}" + _boolean_hint(
            loc, value, expected
        )
    if kind.endswith("_type") or kind in ("model_type", "model_attributes_type", "dict_type", "list_type"):
        wanted = next((v for k, v in _JSON_TYPES.items() if kind.startswith(k)), "object")
        got = _json_type(value)
        return f'{path}: Invalid value: "{got}": {path} in body must be of type {wanted}: "{got}"'
    if kind == "greater_than_equal":
        return (
            f"{path}: Invalid value: {value}: {path} in body should be greater than or equal to {ctx['ge']}"
        )
    if kind == "less_than_equal":
        return f"{path}: Invalid value: {value}: {path} in body should be less than or equal to {ctx['le']}"
    if kind == "string_too_short":
        return f'{path}: Invalid value: "{value}": {path} in body should be at least {ctx["min_length"]} chars long'
    if kind == "string_too_long":
        return f"{path}: Too long: may not be more than {ctx['max_length']} bytes"
    if kind == "string_pattern_mismatch":
        return f"{path}: Invalid value: \"{value}\": {path} in body should match '{ctx['pattern']}'"
    if kind == "too_short":
        return f"{path}: Invalid value: {len(value or ())}: {path} in body should have at least {ctx['min_length']} items"
    if kind == "too_long":
        return f"{path}: Too many: {ctx.get('actual_length')}: must have at most {ctx['max_length']} items"
    if kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
        return f"{path}: Invalid value: {message}"
    return f"{path}: Invalid value: {err['msg']}"
