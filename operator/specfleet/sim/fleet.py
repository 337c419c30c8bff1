"""The simulated fleet: router, engines, rendered Deployments and their rollouts, and the policy loop.

One run replays one workload under one strategy:

- `policy`: the operator's own loop. Every `policy.evaluationIntervalSeconds` the fleet is asked
  (`specfleet.sim.prom`: PromQL semantics over samples scraped every `scrape_interval`) and the
  operator's evaluation (`specfleet.policy.evaluate`: decide, record, drift, the cost-profile
  condition) gives the new status (a retrain Job it asks for is recorded, not run); the pools' Deployments are then rendered by `specfleet.render` from that status (so canary
  replicas, K and maxSurge are the operator's) and rolled out as the Deployment controller would with
  `maxUnavailable: 0`: new pods start (`startup_seconds`), each ready one replaces an old one, and an
  old pod stops taking requests and drains what it holds. Status `settled` / `readyReplicas` come
  from the simulated Deployments, as reconcile sets them.
- `static`: the Auto pools pinned On at a K (or Off) from the start; nothing changes.
- `engineDynamicSD`: the Auto pools pinned On with vLLM's in-engine Dynamic SD table (K per batch
  size, 0 where speculation loses), whose K=0 steps pay `k0_penalty` and whose engines keep the
  drafter's memory.
- `schedule`: the Auto pools follow a fixed list of changes (`Strategy.schedule`: time, pool, mode,
  K), written into status as the policy's decisions are, with no canaries, and rolled out the same
  way; each change pays its real surge rollout. The rollout-paying oracle (`specfleet.sim.bound`)
  runs its hindsight schedule through it.

Requests are classified by the router's own code (`extract_facts`, `classify`, `ClientLoadTracker`,
`resolve_pool`) and sent to the ready engine with the fewest outstanding requests, as the router does.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from specfleet.api.constants import LABEL_POOL, LABEL_TRACK, PoolName
from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.status import PoolStatus, SpeculativeDeploymentStatus
from specfleet.api.validation import SpeculativeDeployment, parse_spec
from specfleet.policy.drift import RetrainTrigger
from specfleet.policy.evaluate import evaluate_policy
from specfleet.policy.record import auto_pools
from specfleet.reconcile import decided_plan
from specfleet.reconcile.apply import hand_over
from specfleet.render import RenderOptions, render_children
from specfleet.render.common import pool_name
from specfleet.render.engine import canary_name
from specfleet.render.router import routing_config
from specfleet.sim import prom
from specfleet.sim.engine import EngineConfig, MemoryModel, Replica, SimRequest, itl_bin_seconds
from specfleet.sim.workload import ClosedLoop, Trace, TraceRequest
from specfleet_runtime import names
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile
from specfleet_runtime.router.classify import ClientLoadTracker, classify, extract_facts
from specfleet_runtime.router.endpoints import resolve_pool
from specfleet_runtime.vllm_args import parse_vllm_args

POOLS: tuple[str, ...] = names.POOLS
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# Prefill cost when the profile has none: 2 x 8.03e9 FLOPs per prompt token on an H100 (989 dense
# bf16 TFLOPS) at 40% utilisation is 0.04 ms per token.
DEFAULT_PREFILL_MS_PER_TOKEN = 0.04


@dataclass(frozen=True)
class Strategy:
    """How the Auto pools' speculation is set during a run."""

    name: str
    kind: str  # "policy", "static", "engineDynamicSD"
    mode: str = "On"
    k: int | None = None
    # kind "schedule": (time in seconds, pool, "On"/"Off", K or None); those at time 0 set the start.
    schedule: tuple[tuple[float, str, str, int | None], ...] = ()


@dataclass(frozen=True)
class SimOptions:
    """Simulation settings that are not in the resource."""

    seed: int = 0
    scrape_interval: float = 15.0
    startup_seconds: float = 60.0
    prefill_ms_per_token: float | None = None
    k0_penalty: float = 0.10
    acceptance: tuple[float, ...] = (0.68, 0.39, 0.20, 0.10, 0.05)
    memory: MemoryModel = field(default_factory=MemoryModel)
    default_max_num_seqs: int = 256
    default_gpu_memory_utilization: float = 0.9
    # Bin width of the timeline and of the oracle's per-window choice (None: the evaluation interval).
    bin_seconds: float | None = None


