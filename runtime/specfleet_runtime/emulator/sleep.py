"""vLLM's sleep mode on the emulated engine: what POST /sleep, POST /wake_up and GET /is_sleeping do.

A standby engine (issue 46) is a second vLLM engine parked asleep at level 1 beside the serving one;
the operator flips a replica by draining it, sleeping one engine and waking the other. The emulator
behaves as vLLM does, so that sequence can be tested without GPUs.

What vLLM does (vllm-project/vllm, read for this module):

- vllm/entrypoints/serve/sleep/api_router.py (commit 09cb327f1183534adbdf9eee3e438688e75fbe2b; the same
  in the newer layout vllm/frontend/entrypoints/serve/dev/sleep/api_router.py, 055e47c2800315642136):
  `POST /sleep` reads the query parameters `level` (default "1", parsed with int()) and `mode` (default
  "abort"), awaits `engine_client.sleep(level, mode)` and answers 200 with an empty body.
  `POST /wake_up` reads the repeated query parameter `tags` (none: wake everything), awaits
  `engine_client.wake_up(tags)` and answers 200, empty. `GET /is_sleeping` answers
  `{"is_sleeping": <bool>}`. `attach_router` adds the three routes only when `VLLM_SERVER_DEV_MODE`
  is set (`VLLM_SERVER_DEV_MODE=1`); without it they are 404, with or without --enable-sleep-mode.
  An exception in the engine call (a bad `level`, an unknown `mode`: "Invalid pause mode: ...") is
  answered by vLLM's exception handler as an OpenAI error body, 400 for a ValueError.
- vllm/v1/engine/core.py, `EngineCore.sleep(level, mode)`: pauses the scheduler first (`abort`: abort
  every request; `wait`: let the requests in flight finish, then sleep; `keep`: keep them, paused),
  clears the prefix cache at level >= 1, then `executor.sleep(level)`; level 0 only pauses. While
  paused, new requests are queued, not served, until `wake_up(tags)`, which wakes the executor (tag
  "scheduling" stands for level 0 and is dropped) and then resumes the scheduler, whatever the tags.
  `is_sleeping` = the scheduler is paused or the executor sleeps.
- vllm/v1/executor/abstract.py, `Executor.sleep` / `wake_up`: sleeping again is a logged no-op, as is
  waking an executor that does not sleep or naming a tag that is not asleep; after a sleep the asleep
  tags are {"weights", "kv_cache"}, and the executor sleeps until every one of them woke.
- vllm/v1/worker/gpu_worker.py (commit 35d5cda123ec28581759b6d34cde8052314fb1e6), `Worker.sleep`:
  CuMemAllocator copies the allocations tagged "weights" to host RAM at level 1 and discards the rest
  (level 2 discards everything). Weights and KV cache are allocated in that pool only with
  --enable-sleep-mode (`_maybe_get_memory_pool_context`): without the flag, /sleep still answers 200
  and /is_sleeping turns true, but nothing is freed ("Sleep mode freed 0.00 GiB memory").
- vllm/v1/metrics/loggers.py: the gauge vllm:engine_sleep_state{sleep_state=awake|weights_offloaded|
  discard_all}, set by AsyncLLM.sleep and reset to awake by every wake_up (also a partial one); it is
  in the repository's capture of vLLM 0.32.0's /metrics (tests/vllm/data).

Where the emulator departs from vLLM, on purpose (each answered as an OpenAI error body):

- Sleeping with requests in flight and `mode` abort or keep: 409, nothing changes. vLLM aborts them
  (abort) or keeps them for after the wake on a KV cache it dropped (keep), and sleeping mid-decode has
  crashed the engine (vllm#28714, #45520). The product drains first; a caller that forgot fails loudly
  here. `mode=wait` drains as vLLM does: new requests are refused meanwhile (vLLM would queue them).
- A generation request while asleep, falling asleep, draining or waking: 503. vLLM queues it until
  the wake (older releases crash on it), a hang that would hide a routing bug as latency.
- A wake that leaves a tag asleep (`tags=weights` alone) keeps refusing requests: vLLM resumes its
  scheduler anyway and the next forward pass faults on the unmapped KV cache (vllm#44395).
- Level 2 takes no time either way (the weights are discarded, and vLLM needs a separate
  reload_weights, not modelled), and an engine with a drafter wakes from it with acceptance 0, as
  EAGLE-3 does (vllm#52479). The product uses level 1 only.

Timing: at level 1 with --enable-sleep-mode, falling asleep copies the weights to host RAM and waking
copies them back, each `sleep_mode.transfer_seconds(weight bytes, host link)` x time_scale (0 with
time_scale 0). Without the flag, and at levels 0 and 2, both take no time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from specfleet_runtime.emulator.engine import Engine
from specfleet_runtime.sleep_mode import transfer_seconds

log = logging.getLogger(__name__)

# vLLM's PauseMode values and its default for POST /sleep.
PAUSE_MODES: Final = ("abort", "wait", "keep")
DEFAULT_PAUSE_MODE: Final = "abort"
# The executor's sleep tags, and the tag that stands for level 0 (the scheduler only).
SLEEP_TAGS: Final = frozenset({"weights", "kv_cache"})
SCHEDULING_TAG: Final = "scheduling"

Phase = Literal["awake", "draining", "falling_asleep", "asleep", "waking"]
Wait = Callable[[float], Awaitable[None]]


class SleepConflictError(Exception):
    """A sleep was asked for while requests are in flight, without mode=wait."""


@dataclass(frozen=True)
class Transition:
    """One sleep or wake that happened: its level and the emulated seconds it was given."""

    kind: Literal["sleep", "wake"]
    level: int
    seconds: float


class SleepMode:
    """Sleep and wake one emulated engine, one call at a time (vLLM's engine core serializes them).

    `wait` waits out a transition's seconds (asyncio.sleep); tests swap it to control time.
    """

    def __init__(self, engine: Engine, wait: Wait = asyncio.sleep) -> None:
        self.engine = engine
        self.wait = wait
        self.phase: Phase = "awake"
        # The level of the current sleep (None while awake), and the executor's tags still asleep.
        self.level: int | None = None
        self.asleep_tags: frozenset[str] = frozenset()
        # Weights held in host RAM now (level 1 with --enable-sleep-mode).
        self.host_bytes = 0.0
        self.transitions: list[Transition] = []
        self._lock = asyncio.Lock()

    @property
    def is_sleeping(self) -> bool:
        """What GET /is_sleeping answers: true from the moment a sleep starts until a wake ends."""
        return self.phase != "awake"

    def _copy_seconds(self, level: int) -> float:
        """Emulated seconds of one level-`level` weight copy over the host link (0 where none)."""
        cfg = self.engine.config
        if level != 1 or not cfg.enable_sleep_mode:
            return 0.0
        return transfer_seconds(cfg.resolved_weight_bytes, cfg.host_link_bytes_per_s) * cfg.time_scale

    async def sleep(self, level: int = 1, mode: str = DEFAULT_PAUSE_MODE) -> None:
        """POST /sleep?level=&mode=: stop serving, drop the KV cache, park the weights (see module doc)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"Invalid pause mode: {mode}")  # vLLM's pause_scheduler message
        async with self._lock:
            if self.phase != "awake":
                log.warning("Executor is already sleeping.")  # vLLM's no-op
                return
            engine = self.engine
            if engine.num_in_flight:
                if mode != "wait":
                    raise SleepConflictError(
                        f"{engine.num_in_flight} requests in flight: drain the engine before "
                        f"POST /sleep, or pass mode=wait (vLLM's mode={mode} would "
                        f"{'abort' if mode == 'abort' else 'keep'} them, and sleeping mid-decode has "
                        "crashed vLLM: vllm#28714, #45520)"
                    )
                self.phase = "draining"
                engine.pause("the engine is draining to fall asleep")
                try:
                    await engine.wait_until_idle()
                except BaseException:
                    self.phase = "awake"
                    engine.resume()
                    raise
            engine.pause("the engine is asleep (vLLM sleep mode): POST /wake_up first")
            self.phase = "falling_asleep"
            self.level = level
            if level >= 1:  # vLLM clears the prefix cache, and the KV cache is unmapped or reused empty
                engine.drop_kv_cache()
            seconds = self._copy_seconds(level)
            await self.wait(seconds)
            self.phase = "asleep"
            self.asleep_tags = SLEEP_TAGS if level >= 1 else frozenset()
            if level == 1 and engine.config.enable_sleep_mode:
                self.host_bytes = engine.config.resolved_weight_bytes
            self.transitions.append(Transition("sleep", level, seconds))
            engine.metrics.record_sleep_state(asleep=True, level=level)
            log.info("fell asleep at level %d in %.3f emulated seconds", level, seconds)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """POST /wake_up[?tags=...]: wake the named tags (all when none); serve once none is asleep."""
        async with self._lock:
            if self.phase == "awake":
                log.warning("Executor is not sleeping.")  # vLLM's no-op
                return
            wanted = None if tags is None else [t for t in tags if t != SCHEDULING_TAG]
            if self.asleep_tags and (wanted is None or wanted):
                unknown = [t for t in wanted or () if t not in self.asleep_tags]
                if unknown:  # vLLM logs and wakes nothing
                    log.warning("Tag %s is not in sleeping tags %s", unknown[0], sorted(self.asleep_tags))
                else:
                    await self._wake_tags(frozenset(wanted) if wanted else self.asleep_tags)
            # vLLM records "awake" after every wake_up, even one that left a tag asleep.
            self.engine.metrics.record_sleep_state(asleep=False, level=0)
            if self.asleep_tags:
                return  # still no KV cache or no weights: keep refusing (module doc)
            self.phase, self.level = "awake", None
            self.engine.resume()

    async def _wake_tags(self, waking: frozenset[str]) -> None:
        level = self.level if self.level is not None else 1
        self.phase = "waking"
        seconds = self._copy_seconds(level) if "weights" in waking else 0.0
        await self.wait(seconds)
        self.asleep_tags -= waking
        self.phase = "asleep"
        if "weights" in waking:
            self.host_bytes = 0.0
            if level >= 2 and self.engine.config.has_drafter:
                # vllm#52479: after a level-2 wake the EAGLE-3 drafter's weights are not reloaded.
                self.engine.set_acceptance([0.0] * len(self.engine.acceptance))
        self.transitions.append(Transition("wake", level, seconds))
        log.info("woke %s in %.3f emulated seconds", sorted(waking), seconds)

    def state(self) -> dict[str, object]:
        """The sleep section of /admin/state."""
        cfg = self.engine.config
        return {
            "enableSleepMode": cfg.enable_sleep_mode,
            "isSleeping": self.is_sleeping,
            "phase": self.phase,
            "level": self.level,
            "asleepTags": sorted(self.asleep_tags),
            "hostBytes": self.host_bytes,
            "weightBytes": cfg.resolved_weight_bytes,
            "hostLinkBytesPerSecond": cfg.host_link_bytes_per_s,
            "transitions": [
                {"kind": t.kind, "level": t.level, "seconds": t.seconds} for t in self.transitions
            ],
        }
