"""The SpeculativeDeployment API (specfleet.io/v1alpha1): pydantic models, the single source of truth.

The CRD in crds/ is generated from these classes (`specfleet crd`); every field's description becomes
its `kubectl explain` text. Cross-field rules (`rules = (...)`) are enforced twice with one message:
as CEL by the apiserver and in Python by `specfleet render` and the operator.

Conventions: camelCase JSON, durations as integers named ...Seconds, no floats in spec (fractions are
milli-units or percent integers, named so), fixed structs for the two pools.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from specfleet.api import constants
from specfleet.api.base import ApiModel, Rule
from specfleet_runtime import routing_config as contract

SpeculativeMethod = Literal["eagle3", "eagle", "draft_model", "ngram", "mtp", "medusa", "suffix"]
# Methods that load a separate drafter checkpoint, so `drafter.model` must name it.
METHODS_NEEDING_MODEL: tuple[str, ...] = ("eagle3", "eagle", "draft_model", "medusa")
# Methods that must not name a drafter model (they draft from the prompt or the target's own heads).
METHODS_WITHOUT_MODEL: tuple[str, ...] = ("ngram", "suffix")
SpeculationSetting = Literal["On", "Off", "Auto"]
SpeculationMode = Literal["On", "Off"]
PoolName = constants.PoolName
MAX_SPECULATIVE_TOKENS = 10
MAX_SCHEDULE_RANGES = 16
# Flips (and adjustments) the status remembers per pool: the most an hourly budget may allow.
MAX_CHANGES_PER_HOUR = 60

# A Kubernetes resource quantity ("8", "500m", "64Gi").
Quantity = Annotated[
    str,
    Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$", max_length=32),
]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# Whether an identity header is believed: the routing contract's own type.
IdentityHeaderTrust = contract.IdentityHeaderTrust
# UpperCamelCase enum values, as the Kubernetes API conventions ask. The earlier camelCase spellings
# are deprecated for one version: accepted (the CRD's enum lists them) and read as the new ones.
RoutingFallback = Literal["OtherPool", "Reject"]
DEPRECATED_FALLBACK: dict[str, RoutingFallback] = {"otherPool": "OtherPool", "reject": "Reject"}
# The routing contract the router reads: `spec.routing` declares its fields with the contract's types and
# defaults (`render.router.routing_config` passes them through; a unit test holds the field sets equal).
_ROUTING = contract.RoutingConfig
_SHAPE = contract.ShapeRules
_SEGMENTATION = contract.AutoSegmentation


def _quote(names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


# Names that end up as vLLM argument values: one starting with "-" would be read as a flag.
NOT_A_FLAG_MESSAGE = "must not start with '-' (vLLM would read it as a flag)"


class ModelSpec(ApiModel):
    """The target model that every pool serves."""

    rules = (
        Rule(
            cel="!self.name.startsWith('-')",
            message=f"model.name {NOT_A_FLAG_MESSAGE}",
            check=lambda m: not m.name.startswith("-"),
        ),
        Rule(
            cel="!has(self.servedModelName) || !self.servedModelName.startsWith('-')",
            message=f"model.servedModelName {NOT_A_FLAG_MESSAGE}",
            check=lambda m: m.served_model_name is None or not m.served_model_name.startswith("-"),
        ),
        Rule(
            cel="!has(self.revision) || !self.revision.startsWith('-')",
            message=f"model.revision {NOT_A_FLAG_MESSAGE}",
            check=lambda m: m.revision is None or not m.revision.startswith("-"),
        ),
    )

    name: str = Field(
        min_length=1,
        max_length=512,
        description="Hugging Face model id (org/name) or a local path inside the model cache volume.",
    )
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Name clients send in the OpenAI `model` field. Defaults to the resource's name.",
    )
    revision: str | None = Field(
        default=None, max_length=128, description="Model revision (branch, tag or commit) to load."
    )


class DynamicScheduleRange(ApiModel):
    """One row of vLLM's Dynamic SD table: batches of minBatchSize..maxBatchSize draft K tokens."""

    rules = (
        Rule(
            cel="self.minBatchSize <= self.maxBatchSize",
            message="minBatchSize must not exceed maxBatchSize",
            check=lambda r: r.min_batch_size <= r.max_batch_size,
        ),
    )

    min_batch_size: int = Field(ge=1, le=65536, description="First batch size of the range (inclusive).")
    max_batch_size: int = Field(ge=1, le=65536, description="Last batch size of the range (inclusive).")
    num_speculative_tokens: int = Field(
        ge=0,
        le=MAX_SPECULATIVE_TOKENS,
        description="Tokens drafted per step at these batch sizes; 0 drafts nothing.",
    )


def _starts_at_one(ranges: list[DynamicScheduleRange] | None) -> bool:
    return ranges is None or any(r.min_batch_size == 1 for r in ranges)


def _non_overlapping(ranges: list[DynamicScheduleRange] | None) -> bool:
    # Each range's start must lie in that range alone: exactly the CEL rule below.
    return ranges is None or all(
        sum(1 for b in ranges if b.min_batch_size <= a.min_batch_size <= b.max_batch_size) == 1
        for a in ranges
    )


