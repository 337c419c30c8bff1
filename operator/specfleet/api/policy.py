"""spec.policy: when the operator turns speculation on or off, and picks K, for Auto pools."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specfleet.api.base import ApiModel, Rule
from specfleet.api.fields import MAX_CHANGES_PER_HOUR


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
        default=600,
        ge=0,
        le=86400,
        description="Minimum time between flips of two different pools of the deployment (a pool's own "
        "flips are spaced by minDwellSeconds).",
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
