"""Render each pool's vLLM engines: Deployment, Service and PodDisruptionBudget (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from specfleet.api.constants import LABEL_FLIP, LABEL_SPECULATION, LABEL_TRACK, PoolName
from specfleet.api.drafter import METHODS_NEEDING_MODEL, DrafterSpec, DynamicScheduleRange
from specfleet.api.effective import PoolEngine, pool_engine
from specfleet.api.fields import SpeculationMode
from specfleet.api.pools import PoolSpec
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import Manifest, RenderOptions, metadata, pool_name, selector_labels
from specfleet.render.standby import (
    SPECULATIVE_PORT_NAME,
    speculative_service_name,
    standby_memory,
    standby_mount,
    standby_pool,
    standby_volume,
    supervisor_init_container,
)
from specfleet_runtime.names import ENGINE_PORT, STANDBY_SPECULATIVE_PORT
from specfleet_runtime.standby import (
    READY_FILE,
    SERVER_DEV_MODE_ENV,
    SUPERVISOR_PATH,
    StandbyArgs,
    build_standby_args,
)
from specfleet_runtime.vllm_args import (
    VLLM_SERVER_MODULE,
    DynamicSpeculationRange,
    EngineArgs,
    SpeculativeConfig,
    build_vllm_args,
)

ENGINE_COMPONENT = "engine"
ENGINE_CONTAINER = "vllm"
SHM_SIZE_LIMIT = "16Gi"
# Probe period while the model loads; startupTimeoutSeconds / this = allowed failures.
STARTUP_PROBE_PERIOD_SECONDS = 10
# Seconds a stopping pod keeps serving while Services and the router drop its endpoint.
PRESTOP_SLEEP_SECONDS = 10


def speculative_config(
    drafter: DrafterSpec, k: int | None = None, schedule: Sequence[DynamicScheduleRange] | None = None
) -> SpeculativeConfig:
    """vLLM's --speculative-config for a drafter spec (schedule sorted by batch size).

    `k` is the K the policy decided for the pool (never above the drafter's); `schedule` the Dynamic
    SD schedule it chose (None: the drafter's own, if any). A schedule is clamped to K, as vLLM would
    clamp it.
    """
    k = drafter.num_speculative_tokens if k is None else min(k, drafter.num_speculative_tokens)
    rows = drafter.dynamic_schedule if schedule is None else schedule
    ranges = tuple(
        DynamicSpeculationRange(r.min_batch_size, r.max_batch_size, min(r.num_speculative_tokens, k))
        for r in sorted(rows or [], key=lambda r: r.min_batch_size)
    )
    return SpeculativeConfig(
        method=drafter.method,
        num_speculative_tokens=k,
        model=drafter.model,
        draft_tensor_parallel_size=drafter.draft_tensor_parallel_size,
        prompt_lookup_min=drafter.prompt_lookup_min,
        prompt_lookup_max=drafter.prompt_lookup_max,
        dynamic_schedule=ranges,
    )


def engine_args(
    sd: SpeculativeDeployment,
    pool: PoolName,
    mode: SpeculationMode,
    k: int | None = None,
    schedule: Sequence[DynamicScheduleRange] | None = None,
) -> EngineArgs:
    """The engine arguments of one pool in one speculation mode (drafting `k` tokens if decided,
    following the policy's Dynamic SD `schedule` if it chose one)."""
    eng = pool_engine(sd.spec, pool)
    util = eng.gpu_memory_utilization_percent
    return EngineArgs(
        model=sd.spec.model.name,
        served_model_name=sd.served_model_name,
        revision=sd.spec.model.revision,
        port=ENGINE_PORT,
        tensor_parallel_size=eng.tensor_parallel_size,
        max_num_seqs=eng.max_num_seqs,
        max_model_len=eng.max_model_len,
        gpu_memory_utilization=None if util is None else util / 100,
        speculative=speculative_config(sd.spec.drafter, k, schedule) if mode == "On" else None,
        extra_args=eng.extra_args,
    )


def _resources(eng: PoolEngine, host_memory: str | None = None) -> dict[str, Any]:
    """The engine container's resources; `host_memory`: a Standby pod's parked weights, added to memory."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if eng.resources.gpus:
        # Extended resources need requests == limits.
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = eng.resources.gpus
    if eng.resources.cpu:
        requests["cpu"] = eng.resources.cpu
    if eng.resources.cpu_limit:
        limits["cpu"] = eng.resources.cpu_limit
    if host_memory is not None:
        requests["memory"], limit = standby_memory(eng.resources.memory, host_memory)
        if limit is not None:
            limits["memory"] = limit
    elif eng.resources.memory:
        requests["memory"] = limits["memory"] = eng.resources.memory
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _env(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    spec = sd.spec.engine
    env = _cache_env(sd)
    if spec.security.read_only_root_filesystem:
        env.append({"name": "HOME", "value": WRITABLE_TMP})
    ref = spec.hf_token_secret_ref
    if ref is not None:
        # The token reaches the pod only through the Secret, never in args or the manifest.
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


# Where a read-only engine may write: HOME and every cache under it (vLLM, Triton, torch, HF modules).
WRITABLE_TMP = "/tmp"


def _container_security(sd: SpeculativeDeployment) -> dict[str, Any]:
    security = sd.spec.engine.security
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
    }
    if security.read_only_root_filesystem:
        context["readOnlyRootFilesystem"] = True
    if security.run_as_user is not None:
        context["runAsNonRoot"] = True
        context["runAsUser"] = security.run_as_user
    return context


def _pod_security(sd: SpeculativeDeployment) -> dict[str, Any]:
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    user = sd.spec.engine.security.run_as_user
    if user is not None:
        # The model cache volume becomes writable for the engine's group.
        context.update({"runAsNonRoot": True, "runAsUser": user, "runAsGroup": user, "fsGroup": user})
    return context


def _cache_env(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    """Where every container that reads the weights finds them, and whether it may fetch missing ones."""
    cache = sd.spec.engine.model_cache
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": cache.mount_path}]
    if cache.read_only:
        # Hugging Face then resolves ids from HF_HOME/hub alone and writes nothing there.
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    return env


def _cache_mount(sd: SpeculativeDeployment) -> dict[str, Any]:
    cache = sd.spec.engine.model_cache
    mount: dict[str, Any] = {"name": "model-cache", "mountPath": cache.mount_path}
    if cache.read_only:
        mount["readOnly"] = True
    return mount


def _volumes(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    cache = sd.spec.engine.model_cache
    if cache.persistent_volume_claim_name:
        claim: dict[str, Any] = {"claimName": cache.persistent_volume_claim_name}
        if cache.read_only:
            # A ReadOnlyMany claim can only be attached read-only.
            claim["readOnly"] = True
        cache_volume: dict[str, Any] = {"name": "model-cache", "persistentVolumeClaim": claim}
    else:
        empty: dict[str, Any] = {"sizeLimit": cache.size_limit} if cache.size_limit else {}
        cache_volume = {"name": "model-cache", "emptyDir": empty}
    # Tensor parallel workers share memory through /dev/shm; the container default (64Mi) is too small.
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE_LIMIT}}
    volumes = [cache_volume, shm]
    if sd.spec.engine.security.read_only_root_filesystem:
        volumes.append({"name": "tmp", "emptyDir": {}})
    return volumes


def _volume_mounts(sd: SpeculativeDeployment) -> list[dict[str, Any]]:
    mounts = [_cache_mount(sd), {"name": "dshm", "mountPath": "/dev/shm"}]
    if sd.spec.engine.security.read_only_root_filesystem:
        mounts.append({"name": "tmp", "mountPath": WRITABLE_TMP})
    return mounts


def _probes(sd: SpeculativeDeployment, standby: bool = False) -> dict[str, Any]:
    """Probes on the (plain) engine's port; a Standby pod starts only once its supervisor wrote the ready
    file (the speculative engine parked asleep, the plain one serving). vLLM answers /health asleep too,
    so a Standby pod stays Ready through flips."""
    http = {"path": "/health", "port": "http"}
    startup_failures = max(1, sd.spec.engine.startup_timeout_seconds // STARTUP_PROBE_PERIOD_SECONDS)
    started: dict[str, Any] = (
        {"exec": {"command": ["test", "-f", READY_FILE]}} if standby else {"httpGet": http}
    )
    return {
        # The port opens only after the model has loaded: minutes, so a patient startup probe.
        "startupProbe": {
            **started,
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": startup_failures,
            "timeoutSeconds": 5,
        },
        "readinessProbe": {"httpGet": http, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {"httpGet": http, "periodSeconds": 15, "failureThreshold": 4, "timeoutSeconds": 10},
    }


PREFLIGHT_CONTAINER = "drafter-preflight"
PREFLIGHT_MODULE = "specfleet_runtime.drafter_preflight"


def preflight_init_container(sd: SpeculativeDeployment, options: RenderOptions) -> dict[str, Any] | None:
    """The drafter compatibility check, run before vLLM starts in every pod that loads a drafter.

    It reads both checkpoints' config.json from the model cache the engine uses (the operator's image,
    which carries specfleet_runtime); a mismatch fails the init container with one
    `DrafterIncompatible: <field> ...` line per difference, which the operator reports as the pool's
    Ready reason. A checkpoint not in the cache yet (vLLM downloads it at start) is not checked.
    """
    drafter = sd.spec.drafter
    if drafter.method not in METHODS_NEEDING_MODEL or drafter.model is None:
        return None
    args = ["--method", drafter.method, "--target", sd.spec.model.name, "--drafter", drafter.model]
    args += ["--cache-dir", sd.spec.engine.model_cache.mount_path, "--skip-missing"]
    if sd.spec.model.revision:
        args += ["--target-revision", sd.spec.model.revision]
    return {
        "name": PREFLIGHT_CONTAINER,
        "image": sd.spec.routing.router.image or options.router_image,
        "imagePullPolicy": sd.spec.engine.image_pull_policy,
        "command": ["python", "-m", PREFLIGHT_MODULE],
        "args": args,
        "env": _cache_env(sd),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "volumeMounts": [_cache_mount(sd)],
        # A failing check's stderr (its DrafterIncompatible lines) becomes the terminated state's message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(sd),
    }


def canary_replicas(sd: SpeculativeDeployment, pool: PoolName, decided: int | None = None) -> int | None:
    """Replicas of the pool's canary Deployment while the pool is off, or None when it has none.

    Only Auto pools with `policy.reentry.canaryReplicas` get one, and never a Standby pool. It exists (possibly at 0 replicas)
    for as long as that holds, so a pool turning speculation back on scales it down declaratively.
    `decided` is the count the policy chose (fewer far past break-even; None: the spec's).
    """
    if getattr(sd.spec.pools, pool).speculation != "Auto" or sd.spec.policy.reentry.canary_replicas == 0:
        return None
    if standby_pool(sd, pool):
        # Its pods hold a speculative engine each; a canary Deployment would sit outside both Services.
        return None
    spec = sd.spec.policy.reentry.canary_replicas
    return spec if decided is None else max(0, min(decided, spec))


def canary_name(sd: SpeculativeDeployment, pool: PoolName) -> str:
    return f"{pool_name(sd, pool)}-canary"


def standby_engine_container(
    sd: SpeculativeDeployment,
    pool: PoolName,
    k: int | None = None,
    schedule: Sequence[DynamicScheduleRange] | None = None,
) -> dict[str, Any]:
    """The parts of a Standby pod's engine container that differ from a Restart pod's: the supervisor
    running both engines (each with the pool's arguments and --enable-sleep-mode; the speculative one
    on its own port), both ports, the parked weights' memory, and the termination message the operator
    reads when the engines cannot sleep. Independent of the pool's mode: a flip never changes it."""
    eng = pool_engine(sd.spec, pool)
    host_memory = getattr(sd.spec.pools, pool).rollout.standby_host_memory
    assert host_memory is not None  # a Rule requires it with flip Standby
    speculative = replace(
        engine_args(sd, pool, "On", k, schedule), port=STANDBY_SPECULATIVE_PORT, enable_sleep_mode=True
    )
    plain = replace(engine_args(sd, pool, "Off"), enable_sleep_mode=True)
    args = StandbyArgs(
        speculative=tuple(build_vllm_args(speculative)),
        plain=tuple(build_vllm_args(plain)),
        startup_timeout_seconds=sd.spec.engine.startup_timeout_seconds,
    )
    return {
        "command": ["python3", SUPERVISOR_PATH],
        "args": build_standby_args(args),
        "ports": [
            {"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"},
            {"name": SPECULATIVE_PORT_NAME, "containerPort": STANDBY_SPECULATIVE_PORT, "protocol": "TCP"},
        ],
        # vLLM serves /sleep, /wake_up and /is_sleeping only with this set.
        "env": [*_env(sd), {"name": SERVER_DEV_MODE_ENV, "value": "1"}],
        "resources": _resources(eng, host_memory),
        "volumeMounts": [*_volume_mounts(sd), standby_mount()],
        # The supervisor's one `standby: ...` line; the log's tail if it died before writing one.
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **_probes(sd, standby=True),
    }


def render_pool_deployment(
    sd: SpeculativeDeployment,
    pool: PoolName,
    mode: SpeculationMode,
    track: str = "stable",
    k: int | None = None,
    canaries: int | None = None,
    options: RenderOptions | None = None,
    schedule: Sequence[DynamicScheduleRange] | None = None,
    standby: bool = False,
) -> Manifest:
    """The pool's Deployment of vLLM servers, with or without --speculative-config.

    `standby`: the pool flips by Standby (decided by reconcile: the spec's rollout.flip, unless its
    engines were found unable to sleep): each pod runs both engines under the supervisor, and the
    template is the same whatever `mode` (pods start with the plain engine serving, labelled Off).

    An autoscaled pool's stable Deployment has no `replicas`: its autoscaler sets them (canaries are
    extra pods, never autoscaled, so the stable track keeps the autoscaler's count while off).

    track "stable" is the pool itself; track "canary" is the few replicas of an Auto pool that keep
    speculating while the pool is off, so acceptance stays measurable for re-entry; they draft the
    pool's K. `canaries` is the policy's canary count (None: the spec's). `schedule` is the policy's
    Dynamic SD schedule for the speculating pool (canaries draft the full K: they measure acceptance).
    """
    spec = sd.spec
    pool_spec = getattr(spec.pools, pool)
    eng = pool_engine(spec, pool)
    canaries = canary_replicas(sd, pool, canaries)
    standby = standby and track == "stable"
    if standby:
        mode = "Off"  # the engine awake at start; the flip driver labels each pod as it flips it
    if track == "canary":
        name = canary_name(sd, pool)
        replicas = (canaries or 0) if mode == "Off" else 0
        mode = "On"
        schedule = None
    else:
        name = pool_name(sd, pool)
        # Canaries come out of a fixed pool's replicas (the total stays `replicas`).
        replicas = pool_spec.replicas - (canaries or 0) if mode == "Off" else pool_spec.replicas
    selector = {**selector_labels(sd, ENGINE_COMPONENT, pool), LABEL_TRACK: track}
    meta = metadata(sd, name, ENGINE_COMPONENT, pool)
    meta["labels"][LABEL_SPECULATION] = mode
    meta["labels"][LABEL_TRACK] = track
    if standby:
        meta["labels"][LABEL_FLIP] = "Standby"
    pod_labels = {**meta["labels"]}
    pod_annotations: dict[str, str] = {}
    if spec.monitoring.scrape_annotations:
        pod_annotations = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(ENGINE_PORT),
            "prometheus.io/path": "/metrics",
        }
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": ["python3", "-m", VLLM_SERVER_MODULE],
        "args": build_vllm_args(engine_args(sd, pool, mode, k, schedule)),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "env": _env(sd),
        "resources": _resources(eng),
        "volumeMounts": _volume_mounts(sd),
        "securityContext": _container_security(sd),
        **_probes(sd),
    }
    if standby:
        container.update(standby_engine_container(sd, pool, k, schedule))
    grace = spec.engine.termination_grace_period_seconds
    # Keep serving briefly after endpoints are withdrawn, so no new request lands on a dying pod; the
    # apiserver refuses a sleep that is not below the grace period (and with none there is no time).
    prestop = min(PRESTOP_SLEEP_SECONDS, grace - 1)
    if prestop > 0:
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": prestop}}}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Engines never talk to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(sd),
        "volumes": _volumes(sd),
        "terminationGracePeriodSeconds": grace,
    }
    options = options or RenderOptions()
    init_containers: list[dict[str, Any]] = []
    if standby:
        init_containers.append(supervisor_init_container(sd, options, _container_security(sd)))
        pod_spec["volumes"].append(standby_volume())
    # A Standby pod loads the drafter whatever its mode.
    preflight = preflight_init_container(sd, options) if mode == "On" or standby else None
    if preflight is not None:
        init_containers.append(preflight)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if eng.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(eng.node_selector.items()))
    if eng.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in eng.tolerations]
    if spec.engine.affinity:
        pod_spec["affinity"] = spec.engine.affinity
    template_meta: dict[str, Any] = {"labels": pod_labels}
    if pod_annotations:
        template_meta["annotations"] = pod_annotations
    deployment_spec: dict[str, Any] = {"replicas": replicas}
    if track == "stable" and pool_spec.autoscaling is not None:
        # The autoscaler owns the count: a rendered value would undo its scale at every apply.
        del deployment_spec["replicas"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            **deployment_spec,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(pool_spec)},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": spec.engine.startup_timeout_seconds + 600,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def rolling_update(pool_spec: PoolSpec) -> dict[str, int]:
    """The engines' rolling update: Surge keeps ready capacity at `replicas` (needs spare GPUs);
    Replace stops `maxUnavailable` engines first so new ones start on their GPUs."""
    if pool_spec.rollout.strategy == "Replace":
        return {"maxUnavailable": pool_spec.rollout.max_unavailable, "maxSurge": 0}
    return {"maxUnavailable": 0, "maxSurge": pool_spec.max_surge}


