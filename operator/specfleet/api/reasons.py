"""Condition types and CamelCase reasons, in one place (Kubernetes API conventions); what each means and
what to do about it is in `api/reason_docs.py`."""

from __future__ import annotations

from typing import Final

from specfleet.api import constants

# Condition types: adjectives, as the conventions ask.
READY: Final = "Ready"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
METRICS_AVAILABLE: Final = "MetricsAvailable"
SPECULATION_SETTLED: Final = "SpeculationSettled"
ACCEPTANCE_DRIFT: Final = "AcceptanceDrift"
# Set only while policy.goodput.costProfileConfigMap names a ConfigMap (or just after it stops).
COST_PROFILE_LOADED: Final = "CostProfileLoaded"

# Reasons.
ALL_POOLS_READY: Final = "AllPoolsReady"
POOLS_NOT_READY: Final = "PoolsNotReady"
# Why pods of a pool do not become ready (Ready=False reasons, from the pods and Deployments).
UNSCHEDULABLE: Final = "Unschedulable"
IMAGE_PULL_FAILED: Final = "ImagePullFailed"
CONTAINER_CONFIG_ERROR: Final = "ContainerConfigError"
CRASH_LOOP: Final = "CrashLoopBackOff"
OOM_KILLED: Final = "OOMKilled"
PROGRESS_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"
# The drafter preflight (the engine pod's init container) found the drafter does not fit the target.
DRAFTER_INCOMPATIBLE: Final = "DrafterIncompatible"
# A Standby pool's engine cannot sleep (its pod's supervisor said so): the pool runs as a Restart pool.
STANDBY_UNAVAILABLE: Final = "StandbyUnavailable"
ROLLING_OUT: Final = "RollingOut"
ROLLOUT_COMPLETE: Final = "RolloutComplete"
INVALID_SPEC: Final = "InvalidSpec"
UNSUPPORTED_CONFIGURATION: Final = "UnsupportedConfiguration"
# vLLM would refuse to start a pool's engines: the weights or one maxModelLen sequence do not fit.
INSUFFICIENT_GPU_MEMORY: Final = "InsufficientGPUMemory"
APPLY_FAILED: Final = "ApplyFailed"
AS_EXPECTED: Final = "AsExpected"
METRICS_OK: Final = "MetricsOK"
METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
# Prometheus answers, but has had no series of a pool's Ready pods for a few evaluations.
PROMETHEUS_NOT_SCRAPING: Final = "PrometheusNotScraping"
COST_PROFILE_FROM_CONFIG_MAP: Final = "ProfileFromConfigMap"
COST_PROFILE_UNAVAILABLE: Final = "CostProfileUnavailable"
COST_PROFILE_DEFAULT: Final = "DefaultProfile"
NO_AUTO_POOLS: Final = "NoAutoPools"
POOLS_SETTLED: Final = "PoolsSettled"
POOLS_TRANSITIONING: Final = "PoolsTransitioning"
# AcceptanceDrift condition reasons.
ACCEPTANCE_BELOW_BASELINE: Final = "AcceptanceBelowBaseline"
ACCEPTANCE_NEAR_BASELINE: Final = "AcceptanceNearBaseline"

# Event reasons.
EVENT_APPLIED: Final = "ChildrenApplied"
EVENT_RESTORED: Final = "DriftCorrected"
EVENT_PRUNED: Final = "ChildrenPruned"
EVENT_POOL_FAILING: Final = "PoolNotReady"
EVENT_DEGRADED: Final = "Degraded"
EVENT_RECOVERED: Final = "Recovered"
EVENT_SPECULATION_ON: Final = "SpeculationOn"
EVENT_SPECULATION_OFF: Final = "SpeculationOff"
EVENT_SPECULATION_RETUNED: Final = "SpeculationRetuned"
EVENT_METRICS_UNAVAILABLE: Final = "MetricsUnavailable"
EVENT_PROMETHEUS_NOT_SCRAPING: Final = "PrometheusNotScraping"
EVENT_COST_PROFILE_UNAVAILABLE: Final = "CostProfileUnavailable"
EVENT_ROLLOUT_FAILED: Final = "RolloutFailed"
EVENT_CANARIES_SCALED: Final = "CanariesScaled"
EVENT_ACCEPTANCE_BASELINE: Final = "AcceptanceBaselineSet"
EVENT_ACCEPTANCE_DRIFT: Final = "AcceptanceDrift"
EVENT_ACCEPTANCE_RECOVERED: Final = "AcceptanceRecovered"
EVENT_RETRAIN_CREATED: Final = "RetrainJobCreated"
EVENT_RETRAIN_FAILED: Final = "RetrainJobFailed"
EVENT_STANDBY_FLIPPED: Final = "StandbyFlipped"

