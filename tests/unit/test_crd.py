"""The CRD is generated from the models, committed, and structurally valid."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, get_args

from specfleet import api
from specfleet.api.base import ApiModel
from specfleet.api.crd import build_crd, crd_yaml
from specfleet.api.drafter import SpeculativeMethod
from specfleet.api.routing import DEPRECATED_FALLBACK
from specfleet.api.validation import NAME_RULES

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "specfleet.io_speculativedeployments.yaml"


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_committed_crd_matches_a_fresh_generation():
    assert COMMITTED.read_text() == crd_yaml(), "crds/ is stale: run `make crd`"


def test_schema_is_structural():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        for combinator in ("anyOf", "oneOf", "allOf"):
            assert combinator not in node, path
        assert "title" not in node, path
        if "properties" in node:
            assert node.get("type") == "object", path
        if node.get("type") == "array":
            assert "items" in node, path
        if "default" in node:
            assert node["default"] is not None, path


def test_every_spec_and_status_field_has_a_description():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = []
    for top in ("spec", "status"):
        for path, node in _walk(schema["properties"][top], top):
            for name, prop in (node.get("properties") or {}).items():
                if "description" not in prop:
                    missing.append(f"{path}.{name}")
    assert missing == []


def _api_models() -> set[type[ApiModel]]:
    """Every spec model, wherever in the `specfleet.api` package it is defined."""
    modules = [importlib.import_module(f"specfleet.api.{m.name}") for m in pkgutil.iter_modules(api.__path__)]
    return {
        cls
        for module in modules
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, ApiModel) and cls is not ApiModel
    }


def test_every_rule_is_emitted_as_cel():
    rules = [r for cls in _api_models() for r in cls.rules] + list(NAME_RULES)
    emitted = [n for _, node in _walk(build_crd()) for n in node.get("x-kubernetes-validations", [])]
    # A model used twice (the two pools) carries its rules in both places.
    assert {(n["rule"], n["message"]) for n in emitted} == {(r.cel, r.message) for r in rules}
    assert len(rules) >= 10


def test_cel_lists_are_bounded():
    # The apiserver estimates CEL cost; unbounded lists iterated by rules make it refuse the CRD.
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if node.get("type") == "array":
            assert "maxItems" in node, path


def test_printer_columns_and_names():
    crd = build_crd()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["specdeploy", "sd"]
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Latency", "Batch", "K", "Batch-K", "Ready", "Progressing", "Acceptance", "SLO", "Age"]
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_conditions_are_a_map_list_keyed_by_type():
    status = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    # A map key must be required in every item (the apiserver refuses the CRD otherwise).
    assert "type" in conditions["items"]["required"]


def test_chart_ships_the_same_crd():
    chart_crd = ROOT / "charts" / "specfleet" / "crds" / "specfleet.io_speculativedeployments.yaml"
    assert chart_crd.read_text() == COMMITTED.read_text(), "run `make crd`"


# Enum values that are not UpperCamelCase, and why: vLLM's own names for its drafting methods (passed
# to it as they are), the pool names (which are also field names: spec.pools.latency), and the
# deprecated spellings still accepted for one version (docs/install.md, "Deprecated spellings").
_NOT_UPPER_CAMEL = {
    "drafter/method": set(get_args(SpeculativeMethod)),
    "defaultPool": {"latency", "batch"},
    "pool": {"latency", "batch"},
    "routing/fallback": set(DEPRECATED_FALLBACK),
}


def test_enum_values_are_upper_camel_case_but_the_listed_exceptions():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        field = path.replace("/properties", "").replace("/items", "")
        allowed = next((v for k, v in _NOT_UPPER_CAMEL.items() if field.endswith("/" + k)), set())
        for value in node.get("enum", []):
            assert value[:1].isupper() or value in allowed, f"{field}: {value!r}"


def test_deprecated_fallback_spellings_stay_accepted_next_to_the_new_ones():
    fallback = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["routing"]["properties"]["fallback"]
    assert fallback["enum"] == ["OtherPool", "Reject", "otherPool", "reject"]
    assert fallback["default"] == "OtherPool"
