"""The Grafana dashboard for specfleet fleets, built in Python from the shared metric names (pure).

`charts/specfleet/dashboards/specfleet.json` is generated from it (`make dashboard`; a unit test
compares the committed file with a fresh build) and shipped by the chart as a ConfigMap the Grafana
sidecar picks up. Engine series are selected by the labels the PodMonitor (or a Kubernetes SD
labelmap) copies from the pods; the operator's per-resource gauges by `namespace` and `name`.
"""

from __future__ import annotations

import json
from typing import Any, Final

from specfleet.observe import resource_metrics as rm
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import BY_POOL, DECISIONS, FLIPS, ROUTER_REQUESTS, SERIES_DEPLOYMENT, SERIES_POOL

UID = "specfleet-fleet"
ENGINES = f'namespace=~"$namespace",{SERIES_DEPLOYMENT}=~"$deployment"'
RESOURCES = 'namespace=~"$namespace",name=~"$deployment"'
POOL_LEGEND = f"{{{{{SERIES_DEPLOYMENT}}}}} {{{{{SERIES_POOL}}}}}"
RATE = "$__rate_interval"


# Panels with data only once a pool's flip or retune has been measured after its rollout settled.
CHANGE_PANEL = "Each change: predicted vs realized speedup"
AFTER_A_CHANGE: Final = frozenset({CHANGE_PANEL})


def _rate_by_pool(metric: str, extra: str = "") -> str:
    return f"sum by ({BY_POOL}{extra}) (rate({metric}{{{ENGINES}}}[{RATE}]))"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by ({BY_POOL}, le) (rate({histogram}_bucket{{{ENGINES}}}[{RATE}])))"


def _share_within_slo_target(target: str, histogram: str) -> str:
    """Per pool with an SLO: the share of requests in the bucket its `target` (ttft, tpot) is counted at.

    The operator's `specfleet_pool_slo_target_bucket` names that bucket (the alerts' choice: the largest
    bound at or under the target); the engines' bucket series are kept where their pool and `le` match it.
    """
    # The operator's gauges name the resource and pool `name` and `pool`; the engines' series otherwise.
    chosen = f'{rm.POOL_SLO_BUCKET}{{{RESOURCES},target="{target}"}}'
    chosen = f'label_replace({chosen}, "{SERIES_DEPLOYMENT}", "$1", "name", "(.*)")'
    chosen = f'label_replace({chosen}, "{SERIES_POOL}", "$1", "pool", "(.*)")'
    # vLLM writes le="1.0", Prometheus 3 stores "1" and so does the gauge: compare without the ".0".
    buckets = f'label_replace(rate({histogram}_bucket{{{ENGINES}}}[{RATE}]), "le", "$1", "le", "(.+)[.]0")'
    within = f"sum by ({BY_POOL}) (\n  {buckets}\n  and on ({BY_POOL}, le) {chosen}\n)"
    return f"{within}\n/ {_rate_by_pool(histogram + '_count')}"


def _target(expr: str, legend: str) -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend}


def _panel(
    title: str, description: str, targets: list[dict[str, Any]], unit: str = "short"
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": targets,
    }


