"""Generate the CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema: no $ref, no anyOf for
optionals, free-form maps marked with x-kubernetes-preserve-unknown-fields, defaults that the
apiserver applies. `structural_schema` makes that translation; `build_crd` wraps it in the CRD.
"""

from __future__ import annotations

import copy
import typing
from typing import Any

import yaml
from pydantic import BaseModel

from specfleet.api.constants import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import NAME_RULES

# JSON Schema keywords that a structural schema does not take (or that only add noise).
_DROPPED_KEYS = frozenset({"title", "$defs", "additionalProperties", "anyOf", "$ref"})

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Latency",
        "type": "string",
        "description": "Speculation mode of the latency pool",
        "jsonPath": ".status.pools.latency.speculation",
    },
    {
        "name": "Batch",
        "type": "string",
        "description": "Speculation mode of the batch pool",
        "jsonPath": ".status.pools.batch.speculation",
    },
    {
        "name": "K",
        "type": "integer",
        "description": "Tokens the latency pool drafts per step now (the policy's K, else "
        "drafter.numSpeculativeTokens; 0 while it does not speculate)",
        "jsonPath": ".status.pools.latency.k",
    },
    {
        "name": "Batch-K",
        "type": "integer",
        "description": "Tokens the batch pool drafts per step now (as K)",
        "jsonPath": ".status.pools.batch.k",
    },
    {
        "name": "Ready",
        "type": "string",
        "description": "Whether every pool has its replicas ready",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Progressing",
        "type": "string",
        "description": "Whether a rollout (a speculation flip, a K change or a spec change) is under way",
        "jsonPath": '.status.conditions[?(@.type=="Progressing")].status',
    },
    {
        "name": "Acceptance",
        "type": "string",
        "description": "Mean acceptance length of the latency pool (tokens per step)",
        "jsonPath": ".status.pools.latency.acceptanceLength",
    },
    {
        "name": "SLO",
        "type": "string",
        "description": "Percent of the latency pool's requests within its SLO over the last policy window "
        "(empty without spec.pools.latency.slo)",
        "jsonPath": ".status.pools.latency.sloAttainmentPercent",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural_schema(model: type[Any], *, object_defaults: bool = True) -> dict[str, Any]:
    """The model's JSON Schema, rewritten into a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    defs = raw.get("$defs", {})
    schema = _convert(raw, defs)
    if object_defaults:
        _add_object_defaults(model, schema)
    return schema


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None` or `list[X]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _add_object_defaults(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Nested objects with a default get it in full, so the apiserver defaults them like pydantic.

    A bare `{}` default is not enough: the apiserver checks a default against the object's CEL
    rules before nested defaults apply, and the rules would see missing fields.
    """
    properties = schema.get("properties", {})
    for name, info in model.model_fields.items():
        sub = properties.get(info.alias or name)
        nested = _model_of(info.annotation)
        if sub is None or nested is None:
            continue
        target = sub.get("items", sub) if sub.get("type") == "array" else sub
        _add_object_defaults(nested, target)
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                sub["default"] = value.model_dump(mode="json", by_alias=True, exclude_none=True)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a $ref, keeping the referring node's own keys (its description wins)."""
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    options = node.get("anyOf")
    if options is not None:
        # pydantic writes `X | None` as anyOf [X, null]: optional means "may be absent" here.
        non_null = [o for o in options if o.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {options}")
        merged = {**_resolve(non_null[0], defs), **{k: v for k, v in node.items() if k != "anyOf"}}
        if merged.get("default", 0) is None:
            del merged["default"]
        return merged
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROPPED_KEYS and k != "properties"}
    kind = node.get("type")
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if props is not None:
            out["properties"] = {name: _convert(sub, defs) for name, sub in props.items()}
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = _convert(extra, defs)
        else:
            # A free-form object (e.g. a Kubernetes Affinity) is kept as written.
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = _convert(node["items"], defs)
    # Defaults of list/dict factories are empty; drop them unless they are meaningful scalars or {}.
    if out.get("default") in ([],):
        del out["default"]
    return out


def build_crd() -> dict[str, Any]:
    """The full CustomResourceDefinition object."""
    spec_schema = structural_schema(SpeculativeDeploymentSpec)
    # Status is written whole by the operator: no defaults needed there.
    status_schema = structural_schema(SpeculativeDeploymentStatus, object_defaults=False)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "specfleet", "app.kubernetes.io/part-of": "specfleet"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "specfleet"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A speculative-decoding vLLM fleet: pools, router and the "
                            "policy that turns speculation on or off per pool.",
                            "required": ["spec"],
                            "x-kubernetes-validations": [
                                {"rule": r.cel, "message": r.message} for r in NAME_RULES
                            ],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as YAML, exactly as committed in crds/."""
    header = (
        "# Generated by `specfleet crd` from the models in operator/specfleet/api/. Do not edit by hand.\n"
        f"# {API_VERSION} {KIND}\n"
    )
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)
