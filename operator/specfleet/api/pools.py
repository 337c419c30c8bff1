"""spec.pools: the latency and batch pools, each with its replicas or autoscaler and its speculation
setting."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specfleet.api.base import ApiModel, Rule
from specfleet.api.engine import EngineOverrides, Quantity
from specfleet.api.fields import SpeculationSetting

AutoscalerKind = Literal["HorizontalPodAutoscaler", "ScaledObject"]
AutoscalingMetric = Literal["RunningRequests", "WaitingRequests", "KVCacheUsage"]
RolloutStrategy = Literal["Surge", "Replace"]
FlipMethod = Literal["Restart", "Standby"]
MAX_POOL_REPLICAS = 1000


class AutoscalingSpec(ApiModel):
    """Scale the pool's engines with an autoscaler on a load metric of vLLM, instead of `replicas`.

    The operator renders the autoscaler and stops owning the replica count of the pool's Deployment,
    so the autoscaler's scale survives every resync and speculation flip. Canary Deployments are not
    autoscaled. A HorizontalPodAutoscaler reads a Pods metric that a metrics adapter (e.g.
    prometheus-adapter) serves; a KEDA ScaledObject queries `policy.prometheus.url` itself.
    """

    rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            check=lambda a: a.min_replicas <= a.max_replicas,
        ),
        Rule(
            cel="self.metric != 'KVCacheUsage' || self.target <= 100",
            message="autoscaling.target of metric KVCacheUsage is a percent of the KV cache (1-100)",
            check=lambda a: a.metric != "KVCacheUsage" or a.target <= 100,
        ),
    )

    kind: AutoscalerKind = Field(
        default="HorizontalPodAutoscaler",
        description="HorizontalPodAutoscaler (autoscaling/v2, needs a metrics adapter serving the vLLM "
        "metric as a Pods metric) or ScaledObject (KEDA's Prometheus scaler, queries "
        "policy.prometheus.url; KEDA must be installed).",
    )
    # No scale to zero: an engine-less pool reports no vLLM metric and the router sends its traffic to
    # the other pool (or rejects it), so nothing would ever scale it up again.
    min_replicas: int = Field(
        default=1, ge=1, le=MAX_POOL_REPLICAS, description="Fewest engine replicas the autoscaler keeps."
    )
    max_replicas: int = Field(
        ge=1, le=MAX_POOL_REPLICAS, description="Most engine replicas the autoscaler may run."
    )
    metric: AutoscalingMetric = Field(
        default="RunningRequests",
        description="Load metric averaged over the pool's engines: RunningRequests "
        "(vllm:num_requests_running, the batch each engine decodes: speculation pays less as it grows), "
        "WaitingRequests (vllm:num_requests_waiting, queued for lack of KV cache or batch slots) or "
        "KVCacheUsage (vllm:kv_cache_usage_perc, in percent).",
    )
    target: int = Field(
        ge=1,
        le=100000,
        description="Average value per engine the autoscaler keeps: requests for RunningRequests and "
        "WaitingRequests, percent for KVCacheUsage.",
    )


class RolloutSpec(ApiModel):
    """How the pool's engines are replaced when its speculation flips (or its K or spec changes)."""

    rules = (
        Rule(
            cel="self.flip != 'Standby' || has(self.standbyHostMemory)",
            message="rollout.standbyHostMemory is required with rollout.flip Standby: the host memory the "
            "sleeping engine's weights take per pod (the operator cannot know a model's exact size), e.g. "
            "'80Gi' for a 70B FP8 model",
            check=lambda r: r.flip != "Standby" or r.standby_host_memory is not None,
        ),
    )

    strategy: RolloutStrategy = Field(
        default="Surge",
        description="Surge: new engines start beside the old ones (maxUnavailable 0, maxSurge "
        "`maxSurge`), so capacity never dips but each flip needs one more engine's GPUs free: on a "
        "cluster whose GPUs are all allocated the new pod stays Pending and the flip is reverted "
        "(RolloutFailed). Replace: `maxUnavailable` old engines stop first and new ones start on "
        "their GPUs (maxSurge 0): no spare GPU needed, but the pool serves with replicas - "
        "maxUnavailable engines while they restart; the policy starts such a flip only when the "
        "remaining engines can carry the load and the flip's gain repays the dip.",
    )
    max_unavailable: int = Field(
        default=1,
        ge=1,
        le=MAX_POOL_REPLICAS,
        description="Replace only: engines stopped at once during a rollout (at most replicas - 1, "
        "unless the pool has one replica).",
    )
    flip: FlipMethod = Field(
        default="Restart",
        description="How a speculation flip reaches the engines. Restart (default): a rollout by "
        "`strategy`, each engine restarted with or without the drafter (minutes for a large model). "
        "Standby: each engine pod runs two vLLM engines on its GPUs, one with the drafter and one "
        "without; one serves while the other sleeps in host memory (vLLM sleep mode, level 1), and a "
        "flip drains one replica at a time, puts its engine to sleep and wakes the other (seconds). "
        "The pod's memory request then covers the sleeping engine's weights (`standbyHostMemory`; a "
        "70B FP8 model parks about 70 GB per pod). Needs a GPU vLLM image with sleep mode (CUDA or "
        "ROCm); where the engines cannot sleep the pool is Degraded and flips by `strategy`. K changes "
        "stay in the engine (Dynamic SD) and other spec changes still roll out by `strategy`.",
    )
    standby_host_memory: Quantity | None = Field(
        default=None,
        description="Standby only, and required there: host memory for the sleeping engine's weights "
        "(level 1 copies them to host RAM), added to each engine pod's memory request and limit, e.g. "
        "'80Gi' for a 70B FP8 model (the target's weights plus the drafter's, per pod). The operator "
        "cannot know a model's exact size, so it is given here. Without engine.resources.memory the pod "
        "requests this much and has no memory limit.",
    )


