"""Render each autoscaled pool's autoscaler: a HorizontalPodAutoscaler or a KEDA ScaledObject (pure).

Both target the pool's stable Deployment (never its canary) and keep the average of one vLLM load
metric per engine at `autoscaling.target`:

- HorizontalPodAutoscaler (autoscaling/v2): a `Pods` metric named `HPA_METRIC_NAMES[metric]`, which a
  metrics adapter (prometheus-adapter) must serve from the engines' vLLM series (docs/tasks/autoscaling.md
  gives the adapter rules).
- ScaledObject (keda.sh/v1alpha1): KEDA's Prometheus scaler queries `policy.prometheus.url` for the
  pool's total; its `AverageValue` metric type divides it by the replicas, as the HPA does.
"""

from __future__ import annotations

from typing import Final

from specfleet.api.constants import PoolName
from specfleet.api.pools import AutoscalingMetric, AutoscalingSpec
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import Manifest, metadata, pool_name
from specfleet.render.engine import ENGINE_COMPONENT
from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.names import SERIES_DEPLOYMENT, SERIES_POOL, SERIES_TRACK

# The custom-metrics name of each metric: vLLM's series name with ':' (not allowed in a custom-metrics
# API path segment by prometheus-adapter's default naming) written as '_'.
HPA_METRIC_NAMES: Final[dict[AutoscalingMetric, str]] = {
    "RunningRequests": vm.REQUESTS_RUNNING.replace(":", "_"),
    "WaitingRequests": vm.REQUESTS_WAITING.replace(":", "_"),
    "KVCacheUsage": vm.KV_CACHE_USAGE.replace(":", "_"),
}
_VLLM_SERIES: Final[dict[AutoscalingMetric, str]] = {
    "RunningRequests": vm.REQUESTS_RUNNING,
    "WaitingRequests": vm.REQUESTS_WAITING,
    "KVCacheUsage": vm.KV_CACHE_USAGE,
}


def _scale_target(sd: SpeculativeDeployment, pool: PoolName) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": pool_name(sd, pool)}


def _hpa_average_value(spec: AutoscalingSpec) -> str:
    """The HPA's averageValue quantity: requests as they are; vLLM's KV-cache usage is a 0-1 fraction,
    so a percent target becomes milli-units (80 -> 800m)."""
    return f"{spec.target * 10}m" if spec.metric == "KVCacheUsage" else str(spec.target)


def render_pool_hpa(sd: SpeculativeDeployment, pool: PoolName, spec: AutoscalingSpec) -> Manifest:
    """An autoscaling/v2 HorizontalPodAutoscaler on the pool's Deployment, on a Pods metric."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(sd, pool_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            "scaleTargetRef": _scale_target(sd, pool),
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": HPA_METRIC_NAMES[spec.metric]},
                        "target": {"type": "AverageValue", "averageValue": _hpa_average_value(spec)},
                    },
                }
            ],
        },
    }


def keda_query(sd: SpeculativeDeployment, pool: PoolName, metric: AutoscalingMetric) -> str:
    """PromQL for the pool's total of the metric over its stable engines (KEDA divides by replicas).

    Series carry the pod labels Prometheus' discovery copies (as the policy's queries select them)."""
    selector = (
        f'namespace="{sd.namespace}",{SERIES_DEPLOYMENT}="{sd.name}",'
        f'{SERIES_POOL}="{pool}",{SERIES_TRACK}="stable"'
    )
    total = f"sum({_VLLM_SERIES[metric]}{{{selector}}})"
    return f"100 * {total}" if metric == "KVCacheUsage" else total


def render_pool_scaled_object(sd: SpeculativeDeployment, pool: PoolName, spec: AutoscalingSpec) -> Manifest:
    """A KEDA ScaledObject on the pool's Deployment with one Prometheus trigger."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(sd, pool_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            "scaleTargetRef": _scale_target(sd, pool),
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": sd.spec.policy.prometheus.url,
                        "query": keda_query(sd, pool, spec.metric),
                        "threshold": str(spec.target),
                    },
                }
            ],
        },
    }


def render_pool_autoscaler(sd: SpeculativeDeployment, pool: PoolName) -> Manifest | None:
    """The pool's autoscaler, or None when the pool has a fixed `replicas`."""
    spec = getattr(sd.spec.pools, pool).autoscaling
    if spec is None:
        return None
    if spec.kind == "ScaledObject":
        return render_pool_scaled_object(sd, pool, spec)
    return render_pool_hpa(sd, pool, spec)