@dataclass
class PoolResult:
    tokens: float = 0.0
    requests: int = 0
    rejected: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: dict[int, float] = field(default_factory=dict)
    gpu_seconds: float = 0.0
    requested_tokens: int = 0


@dataclass
class Change:
    """A flip or a retune the policy made."""

    time: float
    pool: str
    from_mode: str
    to_mode: str
    from_k: int | None
    to_k: int | None
    reason: str

    canaries: int | None = None
    # Running requests per replica the policy observed (window average) and decided with (projected).
    observed_load: float | None = None
    expected_load: float | None = None

    # The policy chose a new Dynamic SD schedule for the pool (a retune that may keep K).
    schedule: bool = False

    @property
    def kind(self) -> str:
        if self.from_mode != self.to_mode:
            return "flip"
        if self.schedule or (self.to_k is not None and self.to_k != self.from_k):
            return "retune"
        return "canaries"


@dataclass
class RunResult:
    """Everything one run measured."""

    strategy: Strategy
    duration: float
    bin_seconds: float
    pools: dict[str, PoolResult]
    # Per pool, per bin: generated tokens, request-seconds in the system, and the state at the bin's end.
    bin_tokens: dict[str, np.ndarray]
    bin_request_seconds: dict[str, np.ndarray]
    timeline: list[dict[str, Any]]
    changes: list[Change]
    submitted: int
    completed: int
    rejected: int
    generation_tokens_total: float
    requested_tokens_completed: int
    # The policy's status at the end, and the retrain Jobs it asked for (not run in the simulator).
    status: SpeculativeDeploymentStatus = field(default_factory=SpeculativeDeploymentStatus)
    retrains: list[RetrainTrigger] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return sum(p.tokens for p in self.pools.values()) / self.duration if self.duration else 0.0


# ---------------------------------------------------------------------------------------------------
# Spec variants for the baselines


def strategy_spec(
    spec: SpeculativeDeploymentSpec, strategy: Strategy, schedule: Sequence[tuple[int, int, int]] = ()
) -> SpeculativeDeploymentSpec:
    """The resource a strategy runs: the policy's is the user's; a baseline pins the Auto pools."""
    if strategy.kind == "policy":
        return spec
    doc = spec.model_dump(by_alias=True, exclude_none=True)
    if strategy.kind == "schedule":
        # The pools stay Auto and take mode and K from status, as under the Goodput policy.
        doc["drafter"].pop("dynamicSchedule", None)
        doc["policy"]["mode"] = "Goodput"
        return parse_spec(doc)
    for pool in POOLS:
        if doc["pools"][pool]["speculation"] == "Auto":
            doc["pools"][pool]["speculation"] = "Off" if strategy.mode == "Off" else "On"
    if strategy.kind == "static":
        doc["drafter"].pop("dynamicSchedule", None)
        if strategy.k is not None:
            doc["drafter"]["numSpeculativeTokens"] = strategy.k
    elif strategy.kind == "engineDynamicSD" and not doc["drafter"].get("dynamicSchedule"):
        doc["drafter"]["dynamicSchedule"] = [
            {"minBatchSize": a, "maxBatchSize": b, "numSpeculativeTokens": k} for a, b, k in schedule
        ]
    return parse_spec(doc)


# ---------------------------------------------------------------------------------------------------
# Deployments


@dataclass
class _Deployment:
    pool: str
    track: str
    replicas: int
    max_surge: int
    template: str
    config: EngineConfig
    pods: list[Replica] = field(default_factory=list)

    def active(self) -> list[Replica]:
        return [p for p in self.pods if p.draining_since is None and p.gone_at is None]

    def settled(self, now: float) -> bool:
        active = self.active()
        return len(active) == self.replicas and all(
            p.template == self.template and p.ready_at <= now for p in active
        )


