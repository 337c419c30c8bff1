"""The simulated router and clients: requests in (a trace or closed-loop clients), routed, and taken back.

Requests are classified by the router's own code (`extract_facts`, `classify`, `ClientLoadTracker`,
`resolve_pool`) and sent to an engine of the pool as the router does, by the pool's endpointSelection
(or `SimOptions.routing`): the ready engine with the fewest outstanding requests, or the router's own
prefix-affinity choice (`PrefixRouting`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from specfleet.api.constants import PoolName
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.router import routing_config
from specfleet.sim.accounts import Accounts
from specfleet.sim.engine import Replica, SimRequest
from specfleet.sim.events import ARRIVAL, TICK, Events
from specfleet.sim.options import LEAST_OUTSTANDING, POOLS, PREFIX_AFFINITY, SimOptions
from specfleet.sim.rollout import Rollouts
from specfleet.sim.workload import ClosedLoop, Trace, TraceRequest
from specfleet_runtime.router.affinity import Affinity, PrefixKeys, Ring, prefix_key
from specfleet_runtime.router.classify import ClientLoadTracker, classify, extract_facts
from specfleet_runtime.router.conversations import ConversationTable
from specfleet_runtime.router.endpoints import resolve_pool
from specfleet_runtime.routing_config import LOAD_BOUND_SLACK


class Traffic:
    """Routes each request to an engine of `rollouts`; `done` holds the ones engines finished."""

    def __init__(
        self,
        sd: SpeculativeDeployment,
        workload: Trace | ClosedLoop,
        options: SimOptions,
        events: Events,
        accounts: Accounts,
        rollouts: Rollouts,
        done: list[SimRequest],
    ) -> None:
        self.workload = workload
        self.options = options
        self.duration = accounts.duration
        self.events = events
        self.accounts = accounts
        self.rollouts = rollouts
        self.done = done
        self.routing = routing_config(sd)
        self.prefix_routing = PrefixRouting()
        self.tracker = ClientLoadTracker()
        self.facts_memo: dict[tuple[Any, ...], Any] = {}
        self.turn = 0
        self.rng = np.random.default_rng([options.seed, 7])
        self.size_draws: list[int] = []
        # Closed loop
        self.clients_active = 0
        self.clients_retiring = 0
        self.client_ids = itertools.count()

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
        candidates = self.rollouts.endpoints(wanted, now)
        pool: PoolName | None = wanted
        if not candidates:
            pods = {p: self.rollouts.endpoints(p, now) for p in POOLS}
            pool = resolve_pool(
                wanted, {p: [str(r.serial) for r in v] for p, v in pods.items()}, self.routing.fallback
            )
            candidates = pods[pool] if pool is not None else []
        acceptance = req.acceptance or self.acceptance_at(now)
        tokens = req.requested_tokens // req.n
        for _ in range(req.n):
            self.accounts.submitted += 1
            sim = SimRequest(
                index,
                now,
                req.prompt_tokens,
                tokens,
                acceptance,
                wanted,
                client_id if req.tenant else client,
                req.prefix,
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
            selection = self.routing.endpoint_selection.of(pool)
            strategy = self.options.routing or (
                PREFIX_AFFINITY if selection.strategy == "PrefixAffinity" else LEAST_OUTSTANDING
            )
            if req.prefix and strategy == PREFIX_AFFINITY:
                best = self.prefix_routing.pick(candidates, req.prefix, best, selection.bound_percent)
            if not best.fits(sim):
                self.reject(sim, pool)
                continue
            sim.pool = pool
            best.advance_to(now, self.done)
            best.submit(sim, now)
            self.accounts.in_system[id(sim)] = sim
            self.finish_done()
            self.events.schedule_replica(best)

    def resend(self, reqs: list[SimRequest], now: float) -> None:
        """Requests a killed engine had not started: the router sends each to another engine of its pool
        (least outstanding), or the pool's fallback; with none left it is refused."""
        for sim in reqs:
            pool: PoolName = sim.pool  # type: ignore[assignment]
            candidates = self.rollouts.endpoints(pool, now)
            if not candidates:
                pods = {p: self.rollouts.endpoints(p, now) for p in POOLS}
                other = resolve_pool(
                    pool, {p: [str(r.serial) for r in v] for p, v in pods.items()}, self.routing.fallback
                )
                candidates = pods[other] if other is not None else []
            best = min(candidates, key=lambda r: r.outstanding, default=None)
            if best is None or not best.fits(sim):
                self.accounts.in_system.pop(id(sim), None)
                self.reject(sim, pool)
                continue
            sim.generated = 0.0
            best.advance_to(now, self.done)
            best.submit(sim, now)
            self.finish_done()
            self.events.schedule_replica(best)

    def fail(self, reqs: list[SimRequest], now: float) -> None:
        """Streams cut off when their engine was killed: failed; a closed-loop client goes on."""
        for sim in reqs:
            self.accounts.fail(sim, now)
            if isinstance(self.workload, ClosedLoop) and sim.client is not None:
                self.client_next(sim.client, now)

    def acceptance_at(self, now: float) -> tuple[float, ...]:
        if isinstance(self.workload, ClosedLoop):
            return self.workload.acceptance_at(now) or self.options.acceptance
        return self.options.acceptance

    def reject(self, sim: SimRequest, pool: str) -> None:
        self.accounts.reject(pool)
        if sim.client is not None and isinstance(self.workload, ClosedLoop):
            self.client_next(sim.client, sim.arrival + 1.0)

    def finish_done(self) -> None:
        # Emptied in place: the engines and `rollouts` append to this same list.
        done = self.done[:]
        self.done.clear()
        for sim in done:
            self.accounts.finished(sim)
            if sim.client is not None and sim.client.startswith("tenant:"):
                self.tracker.end(sim.client, sim.finish, self.routing.auto_segmentation)
            if isinstance(self.workload, ClosedLoop) and sim.client is not None:
                self.client_next(sim.client, sim.finish)

    def client_next(self, client: str, at: float) -> None:
        if self.clients_retiring > 0 or at >= self.duration:
            self.clients_retiring = max(0, self.clients_retiring - 1)
            self.clients_active -= 1
            return
        self.events.push(at, ARRIVAL, int(client.split(":")[1]), 1)

    def closed_loop_request(self, client: int, now: float) -> None:
        assert isinstance(self.workload, ClosedLoop)
        sizes = self.workload.sizes
        if not self.size_draws:
            self.size_draws = self.rng.integers(len(sizes), size=4096).tolist()
        prompt, tokens = sizes[self.size_draws.pop()]
        req = TraceRequest(arrival=now, prompt_tokens=prompt, output_tokens=tokens, pool=self.workload.pool)
        self.arrive(req, now, self.accounts.submitted, client=f"client:{client}")

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
            self.events.push(now + 1.0, TICK)


