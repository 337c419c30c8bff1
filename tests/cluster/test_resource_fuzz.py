"""Random valid and invalid SpeculativeDeployments through the real apiserver to the real operator:
each is refused with a message or reconciled (a Ready or Degraded condition that says why), and the
operator never crashes.

A seeded generator (reproducible, bounded at FUZZ_COUNT resources) mutates the examples: integers
out of range, wrong types, dropped and unknown fields, odd strings, and fragments of the invalid
table. Pools and routers keep at most one replica (most none), so no pod has to be placed.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
import yaml

from specfleet_sandbox.processes import wait_for
from support.manifests import CRD, ROOT, invalid_cases, load_yaml, merge

pytestmark = pytest.mark.cluster
NO_PROMETHEUS = "http://127.0.0.1:9"
FUZZ_COUNT = 50
SEED = 25
BASES = ["01-minimal-eagle3.yaml", "02-two-pools-routing-policy.yaml", "03-ngram.yaml", "04-dynamic-sd.yaml"]
INTS = [-1, 0, 1, 2, 3, 7, 64, 4097, 100_000, 2**31, 2**63]
ODD = ["x", "", " ", "Auto", "On", "Off", "a" * 300, "ünïcødé", "x\ny", [], {}, True, 1.5, [1, "x"], {"k": 1}]
SCALE_KEYS = {"replicas", "maxReplicas", "minReplicas", "canaryReplicas"}


@pytest.fixture
def operator_options(namespace) -> dict[str, Any]:
    # Only this test's namespace: other tests' resources stay out of its log.
    return {"extra_args": ["--namespace", namespace]}


def _base(name: str, namespace: str, rng: random.Random) -> dict[str, Any]:
    doc = load_yaml(ROOT / "examples" / rng.choice(BASES))
    return merge(
        doc,
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "pools": {"latency": {"replicas": 0}, "batch": {"replicas": 0}},
                "routing": {"router": {"replicas": 0}},
                "engine": {"nodeSelector": None, "modelCache": None, "hfTokenSecretRef": None},
                "monitoring": {"podMonitor": False},
                "policy": {"prometheus": {"url": NO_PROMETHEUS}, "reentry": {"canaryReplicas": 0}},
            },
        },
    )


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path (and list index) under `node`."""
    out: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        out.append((*prefix, key))
        out += _paths(value, (*prefix, key))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool = False) -> None:
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def _schema_leaves() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every scalar field of the CRD's spec schema, with its schema."""
    crd = load_yaml(CRD)
    out: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        if node.get("type") == "object" and "properties" in node:
            for key, child in node["properties"].items():
                walk(child, (*path, key))
        elif node.get("type") in ("integer", "string", "boolean"):
            out.append((path, node))

    walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], ())
    return out


LEAVES = _schema_leaves()