# Policy decision reasons (status history, pool status `reason`, Events, the decisions metric).
# Holds: a gate is closed.
ROLLOUT_IN_PROGRESS: Final = "RolloutInProgress"
MIN_DWELL: Final = "MinDwell"
COOLDOWN: Final = "Cooldown"
FLIP_BUDGET_EXHAUSTED: Final = "FlipBudgetExhausted"
MIN_RETUNE_INTERVAL: Final = "MinRetuneInterval"
RETUNE_BUDGET_EXHAUSTED: Final = "RetuneBudgetExhausted"
OTHER_POOL_FLIPPING: Final = "OtherPoolFlipping"
# Threshold mode.
ACCEPTANCE_BELOW_THRESHOLD: Final = "AcceptanceBelowThreshold"
CONCURRENCY_ABOVE_THRESHOLD: Final = "ConcurrencyAboveThreshold"
CONDITIONS_RECOVERED: Final = "ConditionsRecovered"
ACCEPTANCE_STILL_LOW: Final = "AcceptanceStillLow"
CONCURRENCY_STILL_HIGH: Final = "ConcurrencyStillHigh"
SPECULATION_PAYS: Final = "SpeculationPays"
# Both modes.
PROBE_ACCEPTANCE: Final = "ProbeAcceptance"
ROLLOUT_FAILED: Final = "RolloutFailed"
REPLACE_WOULD_OVERLOAD: Final = "ReplaceWouldOverload"
REPLACE_DIP_NOT_REPAID: Final = "ReplaceDipNotRepaid"
STANDBY_WOULD_OVERLOAD: Final = "StandbyWouldOverload"
STANDBY_DIP_NOT_REPAID: Final = "StandbyDipNotRepaid"
CANARIES_SCALED_DOWN: Final = "CanariesScaledDown"
CANARIES_SCALED_UP: Final = "CanariesScaledUp"
# Goodput mode.
GOODPUT_BELOW_BREAK_EVEN: Final = "GoodputBelowBreakEven"
GOODPUT_ABOVE_BREAK_EVEN: Final = "GoodputAboveBreakEven"
GOODPUT_WITHIN_MARGIN: Final = "GoodputWithinMargin"
GOODPUT_RETUNE: Final = "GoodputRetune"
GOODPUT_MEMORY_BOUND: Final = "GoodputMemoryBound"
GOODPUT_OVERLOADED: Final = "GoodputOverloaded"
SLO_TTFT_BOUND: Final = "SloTtftBound"
SLO_TPOT_BOUND: Final = "SloTpotBound"
# Every setting meets the SLO alike; the one that serves more arrivals keeps it through a rise of the load.
SLO_HEADROOM: Final = "SloHeadroom"
# The reasons of a decision the pool's SLO made (a pool the SLO keeps off runs no canaries).
SLO_REASONS: Final = frozenset({SLO_TTFT_BOUND, SLO_TPOT_BOUND, SLO_HEADROOM})
# The speculating setting delivered less of its predicted gain than the margin allows, window after window.
REALIZED_BELOW_PREDICTION: Final = "RealizedBelowPrediction"

# Condition type present only while a pool is autoscaled: whether its autoscaler can scale (reads its
# metric), and its reasons (a failing autoscaler's own reason is used as it is).
AUTOSCALING_ACTIVE: Final = "AutoscalingActive"
AUTOSCALERS_ACTIVE: Final = "AutoscalersActive"
AUTOSCALER_PENDING: Final = "AutoscalerPending"
AUTOSCALER_INACTIVE: Final = "AutoscalerInactive"

# Condition type present only in gateway mode (spec.routing.gateway): whether the Gateways accepted the
# HTTPRoute and the InferencePools (their Accepted and ResolvedRefs), and its reasons.
GATEWAY_ACCEPTED: Final = "GatewayAccepted"
ROUTES_ACCEPTED: Final = "RoutesAccepted"
ROUTES_PENDING: Final = "RoutesPending"
ROUTES_NOT_ACCEPTED: Final = "RoutesNotAccepted"


def troubleshooting_url(reason: str) -> str:
    """The troubleshooting page's entry for a reason (the page's heading ids are the lowercased names)."""
    return f"{constants.DOCS_URL}troubleshooting/#{reason.lower()}"


def with_link(message: str, reason: str) -> str:
    """A condition or Event message that ends with where the reason is explained."""
    return f"{message} (see {troubleshooting_url(reason)})"