class PrefixRouting:
    """The router's prefix-affinity choice (`specfleet_runtime.router.affinity.choose`: the
    conversation's last engine under the conversation limit, else the ring on the leading text under
    the ring's) over simulated engines, each named by its serial as the router names endpoints by URL.

    A request's prefix segments stand for the router's keys: the first (a tenant's system prompt) is
    its leading text, each later one (a conversation) a message-boundary key, which the table maps to
    the engine that last served it, as a router worker's does."""

    def __init__(self, slack: int = LOAD_BOUND_SLACK) -> None:
        self.slack = slack
        self.affinity = Affinity(ConversationTable())
        self.recent = self.affinity.recent
        self.rings: dict[tuple[str, ...], Ring] = {}

    def pick(
        self, candidates: list[Replica], prefix: Sequence[tuple[str, int]], least: Replica, bound_percent: int
    ) -> Replica:
        """The engine for a request with `prefix` among `candidates`; `least` (the least outstanding)
        where the router would pick by least outstanding."""
        keys = self.keys(prefix)
        if keys is None:
            return least
        by_name = {str(r.serial): r for r in candidates}
        ring = self.ring(tuple(sorted(by_name)))
        outstanding = {name: r.outstanding for name, r in by_name.items()}
        choice = self.affinity.pick(ring, keys, outstanding, (), bound_percent, self.slack)
        return least if choice is None else by_name[choice.url]

    @staticmethod
    def keys(prefix: Sequence[tuple[str, int]]) -> PrefixKeys | None:
        leading = prefix_key(prefix[0][0])
        if leading is None:
            return None
        # Its size: the prompt's tokens (the router weighs a placed leading text by its request's bytes).
        return PrefixKeys(leading, tuple(prefix_key(key) or 0 for key, _ in prefix[1:]), prefix[-1][1])

    def ring(self, endpoints: tuple[str, ...]) -> Ring:
        ring = self.rings.get(endpoints)
        if ring is None:
            if len(self.rings) > 64:  # rollouts come and go: keep the recent rings only
                self.rings.clear()
            ring = self.rings[endpoints] = Ring(endpoints)
        return ring
