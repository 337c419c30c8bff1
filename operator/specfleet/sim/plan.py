"""`specfleet plan`: should this workload speculate, with which K, and with which thresholds.

From the cost profile and the acceptance: the break-even concurrency (running requests per replica
where the best K stops beating no speculation), the Dynamic SD table (best K per batch size), and
Threshold-mode values: the concurrency values are the ones the policy itself derives when the spec
leaves them unset (`specfleet.policy.rules.threshold.threshold_values`, from this acceptance at the drafter's
K), and both go through the one break-even function, `cost_profile.break_even_concurrency`; the
acceptance lengths are those at which speculation stops paying at the pool's typical load. From a simulation of the workload: each
pool's load, and the predicted gain of the policy against always-on and always-off.

Each load is judged as the policy judges it (`specfleet.policy.predict.throughput`, one model): where the
trace says how long its requests are, their prefill is priced, and where the profile has a `memory`
section, a pool whose requests in the system do not fit the KV cache of an engine with the drafter is
compared by throughput at the batch each setting holds, and its `why` says so.

Each pool's `standby` says what a flip costs with Standby engines (`rollout.flip: Standby`) and
without: one replica at a time, its drain at the pool's p95 load plus sleep, wake and check
(`policy.predict.rollout_time`), against the restart rollout (start-ups by the pool's strategy);
Standby pays where the pool flips (Auto) and the flip is shorter. The host memory it needs: each pod
parks the sleeping engine's weights (target + drafter, across its GPUs), and a node holds as many pods
as its GPUs fit (`GPUS_PER_NODE`, an 8-GPU node, unless the engines ask for more GPUs than that).

A pool with an SLO gets `slo`: the replicas each setting needs to meet it at the trace's p95 load, the
GPUs speculation saves or costs, and the setting the policy would run (`specfleet.sim.slo_replicas`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from specfleet.api.effective import pool_engine
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.inputs.settings import goodput_margin
from specfleet.policy.predict.dynamic_sd import best_schedule
from specfleet.policy.predict.rollout_time import (
    pool_model_weights,
    restart_rollout,
    standby_rollout,
    standby_startup_seconds,
)
from specfleet.policy.predict.throughput import OFF, SCHEDULE, PoolModel, pool_model, setting_name
from specfleet.policy.rules.threshold import threshold_values
from specfleet.sim.accounts import load_per_replica
from specfleet.sim.compare import Comparison, static_ks
from specfleet.sim.options import POOLS
from specfleet.sim.slo_replicas import OFF_KEY, SloCandidate, SloLoad, slo_replicas
from specfleet_runtime.cost_profile import StepTimeProfile, break_even_concurrency, speedup
from specfleet_runtime.vllm_args import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

MAX_CONCURRENCY = 1024
# GPUs of one node, for the host memory a node needs for its Standby pods (an 8-GPU HGX/DGX node).
GPUS_PER_NODE = 8


def best_speedup(
    profile: StepTimeProfile,
    c: float,
    acceptance: Sequence[float],
    ks: Sequence[int],
    prompt_per_output: float = 0.0,
) -> tuple[float, int]:
    """The best predicted speedup at `c` running per replica, and its K (prefill priced at
    `prompt_per_output` prompt tokens per generated token; 0: decode only)."""
    return max(
        ((speedup(profile, max(1.0, c), k, list(acceptance), prompt_per_output), k) for k in ks),
        key=lambda x: (x[0], -x[1]),
    )


def crossing(
    profile: StepTimeProfile, acceptance: Sequence[float], ks: Sequence[int], level: float
) -> int | None:
    """The smallest whole concurrency at which the best speedup falls below `level` (None: not up to 1024).

    From `break_even_concurrency`, the function the policy derives its Threshold values with.
    """
    c = break_even_concurrency(profile, acceptance, ks, level)
    whole = math.floor(c) + 1
    return None if whole > MAX_CONCURRENCY else whole


def acceptance_break_even(
    profile: StepTimeProfile, acceptance: Sequence[float], ks: Sequence[int], c: float, level: float
) -> float | None:
    """The mean acceptance length at which speculation at load `c` predicts `level` (scaling the vector)."""
    lo, hi = 0.0, 1.0
    if best_speedup(profile, c, acceptance, ks)[0] < level:
        return None  # even the measured acceptance does not reach it at this load
    for _ in range(40):
        mid = (lo + hi) / 2
        if best_speedup(profile, c, [p * mid for p in acceptance], ks)[0] < level:
            lo = mid
        else:
            hi = mid
    k = best_speedup(profile, c, [p * hi for p in acceptance], ks)[1]
    return 1.0 + hi * sum(acceptance[:k])


def plan_model(
    profile: StepTimeProfile,
    request_tokens: tuple[float, float] | None,
    ks: Sequence[int],
    max_num_seqs: int,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
) -> PoolModel:
    """The policy's model of a pool (`policy.predict.throughput`) for requests of (mean prompt, mean output)
    tokens with the KV caches the profile's memory predicts for the pool's utilisation and TP; without
    the lengths, decode only and no memory bound."""
    prompt, output = request_tokens if request_tokens is not None else (None, None)
    ob = PoolObservation(
        pool="plan",
        at=datetime.fromtimestamp(0, UTC),
        running_per_replica=0.0,
        waiting=0.0,
        replicas_reporting=1,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
    )
    return pool_model(
        profile,
        ob,
        ks,
        mode="Off",
        current_k=0,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size,
    )


def gain_at(model: PoolModel, c: float, acceptance: Sequence[float], ks: Sequence[int]) -> tuple[float, int]:
    """The best predicted gain at a demand of `c` requests per replica, and its K: the policy's one
    prediction (batch, decode, prefill and memory priced together)."""
    return max(((model.gain(setting_name(k), acceptance, c), k) for k in ks), key=lambda x: (x[0], -x[1]))


def standby_plan(
    sd: SpeculativeDeployment,
    pool: str,
    model: PoolModel,
    profile: StepTimeProfile,
    load: float,
    acceptance: Sequence[float],
    output_tokens: float | None,
    startup_seconds: float,
    flips: bool,
) -> dict[str, Any]:
    """What a flip of `pool` takes with Standby engines and by restart, and the host memory Standby
    needs (see the module docstring). `load`: requests per replica a flip drains at."""
    spec = sd.spec
    pool_spec = getattr(spec.pools, pool)
    engine = pool_engine(spec, pool)  # type: ignore[arg-type]
    state = PoolState(
        mode="On",
        replicas=max(1, pool_spec.replicas),
        rollout_strategy=pool_spec.rollout.strategy,
        max_unavailable=pool_spec.rollout.max_unavailable,
        max_surge=pool_spec.max_surge,
        startup_seconds=startup_seconds,
        tensor_parallel_size=engine.tensor_parallel_size,
        termination_grace_seconds=float(spec.engine.termination_grace_period_seconds),
    )
    # The drain at the slowest setting the pool runs (the speculating one where memory binds it), at
    # the requests per replica it runs of the load.
    rate, slowest = min((model.tokens_per_second(n, acceptance, max(1.0, load)), n) for n in model.settings)
    obs = PoolObservation(
        pool=pool,
        at=datetime.fromtimestamp(0, UTC),
        running_per_replica=model.batch(slowest, max(1.0, load)),
        waiting=0.0,
        replicas_reporting=1,
        generation_tokens_per_second=rate,
        mean_output_tokens=output_tokens,
    )
    standby = standby_rollout(state, obs, profile)
    restart = restart_rollout(state, obs, profile)
    weights, _ = pool_model_weights(state, profile)
    gpus = max(1, engine.resources.gpus, engine.tensor_parallel_size)
    per_pod = weights.target_weight_bytes + weights.drafter_weight_bytes
    pods_per_node = max(1, GPUS_PER_NODE // gpus)
    pays = flips and standby.seconds < restart.seconds
    # A new pod (a scale-up, a retune, a spec change) starts both engines and checks the sleep.
    standby_startup = standby_startup_seconds(restart.batch_seconds, weights, engine.tensor_parallel_size)
    return {
        "flipSeconds": {"restart": round(restart.seconds), "standby": round(standby.seconds)},
        "podStartupSeconds": {"restart": round(restart.batch_seconds), "standby": round(standby_startup)},
        "perReplicaSeconds": round(standby.batch_seconds, 1),
        "pays": pays,
        "why": (
            f"a flip takes {standby.seconds:.0f} s with Standby engines (one replica at a time: "
            f"{standby.batch_seconds:.1f} s each to drain, sleep, wake and check) against "
            f"{restart.seconds:.0f} s restarting them"
            + ("; the pool flips (Auto), so it pays" if pays else "; the pool does not flip here")
            + f"; a new pod starts in {standby_startup:.0f} s with both engines against {restart.batch_seconds:.0f} s"
        ),
        "hostMemoryPerPodGB": round(per_pod / 1e9, 1),
        "podsPerNode": pods_per_node,
        "hostMemoryPerNodeGB": round(pods_per_node * per_pod / 1e9, 1),
    }


def pool_load(comparison: Comparison, pool: str) -> dict[str, float] | None:
    """Requests in the system per replica (time-averaged per window) over the policy run, as percentiles."""
    run = comparison.runs.get("policy") or comparison.runs[comparison.best_static]
    values = load_per_replica(run, pool)
    if not values or max(values) == 0:
        return None
    arr = np.asarray(values)
    return {q: round(float(np.percentile(arr, p)), 1) for q, p in (("p5", 5), ("p50", 50), ("p95", 95))}


def pool_p95_tokens_per_second(comparison: Comparison, pool: str) -> float:
    """The pool's generated tokens per second in its 95th-percentile window, all replicas together: the
    most any fixed setting served there (the one that kept up best, the closest to what arrived)."""
    return max(
        float(np.percentile(run.bin_tokens[pool] / run.bin_seconds, 95)) if len(run.bin_tokens[pool]) else 0.0
        for run in (comparison.runs[name] for name in comparison.fixed_settings())
    )


def slo_plan(
    sd: SpeculativeDeployment,
    pool: str,
    comparison: Comparison,
    model: PoolModel,
    acceptance: Sequence[float],
    ks: Sequence[int],
    schedule: Sequence[tuple[int, int, int]],
    request_tokens: tuple[float, float],
) -> dict[str, Any]:
    """The replicas `pool` needs for its SLO per setting, the GPUs speculation saves, and the setting the
    policy would run (`specfleet.sim.slo_replicas`), each setting's tail from its own fixed run."""
    spec = sd.spec
    slo = getattr(spec.pools, pool).slo
    assert slo is not None

    def samples(run_name: str) -> list[tuple[float, float | None]]:
        run = comparison.runs.get(run_name) or comparison.runs["alwaysOff"]
        return [x for window in run.bin_latency[pool] for x in window]

    candidates = [SloCandidate(OFF_KEY, model, OFF, samples("alwaysOff"))]
    candidates += [
        SloCandidate(setting_name(k), model, setting_name(k), samples(f"alwaysOnK{k}")) for k in ks
    ]
    if max((k for _, _, k in schedule), default=0) > 0:
        table = model.with_schedule(tuple(schedule))
        candidates.append(SloCandidate("dynamicSchedule", table, SCHEDULE, samples("engineDynamicSD")))
    engine = pool_engine(spec, pool)  # type: ignore[arg-type]
    load = SloLoad(pool_p95_tokens_per_second(comparison, pool), *request_tokens)
    doc = slo_replicas(
        slo,
        candidates,
        acceptance,
        load,
        max(1, engine.resources.gpus, engine.tensor_parallel_size),
        steered=pool == "latency",
        margin=goodput_margin(spec.policy),
    )
    return {"p95TokensPerSecond": round(load.tokens_per_second, 1), **doc}