def _schema_value(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value of the field's type, mostly within its enum or bounds (the apiserver accepts it)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if schema["type"] == "boolean":
        return rng.random() < 0.5
    if schema["type"] == "integer":
        low = schema.get("minimum", 0)
        return rng.randint(low, schema.get("maximum", low + 5000))
    return rng.choice(["1", "500m", "2Gi", "x", "latency", "a" * 40])


def _mutate(
    spec: dict[str, Any], rng: random.Random, cases: list[dict[str, Any]]
) -> tuple[dict[str, Any], str]:
    """One random change of `spec`, and what it was."""
    kind = rng.choice(["schema", "schema", "schema", "int", "odd", "drop", "unknown", "case"])
    value: Any
    if kind == "schema":
        field, schema = rng.choice(LEAVES)
        value = _schema_value(schema, rng)
        patch: dict[str, Any] = {field[-1]: value}
        for key in reversed(field[:-1]):
            patch = {key: patch}
        return merge(spec, patch), f"{'.'.join(field)}={value!r:.40}"
    if kind == "case":
        case = rng.choice(cases)
        return merge(spec, case["spec"]), f"case {case['name']}"
    paths = _paths(spec)
    path = rng.choice(paths)
    spec = copy.deepcopy(spec)
    if kind == "int":
        value = rng.choice(INTS)
    elif kind == "odd":
        value = rng.choice(ODD)
    elif kind == "drop":
        _set(spec, path, None, delete=True)
        return spec, f"drop {'.'.join(map(str, path))}"
    else:
        dicts = [p for p in [(), *paths] if isinstance(_get(spec, p), dict)]
        path, value = (*rng.choice(dicts), "fuzzField"), rng.choice(INTS)
    _set(spec, path, value)
    return spec, f"{'.'.join(map(str, path))}={value!r:.40}"


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _few_replicas(node: Any) -> None:
    """No pod storms: any replica count the mutations raised goes back to at most 1."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in list(items):
        if key in SCALE_KEYS and type(value) is int and value > 1:
            node[key] = 1
        else:
            _few_replicas(value)


def _resources(namespace: str) -> list[tuple[dict[str, Any], list[str]]]:
    rng = random.Random(SEED)
    cases = [{"name": c.name, "spec": c.manifest["spec"]} for c in invalid_cases() if c.manifest.get("spec")]
    out = []
    for n in range(FUZZ_COUNT):
        doc = _base(f"fuzz-{n}", namespace, rng)
        changes: list[str] = []
        # A fifth stays as the example has it (valid), the rest get one to three changes.
        for _ in range(0 if rng.random() < 0.2 else rng.randint(1, 3)):
            doc["spec"], change = _mutate(doc["spec"], rng, cases)
            changes.append(change)
        _few_replicas(doc["spec"])
        out.append((doc, changes))
    return out


def _said_why(obj: dict[str, Any]) -> bool:
    """Reconciled: status for this generation, with a Ready condition or Degraded=True, each with a message."""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return False
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    degraded = conditions.get("Degraded", {})
    if degraded.get("status") == "True":
        return bool(degraded.get("message"))
    ready = conditions.get("Ready", {})
    return ready.get("status") == "True" or (ready.get("status") == "False" and bool(ready.get("message")))


def test_random_resources_are_refused_with_a_message_or_reconciled(cluster, namespace, operator):
    resources = _resources(namespace)
    refused: dict[str, str] = {}
    for doc, _ in resources:
        name = doc["metadata"]["name"]
        result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
        if result.returncode != 0:
            refused[name] = result.stderr.strip()
    changes = {doc["metadata"]["name"]: c for doc, c in resources}
    for name, message in refused.items():
        # The apiserver's answer says what is wrong: a field of the spec, or the object and a rule.
        assert "invalid" in message.lower() or "error" in message.lower(), (changes[name], message)
        assert "spec" in message or name in message, (changes[name], message)
    out = cluster.kubectl("get", "sd", "-n", namespace, "-o", "json").stdout
    accepted = {o["metadata"]["name"] for o in json.loads(out)["items"]}
    assert accepted | set(refused) == set(changes)
    assert not accepted & set(refused)
    # Both kinds are drawn (the seed is fixed: this guards the generator, not luck).
    assert len(accepted) >= 10
    assert len(refused) >= 10

    def unreconciled() -> list[str]:
        items = json.loads(cluster.kubectl("get", "sd", "-n", namespace, "-o", "json").stdout)["items"]
        return [o["metadata"]["name"] for o in items if not _said_why(o)]

    left: list[str] = []

    def all_reconciled() -> bool:
        left[:] = unreconciled()
        return not left

    try:
        wait_for("every accepted resource reconciled", all_reconciled, timeout=180, interval=1)
    except AssertionError:
        raise AssertionError(f"not reconciled: {[(n, changes[n]) for n in left]}") from None
    assert operator.alive()
    log = operator.log()
    assert "Traceback" not in log
    cluster.kubectl("delete", "sd", "--all", "-n", namespace, "--wait=false")
