"""The SpeculativeDeployment's status: written only by the operator, read leniently (a damaged status
must not crash it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from specfleet.api.constants import PoolName
from specfleet.api.drafter import DynamicScheduleRange
from specfleet.api.fields import (
    MAX_CHANGES_PER_HOUR,
    MAX_SCHEDULE_RANGES,
    MAX_SPECULATIVE_TOKENS,
    SpeculationMode,
)


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


class StandbyStatus(StatusModel):
    """Whether a Standby pool's engines can sleep (rollout.flip Standby), as the operator last saw it."""

    available: bool = Field(
        description="False once an engine pod reported that its engine cannot sleep (its supervisor's "
        "termination message): the pool then runs as a Restart pool, one engine per pod, until the "
        "resource's spec changes."
    )
    message: str = Field(default="", description="Why not, in the pod's words.")
    observed_generation: int | None = Field(
        default=None,
        description="metadata.generation it was seen at: any spec change (a newer engine.image) tries "
        "Standby again.",
    )


class RealizedCheck(StatusModel):
    """The policy's check on its own prediction for a pool (Goodput mode): what its engines delivered
    against what the model predicted, per window, and the shortfall it acted on."""

    sampled_at: str = Field(description="When the last window was checked (RFC 3339).")
    off_ratio: str | None = Field(
        default=None,
        description="The engine without the drafter: generated tokens per second per replica measured "
        "over those predicted at the running requests measured, the last window the pool ran off "
        "without canaries, as text (unset: never measured; taken as 1).",
    )
    on_ratio: str | None = Field(
        default=None,
        description="The same ratio for the speculating setting the pool ran, its last window, as text.",
    )
    realized_over_predicted: str | None = Field(
        default=None,
        description="onRatio / offRatio: the share of its predicted gain over the plain engine the "
        "speculating setting delivered in its last window, as text.",
    )
    below_windows: int = Field(
        default=0,
        ge=0,
        description="Consecutive windows realizedOverPredicted stayed below 1 - "
        "policy.goodput.marginPercent while the pool speculated.",
    )
    shortfall: str | None = Field(
        default=None,
        description="Set when the policy turned the pool off because its setting did not deliver "
        "(RealizedBelowPrediction): the realizedOverPredicted it measured, by which every predicted "
        "gain of speculating is multiplied until the pool speculates again and delivers within the "
        "margin, as text.",
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
    slo_attainment_percent: str | None = Field(
        default=None,
        description="Pools with an SLO: the percent of the pool's requests within it over the last policy "
        "window, as text (rounded down to 0.1): the smaller of ttftAttainmentPercent and "
        "tpotAttainmentPercent. The engines' histograms count each target apart, so the share meeting "
        "both is at most this. Unset: no SLO, or a target without requests measured in the window.",
    )
    ttft_attainment_percent: str | None = Field(
        default=None,
        description="Pools with a TTFT target: the percent of the requests whose time to first token was "
        "within it over the last policy window (from vllm:time_to_first_token_seconds, interpolated "
        "within a bucket), as text. Unset: no target, or no request in the window.",
    )
    tpot_attainment_percent: str | None = Field(
        default=None,
        description="Pools with a TPOT target: the percent of the requests finished in the last policy "
        "window whose mean time per output token was within it (from "
        "vllm:request_time_per_output_token_seconds), as text. Unset: no target, or no request "
        "finished in the window.",
    )
    recent_load: list[str] | None = Field(
        default=None,
        max_length=16,
        description="Running requests per replica of the last evaluations, as 'RFC3339=value' (the "
        "policy's view of the load's trend).",
    )
    recent_tokens_per_second: list[str] | None = Field(
        default=None,
        max_length=16,
        description="Generated tokens per second per replica of the last evaluations, as 'RFC3339=value' "
        "(the policy's view of the arrivals' trend).",
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
    standby: StandbyStatus | None = Field(
        default=None,
        description="A Standby pool's engines could not sleep: set when a pod said so, with the "
        "generation; unset: no failure seen (or not a Standby pool).",
    )
    startup_seconds: int | None = Field(
        default=None,
        ge=0,
        description="How long the pool's engines take to start: the median, over its Ready pods that "
        "never restarted, of pod creation to the Ready condition, measured by the operator when it "
        "lists the pool's pods (a rollout, a pool short of replicas, or no measurement yet). The policy "
        "prices a flip's rollout with it; unset: an estimate for the model's size.",
    )
    standby_flip_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Standby pools (rollout.flip: Standby): how long one replica's switch takes (sleep, "
        "wake and check, after its drain), measured from the pool's own flips. The policy prices a flip "
        "with it and the drain estimated from the load at the time (one replica at a time; a drain "
        "lasts as long as the requests the replica holds); unset: the switch estimated from the "
        "weights over the host link.",
    )
    realized_check: RealizedCheck | None = Field(
        default=None,
        description="Goodput mode: the policy's check on its own predictions (what the engines "
        "delivered against what it predicted) and the shortfall it acted on.",
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
    unscraped_evaluations: int | None = Field(
        default=None,
        description="Consecutive evaluations in which Prometheus answered but had no series of the pool's "
        "Ready pods (counted up to the number that sets MetricsAvailable to PrometheusNotScraping; "
        "unset: it had some, or no pod is Ready).",
    )


class PoolStatuses(StatusModel):
    """Status of both pools."""

    latency: PoolStatus = Field(default_factory=PoolStatus, description="Latency pool.")
    batch: PoolStatus = Field(default_factory=PoolStatus, description="Batch pool.")


class RealizedChange(StatusModel):
    """What followed a flip or a retune: the pool's measured throughput per replica before it and over
    the first whole policy window after its rollout settled."""

    time: str = Field(description="When the window after the change was measured (its end, RFC 3339).")
    tokens_per_second_per_replica_before: str = Field(
        description="Generated tokens per second per reporting replica over the window the decision "
        "acted on (its observations' generationTokensPerSecond / replicasReporting), as text."
    )
    tokens_per_second_per_replica_after: str = Field(
        description="Generated tokens per second per reporting replica over the first whole policy "
        "window after the change's rollout settled (status.pools.<pool>.rollout.settledTime), as text."
    )
    running_per_replica_before: str | None = Field(
        default=None,
        description="Running requests per replica over the window before, as text: with "
        "runningPerReplicaAfter, how far the load moved between the two windows.",
    )
    running_per_replica_after: str | None = Field(
        default=None, description="Running requests per replica over the window after, as text."
    )
    realized_speedup: str = Field(
        description="tokensPerSecondPerReplicaAfter / tokensPerSecondPerReplicaBefore, as text, beside "
        "the observations' predictedChangeSpeedup (Goodput decisions: the change's predicted throughput "
        "over the setting it left). A before/after ratio under whatever "
        "load came, not a controlled measurement: the load may have moved between the two windows "
        "(compare runningPerReplicaBefore and runningPerReplicaAfter), and a pool serving all that "
        "arrives produces the same tokens whatever its setting."
    )


class Decision(StatusModel):
    """One speculation flip, with the numbers that caused it."""

    time: str = Field(description="When it was decided (RFC 3339).")
    pool: PoolName = Field(description="Pool that flipped.")
    from_mode: SpeculationMode = Field(alias="from", description="Mode before.")
    to_mode: SpeculationMode = Field(alias="to", description="Mode after.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable explanation.")
    observations: dict[str, str] = Field(default_factory=dict, description="The observed values, as text.")
    realized: RealizedChange | None = Field(
        default=None,
        description="Flips and retunes: the throughput per replica measured before and after, written "
        "once, when a whole policy window has been measured after the change's rollout settled (unset: "
        "not yet, superseded by a later change of the pool first, or not measured).",
    )


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