def plan(
    sd: SpeculativeDeployment,
    comparison: Comparison,
    profile: StepTimeProfile,
    acceptance: Sequence[float],
    request_tokens: tuple[float, float] | None = None,
    startup_seconds: float | None = None,
) -> dict[str, Any]:
    """The recommendation as a document (printed as YAML or JSON by the CLI).

    `request_tokens` (mean prompt and output tokens of the trace's requests) lets it judge memory;
    `startup_seconds` (one engine's, as simulated) prices each pool's restart flips against Standby."""
    spec = sd.spec
    margin = spec.policy.goodput.margin_percent / 100
    ks = static_ks(profile, spec.drafter.num_speculative_tokens)
    break_even = crossing(profile, acceptance, ks, 1.0)
    # Threshold mode drafts the drafter's K: its values are the ones the policy itself derives
    # (`threshold_values`) when the spec leaves them unset, from this workload's acceptance.
    derived = threshold_values(
        spec.policy.model_copy(update={"thresholds": type(spec.policy.thresholds)()}),
        spec.drafter.num_speculative_tokens,
        profile,
        acceptance,
    )
    stop_c = max(2, min(MAX_CONCURRENCY, math.floor(derived.stop_concurrency)))
    schedule = best_schedule(profile, acceptance, spec.drafter.num_speculative_tokens)
    pools: dict[str, Any] = {}
    for pool in POOLS:
        load = pool_load(comparison, pool)
        if load is None:
            pools[pool] = {
                "load": None,
                "recommendation": "no traffic in this trace: keep the spec's setting",
            }
            continue
        # An engine runs at most maxNumSeqs requests; the rest of the load queues.
        engine = pool_engine(spec, pool)  # type: ignore[arg-type]
        cap = float(engine.max_num_seqs or 256)
        mid = min(cap, load["p50"])
        percent = engine.gpu_memory_utilization_percent
        util = percent / 100 if percent else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        model = plan_model(profile, request_tokens, ks, int(cap), util, engine.tensor_parallel_size)
        gain_low, k_low = gain_at(model, load["p5"], acceptance, ks)
        gain_high, k_high = gain_at(model, load["p95"], acceptance, ks)
        gain_mid, k_mid = gain_at(model, load["p50"], acceptance, ks)
        if gain_high > 1 + margin:
            setting, why = "On", f"speculation pays even at its p95 load ({gain_high:.2f}x at K={k_high})"
        elif gain_low < 1 - margin:
            setting, why = "Off", f"speculation loses even at its p5 load ({gain_low:.2f}x)"
        else:
            setting, why = (
                "Auto",
                f"load crosses the break-even point: {gain_low:.2f}x at p5 (K={k_low}), {gain_high:.2f}x at p95",
            )
        bound = next((q for q in ("p5", "p50", "p95") if model.memory_known and model.bound(load[q])), None)
        if bound is not None:
            why += f"; from its {bound} load on, " + model.why(k_high, acceptance, load[bound])
        standby = None
        if startup_seconds is not None:
            output = request_tokens[1] if request_tokens is not None else None
            standby = standby_plan(
                sd, pool, model, profile, load["p95"], acceptance, output, startup_seconds, setting == "Auto"
            )
        stop_len = acceptance_break_even(profile, acceptance, ks, mid, 1 - margin)
        resume_len = acceptance_break_even(profile, acceptance, ks, mid, 1 + margin)
        pools[pool] = {
            "load": {"requestsPerReplica": load},
            "predictedSpeedupAtP50": round(gain_mid, 3),
            "speculation": setting,
            "numSpeculativeTokens": k_mid if setting != "Off" else None,
            "why": why,
            "thresholds": {
                "stopBelowAcceptanceLengthMilli": None if stop_len is None else round(stop_len * 1000),
                "resumeAboveAcceptanceLengthMilli": None if resume_len is None else round(resume_len * 1000),
            },
            **({"standby": standby} if standby is not None else {}),
        }
        if getattr(spec.pools, pool).slo is not None and request_tokens is not None:
            pools[pool]["slo"] = slo_plan(
                sd, pool, comparison, model, acceptance, ks, schedule, request_tokens
            )
    results = comparison.to_json()["results"]

    def gain(a: str, b: str) -> float | None:
        x, y = results[a]["tokensPerRequestSecond"], results[b]["tokensPerRequestSecond"]
        return round(x / y - 1, 4) if x and y else None

    busiest = max(
        (p for p in pools if pools[p].get("load")),
        key=lambda p: pools[p]["load"]["requestsPerReplica"]["p50"],
        default=None,
    )
    lengths = pools[busiest]["thresholds"] if busiest else {}
    return {
        "acceptance": list(acceptance),
        "profile": profile.name,
        "breakEvenConcurrencyPerReplica": break_even,
        "pools": pools,
        "policy": {
            "mode": "Goodput",
            # For mode Threshold: concurrency as the policy derives it at the drafter's K from this acceptance,
            # lengths at the busiest pool's load.
            "thresholds": {
                "stopAboveConcurrencyPerReplica": stop_c,
                "resumeBelowConcurrencyPerReplica": max(
                    0, min(math.floor(derived.resume_concurrency), stop_c - 1)
                ),
                **{k: v for k, v in lengths.items() if v is not None},
            },
        },
        "drafter": {
            "dynamicSchedule": [
                {"minBatchSize": a, "maxBatchSize": b, "numSpeculativeTokens": k} for a, b, k in schedule
            ]
        },
        "predicted": {
            "policyVsAlwaysOn": gain("policy", "alwaysOn"),
            "policyVsAlwaysOff": gain("policy", "alwaysOff"),
            "bestStatic": results["bestStatic"]["setting"],
            "bestStaticVsAlwaysOff": gain("bestStatic", "alwaysOff"),
            "policyRatioToPerLevelOracle": results["policy"]["ratioToPerLevelOracle"],
            "measure": "generated tokens per request-second (see `specfleet simulate`); ...Vs...: the gain "
            "over the other strategy (0.25 = 25% more); ...RatioTo...: the plain ratio (1.0 = as good)",
        },
    }
