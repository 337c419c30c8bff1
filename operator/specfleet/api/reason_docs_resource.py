"""The condition types, and the reasons of the resource's own state: its children and pods (Ready,
Progressing, Degraded), its metrics and cost profile, acceptance drift, the Events of reconciling, and
the autoscaling and gateway conditions. `api/reason_docs.py` merges these with the policy's decision
reasons (`api/reason_docs_policy.py`) into the troubleshooting page's table."""

from __future__ import annotations

from typing import Final

from specfleet.api.reason_docs_base import NOTHING, ReasonDoc
from specfleet.api.reasons import (
    ACCEPTANCE_BELOW_BASELINE,
    ACCEPTANCE_DRIFT,
    ACCEPTANCE_NEAR_BASELINE,
    ALL_POOLS_READY,
    APPLY_FAILED,
    AS_EXPECTED,
    AUTOSCALER_INACTIVE,
    AUTOSCALER_PENDING,
    AUTOSCALERS_ACTIVE,
    AUTOSCALING_ACTIVE,
    CONTAINER_CONFIG_ERROR,
    COST_PROFILE_DEFAULT,
    COST_PROFILE_FROM_CONFIG_MAP,
    COST_PROFILE_LOADED,
    COST_PROFILE_UNAVAILABLE,
    CRASH_LOOP,
    DEGRADED,
    DRAFTER_INCOMPATIBLE,
    EVENT_ACCEPTANCE_BASELINE,
    EVENT_ACCEPTANCE_DRIFT,
    EVENT_ACCEPTANCE_RECOVERED,
    EVENT_APPLIED,
    EVENT_CANARIES_SCALED,
    EVENT_DEGRADED,
    EVENT_POOL_FAILING,
    EVENT_PRUNED,
    EVENT_RECOVERED,
    EVENT_RESTORED,
    EVENT_RETRAIN_CREATED,
    EVENT_RETRAIN_FAILED,
    EVENT_SPECULATION_OFF,
    EVENT_SPECULATION_ON,
    EVENT_SPECULATION_RETUNED,
    EVENT_STANDBY_FLIPPED,
    GATEWAY_ACCEPTED,
    IMAGE_PULL_FAILED,
    INSUFFICIENT_GPU_MEMORY,
    INVALID_SPEC,
    METRICS_AVAILABLE,
    METRICS_OK,
    METRICS_UNAVAILABLE,
    NO_AUTO_POOLS,
    OOM_KILLED,
    POOLS_NOT_READY,
    POOLS_SETTLED,
    POOLS_TRANSITIONING,
    PROGRESS_DEADLINE_EXCEEDED,
    PROGRESSING,
    PROMETHEUS_NOT_SCRAPING,
    READY,
    ROLLING_OUT,
    ROLLOUT_COMPLETE,
    ROUTES_ACCEPTED,
    ROUTES_NOT_ACCEPTED,
    ROUTES_PENDING,
    SPECULATION_SETTLED,
    STANDBY_UNAVAILABLE,
    UNSCHEDULABLE,
    UNSUPPORTED_CONFIGURATION,
)

CONDITION_DOCS: Final[dict[str, str]] = {
    READY: "Every pool has as many ready engines as it asks for, and every child was applied.",
    PROGRESSING: "A rollout is under way: a spec change, a speculation flip or a new K.",
    DEGRADED: "The operator cannot make what the spec asks for; the reason says why.",
    METRICS_AVAILABLE: "Prometheus answered with fresh numbers for every Auto pool; False holds every pool.",
    SPECULATION_SETTLED: "No pool is changing its speculation mode or K.",
    ACCEPTANCE_DRIFT: "A pool's measured acceptance length is below its own baseline (policy.acceptanceDrift).",
    COST_PROFILE_LOADED: "The cost profile named in policy.goodput.costProfileConfigMap was read and is valid.",
    AUTOSCALING_ACTIVE: "Present while a pool is autoscaled: whether its autoscalers can read their metric.",
    GATEWAY_ACCEPTED: "Present in gateway mode: whether every Gateway accepted the HTTPRoute and the "
    "InferencePools and resolved their references; the message also names the routing rules a route "
    "cannot express.",
}

