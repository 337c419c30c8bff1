"""spec.model and spec.engine: the target model and the vLLM server every pool runs, and the
per-pool overrides of its settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from specfleet.api.base import ApiModel, Rule
from specfleet.api.fields import NOT_A_FLAG_MESSAGE

# A Kubernetes resource quantity ("8", "500m", "64Gi").
Quantity = Annotated[
    str,
    Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$", max_length=32),
]


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

    rules = (
        Rule(
            cel="!has(self.readOnly) || !self.readOnly || has(self.persistentVolumeClaimName)",
            message="modelCache.readOnly needs modelCache.persistentVolumeClaimName: an emptyDir cache "
            "starts empty, so a read-only one could never hold the weights",
            check=lambda c: not c.read_only or c.persistent_volume_claim_name is not None,
        ),
    )

    persistent_volume_claim_name: str | None = Field(
        default=None, max_length=253, description="Existing PVC mounted as the Hugging Face cache."
    )
    size_limit: Quantity | None = Field(
        default=None, description="Size limit of the emptyDir cache used when no PVC is given."
    )
    mount_path: str = Field(
        default="/root/.cache/huggingface", max_length=512, description="Mount path; HF_HOME points here."
    )
    read_only: bool = Field(
        default=False,
        description="Mount the PVC read-only (a ReadOnlyMany claim, or any claim a Job filled beforehand) "
        "and set HF_HUB_OFFLINE=1: engines load the weights from the cache and never download, so a "
        "checkpoint missing from it fails the engine's start instead. Needs persistentVolumeClaimName.",
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
