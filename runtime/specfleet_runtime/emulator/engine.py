"""The emulated engine: vLLM's continuous-batching step loop, timed by a step-time cost model.

How a step works (one iteration of `Engine._loop`):

1. Schedule, as vLLM V1's `Scheduler.schedule` (`_schedule`, below): every running request takes the
   KV cache blocks its next tokens need; when too few blocks are free, the newest running request is
   preempted (its blocks freed, back to the front of the waiting queue) until the rest fits. Then, in a
   step without preemptions, waiting requests join first come first served, up to `max_num_seqs` and
   while the KV cache has blocks for their prompts (plus their earlier output, after a preemption).
2. Pick K (`EmulatorConfig.k_for_batch`: fixed K, a Dynamic SD schedule, or 0 without speculation;
   for the batch that proposed the drafts, the running set before this step) and the step's duration
   `profile.step_time(batch, K) * time_scale` (plus the profile's prefill cost for the tokens being
   prefilled, and `spec_k0_overhead` for a K=0 step inside a speculating engine; both 0 by default).
3. Sleep until the step's deadline. Deadlines chain (each is the previous one plus the step's duration),
   so time the loop itself spends, and the event loop's timer slack, does not slow the emulated GPU:
   over many steps the engine runs exactly at the profile's pace as long as it can keep up.
4. Advance every running request: a request's first step is its prefill and yields 1 token; later steps
   yield 1 token without speculation, or 1 + the accepted drafts with it. Accepted drafts are sampled
   per position from the per-position cumulative acceptance p_i (draft i is accepted, given drafts
   0..i-1 were, with probability p_i / p_{i-1}). Then update the metrics, hand each request its new
   tokens, and retire the requests that reached max_tokens or their natural end.

A preempted request later recomputes its prompt and the tokens it had generated (one prefill step,
which yields its next token); tokens it already handed out are not handed out again, so a client sees
a pause, never a failure. The KV cache's blocks are counted in `kv_cache.py`; its size
is `EmulatorConfig.kv_capacity` (docs/testing.md, "The engine emulator's KV cache").

Prefix caching (`enable_prefix_caching`, on by default as in vLLM V1): a request joining the batch
takes the longest run of its prompt's leading full blocks already cached (vLLM's `get_computed_blocks`),
and its prefill is priced for the other tokens only; once prefilled, its full prompt blocks are cached.
vllm:prefix_cache_queries / _hits count, in tokens, each new request's lookup at admission.

Output text does not depend on how many tokens a step yields (see `text.py`), so speculation is
lossless here, unless `break_losslessness` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from specfleet_runtime.cost_profile import validate_acceptance
from specfleet_runtime.emulator.config import EmulatorConfig
from specfleet_runtime.emulator.kv_cache import BlockHash, BlockPool, block_hashes
from specfleet_runtime.emulator.metrics import EngineMetrics, cache_config_labels
from specfleet_runtime.emulator.text import Prompt, drafted_token_text, natural_length, token_text

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The step loop stopped (crashed or shut down); the engine accepts no more work."""


class EnginePausedError(RuntimeError):
    """The engine takes no new requests for now (it is asleep, or draining to fall asleep)."""


class StepOutput(NamedTuple):
    """What one step produced for one request: new token texts, and the finish reason on the last."""

    request_id: str
    tokens: tuple[str, ...]
    finish_reason: str | None


@dataclass(frozen=True)
class Completion:
    """A finished request."""

    request_id: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


OutputCallback = Callable[[StepOutput], None]