class _Fleet:
    def __init__(
        self,
        sd: SpeculativeDeployment,
        strategy: Strategy,
        workload: Trace | ClosedLoop,
        options: SimOptions,
        profile: StepTimeProfile,
    ) -> None:
        self.sd = sd
        self.spec = sd.spec
        self.strategy = strategy
        self.workload = workload
        self.options = options
        self.profile = profile
        self.policy = sd.spec.policy
        self.bin = options.bin_seconds or float(self.policy.evaluation_interval_seconds)
        self.duration = max(workload.duration, self.bin)
        self.nbins = math.ceil(self.duration / self.bin - 1e-9)
        prefill_ms = options.prefill_ms_per_token
        if prefill_ms is None:
            prefill_ms = profile.prefill_ms_per_token or DEFAULT_PREFILL_MS_PER_TOKEN
        self.prefill_s = prefill_ms / 1000.0
        self.routing = routing_config(sd)
        self.tracker = ClientLoadTracker()
        self.status = SpeculativeDeploymentStatus()
        self.serials = itertools.count()
        self.deployments: dict[tuple[str, str], _Deployment] = {}
        self.replicas: dict[int, Replica] = {}
        self.series: dict[int, prom.Series] = {}
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = itertools.count()
        self.versions: dict[int, int] = {}
        self.turn = 0
        self.results = {p: PoolResult() for p in POOLS}
        self.bin_tokens = {p: np.zeros(self.nbins) for p in POOLS}
        self.bin_reqsec = {p: np.zeros(self.nbins) for p in POOLS}
        self.gone_tokens = dict.fromkeys(POOLS, 0.0)
        self.last_tokens = dict.fromkeys(POOLS, 0.0)
        self.timeline: list[dict[str, Any]] = []
        self.changes: list[Change] = []
        self.retrains: list[RetrainTrigger] = []
        self.submitted = 0
        self.completed = 0
        self.rejected = 0
        self.requested_completed = 0
        self.in_system: dict[int, SimRequest] = {}
        self.rng = np.random.default_rng([options.seed, 7])
        self.facts_memo: dict[tuple[Any, ...], Any] = {}
        self.done: list[SimRequest] = []
        self.last_decisions: dict[str, dict[str, Any]] = {}
        self.endpoint_cache: dict[str, list[Replica]] = {}
        self.endpoint_cache_until = 0.0
        self.size_draws: list[int] = []
        # Closed loop
        self.clients_active = 0
        self.clients_retiring = 0
        self.client_ids = itertools.count()

    # -- events --------------------------------------------------------------------------------------
    # kinds, in the order they run at one instant
    POD_READY, SCRAPE, BIN, EVAL, REPLICA, TICK, ARRIVAL = range(7)

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), a, b))

    def schedule_replica(self, rep: Replica) -> None:
        at = rep.next_event()
        version = self.versions.get(rep.serial, 0) + 1
        self.versions[rep.serial] = version
        if at is not None:
            self.push(at, self.REPLICA, rep.serial, version)

    # -- deployments ---------------------------------------------------------------------------------

    def current_sd(self) -> SpeculativeDeployment:
        return dataclasses.replace(self.sd, spec=self.spec, status=self.status)

    def engine_config(self, args: list[str], pool: str) -> EngineConfig:
        engine, _ = parse_vllm_args(args)
        spec = engine.speculative
        util = engine.gpu_memory_utilization or self.options.default_gpu_memory_utilization
        speculative = spec is not None
        return EngineConfig(
            speculative=speculative,
            k=spec.num_speculative_tokens if spec else 0,
            schedule=tuple((r.start, r.end, r.k) for r in spec.dynamic_schedule) if spec else (),
            max_num_seqs=engine.max_num_seqs or self.options.default_max_num_seqs,
            kv_capacity_tokens=self.options.memory.kv_capacity_tokens(util, speculative),
            max_model_len=engine.max_model_len,
            k0_penalty=self.options.k0_penalty,
        )

    def render(self, now: float, initial: bool = False) -> None:
        """Render every pool's Deployments from spec + status and move the simulated ones toward them."""
        sd = self.current_sd()
        # Exactly what reconcile renders from this spec and status; the engine Deployments are the pools.
        children = render_children(sd, decided_plan(sd), RenderOptions())
        if not initial:
            # ... and holds back, as reconcile does, a shrinking one while its pool's other one grows.
            live = {
                f"Deployment/{m['metadata']['name']}": self.live_manifest(m, now)
                for m in children
                if m["kind"] == "Deployment"
            }
            children = hand_over(children, live)
        by_name = {m["metadata"]["name"]: m for m in children if m["kind"] == "Deployment"}
        names: tuple[PoolName, ...] = ("latency", "batch")
        for pool in names:
            for track, name in (("stable", pool_name(sd, pool)), ("canary", canary_name(sd, pool))):
                manifest = by_name.get(name)
                if manifest is None:
                    continue
                dspec = manifest["spec"]
                args = dspec["template"]["spec"]["containers"][0]["args"]
                template = json.dumps(args)
                key = (pool, track)
                dep = self.deployments.get(key)
                surge = int(dspec["strategy"]["rollingUpdate"]["maxSurge"])
                if dep is None:
                    dep = _Deployment(
                        pool, track, int(dspec["replicas"]), surge, template, self.engine_config(args, pool)
                    )
                    self.deployments[key] = dep
                elif dep.template != template:
                    dep.template, dep.config = template, self.engine_config(args, pool)
                dep.replicas, dep.max_surge = int(dspec["replicas"]), surge
                self.sync(dep, now, initial)

    def live_manifest(self, desired: dict[str, Any], now: float) -> dict[str, Any] | None:
        """A simulated Deployment as the apiserver would show it, for `hand_over` (None: none yet)."""
        labels = desired["metadata"].get("labels") or {}
        dep = self.deployments.get((labels.get(LABEL_POOL, ""), labels.get(LABEL_TRACK, "")))
        if dep is None:
            return None
        template = json.dumps(desired["spec"]["template"]["spec"]["containers"][0]["args"])
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

    def new_pod(self, dep: _Deployment, now: float, ready_at: float) -> Replica:
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
        self.series[rep.serial] = prom.Series(pool=dep.pool)
        dep.pods.append(rep)
        if ready_at > now:
            self.push(ready_at, self.POD_READY, rep.serial)
        return rep

    def sync(self, dep: _Deployment, now: float, initial: bool = False) -> None:
        """One pass of the Deployment controller with maxUnavailable 0 and maxSurge `dep.max_surge`."""
        active = dep.active()
        new = [p for p in active if p.template == dep.template]
        old = [p for p in active if p.template != dep.template]
        if initial:
            for _ in range(dep.replicas - len(new)):
                self.new_pod(dep, now, now)
            return
        # Old pods that are not ready yet serve nobody: remove them at once.
        for p in [p for p in old if p.ready_at > now]:
            self.remove(p, now)
            old.remove(p)
        # Too many new pods (scaled down): remove starting ones first, then ready ones.
        excess = len(new) - dep.replicas
        if excess > 0:
            for p in sorted(new, key=lambda p: (p.ready_at <= now, -p.serial))[:excess]:
                self.remove(p, now)
                new.remove(p)
        while True:
            # Surge new pods while the total stays within replicas + maxSurge ...
            room = dep.replicas + dep.max_surge - len(new) - len(old)
            created = max(0, min(dep.replicas - len(new), room))
            for _ in range(created):
                new.append(self.new_pod(dep, now, now + self.options.startup_seconds))
            # ... and retire old ones while the ready pods stay at least `replicas` (maxUnavailable 0).
            ready = sum(1 for p in new if p.ready_at <= now) + len(old)
            retired = sorted(old, key=lambda p: p.serial)[: max(0, ready - dep.replicas)]
            for p in retired:
                self.remove(p, now)
                old.remove(p)
            if not created and not retired:
                return

    def remove(self, rep: Replica, now: float) -> None:
        self.endpoint_cache.clear()
        if rep.ready_at > now:
            rep.gone_at = now
            self.series[rep.serial].deleted_at = now
            return
        rep.advance_to(now, self.done)
        self.finish_done()
        rep.draining_since = now
        if rep.idle:
            self.gone(rep, max(now, rep.t))
        else:
            self.schedule_replica(rep)

    def gone(self, rep: Replica, at: float) -> None:
        rep.gone_at = at
        self.series[rep.serial].deleted_at = at
        self.gone_tokens[rep.pool] += rep.generation_tokens
        for b, w in rep.itl.items():
            itl = self.results[rep.pool].itl
            itl[b] = itl.get(b, 0.0) + w

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

    def update_status(self, now: float) -> None:
        pools = self.status.pools.model_copy()
        for pool in POOLS:
            deps = [d for (pl, _), d in self.deployments.items() if pl == pool]
            active = [p for d in deps for p in d.active()]
            ps: PoolStatus = getattr(pools, pool)
            setattr(
                pools,
                pool,
                ps.model_copy(
                    update={
                        "replicas": len(active),
                        "ready_replicas": sum(1 for p in active if p.ready_at <= now),
                        "updated_replicas": sum(
                            1 for d in deps for p in d.active() if p.template == d.template
                        ),
                        "settled": all(d.settled(now) for d in deps),
                    }
                ),
            )
        self.status = self.status.model_copy(update={"pools": pools})

    # -- requests ------------------------------------------------------------------------------------

    def pool_for(self, req: TraceRequest, client: str, now: float) -> PoolName:
        key = (req.tenant, req.pool, req.max_tokens, req.n, req.stream)
        facts = self.facts_memo.get(key)
        if facts is None:
            headers: dict[str, str] = {}
            if req.tenant:
                headers[self.routing.tenant_header] = req.tenant
            if req.pool:
                headers[self.routing.pool_header] = req.pool
            body: dict[str, Any] = {"stream": req.stream}
            if req.max_tokens is not None:
                body["max_tokens"] = req.max_tokens
            if req.n != 1:
                body["n"] = req.n
            facts = extract_facts(self.routing, headers, body, None)
            self.facts_memo[key] = facts
        segmented = False
        if req.tenant:
            # Only clients that share an identity can be segmented; a lone request never crosses the threshold.
            segmented = self.tracker.begin(client, now, self.routing.auto_segmentation).segmented
        return classify(self.routing, facts, segmented).pool

    def arrive(self, req: TraceRequest, now: float, index: int, client: str | None = None) -> None:
        client_id = f"tenant:{req.tenant}" if req.tenant else (client or f"request:{index}")
        wanted = self.pool_for(req, client_id, now)
        candidates = self.endpoints(wanted, now)
        pool: PoolName | None = wanted
        if not candidates:
            pods = {p: self.endpoints(p, now) for p in POOLS}
            pool = resolve_pool(
                wanted, {p: [str(r.serial) for r in v] for p, v in pods.items()}, self.routing.fallback
            )
            candidates = pods[pool] if pool is not None else []
        acceptance = req.acceptance or self.acceptance_at(now)
        tokens = req.requested_tokens // req.n
        for _ in range(req.n):
            self.submitted += 1
            sim = SimRequest(
                index, now, req.prompt_tokens, tokens, acceptance, wanted, client_id if req.tenant else client
            )
            if pool is None:
                self.reject(sim, wanted)
                continue
            count = len(candidates)
            best = candidates[self.turn % count]
            for offset in range(1, count):
                cand = candidates[(self.turn + offset) % count]
                if cand.outstanding < best.outstanding:
                    best = cand
            self.turn += 1
            if not best.fits(sim):
                self.reject(sim, pool)
                continue
            sim.pool = pool
            best.advance_to(now, self.done)
            best.submit(sim, now)
            self.in_system[id(sim)] = sim
            self.finish_done()
            self.schedule_replica(best)

    def acceptance_at(self, now: float) -> tuple[float, ...]:
        if isinstance(self.workload, ClosedLoop):
            return self.workload.acceptance_at(now) or self.options.acceptance
        return self.options.acceptance

    def reject(self, sim: SimRequest, pool: str) -> None:
        self.rejected += 1
        self.results[pool].rejected += 1
        if sim.client is not None and isinstance(self.workload, ClosedLoop):
            self.client_next(sim.client, sim.arrival + 1.0)

    def finish_done(self) -> None:
        done, self.done = self.done, []
        for sim in done:
            self.in_system.pop(id(sim), None)
            self.completed += 1
            self.requested_completed += sim.tokens
            res = self.results[sim.pool]
            res.requests += 1
            res.requested_tokens += sim.tokens
            res.ttft.append(sim.first_token - sim.arrival)
            self.add_request_seconds(sim.pool, sim.arrival, sim.finish)
            if sim.client is not None and sim.client.startswith("tenant:"):
                self.tracker.end(sim.client, sim.finish, self.routing.auto_segmentation)
            if isinstance(self.workload, ClosedLoop) and sim.client is not None:
                self.client_next(sim.client, sim.finish)

    def add_request_seconds(self, pool: str, start: float, end: float) -> None:
        end = min(end, self.duration)
        if end <= start:
            return
        first, last = int(start // self.bin), min(self.nbins - 1, int(end // self.bin))
        arr = self.bin_reqsec[pool]
        for b in range(first, last + 1):
            lo, hi = max(start, b * self.bin), min(end, (b + 1) * self.bin)
            if hi > lo:
                arr[b] += hi - lo

    # -- closed loop ---------------------------------------------------------------------------------

    def client_next(self, client: str, at: float) -> None:
        if self.clients_retiring > 0 or at >= self.duration:
            self.clients_retiring = max(0, self.clients_retiring - 1)
            self.clients_active -= 1
            return
        self.push(at, self.ARRIVAL, int(client.split(":")[1]), 1)

    def closed_loop_request(self, client: int, now: float) -> None:
        assert isinstance(self.workload, ClosedLoop)
        sizes = self.workload.sizes
        if not self.size_draws:
            self.size_draws = self.rng.integers(len(sizes), size=4096).tolist()
        prompt, tokens = sizes[self.size_draws.pop()]
        req = TraceRequest(arrival=now, prompt_tokens=prompt, output_tokens=tokens, pool=self.workload.pool)
        self.arrive(req, now, self.submitted, client=f"client:{client}")

    def tick(self, now: float) -> None:
        assert isinstance(self.workload, ClosedLoop)
        want = self.workload.clients(now)
        have = self.clients_active - self.clients_retiring
        if want > have:
            revive = min(self.clients_retiring, want - have)
            self.clients_retiring -= revive
            for _ in range(want - have - revive):
                self.clients_active += 1
                self.closed_loop_request(next(self.client_ids), now)
        elif want < have:
            self.clients_retiring += have - want
        if now + 1.0 < self.duration:
            self.push(now + 1.0, self.TICK)

    # -- measurement ---------------------------------------------------------------------------------

    def scrape(self, now: float) -> None:
        for rep in self.replicas.values():
            if rep.gone_at is not None or rep.ready_at > now:
                continue
            rep.advance_to(now, self.done)
            self.series[rep.serial].samples.append(
                prom.Sample(
                    t=now,
                    drafts=rep.drafts,
                    draft_tokens=rep.draft_tokens,
                    accepted=rep.accepted,
                    accepted_pos=tuple(rep.accepted_pos[: rep.config.k]),
                    generation_tokens=rep.generation_tokens,
                    running=float(rep.running),
                    waiting=float(len(rep.waiting)),
                )
            )
            self.after_advance(rep, now)
        self.finish_done()

    def after_advance(self, rep: Replica, now: float) -> None:
        if rep.draining_since is not None and rep.gone_at is None and rep.idle:
            self.gone(rep, max(now, min(rep.t, now)))
        else:
            self.schedule_replica(rep)

    def close_bin(self, index: int, now: float) -> None:
        for rep in self.replicas.values():
            if rep.gone_at is None and rep.ready_at <= now:
                rep.advance_to(now, self.done)
                self.after_advance(rep, now)
        self.finish_done()
        totals = dict(self.gone_tokens)
        for rep in self.replicas.values():
            if rep.gone_at is None:
                totals[rep.pool] += rep.generation_tokens
        row: dict[str, Any] = {"t": now}
        for pool in POOLS:
            self.bin_tokens[pool][index] = totals[pool] - self.last_tokens[pool]
            self.last_tokens[pool] = totals[pool]
            deps = [d for (pl, _), d in self.deployments.items() if pl == pool]
            stable = self.deployments[(pool, "stable")]
            row[pool] = {
                "mode": "On" if stable.config.speculative else "Off",
                "k": stable.config.k,
                "replicas": sum(len(d.active()) for d in deps),
                "readyReplicas": sum(1 for d in deps for p in d.active() if p.ready_at <= now),
                "updatedReplicas": sum(1 for d in deps for p in d.active() if p.template == d.template),
                "canaryReplicas": sum(len(d.active()) for d in deps if d.track == "canary"),
                "running": sum(p.running for p in self.pool_pods(pool) if p.gone_at is None),
                **self.last_decisions.get(pool, {}),
            }
        self.timeline.append(row)

    def set_pool(self, pool: str, mode: str, k: int | None) -> None:
        """Write a pool's mode and K into status, as `record` writes the policy's decisions (no canaries)."""
        pools = self.status.pools.model_copy()
        ps: PoolStatus = getattr(pools, pool)
        setattr(
            pools,
            pool,
            ps.model_copy(
                update={
                    "speculation": mode,
                    "num_speculative_tokens": k if mode == "On" else ps.num_speculative_tokens,
                    "canary_replicas": 0,
                }
            ),
        )
        self.status = self.status.model_copy(update={"pools": pools})

    def apply_schedule(self, now: float) -> None:
        """A `schedule` strategy's changes due at `now`, rolled out like the policy's."""
        changed = False
        for at, pool, mode, k in self.strategy.schedule:
            if abs(at - now) > 1e-6 or pool not in auto_pools(self.spec):
                continue
            ps: PoolStatus = getattr(self.status.pools, pool)
            limit = self.spec.drafter.num_speculative_tokens
            from_k = ps.num_speculative_tokens or limit
            to_k = k or limit
            if ps.speculation == mode and (mode == "Off" or from_k == to_k):
                continue
            self.changes.append(Change(now, pool, ps.speculation, mode, from_k, to_k, "Scheduled"))
            self.set_pool(pool, mode, k)
            changed = True
        if changed:
            self.render(now)
            self.update_status(now)

    def evaluate(self, now: float) -> None:
        if self.strategy.kind == "schedule":
            self.apply_schedule(now)
            return
        self.update_status(now)
        when = EPOCH + timedelta(seconds=now)
        sd = self.current_sd()
        series: dict[str, list[prom.Series]] = {
            pool: [s for s in self.series.values() if s.pool == pool] for pool in auto_pools(self.spec)
        }
        answers = prom.fleet_answers(sd.namespace, sd.name, series, now, float(self.policy.window_seconds))
        # The operator's own evaluation; a retrain it asks for is only recorded (no Job here).
        evaluation = evaluate_policy(sd, self.status, answers, self.profile, None, when)
        self.status = evaluation.status
        self.retrains += evaluation.retrain
        decisions, observations = evaluation.decisions, evaluation.observations
        for d in decisions:
            obs = observations[d.pool]
            expected = d.observations.get("expectedRunningPerReplica")
            self.last_decisions[d.pool] = {
                "reason": d.reason,
                "observedRunningPerReplica": obs.running_per_replica,
                # The load the policy decided with (the observed one projected along its trend).
                "expectedRunningPerReplica": float(expected) if expected else obs.running_per_replica,
                "predictedSpeedup": d.observations.get("predictedSpeedup"),
            }
        for d in evaluation.flipped:
            to_k = d.target_k if d.target_k is not None else d.current_k
            canaries = getattr(d, "canary_replicas", None)
            basis = self.last_decisions.get(d.pool, {})
            self.changes.append(
                Change(
                    now,
                    d.pool,
                    d.current,
                    d.target,
                    d.current_k,
                    to_k,
                    d.reason,
                    canaries,
                    basis.get("observedRunningPerReplica"),
                    basis.get("expectedRunningPerReplica"),
                    schedule=bool(d.target_schedule) and d.current == d.target,
                )
            )
        # Rendered at every evaluation, as the operator's resync reconciles (a held canary hand-over
        # is let go once the growing Deployment is ready), and at once after a change.
        self.render(now)
        self.update_status(now)

    # -- the loop ------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        self.status = self.status.model_copy(
            update={
                "pools": self.status.pools.model_copy(
                    update={p: PoolStatus(speculation="On", settled=True) for p in POOLS}
                )
            }
        )
        if self.strategy.kind == "schedule":
            for at, pool, mode, k in self.strategy.schedule:
                if at <= 0 and pool in auto_pools(self.spec):
                    self.set_pool(pool, mode, k)
        self.render(0.0, initial=True)
        self.update_status(0.0)
        scrape = self.options.scrape_interval
        for i in range(1, math.floor(self.duration / scrape) + 1):
            self.push(i * scrape, self.SCRAPE)
        for i in range(self.nbins):
            self.push(min((i + 1) * self.bin, self.duration), self.BIN, i)
        if self.strategy.kind == "policy" and auto_pools(self.spec):
            every = float(self.policy.evaluation_interval_seconds)
            for i in range(1, math.floor(self.duration / every) + 1):
                self.push(i * every, self.EVAL)
        if self.strategy.kind == "schedule":
            for at in sorted({at for at, *_ in self.strategy.schedule if 0 < at < self.duration}):
                self.push(at, self.EVAL)
        trace = self.workload.requests if isinstance(self.workload, Trace) else ()
        if isinstance(self.workload, ClosedLoop):
            self.push(0.0, self.TICK)
        next_arrival = 0
        events = self.events
        while True:
            t_next = events[0][0] if events else math.inf
            if next_arrival < len(trace) and trace[next_arrival].arrival <= t_next:
                req = trace[next_arrival]
                self.arrive(req, req.arrival, next_arrival)
                next_arrival += 1
                continue
            if not events:
                break
            t, kind, _, a, b = heapq.heappop(events)
            if kind == self.REPLICA:
                if self.versions.get(a) != b:
                    continue
                rep = self.replicas[a]
                if rep.gone_at is not None:
                    continue
                rep.advance_to(t + 1e-9, self.done)
                self.finish_done()
                self.after_advance(rep, t)
            elif kind == self.ARRIVAL:
                self.closed_loop_request(a, t)
            elif kind == self.SCRAPE:
                self.scrape(t)
            elif kind == self.BIN:
                self.close_bin(a, t)
            elif kind == self.EVAL:
                self.evaluate(t)
            elif kind == self.POD_READY:
                rep = self.replicas[a]
                if rep.gone_at is None:
                    for dep in self.deployments.values():
                        if rep in dep.pods:
                            self.sync(dep, t)
                    if self.strategy.kind == "policy":
                        self.update_status(t)
            elif kind == self.TICK:
                self.tick(t)
        return self.result()

    def result(self) -> RunResult:
        end = self.duration
        for sim in self.in_system.values():
            self.add_request_seconds(sim.pool, sim.arrival, end)
        for rep in self.replicas.values():
            if rep.gone_at is None:
                self.gone(rep, max(end, rep.t))
        for rep in self.replicas.values():
            life_end = min(rep.gone_at if rep.gone_at is not None else end, end)
            self.results[rep.pool].gpu_seconds += max(0.0, life_end - rep.created)
        generated = sum(self.gone_tokens.values())
        for pool in POOLS:
            self.results[pool].tokens = float(self.bin_tokens[pool].sum())
        return RunResult(
            strategy=self.strategy,
            duration=end,
            bin_seconds=self.bin,
            pools=self.results,
            bin_tokens=self.bin_tokens,
            bin_request_seconds=self.bin_reqsec,
            timeline=self.timeline,
            changes=self.changes,
            submitted=self.submitted,
            completed=self.completed,
            rejected=self.rejected,
            generation_tokens_total=generated,
            requested_tokens_completed=self.requested_completed,
            status=self.status,
            retrains=self.retrains,
        )


