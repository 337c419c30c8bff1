"""A scripted Prometheus for unit tests: answers the fleet's grouped PromQL from a table of pool values.

Like a real Prometheus it honours the queries' namespace matcher (only pools of the namespaces asked
about answer), and `extra` injects raw samples (hostile or malformed ones) into a query's answer.
The e2e tier runs the same queries against a real Prometheus scraping engines.
"""

from __future__ import annotations

import json
import re
from typing import Any

from specfleet.observe.prometheus import POOL_LABELS, PoolKey, QueryError, fleet_queries


def vector(value: float | None, **labels: str) -> list[dict[str, Any]]:
    return [] if value is None else [{"metric": labels, "value": [0, str(value)]}]


_VALUE_KEYS = {
    "drafts": "drafts",
    "draft_tokens": "draft_tokens",
    "accepted": "accepted",
    "running_per_replica": "running",
    "replicas": "replicas",
    "waiting": "waiting",
    "generation_tps": "gen",
    "itl_p50": "itl50",
    "itl_p99": "itl99",
    "sample_age": "age",
    "window_coverage": "window_coverage",
    "kv_usage": "kv_usage",
    "preemptions": "preemptions",
    "prompt_len": "prompt_len",
    "output_len": "output_len",
    "prefix_hit_rate": "prefix_hit_rate",
}
_MATCHER = re.compile(r'namespace(=~|=)("(?:[^"\\]|\\.)*")')


def asked_namespaces(promql: str) -> list[str]:
    """The namespaces a fleet query's matcher selects (its regex of escaped alternatives undone)."""
    match = _MATCHER.search(promql)
    assert match is not None, f"a fleet query without a namespace matcher: {promql}"
    op, literal = match.groups()
    text: str = json.loads(literal)
    if op == "=":
        return [text]
    names, current, chars = [], "", iter(text)
    for c in chars:
        if c == "\\":
            current += next(chars)
        elif c == "|":
            names.append(current)
            current = ""
        else:
            current += c
    return [*names, current]


class FakePrometheus:
    """`values[(namespace, deployment, pool)]` holds: drafts, accepted, draft_tokens, per_pos (list),
    running, replicas, age, ttft_buckets and tpot_buckets ({le text: cumulative rate}), ...; `set_pool`
    defaults to the namespace and deployment it was made for."""

    def __init__(self, namespace: str, deployment: str, window: int) -> None:
        self.namespace, self.deployment, self.window = namespace, deployment, window
        self.values: dict[PoolKey, dict[str, Any]] = {}
        # query name -> raw samples added to its answer (in the namespaces asked about)
        self.extra: dict[str, list[Any]] = {}
        self.down = False
        self.queries: list[str] = []

    def set_pool(
        self, pool: str, *, namespace: str | None = None, deployment: str | None = None, **values: Any
    ) -> None:
        base = {"replicas": 2, "age": 5.0, "running": 4.0, "waiting": 0.0, "gen": 100.0}
        key = (namespace or self.namespace, deployment or self.deployment, pool)
        self.values[key] = {**base, **values}

    def __call__(self, promql: str) -> list[dict[str, Any]]:
        self.queries.append(promql)
        if self.down:
            raise QueryError("ConnectionError: connection refused")
        namespaces = asked_namespaces(promql)
        names = {
            text: name
            for standby in (False, True)  # a round of resources with Standby pools asks its own forms
            for name, text in fleet_queries(self.window, namespaces, standby=standby).items()
        }
        name = names.get(promql)
        if name is None:
            return []
        out: list[dict[str, Any]] = []
        for key, v in self.values.items():
            if key[0] not in namespaces:
                continue
            labels = dict(zip(POOL_LABELS, key, strict=True))
            if name == "accepted_per_pos":
                out += [
                    r
                    for i, p in enumerate(v.get("per_pos", []))
                    for r in vector(p, **labels, position=str(i))
                ]
            elif name == "kv_capacity":
                # kv_capacity: {"On"/"Off": (num_gpu_blocks, block_size)}, as cache_config_info labels
                out += [
                    r
                    for setting, (blocks, size) in v.get("kv_capacity", {}).items()
                    for r in vector(
                        1,
                        **labels,
                        specfleet_io_speculation=setting,
                        num_gpu_blocks=str(blocks),
                        block_size=str(size),
                    )
                ]
            elif name in ("ttft_buckets", "tpot_buckets"):
                out += [r for le, rate in v.get(name, {}).items() for r in vector(rate, **labels, le=le)]
            else:
                out += vector(v.get(_VALUE_KEYS[name]), **labels)
        for sample in self.extra.get(name, []):
            labels = sample.get("metric") if isinstance(sample, dict) else None
            # What has no labels to match (a broken proxy's answer) comes back whatever was asked.
            if not isinstance(labels, dict) or labels.get("namespace") in namespaces:
                out.append(sample)
        return out