class EngineRequest:
    """One request's life in the engine. Callers read it; only the engine changes it."""

    def __init__(
        self,
        request_id: str,
        prompt: Prompt,
        max_tokens: int,
        stop_at_eos: int | None,
        on_output: OutputCallback | None,
        arrival_time: float,
        finished: asyncio.Future[Completion],
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        # The prompt's full blocks' chained hashes (empty with prefix caching off), and how many of
        # the tokens its next prefill needs were found in the prefix cache at admission.
        self.block_hashes: list[BlockHash] = []
        self.num_cached_tokens = 0
        self.on_output = on_output
        self.arrival_time = arrival_time
        # The request ends at the first of max_tokens and the prompt's natural end (unless ignored).
        if stop_at_eos is not None and stop_at_eos <= max_tokens:
            self.stop_at, self.stop_reason = stop_at_eos, "stop"
        else:
            self.stop_at, self.stop_reason = max_tokens, "length"
        self.tokens: list[str] = []
        # The acceptance its drafts are sampled at when its content has its own (None: the engine's).
        self.acceptance: tuple[float, ...] | None = None
        # False until the step that (re)computes its KV: the first one, and the first after a preemption.
        self.prefilled = False
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # Resolves with the Completion when the request ends (also on abort, with reason "abort").
        self.finished = finished
        self.done = False  # set together with `finished`

    @property
    def num_tokens(self) -> int:
        """Prompt and output tokens so far (what a prefill after a preemption recomputes)."""
        return self.prompt.num_tokens + len(self.tokens)


@dataclass
class EngineStats:
    """Counters of the step loop, for tests, benchmarks and `/admin/state`."""

    steps: int = 0
    generation_tokens: int = 0
    # Event-loop time at which the last step delivered its tokens.
    last_step_end: float = 0.0
    # Sum of the step durations the cost model asked for (wall time should match it).
    scheduled_s: float = 0.0
    # How late the last step delivered, after its deadline (timer slack plus the loop's own work).
    behind_s: float = 0.0
    last_batch: int = 0
    last_k: int = 0
    # Schedule debt forgiven because the loop fell behind by more than max_catch_up_s.
    lag_forgiven_s: float = 0.0
    # Running requests preempted because the KV cache ran out of blocks.
    preemptions: int = 0


class Engine:
    """A vLLM-like engine: submit requests, receive tokens step by step, read the metrics."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        spec = config.speculative
        self.metrics = EngineMetrics(
            config.served_model_name, spec.num_speculative_tokens if spec is not None else None
        )
        self.metrics.set_cache_config(cache_config_labels(config))
        self.kv = self._empty_kv_cache()
        self.stats = EngineStats()
        # Run-time switches (the admin endpoints change them).
        self.break_losslessness = config.break_losslessness
        self._acceptance = config.acceptance
        self._rng = random.Random(config.seed)
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._wakeup = asyncio.Event()
        self._step_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._dead: BaseException | None = None
        # Why new requests are refused now (sleep.py pauses the engine), None while it serves.
        self._paused: str | None = None
        self._ids = itertools.count()

    def _empty_kv_cache(self) -> BlockPool:
        cfg = self.config
        return BlockPool(
            cfg.num_gpu_blocks, cfg.block_size, cfg.max_model_len, enable_caching=cfg.enable_prefix_caching
        )

    # ----------------------------------------------------------------------------------------------
    # Lifecycle

    async def start(self) -> None:
        """Start the step loop (inside the running event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="emulator-step-loop")

    async def stop(self) -> None:
        """Stop the step loop and end every outstanding request with finish reason "abort"."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._dead = self._dead or EngineDeadError("engine stopped")
        for req in [*self._running, *self._waiting]:
            self.abort(req)

    @property
    def healthy(self) -> bool:
        """True while the step loop runs (`/health` answers 503 otherwise)."""
        return self._task is not None and not self._task.done()

    # ----------------------------------------------------------------------------------------------
    # Requests

    def submit(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        on_output: OutputCallback | None = None,
        request_id: str | None = None,
    ) -> EngineRequest:
        """Queue a request; it joins the running batch at the next step with room for it.

        `on_output` is called from the step loop after every step that gives the request tokens.
        """
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        if self._paused is not None:
            raise EnginePausedError(self._paused)
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        loop = asyncio.get_running_loop()
        shortest, longest = self.config.natural_length
        req = EngineRequest(
            request_id=request_id or f"req-{next(self._ids)}",
            prompt=prompt,
            max_tokens=max_tokens,
            stop_at_eos=None if ignore_eos else natural_length(prompt.seed, shortest, longest),
            on_output=on_output,
            arrival_time=loop.time(),
            finished=loop.create_future(),
        )
        if self.config.enable_prefix_caching:
            req.block_hashes = block_hashes(prompt.token_ids, self.config.block_size)
        req.acceptance = self.content_acceptance(prompt)
        self._waiting.append(req)
        self.metrics.waiting.set(len(self._waiting))
        self._wakeup.set()
        return req

    def abort(self, req: EngineRequest) -> None:
        """End a request now (client went away); a no-op when it has already ended."""
        if req.done:
            return
        if req in self._waiting:
            self._waiting.remove(req)
            self.metrics.waiting.set(len(self._waiting))
        # A running request is dropped from the batch by the next step.
        self._resolve(req, "abort")
        self.metrics.request_success["abort"].inc()

    async def wait_for_step(self) -> None:
        """Return after the next step has delivered its tokens."""
        await self._step_event.wait()

    # ----------------------------------------------------------------------------------------------
    # Pausing, for sleep mode (sleep.py)

    @property
    def paused(self) -> str | None:
        """Why new requests are refused now; None while the engine takes them."""
        return self._paused

    def pause(self, reason: str) -> None:
        """Refuse new requests (`submit` raises EnginePausedError) until `resume`."""
        self._paused = reason

    def resume(self) -> None:
        """Take new requests again."""
        self._paused = None

    @property
    def num_in_flight(self) -> int:
        """Requests running or waiting: what a sleep would have to abort or wait for."""
        return self.num_running + self.num_waiting

    async def wait_until_idle(self, poll_s: float = 0.05) -> None:
        """Return once no request is in flight (they finish, or their clients abort them).

        Polls as well as waiting for steps: the last request may end by an abort, with no step after it.
        """
        while self.num_in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait_for_step(), poll_s)

    def drop_kv_cache(self) -> None:
        """Empty the KV cache and its prefix cache, as a sleep does; only while no request holds blocks."""
        if self.num_in_flight:
            raise RuntimeError("cannot drop the KV cache while requests hold blocks")
        self.kv = self._empty_kv_cache()
        self._publish_load()

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return sum(1 for r in self._running if not r.done)

    @property
    def num_waiting(self) -> int:
        """Requests queued behind the running batch."""
        return len(self._waiting)

    @property
    def acceptance(self) -> tuple[float, ...]:
        """The per-position cumulative acceptance the sampler uses now."""
        return self._acceptance

    def set_acceptance(self, per_position: Sequence[float]) -> None:
        """Change the acceptance from the next step on (a content shift)."""
        self._acceptance = validate_acceptance(per_position)

    # ----------------------------------------------------------------------------------------------
    # The step loop

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug: make it visible, fail the waiters, report unhealthy
            log.exception("emulator step loop crashed")
            self._dead = err
            for req in [*self._running, *self._waiting]:
                if not req.done:
                    req.done = True
                    req.finished.set_exception(EngineDeadError(f"engine crashed: {err!r}"))
            self._running.clear()
            self._waiting.clear()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self._running and not self._waiting:
                self._publish_load()
                self._wakeup.clear()
                await self._wakeup.wait()
                deadline = loop.time()
            batch, k = self._schedule()
            if not batch:  # every queued request was aborted meanwhile
                await asyncio.sleep(0)
                continue
            seconds = self._step_seconds(batch, k)
            now = loop.time()
            if self.config.time_scale == 0:  # no schedule to keep: steps take no time
                deadline = now
            elif now - deadline > self.config.max_catch_up_s:
                self.stats.lag_forgiven_s += now - deadline - self.config.max_catch_up_s
                deadline = now - self.config.max_catch_up_s
            deadline += seconds
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            now = loop.time()
            self.stats.scheduled_s += seconds
            self.stats.behind_s = now - deadline
            self._apply_step(batch, k, now)

    def _schedule(self) -> tuple[tuple[EngineRequest, ...], int]:
        """This step's batch and K, as vLLM V1's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py).

        Running requests first, oldest first: each allocates slots for its tokens, the K drafts it
        verifies and the lookahead (`allocate_slots(request, num_new_tokens, num_lookahead_tokens)`;
        computed + new = num_tokens + K). When that fails, `self.running.pop()` (the newest) is
        preempted (`_preempt_request`) until it fits or the request itself was preempted. Waiting
        requests are scheduled only `if not preempted_reqs`, each allocating all its tokens with no
        lookahead (`effective_lookahead_tokens = 0` while num_computed_tokens is 0), stopping at the
        first that does not fit.
        """
        cfg, kv = self.config, self.kv
        for req in self._running:
            if req.done:  # aborted meanwhile
                kv.free(req)
        self._running = [r for r in self._running if not r.done]
        # The drafts verified now were proposed after the last step, for the batch of then.
        k = cfg.k_for_batch(len(self._running)) if self._running else 0
        lookahead = cfg.num_lookahead_tokens
        preempted = False
        i = 0
        while i < len(self._running):
            req = self._running[i]
            if kv.allocate(req, req.num_tokens + k + lookahead):
                i += 1
            else:  # when `req` is the newest, it is preempted itself and the loop ends
                self._preempt(self._running.pop())
                preempted = True
        if not preempted:
            admitted_into_empty = not self._running
            while self._waiting and len(self._running) < cfg.max_num_seqs:
                head = self._waiting[0]
                # vLLM looks up at most num_tokens - 1 tokens: the last one is computed for its logits.
                cached = kv.find_cached(head.block_hashes, head.num_tokens - 1)
                if not kv.allocate(head, head.num_tokens, cached):
                    break
                head.num_cached_tokens = len(cached) * kv.block_size
                if cfg.enable_prefix_caching and head.num_preemptions == 0:
                    # vLLM counts a preempted request's lookups apart (not in these counters).
                    self.metrics.prefix_cache_queries.inc(head.num_tokens)
                    self.metrics.prefix_cache_hits.inc(head.num_cached_tokens)
                self._waiting.popleft()
                self._running.append(head)
            if admitted_into_empty and self._running:  # nothing to verify: the K of the new batch
                k = cfg.k_for_batch(len(self._running))
        self._publish_load()
        return tuple(self._running), k

    def _preempt(self, req: EngineRequest) -> None:
        """Free `req`'s KV and put it back at the front of the waiting queue (it recomputes later)."""
        self.kv.free(req)
        req.prefilled = False
        req.num_preemptions += 1
        self._waiting.appendleft(req)
        self.metrics.num_preemptions.inc()
        self.stats.preemptions += 1

    def _step_seconds(self, batch: Sequence[EngineRequest], k: int) -> float:
        cfg = self.config
        ms = cfg.profile.step_time_ms(len(batch), k)
        if k == 0 and cfg.speculative is not None:
            ms *= 1.0 + cfg.spec_k0_overhead
        # Prefill is priced for the tokens the prefix cache did not have.
        ms += cfg.profile.prefill_time_ms(
            sum(r.num_tokens - r.num_cached_tokens for r in batch if not r.prefilled)
        )
        return ms / 1000.0 * cfg.time_scale

    def content_acceptance(self, prompt: Prompt) -> tuple[float, ...] | None:
        """The acceptance of `prompt`'s content where a configured marker is in its text, else None."""
        for marker, per_position in self.config.content_acceptance:
            if marker in prompt.text:
                return per_position
        return None

    def _sample_accepted(self, k: int, p: Sequence[float]) -> int:
        """How many of `k` drafts are accepted: draft i survives with probability p_i / p_{i-1}."""
        survived = 1.0  # p_{i-1}, with p_{-1} = 1
        for i in range(k):
            p_i = p[i] if i < len(p) else 0.0
            if p_i <= 0.0 or self._rng.random() * survived >= p_i:
                return i
            survived = p_i
        return k

    def _apply_step(self, batch: Sequence[EngineRequest], k: int, now: float) -> None:
        m = self.metrics
        lossy = self.break_losslessness
        prompt_tokens = generated = drafts = accepted_total = 0
        accepted_per_pos = [0] * k
        still_running: list[EngineRequest] = []
        for req in batch:
            if req.done:  # aborted while the step ran
                self.kv.free(req)
                continue
            accepted = 0
            if not req.prefilled:  # prefill step: the next token, nothing to verify yet
                req.prefilled = True
                req.num_cached_tokens = 0
                self.kv.cache_blocks(req, req.block_hashes)
                if not req.tokens:  # vLLM counts a prompt once, not again when it is recomputed
                    prompt_tokens += req.prompt.num_tokens
            elif k > 0:
                own = req.acceptance
                accepted = self._sample_accepted(k, self._acceptance if own is None else own)
                drafts += 1
                accepted_total += accepted
                for pos in range(accepted):
                    accepted_per_pos[pos] += 1

            # The step's tokens: `accepted` drafts, then the target model's own token.
            start = len(req.tokens)
            count = min(1 + accepted, req.stop_at - start)
            seed = req.prompt.seed
            new = tuple(
                drafted_token_text(seed, pos) if lossy and pos - start < accepted else token_text(seed, pos)
                for pos in range(start, start + count)
            )
            req.tokens.extend(new)
            generated += count

            if req.last_token_time is None:
                req.first_token_time = now
                m.ttft.observe(now - req.arrival_time)
            else:
                m.itl.observe(now - req.last_token_time)
            req.last_token_time = now

            finish = req.stop_reason if start + count >= req.stop_at else None
            if req.on_output is not None:
                try:
                    req.on_output(StepOutput(req.request_id, new, finish))
                except Exception:  # one broken consumer must not stop the engine
                    log.exception("output callback of %s failed", req.request_id)
            if finish is None:
                still_running.append(req)
            else:
                self.kv.free(req)
                self._finish(req, finish, now)
        self._running = still_running

        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(generated)
        if m.spec_enabled and drafts:
            m.spec_drafts.inc(drafts)
            m.spec_draft_tokens.inc(drafts * k)
            m.spec_accepted_tokens.inc(accepted_total)
            for pos, count in enumerate(accepted_per_pos):
                m.spec_accepted_per_pos[pos].inc(count)
        self._publish_load()

        s = self.stats
        s.steps += 1
        s.generation_tokens += generated
        s.last_step_end = now
        s.last_batch = len(batch)
        s.last_k = k
        done_event, self._step_event = self._step_event, asyncio.Event()
        done_event.set()

    def _finish(self, req: EngineRequest, reason: str, now: float) -> None:
        m = self.metrics
        m.request_success[reason].inc()
        m.e2e.observe(now - req.arrival_time)
        # As vLLM: every finished request counts, at 0 without a token after the first.
        after_first = len(req.tokens) - 1
        tpot = (
            (now - req.first_token_time) / after_first
            if req.first_token_time is not None and after_first > 0
            else 0.0
        )
        m.tpot.observe(tpot)
        self._resolve(req, reason)

    def _resolve(self, req: EngineRequest, reason: str) -> None:
        req.done = True
        req.finished.set_result(
            Completion(
                request_id=req.request_id,
                text="".join(req.tokens),
                prompt_tokens=req.prompt.num_tokens,
                completion_tokens=len(req.tokens),
                finish_reason=reason,
            )
        )

    def _publish_load(self) -> None:
        """Set the load gauges."""
        m = self.metrics
        m.running.set(sum(1 for r in self._running if not r.done))
        m.waiting.set(len(self._waiting))
        m.kv_cache_usage.set(self.kv.usage)
