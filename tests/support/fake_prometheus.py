"""A scripted Prometheus for unit tests: answers the fleet's grouped PromQL from a table of pool values.

The e2e tier runs the same queries against a real Prometheus scraping engines.
"""

from __future__ import annotations

from typing import Any

from specfleet.metrics.prometheus import POOL_LABELS, PoolKey, QueryError, fleet_queries


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
}


class FakePrometheus:
    """`values[(namespace, deployment, pool)]` holds: drafts, accepted, draft_tokens, per_pos (list),
    running, replicas, age, ...; `set_pool` defaults to the namespace and deployment it was made for."""

    def __init__(self, namespace: str, deployment: str, window: int) -> None:
        self.namespace, self.deployment, self.window = namespace, deployment, window
        self.values: dict[PoolKey, dict[str, Any]] = {}
        self.down = False
        self.queries: list[str] = []
        self._names = {text: name for name, text in fleet_queries(window).items()}

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
        name = self._names.get(promql)
        if name is None:
            return []
        out: list[dict[str, Any]] = []
        for key, v in self.values.items():
            labels = dict(zip(POOL_LABELS, key, strict=True))
            if name == "accepted_per_pos":
                out += [
                    r
                    for i, p in enumerate(v.get("per_pos", []))
                    for r in vector(p, **labels, position=str(i))
                ]
            else:
                out += vector(v.get(_VALUE_KEYS[name]), **labels)
        return out