# Ready, Progressing, Degraded, MetricsAvailable, CostProfileLoaded, SpeculationSettled, AcceptanceDrift
# and the Events of reconciling, in the page's order (the policy's decisions follow them there).
RESOURCE_REASON_DOCS: Final[dict[str, ReasonDoc]] = {
    ALL_POOLS_READY: ReasonDoc("Ready", "Every pool has its ready replicas.", NOTHING),
    POOLS_NOT_READY: ReasonDoc(
        "Ready",
        "Some pool has fewer ready engines than it asks for, or some child could not be applied. The message "
        "lists the ready/desired count per pool.",
        "Usually engines are still starting (model download and load take minutes). If it lasts, "
        "`kubectl get pods -l specfleet.io/deployment=NAME` and `kubectl describe pod` show why; a more "
        "specific reason replaces this one when the pods say what is wrong.",
    ),
    UNSCHEDULABLE: ReasonDoc(
        "Ready, Progressing",
        "An engine pod cannot be scheduled: no node has the GPUs, CPU or memory it requests, or its "
        "nodeSelector, affinity or tolerations match no node. On Ready when the pool is short of engines; "
        "on Progressing when only a rollout's new pod waits (a surge pod with no free GPU: the old engines "
        "keep serving and Ready stays True).",
        "Check the GPU device plugin runs (`kubectl describe node` shows `nvidia.com/gpu`), lower "
        "`engine.resources`, or add nodes. A speculation flip rolls with a surge pod by default: keep one "
        "engine's worth of GPUs free per pool, or set the pool's `rollout.strategy: Replace`.",
    ),
    IMAGE_PULL_FAILED: ReasonDoc(
        "Ready",
        "The engine image (or the operator's image, for the drafter-preflight init container) cannot be "
        "pulled.",
        "Check `engine.image` and the operator's `image.repository`/`image.tag`; mirror them for a cluster "
        "without Internet access; add `imagePullSecrets` for a private registry.",
    ),
    CONTAINER_CONFIG_ERROR: ReasonDoc(
        "Ready",
        "The engine container cannot be created, most often because a Secret or ConfigMap it references "
        "does not exist.",
        "Check that the Secret named in `engine.hfTokenSecretRef` exists in the resource's namespace "
        "with the key given; `kubectl describe pod` names what is missing.",
    ),
    CRASH_LOOP: ReasonDoc(
        "Ready",
        "An engine container keeps exiting: vLLM failed to start.",
        "Read `kubectl logs POD --previous`. Common causes: a gated model without a Hugging Face token "
        "(`engine.hfTokenSecretRef`), too little GPU memory for the model and drafter (raise "
        "`tensorParallelSize` or lower `maxModelLen`), an `extraArgs` flag this vLLM does not know.",
    ),
    OOM_KILLED: ReasonDoc(
        "Ready",
        "An engine container was killed for exceeding its memory limit (host memory, not GPU memory).",
        "Raise `engine.resources.memory` (the limit equals the request).",
    ),
    PROGRESS_DEADLINE_EXCEEDED: ReasonDoc(
        "Ready",
        "A pool's Deployment made no progress within its deadline (`engine.startupTimeoutSeconds` plus "
        "10 minutes).",
        "Look at the pods as for PoolsNotReady; a large model on a slow link may need a longer "
        "`engine.startupTimeoutSeconds` or a pre-filled `engine.modelCache`.",
    ),
    DRAFTER_INCOMPATIBLE: ReasonDoc(
        "Ready",
        "The drafter-preflight init container found that the drafter does not fit the target model "
        "(architecture, hidden size or vocabulary); the message names the field.",
        "Use a drafter trained for this target model (`drafter.model`), or set `drafter.method: ngram`, "
        "which needs no checkpoint.",
    ),
    STANDBY_UNAVAILABLE: ReasonDoc(
        "Degraded, Ready",
        "A pool with `rollout.flip: Standby` started an engine pod whose engine cannot sleep: the pod's "
        "supervisor checks a level-1 sleep and wake through vLLM's /sleep, /wake_up and /is_sleeping "
        "before the plain engine starts, and vLLM on CPU refuses --enable-sleep-mode while a vLLM without "
        "the routes answers 404. The message names the pool and the step that failed. The pool runs as "
        "a Restart pool (one engine per pod, flips by `rollout.strategy`) instead of crash-looping.",
        "Use a GPU vLLM image with sleep mode (CUDA or ROCm; see docs/policy.md, Standby flips), or set "
        "`rollout.flip: Restart`. Any spec change (e.g. a newer `engine.image`) tries Standby again.",
    ),
    ROLLING_OUT: ReasonDoc(
        "Progressing", "A pool's Deployment is rolling out new engines.", "Nothing; it ends by itself."
    ),
    ROLLOUT_COMPLETE: ReasonDoc("Progressing", "No rollout is under way.", NOTHING),
    INVALID_SPEC: ReasonDoc(
        "Degraded",
        "The resource cannot be read as a valid spec (the message says why). The apiserver's schema "
        "normally refuses such a resource first; an older CRD can let one through. Nothing is rendered.",
        "Fix the spec and upgrade the CRD with the chart; `specfleet render -f FILE` checks a file before "
        "you apply it.",
    ),
    UNSUPPORTED_CONFIGURATION: ReasonDoc(
        "Degraded",
        "The spec is valid but cannot run as written, e.g. a drafter method or Dynamic SD schedule that "
        "the engine image's vLLM version does not support (examples/05-degraded-old-image.yaml), an `extraArgs` flag the operator sets itself, or fewer "
        "GPUs than `tensorParallelSize`. Nothing is created, and nothing is retried until the spec changes.",
        "Follow the message: a newer `engine.image`, the typed field instead of the flag, or more GPUs.",
    ),
    INSUFFICIENT_GPU_MEMORY: ReasonDoc(
        "Degraded",
        "vLLM would refuse to start a pool's engines: its weights (divided over `tensorParallelSize`) "
        "leave no KV cache in the `gpuMemoryUtilizationPercent` share of the GPU, or the KV cache cannot "
        "hold one sequence of `maxModelLen` tokens. The message quotes the error vLLM stops with. Checked "
        "only where both are known: the model's name identifies it (Llama-3.1-8B or -70B, bf16 or FP8) "
        "and the pool's `nodeSelector` names the GPU by `nvidia.com/gpu.product`. Nothing is created, and "
        "nothing is retried until the spec changes.",
        "Raise `gpuMemoryUtilizationPercent` or `tensorParallelSize` (with as many `resources.gpus`), "
        "lower `maxModelLen`, or use a quantized checkpoint. `specfleet render -f FILE` runs the same check.",
    ),
    APPLY_FAILED: ReasonDoc(
        "Degraded",
        "The apiserver refused a child (Deployment, Service, ...) the operator rendered; the message has "
        "its answer.",
        "Read the message: a ResourceQuota or LimitRange (set `engine.resources.cpuLimit`), an admission "
        "webhook, or missing RBAC for the operator. PodMonitor and PrometheusRule need "
        "prometheus-operator's CRDs; ScaledObject needs KEDA.",
    ),
    AS_EXPECTED: ReasonDoc("Degraded", "Nothing is wrong.", NOTHING),
    METRICS_OK: ReasonDoc("MetricsAvailable", "Prometheus answered with fresh numbers.", NOTHING),
    METRICS_UNAVAILABLE: ReasonDoc(
        "MetricsAvailable, Event",
        "Prometheus could not be reached, or returned no fresh series for an Auto pool's engines. Every "
        "Auto pool holds its current mode: a load that was not measured is never read as zero.",
        "Check `policy.prometheus.url` from the operator's pod, and that Prometheus scrapes the engines "
        "with their pod labels `specfleet.io/deployment`, `specfleet.io/pool` and `specfleet.io/track` "
        "(`monitoring.podMonitor: true` in the spec renders a PodMonitor that does it). A PodMonitor "
        "that Prometheus ignores lacks the label its `podMonitorSelector` wants: kube-prometheus-stack's "
        "wants `release: <its Helm release name>`; set it in `monitoring.labels` or the chart's "
        "`monitoring.labels`. See [Getting started](getting-started.md#prerequisites).",
    ),
    PROMETHEUS_NOT_SCRAPING: ReasonDoc(
        "MetricsAvailable, Event",
        "Prometheus answers the policy's queries, but has had no series of an Auto pool's engines for "
        "three evaluations in a row while the pool's pods are Ready: it is not scraping them. (A pool "
        "whose pods are not Ready, or an empty window right after a rollout, is MetricsUnavailable.) "
        "Every Auto pool holds its current mode.",
        "The message names the series the queries select (`namespace`, `specfleet_io_deployment`, "
        "`specfleet_io_pool`, from the pod labels `specfleet.io/deployment` and `specfleet.io/pool`) and "
        "what should make Prometheus scrape the pods. With `monitoring.podMonitor: true`: the PodMonitor "
        "(named after the resource, in its namespace) must carry the labels your Prometheus' "
        "`podMonitorSelector` wants (kube-prometheus-stack's: `release: <its Helm release name>`; set "
        "`monitoring.labels` or the chart's `monitoring.labels`), and its `podMonitorNamespaceSelector` "
        "must include the namespace (`kubectl get prometheus -A -o yaml`). With the "
        "`prometheus.io/scrape` annotations: a scrape job must keep annotated pods of the namespace and "
        "copy the pod labels onto the series (`labelmap` of `__meta_kubernetes_pod_label_(.+)`). "
        "Prometheus' Targets page (`/targets`) shows whether the pods are targets at all.",
    ),
    COST_PROFILE_FROM_CONFIG_MAP: ReasonDoc(
        "CostProfileLoaded", "The policy decides with the cost profile from your ConfigMap.", NOTHING
    ),
    COST_PROFILE_UNAVAILABLE: ReasonDoc(
        "CostProfileLoaded, Event",
        "The ConfigMap named in `policy.goodput.costProfileConfigMap` is missing or malformed; every pool "
        "it applies to holds.",
        "Create it in the resource's namespace (`specfleet profile ... --config-map NAME`, see "
        "[Measuring a cost profile](tasks/cost-profile.md)), or remove the field to use the published "
        "profile.",
    ),
    COST_PROFILE_DEFAULT: ReasonDoc(
        "CostProfileLoaded", "No ConfigMap is named any more: the published profile is used.", NOTHING
    ),
    NO_AUTO_POOLS: ReasonDoc(
        "MetricsAvailable, AcceptanceDrift",
        "No pool is `speculation: Auto`, so there is nothing to measure.",
        "Nothing, unless you want the policy to decide: set a pool to `Auto`.",
    ),
    POOLS_SETTLED: ReasonDoc("SpeculationSettled", "No pool is changing mode or K.", NOTHING),
    POOLS_TRANSITIONING: ReasonDoc(
        "SpeculationSettled",
        "A pool is rolling to a new speculation mode or K.",
        "Nothing; if it never settles, the rollout is stuck (see Unschedulable) and is reverted after "
        "`policy.rolloutDeadlineSeconds` with RolloutFailed.",
    ),
    ACCEPTANCE_BELOW_BASELINE: ReasonDoc(
        "AcceptanceDrift",
        "A pool's acceptance length has been more than `policy.acceptanceDrift.thresholdPercent` below its "
        "baseline for `forSeconds`: the traffic moved away from what the drafter was trained on.",
        "Look at what changed in the traffic; retrain the drafter (`drafter.retrain` can start a Job for "
        "it). The policy already turns speculation off where it stops paying.",
    ),
    ACCEPTANCE_NEAR_BASELINE: ReasonDoc("AcceptanceDrift", "Acceptance is near its baseline.", NOTHING),
    EVENT_STANDBY_FLIPPED: ReasonDoc(
        "Event",
        "A Standby pool's pod switched engines (the one it served with asleep, the other awake and "
        "checked) and serves the decided mode; the message gives the seconds from its drain's start.",
        NOTHING,
    ),
    EVENT_APPLIED: ReasonDoc("Event", "Children were created or changed to match the spec.", NOTHING),
    EVENT_RESTORED: ReasonDoc(
        "Event",
        "A child edited or deleted by hand was put back as the spec says.",
        "Change the SpeculativeDeployment, not its children.",
    ),
    EVENT_PRUNED: ReasonDoc("Event", "Children the spec no longer asks for were deleted.", NOTHING),
    EVENT_POOL_FAILING: ReasonDoc(
        "Event",
        "A pool's pods report a failure; the message is the Ready condition's.",
        "See the Ready reason it names.",
    ),
    EVENT_DEGRADED: ReasonDoc(
        "Condition type, Event", "The resource became Degraded.", "See the Degraded condition's reason."
    ),
    EVENT_RECOVERED: ReasonDoc("Event", "The resource is no longer Degraded.", NOTHING),
    EVENT_SPECULATION_ON: ReasonDoc(
        "Event", "The policy turned speculation on for a pool; the message says why.", NOTHING
    ),
    EVENT_SPECULATION_OFF: ReasonDoc(
        "Event", "The policy turned speculation off for a pool; the message says why.", NOTHING
    ),
    EVENT_SPECULATION_RETUNED: ReasonDoc(
        "Event", "The policy changed a pool's K or Dynamic SD schedule.", NOTHING
    ),
    EVENT_CANARIES_SCALED: ReasonDoc(
        "Event", "The policy changed how many canary replicas a pool runs.", NOTHING
    ),
    EVENT_ACCEPTANCE_BASELINE: ReasonDoc(
        "Event", "A pool's acceptance baseline was measured (or re-measured).", NOTHING
    ),
    EVENT_ACCEPTANCE_DRIFT: ReasonDoc(
        "Condition type, Event",
        "The AcceptanceDrift condition turned True for a pool.",
        "See AcceptanceBelowBaseline.",
    ),
    EVENT_ACCEPTANCE_RECOVERED: ReasonDoc("Event", "A pool's acceptance is back near its baseline.", NOTHING),
    EVENT_RETRAIN_CREATED: ReasonDoc(
        "Event", "A retraining Job was created from `drafter.retrain.template`.", "Watch the Job."
    ),
    EVENT_RETRAIN_FAILED: ReasonDoc(
        "Event",
        "The retraining Job could not be created; the message has the apiserver's answer.",
        "Fix `drafter.retrain.template` or the operator's RBAC for Jobs.",
    ),
}

