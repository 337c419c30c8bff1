"""The pools' simulated Deployments: rendered as the operator renders them, rolled out as Kubernetes would.

Each Deployment rolls out as its rendered strategy says. Surge (`maxUnavailable: 0`, `maxSurge` >= 1):
new pods start (`startup_seconds`), each ready one replaces an old one. Replace (`maxSurge: 0`,
`maxUnavailable` >= 1): old pods stop first and each new pod starts on the GPUs one of them frees, so
its start-up begins only when that pod is gone (a Replace pool is one on a cluster with no spare GPU).
Either way an old pod stops taking requests and drains what it holds within its grace period.

A Standby pool (`rollout.flip: Standby`) flips without a restart: where the new template differs from a
pod's only in whether the drafter is on, that pod is flipped in place, one replica at a time whatever
the strategy. It leaves the endpoints and finishes the requests it holds, running and queued, as the
operator's flip driver waits for both (vLLM has no way to hand a queued request back; within its grace
period, as above), then its awake engine sleeps and the other wakes (`policy.predict.rollout_time.standby_switch_seconds`:
the weights per GPU over the host link each way) and serves one check completion
(`STANDBY_CHECK_SECONDS`); then it serves the other setting with an empty KV cache and a cold prefix
cache (a new `Replica` on the same GPUs; its predecessor's series is scraped on, asleep, as the pod
still serves both engines' metrics). Its switch (sleep, wake, check: the flip less its drain) goes
into status as `standbyFlipSeconds`, as the operator measures it. Any other change (a K of its own,
the image, a scale-up) starts new pods as a Restart pool does, and their engine without the
drafter starts awake, so one that is to speculate flips once after its start-up. A flip changes no pod
template, so one that comes during such a rollout leaves its surge pod starting where it is and flips
the ready pods in place beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specfleet.api.constants import LABEL_POOL, LABEL_TRACK, PoolName
from specfleet.api.status import PoolStatus, SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.predict.rollout_time import (
    STANDBY_CHECK_SECONDS,
    standby_startup_seconds,
    standby_switch_seconds,
)
from specfleet.reconcile import decided_plan
from specfleet.reconcile.apply import hand_over
from specfleet.render import PoolPlan, RenderOptions, render_children
from specfleet.render.common import pool_name
from specfleet.render.engine import canary_name
from specfleet.sim.accounts import Accounts
from specfleet.sim.engine import EngineConfig, Replica, SimRequest
from specfleet.sim.events import KILL, POD_READY, Events
from specfleet.sim.options import POOLS, SimOptions
from specfleet.sim.prom import Prometheus
from specfleet_runtime import names
from specfleet_runtime.cost_profile import StepTimeProfile
from specfleet_runtime.standby import parse_standby_args
from specfleet_runtime.vllm_args import LOOKAHEAD_METHODS, METHODS_WITH_DRAFTER_MODEL, parse_vllm_args


def switch_seconds(options: SimOptions, profile: StepTimeProfile, tensor_parallel_size: int) -> float:
    """One Standby replica's sleep + wake + check: the weights of the model the engines' KV cache is
    sized with (`engine_config`), per GPU, over the host link."""
    return standby_switch_seconds(options.memory_of(profile), tensor_parallel_size) + STANDBY_CHECK_SECONDS


def standby_pod_startup(options: SimOptions, profile: StepTimeProfile, tensor_parallel_size: int) -> float:
    """A Standby pod's start-up: two engines' and the supervisor's sleep check (`standby_startup_seconds`
    from the simulated one engine's `options.startup`)."""
    return standby_startup_seconds(options.startup, options.memory_of(profile), tensor_parallel_size)