def render_pool_service(sd: SpeculativeDeployment, pool: PoolName, standby: bool = False) -> Manifest:
    """A ClusterIP Service over the pool's ready engines; the router watches its EndpointSlices.

    `standby`: only the pods whose plain engine serves (labelled Off): a pod the flip driver labels On
    serves from its speculative engine through `render_pool_speculative_service`, one labelled
    Flipping (draining) from neither."""
    selector = selector_labels(sd, ENGINE_COMPONENT, pool)
    if standby:
        selector[LABEL_SPECULATION] = "Off"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(sd, pool_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_pool_speculative_service(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """A Standby pool's second Service: its pods whose speculative engine is awake (labelled On), on
    the speculative engine's port. Rendered from the spec (not the plan), so a pool that fell back to
    restart flips keeps it, empty: only Standby pods carry the flip label."""
    selector = {**selector_labels(sd, ENGINE_COMPONENT, pool), LABEL_SPECULATION: "On", LABEL_FLIP: "Standby"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(sd, speculative_service_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {
                    "name": SPECULATIVE_PORT_NAME,
                    "port": STANDBY_SPECULATIVE_PORT,
                    "targetPort": SPECULATIVE_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def render_pool_pdb(sd: SpeculativeDeployment, pool: PoolName) -> Manifest:
    """Voluntary disruptions (node drains) take at most one engine of a pool at a time by default."""
    pool_spec = getattr(sd.spec.pools, pool)
    budget: dict[str, int]
    if pool_spec.min_available is not None:
        budget = {"minAvailable": pool_spec.min_available}
    elif pool_spec.autoscaling is not None:
        # The replica count moves: one engine at a time holds at any count.
        budget = {"maxUnavailable": 1}
    else:
        budget = {"minAvailable": max(pool_spec.replicas - 1, 0)}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(sd, pool_name(sd, pool), ENGINE_COMPONENT, pool),
        "spec": {
            **budget,
            "selector": {"matchLabels": selector_labels(sd, ENGINE_COMPONENT, pool)},
        },
    }
