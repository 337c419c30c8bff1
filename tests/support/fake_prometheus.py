"""A scripted Prometheus for unit tests: answers the policy's PromQL from a table of pool values.

The e2e tier runs the same queries against a real Prometheus scraping engines.
"""

from __future__ import annotations

from typing import Any

from specfleet.metrics.prometheus import PoolSelector, QueryError, pool_queries


def vector(value: float | None, **labels: str) -> list[dict[str, Any]]:
    return [] if value is None else [{"metric": labels, "value": [0, str(value)]}]


class FakePrometheus:
    """`values[pool]` holds: drafts, accepted, draft_tokens, per_pos (list), running, replicas, age, ..."""

    def __init__(self, namespace: str, deployment: str, window: int) -> None:
        self.namespace, self.deployment, self.window = namespace, deployment, window
        self.values: dict[str, dict[str, Any]] = {}
        self.down = False
        self.queries: list[str] = []

    def set_pool(self, pool: str, **values: Any) -> None:
        base = {"replicas": 2, "age": 5.0, "running": 4.0, "waiting": 0.0, "gen": 100.0}
        self.values[pool] = {**base, **values}

    def __call__(self, promql: str) -> list[dict[str, Any]]:
        self.queries.append(promql)
        if self.down:
            raise QueryError("ConnectionError: connection refused")
        for pool, v in self.values.items():
            queries = pool_queries(PoolSelector(self.namespace, self.deployment, pool), self.window)
            for name, text in queries.items():
                if text == promql:
                    return self._answer(name, v)
        return []

    @staticmethod
    def _answer(name: str, v: dict[str, Any]) -> list[dict[str, Any]]:
        if name == "accepted_per_pos":
            return [r for i, p in enumerate(v.get("per_pos", [])) for r in vector(p, position=str(i))]
        key = {
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
        }[name]
        return vector(v.get(key))
