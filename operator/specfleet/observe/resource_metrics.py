"""The operator's per-resource gauges, as a pure function of a SpeculativeDeployment (no I/O).

These are the series the rendered PrometheusRule and the Grafana dashboard read for what only the
operator knows: conditions, each pool's mode and K, replicas, the last measured acceptance and the
bucket each SLO target is counted at.
`specfleet.observe.gauges` exports them with prometheus_client; both share the names below.

Series carry `namespace` and `name` of the resource (kube-state-metrics' convention), so the
operator's ServiceMonitor scrapes with `honorLabels: true`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from specfleet.api.constants import POOLS
from specfleet.api.pools import LatencySlo
from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.policy.decision.realized import predicted_change
from specfleet.policy.inputs.slo_attainment import target_buckets
from specfleet_runtime import vllm_metrics as vm

CONDITION: Final = "specfleet_condition"
POOL_SPECULATING: Final = "specfleet_pool_speculating"
POOL_K: Final = "specfleet_pool_num_speculative_tokens"
POOL_REPLICAS: Final = "specfleet_pool_replicas"
POOL_READY_REPLICAS: Final = "specfleet_pool_ready_replicas"
POOL_ACCEPTANCE: Final = "specfleet_pool_acceptance_length"
POOL_ACCEPTANCE_BASELINE: Final = "specfleet_pool_acceptance_baseline_length"
POOL_ACCEPTANCE_DRIFT: Final = "specfleet_pool_acceptance_drift_percent"
POOL_SLO_BUCKET: Final = "specfleet_pool_slo_target_bucket"
POOL_CHANGE_PREDICTED: Final = "specfleet_pool_change_predicted_speedup"
POOL_CHANGE_REALIZED: Final = "specfleet_pool_change_realized_speedup"

HELP: Final[dict[str, str]] = {
    CONDITION: "1 for the status a resource's condition has now, 0 for the other two (True, False, Unknown).",
    POOL_SPECULATING: "1 while the pool's engines run with speculation, 0 without.",
    POOL_K: "Tokens the pool drafts per step while speculating (K).",
    POOL_REPLICAS: "Engine replicas the spec asks for, per pool (for an autoscaled pool: the count its "
    "Deployments ask for now, as the autoscaler set it).",
    POOL_READY_REPLICAS: "Ready engine pods of the pool's Deployment.",
    POOL_ACCEPTANCE: "Last mean acceptance length the policy measured for the pool (tokens per step).",
    POOL_ACCEPTANCE_BASELINE: "The pool's acceptance baseline (tokens per step over its baseline's positions).",
    POOL_ACCEPTANCE_DRIFT: "Percent the pool's last measured acceptance length is below its baseline "
    "(negative: above).",
    POOL_SLO_BUCKET: "1 for the vLLM histogram bucket (le, as Prometheus 3 stores it) at which a pool's SLO "
    "target (ttft or tpot) is counted: the largest bound at or under the target.",
    POOL_CHANGE_PREDICTED: "The pool's newest flip or retune whose outcome was measured: the speedup it "
    "predicted over the setting it left (status.history[].observations.predictedChangeSpeedup).",
    POOL_CHANGE_REALIZED: "The same change: generated tokens/s per replica over the first window after "
    "its rollout settled, over the window it acted on (status.history[].realized.realizedSpeedup).",
}
LABELS: Final[dict[str, tuple[str, ...]]] = {
    CONDITION: ("namespace", "name", "type", "status"),
    POOL_SPECULATING: ("namespace", "name", "pool"),
    POOL_K: ("namespace", "name", "pool"),
    POOL_REPLICAS: ("namespace", "name", "pool"),
    POOL_READY_REPLICAS: ("namespace", "name", "pool"),
    POOL_ACCEPTANCE: ("namespace", "name", "pool"),
    POOL_ACCEPTANCE_BASELINE: ("namespace", "name", "pool"),
    POOL_ACCEPTANCE_DRIFT: ("namespace", "name", "pool"),
    POOL_SLO_BUCKET: ("namespace", "name", "pool", "target", "le"),
    POOL_CHANGE_PREDICTED: ("namespace", "name", "pool", "reason"),
    POOL_CHANGE_REALIZED: ("namespace", "name", "pool", "reason"),
}
CONDITION_STATUSES: Final = ("True", "False", "Unknown")


@dataclass(frozen=True)
class Sample:
    """One gauge value: metric name, label values (in LABELS order) and the value."""

    name: str
    labels: tuple[str, ...]
    value: float


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _baseline_length(text: str | None) -> float | None:
    """1 + the sum of the baseline's per-position acceptance (None when absent or unreadable)."""
    values = [_float(x) for x in (text or "").split(",") if x]
    if not values or any(v is None for v in values):
        return None
    return 1.0 + sum(v for v in values if v is not None)


