"""One simulated run: a workload replayed through a fleet under one strategy (`simulate`).

`_Fleet` owns the clock and composes the parts: `traffic` (router and clients), `rollouts` (the
Deployments and their engines), `prometheus` (scrapes), `control` (status and the policy) and
`accounts` (what was measured). How they fit together: docs/architecture.md, "The fleet simulator".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.validation import SpeculativeDeployment
from specfleet.policy.inputs.status import auto_pools
from specfleet.policy.predict.startup_memory import engine_problems
from specfleet.sim.accounts import Accounts, RunResult, load_per_replica
from specfleet.sim.engine import SimRequest
from specfleet.sim.events import ARRIVAL, BIN, EVAL, KILL, POD_READY, REPLICA, SCRAPE, TICK, Events
from specfleet.sim.options import DEFAULT_PREFILL_MS_PER_TOKEN, POOLS, SimOptions, Strategy, strategy_spec
from specfleet.sim.policy_loop import PolicyLoop
from specfleet.sim.prom import Prometheus
from specfleet.sim.rollout import Rollouts
from specfleet.sim.traffic import Traffic
from specfleet.sim.workload import ClosedLoop, Trace
from specfleet_runtime.cost_profile import StepTimeProfile, default_profile

# Re-exported: callers import the run's inputs and outputs from here.
__all__ = [
    "DEFAULT_PREFILL_MS_PER_TOKEN",
    "RunResult",
    "SimOptions",
    "Strategy",
    "load_per_replica",
    "simulate",
]


class _Fleet:
    def __init__(
        self,
        sd: SpeculativeDeployment,
        strategy: Strategy,
        workload: Trace | ClosedLoop,
        options: SimOptions,
        profile: StepTimeProfile,
    ) -> None:
        self.strategy = strategy
        self.workload = workload
        self.options = options
        self.policy = sd.spec.policy
        self.bin = options.bin_seconds or float(self.policy.evaluation_interval_seconds)
        self.duration = max(workload.duration, self.bin)
        prefill_ms = options.prefill_ms_per_token_of(profile)
        self.events = Events()
        self.accounts = Accounts(self.duration, self.bin)
        self.prometheus = Prometheus()
        # Requests the engines finished, until `traffic` takes them.
        self.done: list[SimRequest] = []
        self.rollouts = Rollouts(
            options,
            profile,
            prefill_ms / 1000.0,
            self.events,
            self.accounts,
            self.prometheus,
            self.done,
            self.finish_done,
        )
        self.traffic = Traffic(sd, workload, options, self.events, self.accounts, self.rollouts, self.done)
        decides_with = options.policy_profile or profile
        self.control = PolicyLoop(sd, strategy, decides_with, self.rollouts, self.prometheus)

    def finish_done(self) -> None:
        self.traffic.finish_done()

    def scrape(self, now: float) -> None:
        for rep in self.rollouts.replicas.values():
            if rep.gone_at is not None or rep.ready_at > now:
                continue
            rep.advance_to(now, self.done)
            self.prometheus.scrape(rep, now)
            self.rollouts.after_advance(rep, now)
        self.prometheus.scrape_parked(now)
        self.finish_done()

    def close_bin(self, index: int, now: float) -> None:
        replicas = self.rollouts.replicas
        for rep in replicas.values():
            if rep.gone_at is None and rep.ready_at <= now:
                rep.advance_to(now, self.done)
                self.rollouts.after_advance(rep, now)
        self.finish_done()
        states = {
            pool: {**self.rollouts.pool_state(pool, now), **self.control.last_decisions.get(pool, {})}
            for pool in POOLS
        }
        live = [rep for rep in replicas.values() if rep.gone_at is None]
        self.accounts.close_bin(index, now, live, states)

    def schedule_events(self) -> None:
        """The scrapes, bin ends, evaluations and closed-loop ticks of the whole run."""
        scrape = self.options.scrape_interval
        for i in range(1, math.floor(self.duration / scrape) + 1):
            self.events.push(i * scrape, SCRAPE)
        for i in range(self.accounts.nbins):
            self.events.push(min((i + 1) * self.bin, self.duration), BIN, i)
        if self.strategy.kind == "policy" and auto_pools(self.control.spec):
            every = float(self.policy.evaluation_interval_seconds)
            for i in range(1, math.floor(self.duration / every) + 1):
                self.events.push(i * every, EVAL)
        if self.strategy.kind == "schedule":
            for at in sorted({at for at, *_ in self.strategy.schedule if 0 < at < self.duration}):
                self.events.push(at, EVAL)
        if isinstance(self.workload, ClosedLoop):
            self.events.push(0.0, TICK)

    def run(self) -> RunResult:
        self.control.start()
        self.schedule_events()
        trace = self.workload.requests if isinstance(self.workload, Trace) else ()
        next_arrival = 0
        heap = self.events.heap
        while True:
            # A trace's requests are not queued as events: each arrives before the events at its time.
            t_next = heap[0][0] if heap else math.inf
            if next_arrival < len(trace) and trace[next_arrival].arrival <= t_next:
                req = trace[next_arrival]
                self.traffic.arrive(req, req.arrival, next_arrival)
                next_arrival += 1
                continue
            if not heap:
                break
            t, kind, _, a, b = self.events.pop()
            if kind == REPLICA:
                if not self.events.current(a, b):
                    continue
                rep = self.rollouts.replicas[a]
                if rep.gone_at is not None:
                    continue
                rep.advance_to(t + 1e-9, self.done)
                self.finish_done()
                self.rollouts.after_advance(rep, t)
            elif kind == ARRIVAL:
                self.traffic.closed_loop_request(a, t)
            elif kind == SCRAPE:
                self.scrape(t)
            elif kind == BIN:
                self.close_bin(a, t)
            elif kind == EVAL:
                self.control.evaluate(t)
            elif kind == POD_READY:
                if self.rollouts.pod_ready(a, t) and self.strategy.kind == "policy":
                    self.control.update_status(t)
            elif kind == TICK:
                self.traffic.tick(t)
            elif kind == KILL:
                unstarted, cut_off = self.rollouts.kill(a, t)
                self.traffic.resend(unstarted, t)
                self.traffic.fail(cut_off, t)
        return self.result()

    def result(self) -> RunResult:
        end = self.duration
        for sim in self.accounts.in_system.values():
            self.accounts.add_request_seconds(sim.pool, sim.arrival, end)
        replicas = self.rollouts.replicas
        for rep in replicas.values():
            if rep.gone_at is None:
                self.rollouts.gone(rep, max(end, rep.t))
        for rep in replicas.values():
            life_end = min(rep.gone_at if rep.gone_at is not None else end, end)
            self.accounts.results[rep.pool].gpu_seconds += max(0.0, life_end - rep.created)
        control = self.control
        return self.accounts.result(self.strategy, control.changes, control.status, control.retrains)


def simulated_engines_that_cannot_start(
    spec: SpeculativeDeploymentSpec, options: SimOptions, profile: StepTimeProfile
) -> list[str]:
    """Every pool whose simulated engines vLLM would refuse to start with the memory the simulator gives
    them (`SimOptions.memory_of`): a run of them would serve nothing."""
    memory = options.memory_of(profile)
    source = "the profile's memory section" if options.memory is None and profile.memory else "assumed"
    where = f"in the simulation ({memory.name}, {source})"
    return engine_problems(spec, lambda pool, settings: (memory, where))


def simulate(
    sd: SpeculativeDeployment,
    workload: Trace | ClosedLoop,
    strategy: Strategy | None = None,
    options: SimOptions | None = None,
    profile: StepTimeProfile | None = None,
    schedule: Sequence[tuple[int, int, int]] = (),
) -> RunResult:
    """Replay `workload` through the fleet `sd` describes, under `strategy` (default: the policy), on
    `profile` (default: the published one of the spec's drafter method, engines and policy alike)."""
    strategy = strategy or Strategy("policy", "policy")
    options = (options or SimOptions()).resolved(sd.spec)
    profile = profile or default_profile(sd.spec.drafter.method)
    spec = strategy_spec(sd.spec, strategy, schedule)
    fleet = _Fleet(dataclasses.replace(sd, spec=spec), strategy, workload, options, profile)
    return fleet.run()