class RetrainTemplate(ApiModel):
    """The pod of a retrain Job: a Kubernetes PodTemplateSpec (metadata and spec)."""

    metadata: dict[str, Any] | None = Field(
        default=None, description="Labels and annotations of the retrain pod (ObjectMeta)."
    )
    spec: dict[str, Any] = Field(
        description="The retrain pod's PodSpec (containers, volumes, ...). restartPolicy defaults to Never; "
        "every container gets the observed numbers as SPECFLEET_* environment variables."
    )


class RetrainSpec(ApiModel):
    """Start a drafter retraining Job from your own pod template when a pool's acceptance drifts."""

    template: RetrainTemplate = Field(
        description="Pod template of the Job. Its containers receive SPECFLEET_POOL, SPECFLEET_MODEL, "
        "SPECFLEET_DRAFTER, SPECFLEET_BASELINE_ACCEPTANCE_LENGTH, SPECFLEET_CURRENT_ACCEPTANCE_LENGTH, "
        "SPECFLEET_DRIFT_PERCENT (and the per-position values, the resource's namespace and name)."
    )
    period_seconds: int = Field(
        default=86400,
        ge=600,
        le=31536000,
        description="At most one retrain Job per pool in this period; the last start is in "
        "status.pools.<pool>.lastRetrainTime. A finished Job is kept for one period.",
    )
    backoff_limit: int = Field(default=0, ge=0, le=10, description="Retries of a failed retrain pod.")


class DrafterSpec(ApiModel):
    """How tokens are drafted: vLLM's `--speculative-config`, used by pools while speculation is on."""

    rules = (
        Rule(
            cel="!has(self.model) || !self.model.startsWith('-')",
            message=f"drafter.model {NOT_A_FLAG_MESSAGE}",
            check=lambda d: d.model is None or not d.model.startswith("-"),
        ),
        Rule(
            cel=f"!(self.method in {_quote(METHODS_NEEDING_MODEL)}) || has(self.model)",
            message="drafter.model is required for methods eagle3, eagle, draft_model and medusa",
            check=lambda d: d.method not in METHODS_NEEDING_MODEL or d.model is not None,
        ),
        Rule(
            cel=f"!(self.method in {_quote(METHODS_WITHOUT_MODEL)}) || !has(self.model)",
            message="drafter.model must not be set for methods ngram and suffix (they draft from the prompt)",
            check=lambda d: d.method not in METHODS_WITHOUT_MODEL or d.model is None,
        ),
        Rule(
            cel="self.method == 'ngram' || (!has(self.promptLookupMin) && !has(self.promptLookupMax))",
            message="promptLookupMin and promptLookupMax apply only to method ngram",
            check=lambda d: (
                d.method == "ngram" or (d.prompt_lookup_min is None and d.prompt_lookup_max is None)
            ),
        ),
        Rule(
            cel="!has(self.promptLookupMin) || !has(self.promptLookupMax) "
            "|| self.promptLookupMin <= self.promptLookupMax",
            message="promptLookupMin must not exceed promptLookupMax",
            check=lambda d: (
                d.prompt_lookup_min is None
                or d.prompt_lookup_max is None
                or d.prompt_lookup_min <= d.prompt_lookup_max
            ),
        ),
        Rule(
            cel="!has(self.dynamicSchedule) || self.dynamicSchedule.exists(r, r.minBatchSize == 1)",
            message="dynamicSchedule must start at batch size 1",
            check=lambda d: _starts_at_one(d.dynamic_schedule),
        ),
        Rule(
            cel="!has(self.dynamicSchedule) || self.dynamicSchedule.all(a, self.dynamicSchedule.filter(b, "
            "b.minBatchSize <= a.minBatchSize && a.minBatchSize <= b.maxBatchSize).size() == 1)",
            message="dynamicSchedule ranges must not overlap",
            check=lambda d: _non_overlapping(d.dynamic_schedule),
        ),
        Rule(
            cel="!has(self.dynamicSchedule) "
            "|| self.dynamicSchedule.all(r, r.numSpeculativeTokens <= self.numSpeculativeTokens)",
            message="dynamicSchedule must not use more tokens than numSpeculativeTokens",
            check=lambda d: (
                d.dynamic_schedule is None
                or all(r.num_speculative_tokens <= d.num_speculative_tokens for r in d.dynamic_schedule)
            ),
        ),
    )

    method: SpeculativeMethod = Field(
        default="eagle3", description="vLLM speculative method (eagle3, eagle, draft_model, ngram, mtp, ...)."
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Drafter checkpoint (HF id or local path). Required for eagle3, eagle, draft_model, medusa.",
    )
    num_speculative_tokens: int = Field(
        default=3,
        ge=1,
        le=MAX_SPECULATIVE_TOKENS,
        description="K, the tokens drafted per step (1..10); also the upper bound of dynamicSchedule.",
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="Tensor parallel size of the drafter: 1 or the target's."
    )
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, le=64, description="ngram only: shortest prompt n-gram to match."
    )
    prompt_lookup_max: int | None = Field(
        default=None, ge=1, le=64, description="ngram only: longest prompt n-gram to match."
    )
    dynamic_schedule: list[DynamicScheduleRange] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SCHEDULE_RANGES,
        description="vLLM Dynamic SD: K per batch-size range, chosen per step inside the engine. "
        "Starts at batch 1, ranges do not overlap, K <= numSpeculativeTokens.",
    )
    retrain: RetrainSpec | None = Field(
        default=None,
        description="Run a Job from this template when a pool's acceptance drifts below its baseline for "
        "policy.acceptanceDrift.forSeconds (at most once per periodSeconds).",
    )