class LatencySlo(ApiModel):
    """The pool's latency objective: the share of requests (`percentile`) that each target must hold for.

    Measured from the engines' own histograms over the policy window (status.pools.<pool>
    sloAttainmentPercent). In Goodput mode the latency pool's speculation follows it: the setting predicted to
    meet it for the most requests (`specfleet.policy.rules.slo`); the batch pool's is only measured.
    """

    rules = (
        Rule(
            cel="has(self.timeToFirstTokenMilliseconds) || has(self.timePerOutputTokenMilliseconds)",
            message="slo needs at least one target: timeToFirstTokenMilliseconds or "
            "timePerOutputTokenMilliseconds",
            check=lambda s: (
                s.time_to_first_token_milliseconds is not None
                or s.time_per_output_token_milliseconds is not None
            ),
        ),
    )

    time_to_first_token_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=600000,
        description="Target time to first token (TTFT), in milliseconds: from the request's arrival at "
        "the vLLM server to its first generated token, queueing and prefill included (vLLM's "
        "vllm:time_to_first_token_seconds). Unset: no TTFT target.",
    )
    time_per_output_token_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=10000,
        description="Target time per output token (TPOT), in milliseconds: a request's mean time per "
        "generated token after the first, (last token - first token) / (tokens - 1) (vLLM's "
        "vllm:request_time_per_output_token_seconds). Unset: no TPOT target.",
    )
    percentile: int = Field(
        default=95,
        ge=50,
        le=99,
        description="The percent of requests that must meet each target: the objective holds while "
        "status.pools.<pool>.sloAttainmentPercent is at least this.",
    )


class PoolSpec(ApiModel):
    """One traffic pool: its size, its speculation setting and its engine overrides."""

    rules = (
        Rule(
            cel="!has(self.minAvailable) || has(self.autoscaling) || self.minAvailable <= self.replicas",
            message="minAvailable must not exceed replicas",
            check=lambda p: (
                p.min_available is None or p.autoscaling is not None or p.min_available <= p.replicas
            ),
        ),
        Rule(
            cel="!has(self.minAvailable) || !has(self.autoscaling) "
            "|| self.minAvailable <= self.autoscaling.minReplicas",
            message="minAvailable must not exceed autoscaling.minReplicas",
            check=lambda p: (
                p.min_available is None
                or p.autoscaling is None
                or p.min_available <= p.autoscaling.min_replicas
            ),
        ),
        Rule(
            cel="!has(self.rollout) || self.rollout.strategy != 'Replace' || has(self.autoscaling) "
            "|| self.replicas <= 1 || self.rollout.maxUnavailable <= self.replicas - 1",
            message="rollout.maxUnavailable must be at most replicas - 1 (a pool of one replica may stop it)",
            check=lambda p: (
                p.rollout.strategy != "Replace"
                or p.autoscaling is not None
                or p.replicas <= 1
                or p.rollout.max_unavailable <= p.replicas - 1
            ),
        ),
        Rule(
            cel="!has(self.rollout) || self.rollout.strategy != 'Replace' || !has(self.autoscaling) "
            "|| self.autoscaling.minReplicas <= 1 "
            "|| self.rollout.maxUnavailable <= self.autoscaling.minReplicas - 1",
            message="rollout.maxUnavailable must be at most autoscaling.minReplicas - 1",
            check=lambda p: (
                p.rollout.strategy != "Replace"
                or p.autoscaling is None
                or p.autoscaling.min_replicas <= 1
                or p.rollout.max_unavailable <= p.autoscaling.min_replicas - 1
            ),
        ),
    )

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_POOL_REPLICAS,
        description="Engine replicas of this pool. Not used when autoscaling is set: the autoscaler "
        "owns the Deployment's replica count.",
    )
    speculation: SpeculationSetting = Field(
        default="Auto",
        description="On or Off pins speculation; Auto lets the policy turn it on or off from Prometheus.",
    )
    max_surge: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Extra pods during a Surge rollout (capacity never drops below replicas).",
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec,
        description="Surge (default: needs one more engine's GPUs free per pool) or Replace (rolls "
        "within the pool's own GPUs, dipping capacity while engines restart).",
    )
    min_available: int | None = Field(
        default=None, ge=0, description="PodDisruptionBudget minAvailable. Defaults to replicas - 1."
    )
    engine: EngineOverrides | None = Field(default=None, description="Engine settings for this pool only.")
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale this pool with a HorizontalPodAutoscaler or a KEDA ScaledObject on a vLLM "
        "load metric; unset: `replicas` engines.",
    )
    slo: LatencySlo | None = Field(
        default=None,
        description="Latency objective of this pool (TTFT and/or TPOT targets at a percentile); the "
        "operator reports its attainment in status, and in Goodput mode steers the latency pool's "
        "speculation by it (the setting predicted to meet it for the most requests). Unset: none measured.",
    )

    @property
    def reference_replicas(self) -> int:
        """The replicas that bound canaries: `replicas`, or the most the autoscaler may run."""
        return self.replicas if self.autoscaling is None else self.autoscaling.max_replicas


class Pools(ApiModel):
    """The two pools: latency-sensitive traffic and batch traffic."""

    latency: PoolSpec = Field(
        default_factory=PoolSpec, description="Latency-sensitive (interactive) traffic."
    )
    batch: PoolSpec = Field(
        default_factory=PoolSpec, description="Throughput-oriented batch traffic (high concurrency)."
    )
