"""A Standby pool's flip, one replica at a time (pure): what to do next with each engine pod.

A Standby pool's pods each hold two vLLM engines on their GPUs, one with the drafter and one without;
one serves, the other sleeps in host memory (vLLM sleep mode, level 1). The pod's speculation label
says which serves (`On`: the engine with the drafter, `Off`: the one without) and puts the pod in that
engine's Service; `Flipping` takes it out of both. A flip of the pool walks its pods in turn:

    Begin     label Flipping: the pod leaves both Services, so no router sends it a new request
    Drain     wait until no Service's endpoints list it and its engine holds no request (running or
              waiting), or the grace period has passed
    Switch    put the serving engine to sleep, wake the other, check it (a completion; after a flip
              On, acceptance near the pool's baseline)
    Finish    label the new setting: the pod joins that engine's Service

A switch that fails puts the pod back on the engine it came from (`Revert`) and the pool stops
flipping by Standby: the caller falls back to restart flips and says why.

Who drives it, and why the operator: it is the one writer (leader-elected) and keeps the pool's status,
while the router runs several replicas that would have to agree on which pod drains; draining through
Service membership reaches every router replica (and a gateway's picker) by the endpoints they already
watch. The state lives on the pod (label and `FLIP_ANNOTATION`), so a restarted operator resumes a
flip where it stopped. The I/O is in `specfleet.controller.standby_flips`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from specfleet_runtime.names import ENGINE_PORT, GROUP, LABEL_SPECULATION, STANDBY_SPECULATIVE_PORT

Setting = Literal["On", "Off"]
FLIPPING = "Flipping"
# On a pod mid-flip: {"to": "On" | "Off", "since": RFC 3339 time}.
FLIP_ANNOTATION = f"{GROUP}/standby-flip"
# The engine with the drafter listens here; the one without on ENGINE_PORT (where every pod starts
# serving, so a pod added under load starts without the drafter).
SPECULATIVE_PORT = STANDBY_SPECULATIVE_PORT
# Pods flipped at once: one, so the pool serves with replicas - 1 engines for the seconds a switch takes.
MAX_FLIPPING = 1


def engine_port(setting: str) -> int:
    """The port of the engine that serves `setting`."""
    return SPECULATIVE_PORT if setting == "On" else ENGINE_PORT


def other(setting: str) -> Setting:
    return "Off" if setting == "On" else "On"


@dataclass(frozen=True)
class FlipMark:
    """A pod's flip in progress, as its annotation records it."""

    to: Setting
    since: datetime

    def text(self) -> str:
        return json.dumps({"to": self.to, "since": self.since.isoformat()}, sort_keys=True)

    @staticmethod
    def parse(text: str | None) -> FlipMark | None:
        """The mark, or None where there is none or it does not parse (the pod is then not flipping)."""
        if not text:
            return None
        try:
            doc = json.loads(text)
            to, since = doc["to"], datetime.fromisoformat(doc["since"])
        except (ValueError, TypeError, KeyError):
            return None
        if to not in ("On", "Off") or since.tzinfo is None:
            return None
        return FlipMark(to, since)


@dataclass(frozen=True)
class Replica:
    """One engine pod of a Standby pool as the driver sees it."""

    pod: str
    label: str  # On, Off, Flipping (or anything else: not a Standby pod yet)
    mark: FlipMark | None
    ready: bool
    # Some Service's ready endpoints still list the pod (None: not known, taken as listed).
    listed: bool | None = None
    # Requests running or waiting in the engine serving now (None: not measured).
    in_flight: float | None = None


@dataclass(frozen=True)
class Step:
    """One thing to do to one pod."""

    kind: Literal["Begin", "Switch", "Finish", "Wait"]
    pod: str
    to: Setting
    why: str = ""


def replica_of(pod: Mapping[str, Any], listed: bool | None = None, in_flight: float | None = None) -> Replica:
    """A pod as the plan sees it, from its labels, flip mark and Ready condition."""
    meta = pod.get("metadata") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
    return Replica(
        meta.get("name", ""),
        (meta.get("labels") or {}).get(LABEL_SPECULATION, ""),
        FlipMark.parse((meta.get("annotations") or {}).get(FLIP_ANNOTATION)),
        ready,
        listed,
        in_flight,
    )


def _flipping(r: Replica) -> bool:
    return r.label == FLIPPING or r.mark is not None


def next_steps(
    desired: Setting, replicas: Sequence[Replica], now: datetime, grace_seconds: float
) -> list[Step]:
    """What to do next: finish or advance the pods mid-flip, then begin on the next pod whose label is
    not `desired`, while fewer than MAX_FLIPPING are flipping. Empty: the pool serves `desired`."""
    steps: list[Step] = []
    for r in replicas:
        if not _flipping(r):
            continue
        if r.mark is None:
            # Flipping with no mark (cut between the two writes): start its drain over toward `desired`.
            steps.append(Step("Begin", r.pod, desired, "flipping without a mark"))
            continue
        waited = (now - r.mark.since).total_seconds()
        if waited < grace_seconds and (r.listed is None or r.listed):
            steps.append(Step("Wait", r.pod, r.mark.to, "still listed by a Service's endpoints"))
        elif waited < grace_seconds and (r.in_flight is None or r.in_flight > 0):
            steps.append(Step("Wait", r.pod, r.mark.to, f"{r.in_flight} requests still in the engine"))
        else:
            steps.append(Step("Switch", r.pod, r.mark.to))
    room = MAX_FLIPPING - sum(1 for r in replicas if _flipping(r))
    for r in replicas:
        if room <= 0:
            break
        if not _flipping(r) and r.ready and r.label in ("On", "Off") and r.label != desired:
            steps.append(Step("Begin", r.pod, desired))
            room -= 1
    return steps


def settled(desired: Setting, replicas: Sequence[Replica]) -> bool:
    """Every pod serves `desired` (pods not Ready yet count: they start serving Off and flip later)."""
    return all(not _flipping(r) and (r.label == desired or not r.ready) for r in replicas)