class GpuResources(ApiModel):
    """Compute requested by each engine replica."""

    gpus: int = Field(default=1, ge=0, le=64, description="nvidia.com/gpu per replica.")
    cpu: Quantity | None = Field(default=None, description="CPU request, e.g. '8'.")
    cpu_limit: Quantity | None = Field(
        default=None,
        description="CPU limit, e.g. '16'. Unset by default: a CFS quota throttles vLLM's scheduler and "
        "tokenizer threads in bursts, which shows up as token-latency spikes; set it where a namespace "
        "quota or LimitRange requires one, with headroom above the request.",
    )
    memory: Quantity | None = Field(default=None, description="Memory request and limit, e.g. '64Gi'.")


class ModelCache(ApiModel):
    """Where downloaded weights live; a PersistentVolumeClaim survives pod restarts, an emptyDir does not."""

    persistent_volume_claim_name: str | None = Field(
        default=None, max_length=253, description="Existing PVC mounted as the Hugging Face cache."
    )
    size_limit: Quantity | None = Field(
        default=None, description="Size limit of the emptyDir cache used when no PVC is given."
    )
    mount_path: str = Field(
        default="/root/.cache/huggingface", max_length=512, description="Mount path; HF_HOME points here."
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace."""

    name: str = Field(
        min_length=1, max_length=253, description="Name of the Secret, in the resource's namespace."
    )
    key: str = Field(default="token", min_length=1, max_length=253, description="Key inside the Secret.")


class Toleration(ApiModel):
    """A Kubernetes pod toleration."""

    key: str | None = Field(default=None, description="Taint key to tolerate.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty means all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


class EngineSecurity(ApiModel):
    """How far engine pods are locked down beyond what every engine gets.

    Every engine runs without privilege escalation, with all capabilities dropped, the RuntimeDefault
    seccomp profile and no service-account token. These two settings also depend on the image.
    """

    run_as_user: int | None = Field(
        default=None,
        ge=1,
        le=2147483647,
        description="Run the engine as this non-root UID (runAsNonRoot, and fsGroup so it can write the "
        "model cache). The official vLLM image runs as root, so leave unset unless the image supports it.",
    )
    read_only_root_filesystem: bool = Field(
        default=False,
        description="Mount the container's root filesystem read-only. Writable paths become explicit "
        "volumes: /tmp (an emptyDir; HOME points there, so vLLM, Triton and torch caches land in it), "
        "/dev/shm and the model cache.",
    )


class EngineOverrides(ApiModel):
    """Per-pool changes to the engine settings; unset fields inherit from spec.engine."""

    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=64, description="Overrides engine.tensorParallelSize for this pool."
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=65536, description="Overrides engine.maxNumSeqs for this pool."
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Overrides engine.maxModelLen for this pool."
    )
    gpu_memory_utilization_percent: int | None = Field(
        default=None, ge=1, le=100, description="Overrides engine.gpuMemoryUtilizationPercent for this pool."
    )
    extra_args: list[str] | None = Field(
        default=None, max_length=64, description="Replaces engine.extraArgs for this pool."
    )
    resources: GpuResources | None = Field(
        default=None, description="Replaces engine.resources for this pool."
    )
    node_selector: dict[str, str] | None = Field(default=None, description="Replaces engine.nodeSelector.")
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=32, description="Replaces engine.tolerations."
    )


class EngineSpec(ApiModel):
    """The vLLM server every pool runs, before per-pool overrides."""

    image: str = Field(
        default="vllm/vllm-openai:v0.32.0",
        min_length=1,
        max_length=512,
        description="The vLLM OpenAI-compatible server image the engines run (default from Docker Hub). Its "
        "vLLM version decides which drafter methods and Dynamic SD schedules run: one too old for the "
        "spec gives Degraded=True with reason UnsupportedConfiguration.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of engine containers."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="--tensor-parallel-size.")
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536, description="--max-num-seqs (batch cap).")
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Longest context in tokens, prompt plus output (vLLM's --max-model-len); unset: the "
        "model's own.",
    )
    gpu_memory_utilization_percent: int | None = Field(
        default=None, ge=1, le=100, description="--gpu-memory-utilization as a percent (90 means 0.9)."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Further vLLM flags. Flags the operator owns (--model, --port, --speculative-config, ...) "
        "are refused.",
    )
    resources: GpuResources = Field(default_factory=GpuResources, description="Per-replica resources.")
    model_cache: ModelCache = Field(default_factory=ModelCache, description="Model weight cache volume.")
    hf_token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding a Hugging Face token; reaches pods as env HF_TOKEN."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Engine pod node selector.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Engine pod tolerations."
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description="Engine pod affinity (Kubernetes Affinity)."
    )
    termination_grace_period_seconds: int = Field(
        default=120, ge=0, le=3600, description="Time a stopping engine gets to drain in-flight requests."
    )
    security: EngineSecurity = Field(
        default_factory=EngineSecurity, description="Non-root user and read-only root for engine pods."
    )
    startup_timeout_seconds: int = Field(
        default=1800, ge=60, le=7200, description="How long a starting engine may take to load the model."
    )


AutoscalerKind = Literal["HorizontalPodAutoscaler", "ScaledObject"]
AutoscalingMetric = Literal["RunningRequests", "WaitingRequests", "KVCacheUsage"]
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
        description="Extra pods during a rollout (capacity never drops below replicas).",
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


class TenantRule(ApiModel):
    """Send the requests of some tenants or API keys to one pool."""

    rules = (
        Rule(
            cel="size(self.tenants) > 0 || size(self.apiKeySha256) > 0",
            message="a tenant rule needs at least one tenant or apiKeySha256",
            check=lambda r: bool(r.tenants or r.api_key_sha256),
        ),
    )

    pool: PoolName = Field(description="Pool these requests go to.")
    tenants: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list,
        max_length=256,
        description="Values of the tenant header (needs routing.tenantHeaderTrust: Trusted).",
    )
    api_key_sha256: list[Sha256Hex] = Field(
        default_factory=list,
        max_length=256,
        description="Lowercase hex SHA-256 of bearer tokens (never the tokens themselves).",
    )


class ShapeRules(ApiModel):
    """Classify by request shape: a request matching any set rule is batch traffic."""

    batch_if_max_tokens_at_least: int | None = Field(
        default=_SHAPE.batch_if_max_tokens_at_least,
        ge=1,
        description="max_tokens at or above this marks a batch request.",
    )
    batch_if_n_at_least: int | None = Field(
        default=_SHAPE.batch_if_n_at_least,
        ge=2,
        description="n (completions per prompt) at or above this marks a batch request.",
    )
    batch_if_not_streaming: bool = Field(
        default=_SHAPE.batch_if_not_streaming, description="Non-streaming requests are batch."
    )


class AutoSegmentation(ApiModel):
    """A client with too many requests in flight is treated as batch traffic until it calms down."""

    enabled: bool = Field(default=_SEGMENTATION.enabled, description="Turn auto-segmentation on.")
    in_flight_threshold: int = Field(
        default=_SEGMENTATION.in_flight_threshold,
        ge=1,
        le=100000,
        description="In-flight requests above which a client counts as batch.",
    )
    calm_seconds: int = Field(
        default=_SEGMENTATION.calm_seconds,
        ge=0,
        le=86400,
        description="Time below the threshold before a client is latency again.",
    )


class RouterSpec(ApiModel):
    """The router Deployment in front of the pools."""

    replicas: int = Field(
        default=2, ge=0, le=100, description="Router pods, behind the Service named after the resource."
    )
    image: str | None = Field(
        default=None, max_length=512, description="Router image. Defaults to the operator's own image."
    )


class RoutingSpec(ApiModel):
    """How the router classifies each request into the latency or the batch pool."""

    rules = (
        Rule(
            cel="self.tenantHeaderTrust == 'Trusted' || !has(self.tenantRules) "
            "|| self.tenantRules.all(r, !has(r.tenants) || size(r.tenants) == 0)",
            message="tenant rules that list tenants need tenantHeaderTrust: Trusted (the tenant header is "
            "read only where an authenticating gateway sets it)",
            check=lambda r: r.tenant_header_trust == "Trusted" or not any(t.tenants for t in r.tenant_rules),
        ),
    )

    default_pool: PoolName = Field(
        default=_ROUTING.default_pool, description="Pool for requests no rule classifies."
    )
    pool_header: str = Field(
        default=_ROUTING.pool_header, max_length=128, description="Header that names the pool explicitly."
    )
    pool_header_trust: contract.PoolHeaderTrust = Field(
        default=_ROUTING.pool_header_trust,
        description="How far a client's own pool header is trusted. AfterTenantRules (default): it counts "
        "only where no tenant or API-key rule matched, so a client cannot move itself out of the pool "
        "its rules assign; Always: it beats every rule (only where every client is trusted); Ignored: "
        "never read.",
    )
    tenant_header: str = Field(
        default=_ROUTING.tenant_header,
        max_length=128,
        description="Header carrying the tenant name; read only where tenantHeaderTrust is Trusted.",
    )
    tenant_header_trust: IdentityHeaderTrust = Field(
        default=_ROUTING.tenant_header_trust,
        description="Whether the tenant header is believed. Ignored (default): never read, so no client "
        "can claim a tenant, and tenant rules match API keys only; Trusted: read on every request. Set "
        "Trusted only where an authenticating gateway in front of the router sets this header on every "
        "request, replacing any value the client sent.",
    )
    client_header: str = Field(
        default=_ROUTING.client_header,
        max_length=128,
        description="Header naming the client for auto-segmentation; read only where clientHeaderTrust "
        "is Trusted.",
    )
    client_header_trust: IdentityHeaderTrust = Field(
        default=_ROUTING.client_header_trust,
        description="Whether the client header is believed. Ignored (default): a client is its API key, "
        "else its network address, so no client can push another's requests into the batch pool; "
        "Trusted: read on every request. Set Trusted only where an authenticating gateway in front of "
        "the router sets this header on every request, replacing any value the client sent.",
    )
    tenant_rules: list[TenantRule] = Field(
        default_factory=list, max_length=64, description="Tenant and API-key rules, first match wins."
    )
    shape: ShapeRules = Field(
        default_factory=ShapeRules, description="Send a request to the batch pool by its shape."
    )
    auto_segmentation: AutoSegmentation = Field(
        default_factory=AutoSegmentation, description="Per-client in-flight based segmentation."
    )
    fallback: RoutingFallback = Field(
        default="OtherPool",
        description="When a pool has no ready engine: OtherPool sends its requests to the other pool, "
        "Reject answers 503. The spellings otherPool and reject are deprecated (read as OtherPool and "
        "Reject) and will be refused by a later version.",
        json_schema_extra={"enum": [*get_args(RoutingFallback), *DEPRECATED_FALLBACK]},
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router deployment settings.")

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback_spelling(cls, value: Any) -> Any:
        return DEPRECATED_FALLBACK.get(value, value) if isinstance(value, str) else value


class PrometheusSpec(ApiModel):
    """Where the policy reads engine metrics."""

    url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        max_length=512,
        description="Prometheus base URL. It must scrape the engines with their pod labels "
        "specfleet.io/deployment, specfleet.io/pool and specfleet.io/track (as specfleet_io_deployment, "
        "...); monitoring.podMonitor renders a PodMonitor that does. Without them Auto pools hold with "
        "MetricsAvailable=False.",
    )
    timeout_seconds: int = Field(default=5, ge=1, le=120, description="Timeout of each Prometheus query.")


class Thresholds(ApiModel):
    """Threshold mode: stop past the stop values, resume only past the resume values (hysteresis).

    An unset value is derived from the break-even point of the cost profile at the drafter's K, with
    `goodput.marginPercent` as the hysteresis: the concurrency values where the published acceptance
    (EAGLE, Llama-3.1-8B) predicts a speedup of 1 - margin (stop) and 1 + margin (resume), and the
    acceptance lengths that break even at batch size 1, times 1 - margin (stop) and 1 + margin (resume).
    """

    rules = (
        Rule(
            cel="!has(self.resumeAboveAcceptanceLengthMilli) || !has(self.stopBelowAcceptanceLengthMilli) "
            "|| self.resumeAboveAcceptanceLengthMilli > self.stopBelowAcceptanceLengthMilli",
            message="resumeAboveAcceptanceLengthMilli must be greater than stopBelowAcceptanceLengthMilli",
            check=lambda t: (
                t.resume_above_acceptance_length_milli is None
                or t.stop_below_acceptance_length_milli is None
                or t.resume_above_acceptance_length_milli > t.stop_below_acceptance_length_milli
            ),
        ),
        Rule(
            cel="!has(self.resumeBelowConcurrencyPerReplica) || !has(self.stopAboveConcurrencyPerReplica) "
            "|| self.resumeBelowConcurrencyPerReplica < self.stopAboveConcurrencyPerReplica",
            message="resumeBelowConcurrencyPerReplica must be less than stopAboveConcurrencyPerReplica",
            check=lambda t: (
                t.resume_below_concurrency_per_replica is None
                or t.stop_above_concurrency_per_replica is None
                or t.resume_below_concurrency_per_replica < t.stop_above_concurrency_per_replica
            ),
        ),
    )

    stop_below_acceptance_length_milli: int | None = Field(
        default=None,
        ge=1000,
        le=11000,
        description="Stop speculating when mean acceptance length (tokens/step x1000) falls below this. "
        "Default: break-even at batch size 1 for the drafter's K, times 1 - margin.",
    )
    resume_above_acceptance_length_milli: int | None = Field(
        default=None,
        ge=1000,
        le=11000,
        description="Resume only when acceptance length x1000 exceeds this. "
        "Default: break-even at batch size 1 for the drafter's K, times 1 + margin.",
    )
    stop_above_concurrency_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="Stop when running requests per replica rise above this. Default: where the "
        "cost profile and the published acceptance predict a speedup of 1 - margin.",
    )
    resume_below_concurrency_per_replica: int | None = Field(
        default=None,
        ge=0,
        le=100000,
        description="Resume only when running requests per replica fall below this. Default: where "
        "the cost profile and the published acceptance predict a speedup of 1 + margin.",
    )


class GoodputPolicy(ApiModel):
    """Goodput mode: predict speedup from acceptance, load and a step-time cost profile."""

    margin_percent: int = Field(
        default=5, ge=0, le=50, description="Turn off below 1 - margin, on above 1 + margin (hysteresis)."
    )
    retune_margin_percent: int = Field(
        default=2,
        ge=0,
        le=50,
        description="Retune K when another K predicts more than this much above the current one.",
    )
    engine_schedule: bool | None = Field(
        default=None,
        description="Let the policy give each speculating pool a Dynamic SD schedule (K per batch size "
        "inside the engine), so K follows load without a rollout. Unset: on for vLLM >= 0.32 images "
        "without drafter.dynamicSchedule; true: on for any image; false: K changes by rollout.",
    )
    cost_profile_config_map: str | None = Field(
        default=None,
        max_length=253,
        description="ConfigMap in this namespace with a step-time profile under key profile.yaml "
        "(`specfleet profile --config-map NAME` writes it); the policy decides with it instead of the "
        "published H100 Llama-3.1-8B profile. Missing or malformed: every pool holds and condition "
        "CostProfileLoaded is False with the reason.",
    )


class Reentry(ApiModel):
    """How a pool that runs without speculation learns whether turning it back on would pay."""

    canary_replicas: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Replicas of an Auto pool that keep speculation on while it is off.",
    )
    max_acceptance_age_seconds: int = Field(
        default=3600, ge=0, description="Last measured acceptance is trusted for this long after a stop."
    )


class AcceptanceDrift(ApiModel):
    """Each Auto pool's acceptance baseline, and when a fall below it counts as drift.

    The baseline is the per-position median of the first `baselineSamples` measured windows; it is
    measured again only every `baselineRefreshSeconds` and only while the pool is not drifting, so it
    never follows a falling acceptance down. Drift compares the mean acceptance length over the
    positions both measured (a lower K does not read as drift).
    """

    threshold_percent: int = Field(
        default=20,
        ge=1,
        le=99,
        description="Acceptance this many percent below the baseline is drift (condition AcceptanceDrift).",
    )
    for_seconds: int = Field(
        default=900,
        ge=0,
        le=604800,
        description="How long drift must last before AcceptanceDrift turns True (and a retrain may start).",
    )
    baseline_samples: int = Field(
        default=10,
        ge=1,
        le=32,
        description="Measured windows (policy.windowSeconds apart) whose per-position median becomes the "
        "baseline.",
    )
    baseline_refresh_seconds: int = Field(
        default=604800,
        ge=3600,
        le=31536000,
        description="Age after which the baseline is measured again (only while the pool is not drifting).",
    )


class PolicySpec(ApiModel):
    """When the operator turns speculation on or off for Auto pools."""

    mode: Literal["Threshold", "Goodput"] = Field(
        default="Goodput",
        description="Decision rule: Goodput predicts the speedup of each K from measured acceptance, load "
        "and the cost profile; Threshold compares acceptance length and concurrency with fixed values.",
    )
    prometheus: PrometheusSpec = Field(
        default_factory=PrometheusSpec, description="Where the policy reads the engines' vLLM metrics."
    )
    evaluation_interval_seconds: int = Field(
        default=30, ge=1, le=3600, description="How often the policy decides for every Auto pool."
    )
    window_seconds: int = Field(
        default=120,
        ge=5,
        le=3600,
        description="Window over which the policy averages the engines' metrics (the range of its PromQL "
        "rate() queries): longer is steadier, shorter reacts faster.",
    )
    thresholds: Thresholds = Field(
        default_factory=Thresholds, description="Settings of policy.mode Threshold."
    )
    goodput: GoodputPolicy = Field(
        default_factory=GoodputPolicy, description="Settings of policy.mode Goodput."
    )
    min_dwell_seconds: int = Field(
        default=300, ge=0, le=86400, description="Minimum time a pool stays in a mode after a flip."
    )
    cooldown_seconds: int = Field(
        default=600, ge=0, le=86400, description="Minimum time between two flips of the same deployment."
    )
    max_flips_per_hour: int = Field(
        default=4, ge=1, le=MAX_CHANGES_PER_HOUR, description="Cap on flips per pool per hour."
    )
    min_retune_interval_seconds: int = Field(
        default=120,
        ge=0,
        le=86400,
        description="Minimum time between a pool's last change and an adjustment that keeps its mode "
        "(a new K, canaries scaled down or up). Adjustments have their own budget: they do not spend "
        "dwell, cooldown or flips.",
    )
    max_retunes_per_hour: int = Field(
        default=6, ge=1, le=MAX_CHANGES_PER_HOUR, description="Cap on adjustments per pool per hour."
    )
    rollout_deadline_seconds: int = Field(
        default=1200,
        ge=60,
        le=86400,
        description="A change the policy made that has not finished rolling out after this long (a "
        "surge pod that finds no free GPU) is reverted, with reason RolloutFailed.",
    )
    reentry: Reentry = Field(default_factory=Reentry, description="Re-entry into speculation.")
    acceptance_drift: AcceptanceDrift = Field(
        default_factory=AcceptanceDrift, description="Acceptance baseline and drift of each Auto pool."
    )


class AlertSpec(ApiModel):
    """Values of the PrometheusRule's alerts that the policy does not already give.

    The acceptance stop value, the flip budget and the load limit come from `policy`; the rate window
    of every alert is `policy.windowSeconds`.
    """

    for_seconds: int = Field(
        default=300, ge=0, le=86400, description="How long a condition must hold before its alert fires."
    )
    acceptance_drop_percent: int = Field(
        default=25,
        ge=1,
        le=99,
        description="Alert when a speculating pool's acceptance length falls this many percent below its "
        "baseline (the median over acceptanceBaselineSeconds).",
    )
    acceptance_baseline_seconds: int = Field(
        default=86400,
        ge=600,
        le=2592000,
        description="Period whose median acceptance length is the pool's baseline (needs that much "
        "Prometheus retention).",
    )
    router_error_percent: int = Field(
        default=5, ge=1, le=100, description="Alert when more than this percent of router answers are 5xx."
    )
    rejected_draft_tokens_per_second_per_replica: int = Field(
        default=1000,
        ge=1,
        le=10000000,
        description="Alert when a speculating pool rejects more drafted tokens per second per replica than "
        "this while its running requests per replica exceed policy.thresholds.stopAboveConcurrencyPerReplica.",
    )


class MonitoringSpec(ApiModel):
    """How Prometheus finds the engines and the router, and which alerts it evaluates."""

    pod_monitor: bool = Field(
        default=False, description="Render a prometheus-operator PodMonitor (needs its CRD in the cluster)."
    )
    scrape_annotations: bool = Field(
        default=True, description="Put prometheus.io/scrape annotations on engine and router pods."
    )
    prometheus_rule: bool = Field(
        default=False,
        description="Render a prometheus-operator PrometheusRule with this resource's alerts (acceptance, "
        "metrics, flip budget, Degraded, engines, router errors, rejected drafts; needs its CRD).",
    )
    alerts: AlertSpec = Field(default_factory=AlertSpec, description="Alert values of the PrometheusRule.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the PodMonitor and PrometheusRule (to match a Prometheus selector).",
    )


class SpeculativeDeploymentSpec(ApiModel):
    """Desired state of a speculative-decoding fleet: one model, a drafter, two pools, a router, a policy."""

    rules = (
        Rule(
            cel="self.policy.reentry.canaryReplicas == 0 || "
            "((self.pools.latency.speculation != 'Auto' || self.policy.reentry.canaryReplicas "
            "< (has(self.pools.latency.autoscaling) ? self.pools.latency.autoscaling.maxReplicas "
            ": self.pools.latency.replicas)) && (self.pools.batch.speculation != 'Auto' || "
            "self.policy.reentry.canaryReplicas < (has(self.pools.batch.autoscaling) ? "
            "self.pools.batch.autoscaling.maxReplicas : self.pools.batch.replicas)))",
            message="policy.reentry.canaryReplicas must be less than the replicas (autoscaling.maxReplicas "
            "when autoscaled) of every Auto pool",
            check=lambda s: (
                s.policy.reentry.canary_replicas == 0
                or all(
                    p.speculation != "Auto" or s.policy.reentry.canary_replicas < p.reference_replicas
                    for p in (s.pools.latency, s.pools.batch)
                )
            ),
        ),
    )

    model: ModelSpec = Field(description="The target model every pool serves; its output is the answer.")
    drafter: DrafterSpec = Field(description="Speculative decoding settings (vLLM --speculative-config).")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM engine settings.")
    pools: Pools = Field(
        default_factory=Pools,
        description="The two pools of engines: latency (interactive traffic) and batch (throughput-bound "
        "traffic), each with its replicas or autoscaling and its speculation mode (On, Off or Auto).",
    )
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec,
        description="How the router sends each request to a pool: tenant and API-key rules, request "
        "shape, auto-segmentation of busy clients, which headers it trusts, and the router's replicas.",
    )
    policy: PolicySpec = Field(
        default_factory=PolicySpec,
        description="How the operator decides speculation and K for Auto pools from Prometheus: mode, "
        "timing, gates against flapping, re-entry canaries and acceptance drift.",
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="How Prometheus finds the engines (PodMonitor or scrape annotations) and the "
        "alerting rules rendered for this resource.",
    )


# ---- status: written only by the operator, read leniently (a damaged status must not crash it) ----


class StatusModel(BaseModel):
    """Base of status models: camelCase, tolerant of unknown fields and loose types when read back."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase dict, without unset optionals."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Condition(StatusModel):
    """A Kubernetes API convention condition."""

    type: str = Field(description="Condition type: Ready, Progressing, Degraded, ...")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    observed_generation: int | None = Field(default=None, description="metadata.generation this reflects.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")


class PoolRollout(StatusModel):
    """The policy's last change of a pool: what it replaced (to revert it) and when it settled."""

    time: str = Field(description="When the change was decided (RFC 3339).")
    reason: str = Field(default="", description="Reason of the change.")
    from_mode: SpeculationMode = Field(default="On", description="Mode before the change.")
    from_num_speculative_tokens: int | None = Field(default=None, description="K before the change.")
    from_dynamic_schedule: list[DynamicScheduleRange] | None = Field(
        default=None,
        max_length=MAX_SCHEDULE_RANGES,
        description="The policy's Dynamic SD schedule before the change.",
    )
    from_canary_replicas: int | None = Field(
        default=None, description="Canary replicas the policy ran before the change (unset: spec's)."
    )
    drafted_before: int = Field(
        default=0, description="Fewest positions any speculating engine of the pool drafted before (0: none)."
    )
    drafted_after: int = Field(
        default=0, description="Fewest positions any speculating engine of the pool drafts after (0: none)."
    )
    settled_time: str | None = Field(
        default=None, description="When the policy saw the pool settled after the change (RFC 3339)."
    )


class PoolStatus(StatusModel):
    """Observed state of one pool."""

    speculation: SpeculationMode = Field(default="On", description="Speculation mode the pool runs now.")
    replicas: int = Field(default=0, description="Pods of the pool's Deployment.")
    desired_replicas: int = Field(
        default=0,
        description="Replicas the pool's Deployments ask for now, read from them (with autoscaling: "
        "the autoscaler's count), canaries included.",
    )
    ready_replicas: int = Field(default=0, description="Ready pods.")
    updated_replicas: int = Field(default=0, description="Pods with the current template.")
    settled: bool = Field(default=False, description="The rollout to the current mode has finished.")
    num_speculative_tokens: int | None = Field(
        default=None,
        description="K the pool drafts while speculating, when the Goodput policy chose one below "
        "drafter.numSpeculativeTokens (unset: the drafter's K).",
    )
    dynamic_schedule: list[DynamicScheduleRange] | None = Field(
        default=None,
        max_length=MAX_SCHEDULE_RANGES,
        description="Dynamic SD schedule the Goodput policy chose for the pool while it speculates "
        "(policy.goodput.engineSchedule): K per batch-size range, up to numSpeculativeTokens.",
    )
    k: int | None = Field(
        default=None,
        description="Tokens the pool's engines draft per step now: the policy's K or "
        "drafter.numSpeculativeTokens while the pool speculates, 0 while it does not (kubectl's K column).",
    )
    acceptance_length: str | None = Field(
        default=None, description="Last measured mean acceptance length (tokens per step), as text."
    )
    per_position_acceptance: str | None = Field(
        default=None, description="Last measured cumulative acceptance per draft position, comma-separated."
    )
    acceptance_measured_at: str | None = Field(
        default=None, description="When acceptance was last measured (RFC 3339); used for re-entry."
    )
    running_per_replica: str | None = Field(
        default=None, description="Last observed running requests per replica, as text."
    )
    generation_tokens_per_second: str | None = Field(
        default=None, description="Last observed generated tokens per second of the whole pool, as text."
    )
    recent_load: list[str] | None = Field(
        default=None,
        max_length=16,
        description="Running requests per replica of the last evaluations, as 'RFC3339=value' (the "
        "policy's view of the load's trend).",
    )
    last_transition_time: str | None = Field(default=None, description="When speculation last flipped.")
    reason: str | None = Field(default=None, description="Why the pool is in this mode.")
    message: str | None = Field(default=None, description="Details of the last decision.")
    per_position_measured_at: list[str] | None = Field(
        default=None,
        max_length=MAX_SPECULATIVE_TOKENS,
        description="When each position of perPositionAcceptance was last measured (RFC 3339): a pool "
        "drafting fewer positions keeps the deeper ones it measured before.",
    )
    recent_flip_times: list[str] | None = Field(
        default=None,
        max_length=MAX_CHANGES_PER_HOUR,
        description="This pool's flips in the last hour (RFC 3339), for policy.maxFlipsPerHour.",
    )
    last_retune_time: str | None = Field(
        default=None, description="When the policy last adjusted the pool without flipping it."
    )
    recent_retune_times: list[str] | None = Field(
        default=None,
        max_length=MAX_CHANGES_PER_HOUR,
        description="This pool's adjustments in the last hour (RFC 3339), for policy.maxRetunesPerHour.",
    )
    canary_replicas: int | None = Field(
        default=None,
        description="Canary replicas the policy runs while the pool is off, when it scaled them below "
        "policy.reentry.canaryReplicas (far past break-even); unset: the spec's count.",
    )
    rollout: PoolRollout | None = Field(
        default=None, description="The policy's last change of the pool and how its rollout went."
    )
    acceptance_baseline: str | None = Field(
        default=None,
        description="Baseline cumulative acceptance per draft position, comma-separated (see "
        "policy.acceptanceDrift).",
    )
    acceptance_baseline_time: str | None = Field(
        default=None, description="When the baseline was set (RFC 3339)."
    )
    acceptance_baseline_drafter: str | None = Field(
        default=None,
        description="The drafter (method:model) the baseline was measured with; another drafter in the "
        "spec starts a new baseline.",
    )
    acceptance_baseline_samples: list[str] | None = Field(
        default=None,
        max_length=32,
        description="Measurements collected for the next baseline, as 'RFC3339=p1,p2,...'.",
    )
    acceptance_drift_percent: str | None = Field(
        default=None,
        description="How far the last measured acceptance length is below the baseline's, in percent "
        "(negative: above), as text.",
    )
    acceptance_drift_positions: int | None = Field(
        default=None, description="Draft positions that comparison covered (those both measured)."
    )
    acceptance_compared_length: str | None = Field(
        default=None,
        description="The last measured mean acceptance length over those positions (what drift compares "
        "with the baseline), as text.",
    )
    acceptance_drift_since: str | None = Field(
        default=None, description="Since when drift has exceeded policy.acceptanceDrift.thresholdPercent."
    )
    last_retrain_time: str | None = Field(
        default=None, description="When the last drafter retrain Job of this pool was created (RFC 3339)."
    )
    last_retrain_job: str | None = Field(default=None, description="Name of that Job.")


class PoolStatuses(StatusModel):
    """Status of both pools."""

    latency: PoolStatus = Field(default_factory=PoolStatus, description="Latency pool.")
    batch: PoolStatus = Field(default_factory=PoolStatus, description="Batch pool.")


class Decision(StatusModel):
    """One speculation flip, with the numbers that caused it."""

    time: str = Field(description="When it was decided (RFC 3339).")
    pool: PoolName = Field(description="Pool that flipped.")
    from_mode: SpeculationMode = Field(alias="from", description="Mode before.")
    to_mode: SpeculationMode = Field(alias="to", description="Mode after.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable explanation.")
    observations: dict[str, str] = Field(default_factory=dict, description="The observed values, as text.")


class SpeculativeDeploymentStatus(StatusModel):
    """Observed state, and the runtime decisions the operator owns (spec is never written)."""

    observed_generation: int | None = Field(default=None, description="Last metadata.generation reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Progressing, Degraded, ... (one per type).",
        # A map list keyed by type, as Kubernetes' own conditions: server-side apply merges by type.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    pools: PoolStatuses = Field(default_factory=PoolStatuses, description="Per-pool state.")
    history: list[Decision] = Field(
        default_factory=list, max_length=20, description="Most recent speculation decisions, newest last."
    )
