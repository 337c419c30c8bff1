"""One simulated vLLM replica: continuous batching on the cost profile, with aggregated sampling.

Exact parts: FCFS admission up to `max_num_seqs` while the KV cache has room; a step's time is
`profile.step_time(batch, K)` (plus `k0_penalty` for K=0 inside a speculating engine, plus the prefill
cost of the prompts admitted in that step); a request's first step is its prefill and yields one
token; the number of accepted drafts is sampled per draft from the per-position cumulative acceptance
(a draft of K tokens accepts j of them with probability p_{j-1} - p_j), so the engine's counters
(drafts, draft tokens, accepted, accepted per position) are the sums vLLM would export.

Aggregated (the approximation that makes an hour of a 16-replica fleet take seconds): the steps between
two batch changes are simulated together. The accepted drafts of all requests of the same acceptance
in that span are drawn at once (one multinomial), and each of those requests advances by their mean,
so requests of one acceptance progress in lockstep rather than each with its own luck. A span ends at
the step where the next request is expected to finish; where the draw has a request finish a step or
two earlier (at the step its share of the draw puts it), the span ends there instead, its draws
scaled to the steps it ran, so that the batch changes, and an engine left idle is free, when that
request finishes; one that the draw leaves short runs on into the next span. Chunked prefill is
approximated by admitting prompts per step up to `max_batched_tokens` (vLLM's
max_num_batched_tokens), each whole prompt charged to the step that admits it; a speculating engine's
drafter also runs over every prompt token (`drafter_prefill_fraction` of the target's prefill).

KV cache, as vLLM V1's scheduler takes it (the emulator's `kv_cache.py` has it block by block): a
running request holds slots for its prompt and the tokens it generated, plus, while speculating, the
K drafts it verifies and the proposer's lookahead slots. The full blocks of its shared prefix are the
prefix cache's, counted once however many running requests share them (`kv_tokens` has each
request's own tokens, `PrefixCache.held` the shared blocks): a joining request needs room for the
prefix blocks no running request holds yet, and one preempted or finished frees those nobody else
holds. Each step, when they no longer fit, the newest running request is preempted (its KV freed,
back to the front of the waiting queue; it recomputes its prompt and output later in one prefill,
and hands out no token twice); only in a step without a preemption do waiting requests join, first
come first served, while their prompt (and earlier output) fits. Aggregated: each request's rounding
up to whole blocks is counted as its mean ((B - 1) / 2B of a block of B tokens), and a span ends at
the step whose allocation would not fit.

Prefix cache (`prefix_cache.py`): a request joining the batch takes the blocks of its shared prefix the
engine has cached, is prefilled (and charged against max_batched_tokens) for the rest only, and
vllm:prefix_cache_queries / _hits count, in tokens, each request's first lookup on the engine.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from specfleet.sim.histograms import LatencyCounts, itl_bin
from specfleet.sim.prefix_cache import PrefixCache
from specfleet_runtime.cost_profile import StepTimeProfile

EPS = 1e-9


@dataclass(frozen=True)
class EngineConfig:
    """What a replica runs, as its rendered command line says."""

    speculative: bool
    k: int
    schedule: tuple[tuple[int, int, int], ...] = ()
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 400_000
    max_model_len: int | None = None
    k0_penalty: float = 0.10
    # Prompt tokens one step may prefill (vLLM's max_num_batched_tokens; its V1 default on large GPUs).
    max_batched_tokens: int = 8192
    # vLLM's --block-size (16 on GPUs): KV is taken in blocks of this many tokens.
    block_size: int = 16
    # KV slots each running request keeps for the proposer's next drafts (K for EAGLE-style drafters).
    lookahead_tokens: int = 0
    # The drafter's pass over prompt tokens, as a fraction of the target's prefill time.
    drafter_prefill_fraction: float = 0.0
    # vLLM's --enable-prefix-caching (on by default in vLLM V1).
    enable_prefix_caching: bool = True

    def k_for_batch(self, batch: int) -> int:
        if not self.speculative:
            return 0
        for start, end, k in self.schedule:
            if start <= batch <= end:
                return min(k, self.k)
        if self.schedule:
            return min(self.schedule[-1][2], self.k)
        return self.k


class SimRequest:
    """A request inside the simulated fleet."""

    __slots__ = (
        "acceptance",
        "arrival",
        "client",
        "entry_level",
        "finish",
        "first_token",
        "generated",
        "hit",
        "index",
        "kv",
        "pinned",
        "pool",
        "preemptions",
        "prefix",
        "prompt",
        "replica",
        "seq",
        "shared",
        "tokens",
    )

    def __init__(
        self,
        index: int,
        arrival: float,
        prompt: int,
        tokens: int,
        acceptance: tuple[float, ...],
        pool: str,
        client: str | None,
        prefix: tuple[tuple[str, int], ...] = (),
    ) -> None:
        self.index = index
        self.arrival = arrival
        self.prompt = prompt
        self.tokens = tokens
        self.acceptance = acceptance
        self.pool = pool
        self.client = client
        self.kv = prompt + tokens  # the KV it holds when it finishes
        self.first_token = -1.0
        self.finish = -1.0
        self.replica = -1
        # While running: its heap entry's sequence number (-1 otherwise) and its group's level then.
        self.seq = -1
        self.entry_level = 0.0
        self.generated = 0.0  # tokens generated before its current run (after a preemption)
        self.preemptions = 0
        # Its shared leading context ((key, end) segments; see the module docstring), the prompt tokens
        # the prefix cache held at its last admission, and while running the (key, blocks) it holds
        # there and their tokens (the engine counts those blocks once, in the prefix cache).
        self.prefix = prefix
        self.hit = 0
        self.pinned: tuple[tuple[str, int], ...] = ()
        self.shared = 0


class _Group:
    """The running requests of one acceptance vector: a shared progress counter and their finish lines."""

    __slots__ = ("acceptance", "heap", "level", "pmf", "size")

    def __init__(self, acceptance: tuple[float, ...]) -> None:
        self.acceptance = acceptance
        self.level = 0.0  # tokens each member has gained since the group began (shared progress)
        self.heap: list[tuple[float, int, SimRequest]] = []  # (level at which it has all its tokens, ...)
        self.size = 0
        self.pmf: dict[int, tuple[np.ndarray, float]] = {}

    def distribution(self, k: int) -> tuple[np.ndarray, float]:
        """P(j drafts accepted), j = 0..k, and the expected tokens per step (1 + accepted)."""
        cached = self.pmf.get(k)
        if cached is None:
            p = [1.0, *[self.acceptance[i] if i < len(self.acceptance) else 0.0 for i in range(k)], 0.0]
            probs = np.array([max(0.0, p[j] - p[j + 1]) for j in range(k + 1)], dtype=float)
            probs /= probs.sum()
            cached = (probs, 1.0 + sum(p[1 : k + 1]))
            self.pmf[k] = cached
        return cached


def _finish_step(need: float, gained: float, steps: int) -> int:
    """The step of a span of `steps` in which a member that lacked `need` tokens has them, when each
    member gains `gained` tokens over the span at an even pace."""
    share = need / gained if gained > 0 else 1.0
    return min(steps, max(1, math.ceil(share * steps - EPS)))


def _first_finish(draws: list[tuple[_Group, np.ndarray | None, float]], steps: int) -> int:
    """The step in which the first running request has all its tokens by the draws (`steps` if none
    does in the span)."""
    first = steps
    for g, _, gained in draws:
        heap = g.heap
        while heap and heap[0][1] != heap[0][2].seq:
            heapq.heappop(heap)  # preempted since
        if heap and heap[0][0] <= g.level + gained + EPS:
            first = min(first, _finish_step(heap[0][0] - g.level, gained, steps))
    return first


class Replica:
    """One engine pod's step loop, simulated span by span (see the module docstring)."""

    def __init__(
        self,
        serial: int,
        pool: str,
        track: str,
        template: str,
        config: EngineConfig,
        profile: StepTimeProfile,
        prefill_s_per_token: float,
        seed: int,
        created: float,
        ready_at: float,
    ) -> None:
        self.serial = serial
        self.pool = pool
        self.track = track
        self.template = template
        self.config = config
        self.profile = profile
        self.prefill_s = prefill_s_per_token
        self.rng = np.random.default_rng([seed, serial])
        self.created = created
        self.ready_at = ready_at
        self.draining_since: float | None = None
        self.gone_at: float | None = None
        # When its terminationGracePeriodSeconds runs out once it drains (then the kubelet kills it).
        self.kill_at: float | None = None
        self.t = ready_at
        # When its last step ended (none yet): an idle engine is free from then on, however far its
        # clock was advanced since (a request arriving then starts at once).
        self.free_at = -math.inf
        self.waiting: deque[SimRequest] = deque()
        self.running = 0
        self.outstanding = 0
        # KV held by the running requests: their tokens (prompt + generated) less the prefix blocks they
        # hold in the prefix cache (counted there, once however many share them), and blocks of capacity.
        self.kv_tokens = 0.0
        self.kv_blocks = config.kv_capacity_tokens // config.block_size
        self._order: dict[int, SimRequest] = {}  # running requests by id(), oldest first
        self.preemptions = 0
        self.groups: dict[tuple[float, ...], _Group] = {}
        self._dt: dict[tuple[int, int], float] = {}
        self._seq = 0
        # Counters, named after the vLLM metrics they stand for.
        self.drafts = 0.0
        self.draft_tokens = 0.0
        self.accepted = 0.0
        self.accepted_pos = [0.0] * max(1, config.k)
        self.generation_tokens = 0.0
        self.prompt_tokens = 0.0
        self.itl: dict[int, float] = {}
        self.steps = 0
        # Finished requests and their prompt and output tokens (vLLM's per-request histograms).
        self.finished = 0
        self.finished_prompt_tokens = 0.0
        self.finished_output_tokens = 0.0
        self.latency = LatencyCounts()
        self.prefix_cache = PrefixCache(config.block_size)
        # vllm:prefix_cache_queries / vllm:prefix_cache_hits (tokens).
        self.prefix_queries = 0.0
        self.prefix_hits = 0.0

    # -- state -------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.draining_since is None and self.gone_at is None

    @property
    def idle(self) -> bool:
        return self.running == 0 and not self.waiting

    def fits(self, req: SimRequest) -> bool:
        """The request can ever run here (prompt + output within max_model_len and the KV cache)."""
        limit = self.config.max_model_len
        return req.kv <= self.config.kv_capacity_tokens and (limit is None or req.kv <= limit)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache's blocks the running requests hold (vllm:kv_cache_usage_perc)."""
        return min(1.0, self._blocks_held(0) / self.kv_blocks) if self.kv_blocks else 0.0

    def _blocks_held(self, k: int) -> float:
        """Blocks the running requests need for a step that verifies `k` drafts (see module doc)."""
        if self.running == 0:
            return 0.0
        slots = k + self.config.lookahead_tokens if self.config.speculative else 0
        size = self.config.block_size
        # Each request's last block is on average (size - 1) / (2 size) empty; shared prefix blocks are full.
        return (
            (self.kv_tokens + self.running * slots) / size
            + self.running * (size - 1) / (2 * size)
            + self.prefix_cache.held
        )

    def _blocks_for_admission(self, req: SimRequest) -> float:
        """Blocks a waiting request needs to join: its prompt and what it had generated (no lookahead),
        less the prefix blocks running requests already hold (it shares them)."""
        size = self.config.block_size
        tokens = req.prompt + req.generated
        if req.prefix and self.config.enable_prefix_caching:
            shared, unheld = self.prefix_cache.to_hold(req.prefix, req.prompt)
            return math.ceil((tokens - shared * size) / size) + unheld
        return math.ceil(tokens / size)

    def submit(self, req: SimRequest, now: float) -> None:
        """Queue a request that arrives at `now` (the replica must have been advanced to `now`)."""
        if self.idle:
            self.t = max(self.free_at, self.ready_at, now)
        else:
            self.t = max(self.t, now)  # it joins at the end of the step in progress
        req.replica = self.serial
        self.waiting.append(req)
        self.outstanding += 1

    # -- time ----------------------------------------------------------------------------------------

    def step_seconds(self, batch: int, k: int) -> float:
        key = (batch, k)
        dt = self._dt.get(key)
        if dt is None:
            dt = self.profile.step_time_s(batch, k)
            if k == 0 and self.config.speculative:
                dt *= 1.0 + self.config.k0_penalty
            self._dt[key] = dt
        return dt

    def _can_admit(self) -> bool:
        if not self.waiting or self.running >= self.config.max_num_seqs:
            return False
        k = self.config.k_for_batch(self.running) if self.running else 0
        need = self._blocks_held(k)
        return need <= self.kv_blocks and need + self._blocks_for_admission(self.waiting[0]) <= self.kv_blocks

    def _growth_per_step(self, k: int) -> float:
        """Expected tokens the running requests gain per step at `k`."""
        growth = 0.0
        for g in self.groups.values():
            if g.size:
                growth += g.size * (g.distribution(k)[1] if k > 0 else 1.0)
        return growth

    def _steps_until_full(self, k: int) -> float:
        """Steps that fit before the next step's allocation would not (inf when nothing grows)."""
        growth = self._growth_per_step(k)
        if growth <= 0:
            return math.inf
        slack_tokens = (self.kv_blocks - self._blocks_held(k)) * self.config.block_size
        return max(1, math.floor(slack_tokens / growth + EPS) + 1)

    def next_event(self) -> float | None:
        """When this replica next changes its batch (admits, finishes or preempts), if it will."""
        if self._can_admit():
            return self.t
        if self.running == 0:
            return None
        k = self.config.k_for_batch(self.running)
        if self._blocks_held(k) > self.kv_blocks:
            return self.t
        dt = self.step_seconds(self.running, k)
        steps = self._steps_until_full(k)
        for g in self.groups.values():
            if g.heap:
                _, m = g.distribution(k)
                steps = min(steps, max(1, math.ceil((g.heap[0][0] - g.level) / m - EPS)))
        return self.t + steps * dt

    def _preempt_newest(self) -> None:
        """Free the newest running request's KV and put it back at the front of the waiting queue."""
        req = self._order.pop(next(reversed(self._order)))
        g = self.groups[req.acceptance]
        done = min(float(req.tokens), req.generated + (g.level - req.entry_level))
        req.generated = done
        self.kv_tokens -= req.prompt + done - req.shared
        req.seq = -1
        g.size -= 1
        heap = g.heap
        while heap and heap[0][1] != heap[0][2].seq:
            heapq.heappop(heap)
        self.running -= 1
        req.preemptions += 1
        self.preemptions += 1
        self.prefix_cache.release(req.pinned)
        req.pinned = ()
        req.shared = 0
        self.waiting.appendleft(req)

    def advance_to(self, until: float, done: list[SimRequest]) -> None:
        """Run every step that starts before `until`; finished requests are appended to `done`."""
        while self.t < until:
            if self.running == 0 and not self._can_admit():
                self.t = until
                return
            preempted = False
            if self.running:
                k_now = self.config.k_for_batch(self.running)
                if self._blocks_held(k_now) > self.kv_blocks:
                    self.prefix_cache.evict(
                        0.0
                    )  # vLLM takes every free block, cached or not, before preempting
                while self.running and self._blocks_held(k_now) > self.kv_blocks:
                    self._preempt_newest()
                    preempted = True
                    k_now = self.config.k_for_batch(self.running) if self.running else 0
            admitted: list[SimRequest] = []
            budget = self.config.max_batched_tokens
            prompts = 0.0
            if not preempted:
                k_now = self.config.k_for_batch(self.running) if self.running else 0
                need = self._blocks_held(k_now)
                caching = self.config.enable_prefix_caching
                while self.waiting and self.running < self.config.max_num_seqs:
                    head = self.waiting[0]
                    recompute = head.prompt + head.generated
                    blocks = self._blocks_for_admission(head)
                    if caching and head.prefix:
                        self.prefix_cache.evict(self.kv_blocks - need)
                        head.hit = self.prefix_cache.lookup(head.prefix, head.prompt)
                    else:
                        head.hit = 0
                    if need + blocks > self.kv_blocks or (
                        admitted and prompts + recompute - head.hit > budget
                    ):
                        break
                    prompts += recompute - head.hit
                    need += blocks
                    self.waiting.popleft()
                    self.running += 1
                    admitted.append(head)
                    if caching and head.generated == 0:
                        # A request's first lookup here (vLLM counts a preempted one's apart).
                        self.prefix_queries += head.prompt
                        self.prefix_hits += head.hit
                    if caching and head.prefix:
                        head.pinned = self.prefix_cache.take(head.prefix, head.prompt)
                        head.shared = sum(blocks for _, blocks in head.pinned) * self.config.block_size
                    self.kv_tokens += recompute - head.shared
            if self.running == 0:
                continue  # everything was preempted: the next iteration admits from the front again
            batch = self.running
            k = self.config.k_for_batch(batch)
            dt = self.step_seconds(batch, k)
            t0 = self.t
            if admitted:
                prompt = sum(r.prompt + r.generated for r in admitted)
                # Prefill is priced for the tokens the prefix cache did not have.
                prefill = self.prefill_s * (prompt - sum(r.hit for r in admitted))
                if self.config.speculative:
                    prefill *= 1.0 + self.config.drafter_prefill_fraction
                dt += prefill
                self.prompt_tokens += prompt
                steps = 1
            else:
                steps = max(1, math.ceil((until - t0) / dt - EPS))
                full = self._steps_until_full(k)
                if full < steps:
                    steps = int(full)
                for g in self.groups.values():
                    if g.heap:
                        _, m = g.distribution(k)
                        steps = min(steps, max(1, math.ceil((g.heap[0][0] - g.level) / m - EPS)))
            # The batch changes at the first finish the draw realizes, which may come before the
            # expected one: the span stops there, and the draws shrink to the steps it ran.
            draws = self._draw(k, steps)
            span = _first_finish(draws, steps)
            cut = span / steps
            if not admitted and self.prefix_cache.free_blocks_cached:
                # The span's growth takes free blocks: evict down to what is free at its end.
                grown = self._growth_per_step(k) * span / self.config.block_size
                self.prefix_cache.evict(self.kv_blocks - self._blocks_held(k) - grown)
            end = t0 + span * dt
            tokens = 0.0
            decoding = 0
            for g, counts, drawn in draws:
                decoding += g.size
                if counts is not None:
                    self._count_drafts(k, g.size * span, counts * cut)
                before = g.level
                gained = drawn * cut
                g.level += gained
                tokens += g.size * gained
                heap = g.heap
                while heap and heap[0][0] <= g.level + EPS:
                    line, seq, req = heapq.heappop(heap)
                    if seq != req.seq:
                        continue  # preempted since
                    g.size -= 1
                    tokens -= g.level - line
                    j = _finish_step(line - before, gained, span)
                    self._finish(req, t0 + j * dt, done, req.prompt + req.tokens)
            self.kv_tokens += tokens
            for req in admitted:
                group = self.groups.get(req.acceptance)
                if group is None:
                    group = self.groups[req.acceptance] = _Group(req.acceptance)
                g = group
                # Its (re)computing step yields one token (what is left of one, after a preemption).
                first = 1.0 if req.generated == 0 else min(1.0, req.tokens - req.generated)
                if req.first_token < 0:
                    req.first_token = t0 + dt
                tokens += first
                self.kv_tokens += first
                req.generated += first
                self._order[id(req)] = req
                if req.generated >= req.tokens - EPS:
                    self._finish(req, t0 + dt, done, req.prompt + req.generated)
                    continue
                self._seq += 1
                req.seq = self._seq
                req.entry_level = g.level
                heapq.heappush(g.heap, (g.level + req.tokens - req.generated, self._seq, req))
                g.size += 1
            self.generation_tokens += tokens
            if decoding:
                b = itl_bin(dt)
                self.itl[b] = self.itl.get(b, 0.0) + decoding * span
            self.steps += span
            self.t = self.free_at = end

    def _draw(self, k: int, steps: int) -> list[tuple[_Group, np.ndarray | None, float]]:
        """Each decoding group's accepted drafts over `steps` steps at `k` (one multinomial draw of its
        members' drafts; None without speculation) and the tokens each member gains by them."""
        out: list[tuple[_Group, np.ndarray | None, float]] = []
        for g in self.groups.values():
            if g.size == 0:
                continue
            if k == 0:
                out.append((g, None, float(steps)))
                continue
            probs, _ = g.distribution(k)
            counts = self.rng.multinomial(g.size * steps, probs)
            out.append((g, counts, steps + float(np.dot(counts, np.arange(k + 1))) / g.size))
        return out

    def _count_drafts(self, k: int, drafts: int, counts: np.ndarray) -> None:
        """Add `drafts` drafts of `k` tokens to the vLLM counters, `counts[j]` of them accepting j."""
        self.drafts += drafts
        self.draft_tokens += drafts * k
        self.accepted += float(np.dot(counts, np.arange(k + 1)))
        pos = self.accepted_pos
        if len(pos) < k:
            pos.extend([0.0] * (k - len(pos)))
        tail = float(drafts)  # drafts that accepted more than i tokens, for position i
        for i in range(k):
            tail -= counts[i]
            pos[i] += tail

    def _finish(self, req: SimRequest, at: float, done: list[SimRequest], held: float) -> None:
        """`req` finished at `at`, giving back the `held` tokens of KV it had."""
        req.finish = at
        req.seq = -1
        self.running -= 1
        self.outstanding -= 1
        self.kv_tokens -= held - req.shared
        self._order.pop(id(req), None)
        if req.pinned:
            self.prefix_cache.release(req.pinned)
            req.pinned = ()
            req.shared = 0
        self.finished += 1
        self.finished_prompt_tokens += req.prompt
        self.finished_output_tokens += req.tokens
        tpot = (at - req.first_token) / (req.tokens - 1) if req.tokens > 1 else None
        self.latency.observe(req.first_token - req.arrival, tpot)
        done.append(req)

    def take_waiting(self) -> list[SimRequest]:
        """Remove the queued (not yet running) requests, e.g. to re-route them."""
        out = list(self.waiting)
        self.outstanding -= len(out)
        self.waiting.clear()
        return out

    def take_unstarted(self) -> list[SimRequest]:
        """Remove the queued requests that have not streamed a token (a preempted one that has stays):
        what a router may send to another engine without a client noticing."""
        out = [r for r in self.waiting if r.first_token < 0]
        if out:
            self.waiting = deque(r for r in self.waiting if r.first_token >= 0)
            self.outstanding -= len(out)
        return out

    def take_running(self) -> list[SimRequest]:
        """Remove the running requests (the engine is killed: their KV is gone with it)."""
        out = list(self._order.values())
        for req in out:
            req.seq = -1
            if req.pinned:
                self.prefix_cache.release(req.pinned)
                req.pinned = ()
                req.shared = 0
        self._order.clear()
        for g in self.groups.values():
            g.heap.clear()
            g.size = 0
        self.outstanding -= len(out)
        self.running = 0
        self.kv_tokens = 0.0
        return out