# AutoscalingActive and GatewayAccepted: the page lists them after the policy's decisions.
INTEGRATION_REASON_DOCS: Final[dict[str, ReasonDoc]] = {
    AUTOSCALERS_ACTIVE: ReasonDoc("AutoscalingActive", "Every autoscaler reads its metric.", NOTHING),
    AUTOSCALER_PENDING: ReasonDoc(
        "AutoscalingActive",
        "An autoscaler has not reported yet (Unknown); for a ScaledObject, KEDA may not be installed.",
        "Install KEDA for `kind: ScaledObject`; otherwise wait for the first report.",
    ),
    AUTOSCALER_INACTIVE: ReasonDoc(
        "AutoscalingActive",
        "An autoscaler cannot scale and gave no reason of its own (when it gives one, e.g. the HPA's "
        "FailedGetPodsMetric, that reason is shown instead).",
        "For a HorizontalPodAutoscaler, a metrics adapter must serve the vLLM metric (see "
        "[Autoscaling](tasks/autoscaling.md)); `kubectl describe hpa` says more.",
    ),
    ROUTES_ACCEPTED: ReasonDoc(
        "GatewayAccepted",
        "Every parent Gateway reports Accepted and ResolvedRefs True on the HTTPRoute and on both "
        "InferencePools. Routing rules a route cannot express (shape, auto-segmentation, API-key rules, "
        "the OtherPool fallback) are named in the message: they do not apply in gateway mode.",
        "Nothing, unless the message names rules you rely on: those need the router (remove "
        "`routing.gateway`) or settings that say what the gateway does (see [Gateway API](gateway.md)).",
    ),
    ROUTES_PENDING: ReasonDoc(
        "GatewayAccepted",
        "No Gateway has reported on the HTTPRoute or an InferencePool yet (Unknown): no gateway "
        "implementation watches them, the `parentRefs` name a Gateway that does not exist, or it has not "
        "caught up with the last change.",
        "Check that the Gateway named in `routing.gateway.parentRefs` exists and that its implementation "
        "supports InferencePool backends; `kubectl describe httproute <name>` shows its parents' status.",
    ),
    ROUTES_NOT_ACCEPTED: ReasonDoc(
        "GatewayAccepted",
        "A Gateway reports Accepted or ResolvedRefs False for the HTTPRoute or an InferencePool; the "
        "message gives the Gateway's own reason (e.g. NotAllowedByListeners, NoMatchingParent, "
        "InvalidExtensionRef).",
        "Follow the Gateway's reason: allow routes from this namespace on its listener (`allowedRoutes`), "
        "fix the `sectionName`, or make the endpoint picker Service exist.",
    ),
}