def resource_samples(body: Mapping[str, Any]) -> list[Sample]:
    """Every gauge value for one resource (a body as the API returns it); tolerant of a damaged status."""
    meta = _mapping(body.get("metadata"))
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    spec = _mapping(body.get("spec"))
    try:
        status = SpeculativeDeploymentStatus.model_validate(body.get("status") or {})
    except ValidationError:
        status = SpeculativeDeploymentStatus()
    samples: list[Sample] = []
    for cond in status.conditions:
        for value in CONDITION_STATUSES:
            samples.append(Sample(CONDITION, (ns, name, cond.type, value), float(cond.status == value)))
    drafter = _mapping(spec.get("drafter"))
    pools_spec = _mapping(spec.get("pools"))
    for pool in POOLS:
        pool_status = getattr(status.pools, pool)
        pool_spec = _mapping(pools_spec.get(pool))
        labels = (ns, name, pool)
        k = pool_status.num_speculative_tokens or _int(drafter.get("numSpeculativeTokens"), 3)
        samples += [
            Sample(POOL_SPECULATING, labels, float(pool_status.speculation == "On")),
            Sample(POOL_K, labels, float(k)),
            Sample(POOL_REPLICAS, labels, float(_wanted_replicas(pool_spec, pool_status.desired_replicas))),
            Sample(POOL_READY_REPLICAS, labels, float(pool_status.ready_replicas)),
        ]
        acceptance = _float(pool_status.acceptance_length)
        if acceptance is not None:
            samples.append(Sample(POOL_ACCEPTANCE, labels, acceptance))
        baseline = _baseline_length(pool_status.acceptance_baseline)
        if baseline is not None:
            samples.append(Sample(POOL_ACCEPTANCE_BASELINE, labels, baseline))
        drift = _float(pool_status.acceptance_drift_percent)
        if drift is not None and baseline is not None:
            samples.append(Sample(POOL_ACCEPTANCE_DRIFT, labels, drift))
        samples += _last_change(status, pool, labels)
        # The dashboard's SLO panel selects the engines' bucket by this series' `le`.
        slo = _latency_slo(pool_spec.get("slo"))
        for tb in target_buckets(slo) if slo is not None else []:
            samples.append(Sample(POOL_SLO_BUCKET, (*labels, tb.target, vm.stored_bucket_label(tb.le)), 1.0))
    return samples


def _last_change(status: SpeculativeDeploymentStatus, pool: str, labels: tuple[str, ...]) -> list[Sample]:
    """The predicted and realized speedup of the pool's newest change whose outcome was measured (none
    before one is; a side that is not a number is left out)."""
    for entry in reversed(status.history):
        if entry.pool != pool or entry.realized is None:
            continue
        predicted = _float(predicted_change(entry.observations))
        realized = _float(entry.realized.realized_speedup)
        return [
            Sample(name, (*labels, entry.reason), value)
            for name, value in ((POOL_CHANGE_PREDICTED, predicted), (POOL_CHANGE_REALIZED, realized))
            if value is not None
        ]
    return []


def _latency_slo(value: Any) -> LatencySlo | None:
    """The pool's SLO, or None when it has none or it does not validate."""
    if not isinstance(value, Mapping):
        return None
    try:
        return LatencySlo.model_validate(value)
    except ValidationError:
        return None


def _wanted_replicas(pool_spec: Mapping[str, Any], desired: int) -> int:
    """The spec's replicas, or for an autoscaled pool the count read from its Deployments."""
    if isinstance(pool_spec.get("autoscaling"), Mapping):
        return desired
    return _int(pool_spec.get("replicas"), 1)
