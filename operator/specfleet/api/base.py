"""The base of every API model: camelCase JSON, strict types, and cross-field rules kept in one place.

A `Rule` holds a CEL expression (emitted into the CRD as `x-kubernetes-validations`, so the apiserver
enforces it) and a Python predicate with the same meaning and the same message (so `specfleet render`
rejects a bad file before it reaches a cluster). One table of bad manifests tests both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: `cel` for the apiserver, `check` (True when valid) for Python."""

    cel: str
    message: str
    check: Callable[[Any], bool]


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; no coercion ("3" is not 3) and no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        use_attribute_docstrings=False,
    )

    # Rules of this model; subclasses set their own tuple.
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        if cls.rules:
            target["x-kubernetes-validations"] = [{"rule": r.cel, "message": r.message} for r in cls.rules]
        return schema

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase dict, without unset optionals."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