def simulate(
    sd: SpeculativeDeployment,
    workload: Trace | ClosedLoop,
    strategy: Strategy | None = None,
    options: SimOptions | None = None,
    profile: StepTimeProfile | None = None,
    schedule: Sequence[tuple[int, int, int]] = (),
) -> RunResult:
    """Replay `workload` through the fleet `sd` describes, under `strategy` (default: the policy)."""
    strategy = strategy or Strategy("policy", "policy")
    options = options or SimOptions()
    profile = profile or default_profile()
    spec = strategy_spec(sd.spec, strategy, schedule)
    fleet = _Fleet(dataclasses.replace(sd, spec=spec), strategy, workload, options, profile)
    return fleet.run()


def load_per_replica(run: RunResult, pool: str) -> list[float]:
    """Per window: requests in the system (running and queued), time-averaged, per replica of the pool."""
    out = []
    for row, reqsec in zip(run.timeline, run.bin_request_seconds[pool], strict=False):
        out.append(float(reqsec) / run.bin_seconds / max(1, row[pool]["replicas"]))
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if len(values) else None


def histogram_percentile(hist: dict[int, float], q: float) -> float | None:
    total = sum(hist.values())
    if total <= 0:
        return None
    target = total * q / 100
    acc = 0.0
    for b in sorted(hist):
        acc += hist[b]
        if acc >= target:
            return itl_bin_seconds(b)
    return itl_bin_seconds(max(hist))


Progress = Callable[[str], None]