@functools.lru_cache(maxsize=256)
def standby_flip(old_template: str, new_template: str) -> bool:
    """Whether two pod templates (their engine args, as JSON) differ only in whether the drafter is on:
    what a Standby pod switches between without a restart."""
    old, old_rest = parse_vllm_args(json.loads(old_template))
    new, new_rest = parse_vllm_args(json.loads(new_template))
    if (old.speculative is None) == (new.speculative is None) or old_rest != new_rest:
        return False
    # A Standby pod's two engines listen on two ports: the port is not what the flip changes.
    same = {"speculative": None, "port": 0}
    return dataclasses.replace(old, **same) == dataclasses.replace(new, **same)  # type: ignore[arg-type]


def serving_args(deployment: Mapping[str, Any], standby_mode: str | None) -> list[str]:
    """The vLLM arguments of the engine that serves in the Deployment's pods. A Standby pod's container
    is the supervisor of both engines (its template the same whatever the mode): the one for
    `standby_mode` serves, as the operator's flip driver wakes it; any other pod's container is the
    engine itself (`standby_mode` None)."""
    args = list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    if standby_mode is None:
        return args
    both = parse_standby_args(args)
    return list(both.speculative if standby_mode == "On" else both.plain)


@dataclass
class SimDeployment:
    """One pool's stable or canary Deployment: the rendered template and the pods it has."""

    pool: str
    track: str
    replicas: int
    max_surge: int
    template: str
    config: EngineConfig
    pods: list[Replica] = field(default_factory=list)
    # The pod template's terminationGracePeriodSeconds (Kubernetes' default when it has none).
    grace_seconds: float = 30.0
    # Pods the rollout may take out of service (0: a surge rollout).
    max_unavailable: int = 0
    # A Standby pool's stable Deployment: its pods flip in place, each taking `switch_seconds` (sleep +
    # wake + check) after its drain.
    standby: bool = False
    switch_seconds: float = 0.0
    # A Standby pod's start-up (two engines and a sleep check), used in place of one engine's.
    startup_seconds: float | None = None

    def active(self) -> list[Replica]:
        return [p for p in self.pods if p.draining_since is None and p.gone_at is None]

    def settled(self, now: float) -> bool:
        active = self.active()
        return len(active) == self.replicas and all(
            p.template == self.template and p.ready_at <= now for p in active
        )