def panels() -> list[dict[str, Any]]:
    """Every panel, in reading order (two per row)."""
    drafts = _rate_by_pool(vm.SPEC_DRAFTS)
    return [
        _panel(
            "Acceptance length per pool",
            "Mean tokens per speculative step (1 + accepted / drafts): the first-class signal of a drafter.",
            [_target(f"1 + {_rate_by_pool(vm.SPEC_ACCEPTED_TOKENS)} / {drafts}", POOL_LEGEND)],
        ),
        _panel(
            "Acceptance per draft position",
            "Share of drafts whose token at each position was accepted (falls with position).",
            [
                _target(
                    f"{_rate_by_pool(vm.SPEC_ACCEPTED_PER_POS, ', ' + vm.LABEL_POSITION)}\n"
                    f"/ on ({BY_POOL}) group_left {drafts}",
                    POOL_LEGEND + " position {{position}}",
                )
            ],
            unit="percentunit",
        ),
        _panel(
            "Drafted vs accepted tokens/s",
            "Draft tokens proposed and accepted per second; the gap is verification work thrown away.",
            [
                _target(_rate_by_pool(vm.SPEC_DRAFT_TOKENS), POOL_LEGEND + " drafted"),
                _target(_rate_by_pool(vm.SPEC_ACCEPTED_TOKENS), POOL_LEGEND + " accepted"),
            ],
        ),
        _panel(
            "Speculation mode and K per pool",
            "From the operator: 1 while a pool speculates, 0 without; K is the tokens drafted per step.",
            [
                _target(f"{rm.POOL_SPECULATING}{{{RESOURCES}}}", "{{name}} {{pool}} speculating"),
                _target(f"{rm.POOL_K}{{{RESOURCES}}}", "{{name}} {{pool}} K"),
            ],
        ),
        _panel(
            "Flips and decisions by reason",
            "Speculation flips and policy decisions per interval, from the operator's counters.",
            [
                _target(f"sum by (pool, to) (increase({FLIPS}[{RATE}]))", "flip {{pool}} to {{to}}"),
                _target(f"sum by (pool, reason) (increase({DECISIONS}[{RATE}]))", "{{pool}} {{reason}}"),
            ],
        ),
        _panel(
            "Running and waiting requests per replica",
            "vLLM's running and waiting requests of every engine: the load the policy weighs.",
            [
                _target(f"{vm.REQUESTS_RUNNING}{{{ENGINES}}}", f"{{{{{SERIES_POOL}}}}} {{{{pod}}}} running"),
                _target(f"{vm.REQUESTS_WAITING}{{{ENGINES}}}", f"{{{{{SERIES_POOL}}}}} {{{{pod}}}} waiting"),
            ],
        ),
        _panel(
            "KV-cache usage",
            "Fraction of each engine's KV cache in use (a drafter takes some of it).",
            [_target(f"{vm.KV_CACHE_USAGE}{{{ENGINES}}}", f"{{{{{SERIES_POOL}}}}} {{{{pod}}}}")],
            unit="percentunit",
        ),
        _panel(
            "Time to first token p50 / p99",
            "Per pool, from vLLM's histogram.",
            [
                _target(_quantile(0.5, vm.TIME_TO_FIRST_TOKEN), POOL_LEGEND + " p50"),
                _target(_quantile(0.99, vm.TIME_TO_FIRST_TOKEN), POOL_LEGEND + " p99"),
            ],
            unit="s",
        ),
        _panel(
            "Share of requests within the SLO's TTFT / TPOT targets",
            "Per pool with an SLO: the share of requests at or under the bucket each target is counted "
            "at, the largest of vLLM's bucket bounds at or under it (as the burn-rate alerts count). "
            "Between two bounds this is lower than status's sloAttainmentPercent, which interpolates; "
            "each target apart, not the share meeting both.",
            [
                _target(_share_within_slo_target("ttft", vm.TIME_TO_FIRST_TOKEN), POOL_LEGEND + " TTFT"),
                _target(_share_within_slo_target("tpot", vm.TIME_PER_OUTPUT_TOKEN), POOL_LEGEND + " TPOT"),
            ],
            unit="percentunit",
        ),
        _panel(
            "Inter-token latency p50 / p99",
            "Per pool, from vLLM's histogram: what speculation is meant to lower.",
            [
                _target(_quantile(0.5, vm.INTER_TOKEN_LATENCY), POOL_LEGEND + " p50"),
                _target(_quantile(0.99, vm.INTER_TOKEN_LATENCY), POOL_LEGEND + " p99"),
            ],
            unit="s",
        ),
        _panel(
            "Router requests by class and pool",
            "Requests per second by the pool a request was classified into and the pool that served it.",
            [
                _target(
                    f"sum by ({SERIES_DEPLOYMENT}, class, pool, code) (rate({ROUTER_REQUESTS}{{{ENGINES}}}[{RATE}]))",
                    f"{{{{{SERIES_DEPLOYMENT}}}}} class {{{{class}}}} pool {{{{pool}}}} {{{{code}}}}",
                )
            ],
            unit="reqps",
        ),
        _panel(
            CHANGE_PANEL,
            "From the operator's status: the newest flip or retune of each pool whose outcome was measured, "
            "the speedup it predicted over the setting it left beside tokens/s per replica over the first "
            "window after its rollout settled, over the window it acted on (under whatever load came).",
            [
                _target(
                    f"{rm.POOL_CHANGE_PREDICTED}{{{RESOURCES}}}", "{{name}} {{pool}} {{reason}} predicted"
                ),
                _target(f"{rm.POOL_CHANGE_REALIZED}{{{RESOURCES}}}", "{{name}} {{pool}} {{reason}} realized"),
            ],
        ),
        _panel(
            "Acceptance the policy last measured",
            "From the operator's status: the acceptance length each decision used.",
            [_target(f"{rm.POOL_ACCEPTANCE}{{{RESOURCES}}}", "{{name}} {{pool}}")],
        ),
    ]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def dashboard() -> dict[str, Any]:
    """The whole dashboard document."""
    laid_out = []
    for index, panel in enumerate(panels()):
        refs = [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(panel["targets"])]
        grid = {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)}
        laid_out.append({**panel, "id": index + 1, "gridPos": grid, "targets": refs})
    return {
        "uid": UID,
        "title": "specfleet: speculative-decoding fleet",
        "description": "Acceptance, speculation mode and K, load, latency and routing of SpeculativeDeployments.",
        "tags": ["specfleet", "vllm", "speculative-decoding"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("namespace", "Namespace", f"label_values({vm.REQUESTS_RUNNING}, namespace)"),
                _variable(
                    "deployment",
                    "SpeculativeDeployment",
                    f'label_values({vm.REQUESTS_RUNNING}{{namespace=~"$namespace"}}, {SERIES_DEPLOYMENT})',
                ),
            ]
        },
        "panels": laid_out,
    }


def dashboard_json() -> str:
    """The dashboard as committed in the chart (stable key order, trailing newline)."""
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    print(dashboard_json(), end="")