class Rollouts:
    """Every pool's Deployments and engines; `finish_done` takes the requests engines put in `done`."""

    def __init__(
        self,
        options: SimOptions,
        profile: StepTimeProfile,
        prefill_s: float,
        events: Events,
        accounts: Accounts,
        prometheus: Prometheus,
        done: list[SimRequest],
        finish_done: Callable[[], None],
    ) -> None:
        self.options = options
        self.profile = profile
        self.prefill_s = prefill_s
        self.events = events
        self.accounts = accounts
        self.prometheus = prometheus
        self.done = done
        self.finish_done = finish_done
        self.serials = itertools.count()
        self.deployments: dict[tuple[str, str], SimDeployment] = {}
        self.replicas: dict[int, Replica] = {}
        self.endpoint_cache: dict[str, list[Replica]] = {}
        self.endpoint_cache_until = 0.0
        # A draining pod of a Replace rollout -> the new pod that waits for its GPUs (Pending until then)
        # and how long it takes once it has them (a start-up, or a Standby pod's sleep + wake + check).
        self.gpu_waiters: dict[int, tuple[Replica, float]] = {}
        # A Standby pod flipping -> when its predecessor left the endpoints; each pool's flips measured.
        self.flip_started: dict[int, float] = {}
        # A Standby pod's engine now serving -> its sibling engine, asleep in the same pod (its series
        # is still scraped).
        self.parked_for: dict[int, int] = {}
        self.standby_flips: dict[str, list[float]] = {}
        # Where a draining Standby pod's unstarted requests go (the router's retry; set by the fleet).

    def engine_config(self, args: list[str], pool: str) -> EngineConfig:
        engine, _ = parse_vllm_args(args)
        spec = engine.speculative
        util = engine.gpu_memory_utilization or self.options.default_gpu_memory_utilization
        speculative = spec is not None
        # The KV cache as vLLM sizes it for this engine's utilisation and TP (`policy.predict.kv_cache`): the
        # options' model where set, else the one the profile's memory section calibrates.
        memory = self.options.memory_of(self.profile)
        capacity = memory.kv_tokens(util, engine.tensor_parallel_size, speculative)
        block_size = memory.block_size
        return EngineConfig(
            speculative=speculative,
            k=spec.num_speculative_tokens if spec else 0,
            schedule=tuple((r.start, r.end, r.k) for r in spec.dynamic_schedule) if spec else (),
            max_num_seqs=engine.max_num_seqs or self.options.default_max_num_seqs,
            kv_capacity_tokens=capacity,
            max_model_len=engine.max_model_len,
            k0_penalty=self.options.k0_penalty,
            block_size=block_size,
            lookahead_tokens=spec.num_speculative_tokens if spec and spec.method in LOOKAHEAD_METHODS else 0,
            drafter_prefill_fraction=(
                self.options.drafter_prefill_fraction_of(self.profile)
                if spec and spec.method in METHODS_WITH_DRAFTER_MODEL
                else 0.0
            ),
        )

    def render(self, sd: SpeculativeDeployment, now: float, initial: bool = False) -> None:
        """Render every pool's Deployments from spec + status and move the simulated ones toward them."""
        # Exactly what reconcile renders from this spec and status; the engine Deployments are the pools.
        plan = decided_plan(sd)
        children = render_children(sd, plan, RenderOptions())
        if not initial:
            # ... and holds back, as reconcile does, a shrinking one while its pool's other one grows.
            live = {
                f"Deployment/{m['metadata']['name']}": self.live_manifest(m, now, plan)
                for m in children
                if m["kind"] == "Deployment"
            }
            children = hand_over(children, live)
        by_name = {m["metadata"]["name"]: m for m in children if m["kind"] == "Deployment"}
        for pool in names.POOLS:
            for track, name in (("stable", pool_name(sd, pool)), ("canary", canary_name(sd, pool))):
                manifest = by_name.get(name)
                if manifest is None:
                    continue
                dspec = manifest["spec"]
                standby = plan[pool].standby and track == "stable"
                args = serving_args(manifest, plan[pool].mode if standby else None)
                template = json.dumps(args)
                key = (pool, track)
                dep = self.deployments.get(key)
                rolling = dspec["strategy"]["rollingUpdate"]
                surge = int(rolling["maxSurge"])
                if dep is None:
                    dep = SimDeployment(
                        pool, track, int(dspec["replicas"]), surge, template, self.engine_config(args, pool)
                    )
                    self.deployments[key] = dep
                elif dep.template != template:
                    dep.template, dep.config = template, self.engine_config(args, pool)
                dep.replicas, dep.max_surge = int(dspec["replicas"]), surge
                dep.max_unavailable = int(rolling.get("maxUnavailable", 0))
                dep.grace_seconds = float(dspec["template"]["spec"].get("terminationGracePeriodSeconds", 30))
                dep.standby = standby
                if dep.standby:
                    engine, _ = parse_vllm_args(args)
                    tp = engine.tensor_parallel_size
                    dep.switch_seconds = switch_seconds(self.options, self.profile, tp)
                    dep.startup_seconds = standby_pod_startup(self.options, self.profile, tp)
                self.sync(dep, now, initial)

    def live_manifest(
        self, desired: dict[str, Any], now: float, plan: Mapping[PoolName, PoolPlan]
    ) -> dict[str, Any] | None:
        """A simulated Deployment as the apiserver would show it, for `hand_over` (None: none yet)."""
        labels = desired["metadata"].get("labels") or {}
        pool, track = labels.get(LABEL_POOL, ""), labels.get(LABEL_TRACK, "")
        dep = self.deployments.get((pool, track))
        if dep is None:
            return None
        decided = plan.get(pool)
        standby = decided is not None and decided.standby and track == "stable"
        template = json.dumps(serving_args(desired, decided.mode if standby and decided else None))
        active = dep.active()
        return {
            "kind": "Deployment",
            "metadata": {"name": desired["metadata"]["name"], "generation": 1},
            "spec": {"replicas": dep.replicas},
            "status": {
                "observedGeneration": 1,
                "replicas": len(active),
                "updatedReplicas": sum(1 for p in active if p.template == template),
                "readyReplicas": sum(1 for p in active if p.ready_at <= now),
            },
        }

    def new_pod(self, dep: SimDeployment, now: float, ready_at: float) -> Replica:
        rep = Replica(
            next(self.serials),
            dep.pool,
            dep.track,
            dep.template,
            dep.config,
            self.profile,
            self.prefill_s,
            self.options.seed,
            created=now,
            ready_at=ready_at,
        )
        self.replicas[rep.serial] = rep
        self.endpoint_cache.clear()
        self.prometheus.track(rep)
        dep.pods.append(rep)
        if now < ready_at < math.inf:
            self.events.push(ready_at, POD_READY, rep.serial)
        return rep

    def start_pod(self, dep: SimDeployment, now: float, standby: bool = False) -> Replica:
        """A new pod of a rollout: it starts now, or (maxSurge 0) once a draining pod frees its GPUs. A
        Standby flip's (`standby`) is the drained pod's other engine: it serves `switch_seconds` after
        its predecessor is gone. A Standby pod that starts up to speculate flips once after it."""
        startup = self.options.startup
        if standby:
            startup = dep.switch_seconds
        elif dep.standby:
            startup = dep.startup_seconds or startup
            if dep.config.speculative:
                startup += dep.switch_seconds
        if dep.max_surge == 0 or standby:
            freeing = [
                p
                for p in dep.pods
                if p.draining_since is not None
                and p.gone_at is None
                and (
                    p.serial not in self.gpu_waiters
                    or (standby and self.gpu_waiters[p.serial][0].gone_at is not None)
                )
            ]
            if freeing:
                pending = self.new_pod(dep, now, math.inf)
                first = min(freeing, key=lambda p: p.serial)
                self.gpu_waiters[first.serial] = (pending, startup)
                if standby:
                    self.flip_started[pending.serial] = first.draining_since or now
                return pending
        rep = self.new_pod(dep, now, now + startup)
        if standby:
            self.flip_started[rep.serial] = now
        return rep

    def sync(self, dep: SimDeployment, now: float, initial: bool = False) -> None:
        """One pass of the Deployment controller with `dep.max_surge` and `dep.max_unavailable`."""
        active = dep.active()
        new = [p for p in active if p.template == dep.template]
        old = [p for p in active if p.template != dep.template]
        if initial:
            for _ in range(dep.replicas - len(new)):
                self.new_pod(dep, now, now)
            return
        # A Standby pool whose pods differ from the template only in the drafter flips them in place,
        # one at a time (each new pod is the drained one's other engine).
        standby = bool(old) and dep.standby and all(standby_flip(p.template, dep.template) for p in old)
        surge, unavailable = (0, 1) if standby else (dep.max_surge, dep.max_unavailable)
        # Old pods that are not ready yet serve nobody: remove them at once. A Standby pod still starting
        # is not restarted by a flip (the template is the same whatever the mode): it comes up and the
        # driver wakes the engine of the new mode, so it serves that one from when it would have been
        # Ready, plus a switch if it must speculate (pods start serving without the drafter).
        for p in [p for p in old if p.ready_at > now]:
            self.remove(p, now)
            old.remove(p)
            if standby and p.ready_at < math.inf:
                ready_at = p.created + (dep.startup_seconds or self.options.startup)
                ready_at += dep.switch_seconds if dep.config.speculative else 0.0
                new.append(self.new_pod(dep, p.created, max(now, ready_at)))
        # The pods the rollout ends with. A flip changes no pod template (the driver wakes the other
        # engine): a pod a restart rollout started beyond the replicas (its surge pod) keeps its place
        # while it starts, and the ready pods flip in place beside it, one at a time.
        target = dep.replicas
        if standby:
            starting = [p for p in new if now < p.ready_at and p.serial not in self.flip_started]
            target += max(0, min(len(starting), len(active) - dep.replicas))
        # Too many new pods (scaled down): remove starting ones first, then ready ones.
        excess = len(new) - target
        if excess > 0:
            for p in sorted(new, key=lambda p: (p.ready_at <= now, -p.serial))[:excess]:
                self.remove(p, now)
                new.remove(p)
        while True:
            # New pods while the total stays within replicas + maxSurge ...
            room = target + surge - len(new) - len(old)
            created = max(0, min(target - len(new), room))
            for _ in range(created):
                new.append(self.start_pod(dep, now, standby))
            # ... and retire old ones while the ready pods stay at least replicas - maxUnavailable.
            ready = sum(1 for p in new if p.ready_at <= now) + len(old)
            floor = dep.replicas - unavailable
            retired = sorted(old, key=lambda p: p.serial)[: max(0, min(len(old), ready - floor))]
            for p in retired:
                self.remove(p, now)
                old.remove(p)
            if not created and not retired:
                return

    def remove(self, rep: Replica, now: float) -> None:
        """Take a pod out of the endpoints: it drains what it holds and is gone when idle or killed at
        its grace period."""
        self.endpoint_cache.clear()
        if rep.ready_at > now:
            rep.gone_at = now
            self.prometheus.deleted(rep, now)
            return
        rep.advance_to(now, self.done)
        self.finish_done()
        rep.draining_since = now
        if rep.idle:
            self.gone(rep, max(now, rep.t))
        else:
            grace = next((d.grace_seconds for d in self.deployments.values() if rep in d.pods), 30.0)
            rep.kill_at = now + grace
            self.events.push(rep.kill_at, KILL, rep.serial)
            self.events.schedule_replica(rep)

    def kill(self, serial: int, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """A draining pod's grace period ran out: it is killed with what it still holds, as the kubelet
        does. Returns (requests that had not started streaming, requests cut off mid-stream)."""
        rep = self.replicas[serial]
        if rep.gone_at is not None:
            return [], []
        rep.advance_to(now, self.done)
        self.finish_done()
        held = [*rep.take_waiting(), *rep.take_running()]
        self.gone(rep, now)
        unstarted = [r for r in held if r.first_token < 0]
        return unstarted, [r for r in held if r.first_token >= 0]

    def gone(self, rep: Replica, at: float) -> None:
        rep.gone_at = at
        waiting = self.gpu_waiters.pop(rep.serial, None)
        if waiting is not None and waiting[0].serial in self.flip_started:
            # A Standby flip: this engine sleeps in its pod, which still serves its metrics (both engines
            # are scraped, render/monitoring.py), so its series stays, asleep, until the pod's other
            # engine is itself switched or gone.
            self.prometheus.park(rep, at)
            self.prometheus.waking(waiting[0], at)
            self.parked_for[waiting[0].serial] = rep.serial
        else:
            self.prometheus.deleted(rep, at)
        parked = self.parked_for.pop(rep.serial, None)
        if parked is not None:
            self.prometheus.deleted(self.replicas[parked], at)
        self.accounts.gone(rep)
        if waiting is not None and waiting[0].gone_at is None:
            # Its GPUs are free: the pod that waited for them is scheduled and starts up.
            waiter, startup = waiting
            waiter.ready_at = waiter.t = at + startup
            if waiter.serial in self.flip_started:
                # The same pod's other engine: its GPUs are counted once.
                waiter.created = at
            self.endpoint_cache.clear()
            self.events.push(waiter.ready_at, POD_READY, waiter.serial)

    def pool_pods(self, pool: str) -> list[Replica]:
        return [p for (pl, _), d in self.deployments.items() if pl == pool for p in d.pods]

    def endpoints(self, pool: str, now: float) -> list[Replica]:
        """Ready, not draining engines of the pool (cached until a pod starts, becomes ready or goes)."""
        cached = self.endpoint_cache.get(pool)
        if cached is None or now >= self.endpoint_cache_until:
            cached = [p for p in self.pool_pods(pool) if p.ready and p.ready_at <= now]
            self.endpoint_cache[pool] = cached
            self.endpoint_cache_until = min(
                (p.ready_at for p in self.replicas.values() if p.ready_at > now and p.gone_at is None),
                default=math.inf,
            )
        return cached

    def after_advance(self, rep: Replica, now: float) -> None:
        """After an engine ran up to `now`: a drained one is gone, any other waits for its next event."""
        if rep.draining_since is not None and rep.gone_at is None and rep.idle:
            self.gone(rep, max(now, min(rep.t, now)))
        else:
            self.events.schedule_replica(rep)

    def pod_ready(self, serial: int, now: float) -> bool:
        """A pod became ready: its Deployment's rollout goes on (False: the pod is gone already)."""
        rep = self.replicas[serial]
        if rep.gone_at is not None:
            return False
        if self.flip_started.pop(serial, None) is not None:
            # The switch, as the operator measures it (sleep, wake, check): a flipped pod's other engine
            # is created when its predecessor is gone.
            self.standby_flips.setdefault(rep.pool, []).append(now - rep.created)
        for dep in self.deployments.values():
            if rep in dep.pods:
                self.sync(dep, now)
        return True

    def observed_status(self, status: SpeculativeDeploymentStatus, now: float) -> SpeculativeDeploymentStatus:
        """`status` with each pool's replica counts and `settled` from its Deployments, as reconcile sets."""
        pools = status.pools.model_copy()
        for pool in POOLS:
            deps = [d for (pl, _), d in self.deployments.items() if pl == pool]
            active = [p for d in deps for p in d.active()]
            ps: PoolStatus = getattr(pools, pool)
            flips = self.standby_flips.get(pool)
            standby = {}
            if flips:
                # As the operator measures it: one replica's switch, the median of the last flip's.
                last = flips[-max(1, max((d.replicas for d in deps), default=1)) :]
                standby["standby_flip_seconds"] = max(1, round(statistics.median(last)))
            setattr(
                pools,
                pool,
                ps.model_copy(
                    update={
                        **standby,
                        "replicas": len(active),
                        "ready_replicas": sum(1 for p in active if p.ready_at <= now),
                        "updated_replicas": sum(
                            1 for d in deps for p in d.active() if p.template == d.template
                        ),
                        "settled": all(d.settled(now) for d in deps),
                        # As the operator measures it from the pods (pod created to Ready).
                        "startup_seconds": max(
                            1,
                            round(
                                max(
                                    (d.startup_seconds or self.options.startup for d in deps),
                                    default=self.options.startup,
                                )
                            ),
                        ),
                    }
                ),
            )
        return status.model_copy(update={"pools": pools})

    def pool_state(self, pool: str, now: float) -> dict[str, Any]:
        """A pool's row in the timeline: its stable engines' mode and K, and its replica counts."""
        deps = [d for (pl, _), d in self.deployments.items() if pl == pool]
        stable = self.deployments[(pool, "stable")]
        return {
            "mode": "On" if stable.config.speculative else "Off",
            "k": stable.config.k,
            "replicas": sum(len(d.active()) for d in deps),
            "readyReplicas": sum(1 for d in deps for p in d.active() if p.ready_at <= now),
            "updatedReplicas": sum(1 for d in deps for p in d.active() if p.template == d.template),
            "canaryReplicas": sum(len(d.active()) for d in deps if d.track == "canary"),
            "running": sum(p.running for p in self.pool_pods(pool) if p.gone_at is None),
        }
