"""Workloads for the simulator: trace files (open loop) and concurrency profiles (closed loop).

Trace format: CSV with the columns of the Azure LLM inference trace, `TIMESTAMP,ContextTokens,
GeneratedTokens`, plus optional columns `tenant` (the tenant header, which tenant rules read only
where the resource sets `tenantHeaderTrust: Trusted`), `pool` (the client's pool header), `max_tokens`,
`n`, `stream` (true/false), `acceptance` (a profile name, or per-position values separated by `;`)
and `prefix` (the prompt's shared leading context, `key:end` segments separated by `;`; see
`TraceRequest.prefix`).
TIMESTAMP is either a date-time (`2023-11-16 18:17:03.9799600`) or seconds; arrivals are taken
relative to the first row and divided by `time_scale` (2 compresses the trace to half its length).
A file whose name ends in `.gz` is read through gzip (the traces in `examples/traces/` are).

A row without `stream` counts as streaming (interactive clients stream); a row without `tenant` is
its own client (so auto-segmentation, which counts in-flight requests per client, never groups it).

`shared_prefix_conversations` makes a trace whose prompts share prefixes (tenants' system prompts,
conversations whose context grows each turn), for the engines' prefix caches and prefix-aware routing.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from specfleet_runtime.cost_profile import (
    PUBLISHED_ACCEPTANCE,
    PUBLISHED_EAGLE3_ACCEPTANCE,
    validate_acceptance,
)
from specfleet_runtime.names import POOLS

# Per-position cumulative acceptance by name. "published": the vLLM Dynamic SD profile's EAGLE-1
# drafter on Llama-3.1-8B; "eagle3": published EAGLE-3 figures at K=3; "weak" and "strong": the two
# drafters the policy was first measured with.
ACCEPTANCE_PROFILES: dict[str, tuple[float, ...]] = {
    "published": PUBLISHED_ACCEPTANCE,
    "eagle3": PUBLISHED_EAGLE3_ACCEPTANCE,
    "weak": (0.3, 0.1, 0.03, 0.01, 0.0),
    "strong": (0.9, 0.8, 0.7, 0.6, 0.5),
}

REQUIRED_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


# One segment of a prompt's shared leading context: (key, end), the prompt tokens from the previous
# segment's end (0 for the first) up to `end`, named by `key`.
PrefixSegment = tuple[str, int]


class WorkloadError(ValueError):
    """A trace or acceptance value that cannot be used; the message says where and why."""


def parse_acceptance(text: str) -> tuple[float, ...]:
    """A profile name (`published`, `weak`, `strong`) or per-position values separated by `,` or `;`."""
    name = text.strip()
    if name in ACCEPTANCE_PROFILES:
        return ACCEPTANCE_PROFILES[name]
    parts = [p for p in name.replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise WorkloadError(
            f"acceptance {text!r}: expected one of {', '.join(ACCEPTANCE_PROFILES)} or values like 0.7;0.4;0.2"
        )
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise WorkloadError(
            f"acceptance {text!r}: not a profile name ({', '.join(ACCEPTANCE_PROFILES)}) nor numbers"
        ) from None
    try:
        return validate_acceptance(values)
    except ValueError as err:
        raise WorkloadError(f"acceptance {text!r}: {err}") from None


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload (open loop: `arrival` is fixed by the trace)."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    tenant: str | None = None
    pool: str | None = None
    max_tokens: int | None = None
    n: int = 1
    stream: bool = True
    acceptance: tuple[float, ...] | None = None
    # The prompt's shared leading context, as (key, end) segments with increasing ends. A key names
    # the same tokens at the same offset wherever it appears (a tenant's system prompt; a conversation's
    # history, which a later turn may extend but never change), so two prompts share the leading
    # segments whose keys match. Tokens past the last end are the request's own. Empty: nothing shared.
    prefix: tuple[PrefixSegment, ...] = ()

    @property
    def requested_tokens(self) -> int:
        """Tokens the request asks for: its generated tokens (capped by max_tokens), per completion."""
        cap = self.output_tokens if self.max_tokens is None else min(self.output_tokens, self.max_tokens)
        return max(1, cap) * self.n


@dataclass(frozen=True)
class Trace:
    """An open-loop workload: requests sorted by arrival time (seconds from 0)."""

    requests: tuple[TraceRequest, ...]
    name: str = "trace"

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival if self.requests else 0.0


def _timestamp(text: str, row: int) -> float:
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    # Python's fromisoformat takes at most 6 fractional digits; the Azure trace has 7.
    head, dot, frac = value.partition(".")
    try:
        base = datetime.fromisoformat(head)
    except ValueError:
        raise WorkloadError(f"row {row}: TIMESTAMP {text!r} is neither seconds nor a date-time") from None
    seconds = base.timestamp()
    if dot:
        if not frac.isdigit():
            raise WorkloadError(f"row {row}: TIMESTAMP {text!r} has a malformed fraction")
        seconds += float(f"0.{frac}")
    return seconds


def _int(text: str | None, column: str, row: int, *, minimum: int) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        value = int(float(text))
    except ValueError:
        raise WorkloadError(f"row {row}: {column} {text!r} is not a number") from None
    if value < minimum:
        raise WorkloadError(f"row {row}: {column} must be >= {minimum}, got {value}")
    return value


def _prefix(text: str | None, row: int) -> tuple[PrefixSegment, ...]:
    """`key:end;key:end` (ends increasing) as segments; empty: no shared context."""
    if text is None or not text.strip():
        return ()
    segments: list[PrefixSegment] = []
    for part in text.split(";"):
        key, sep, end = part.strip().rpartition(":")
        if not sep or not key:
            raise WorkloadError(f"row {row}: prefix segment {part.strip()!r} is not key:end")
        value = _int(end, "prefix end", row, minimum=1)
        if value is None:
            raise WorkloadError(f"row {row}: prefix segment {part.strip()!r} has no end")
        if segments and value <= segments[-1][1]:
            raise WorkloadError(
                f"row {row}: prefix segment {part.strip()!r} does not end after the one before"
            )
        segments.append((key, value))
    return tuple(segments)


def _bool(text: str | None, row: int) -> bool | None:
    if text is None or not text.strip():
        return None
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise WorkloadError(f"row {row}: stream {text!r} must be true or false")


def parse_trace(lines: Iterable[str], *, time_scale: float = 1.0, name: str = "trace") -> Trace:
    """Parse trace CSV text (see the module docstring); raises WorkloadError naming the bad row."""
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise WorkloadError(f"time scale must be a positive number, got {time_scale}")
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise WorkloadError(
            f"trace lacks column(s) {', '.join(missing)} (has: {', '.join(header) or 'none'})"
        )
    raw: list[tuple[float, TraceRequest]] = []
    acceptance_cache: dict[str, tuple[float, ...]] = {}
    for row_number, row in enumerate(reader, start=2):
        at = _timestamp(row["TIMESTAMP"] or "", row_number)
        prompt = _int(row["ContextTokens"], "ContextTokens", row_number, minimum=0)
        output = _int(row["GeneratedTokens"], "GeneratedTokens", row_number, minimum=0)
        if prompt is None or output is None:
            raise WorkloadError(f"row {row_number}: ContextTokens and GeneratedTokens are required")
        pool = (row.get("pool") or "").strip().lower() or None
        if pool is not None and pool not in POOLS:
            raise WorkloadError(f"row {row_number}: pool {pool!r} must be latency or batch")
        acceptance = None
        text = (row.get("acceptance") or "").strip()
        if text:
            if text not in acceptance_cache:
                try:
                    acceptance_cache[text] = parse_acceptance(text)
                except WorkloadError as err:
                    raise WorkloadError(f"row {row_number}: {err}") from None
            acceptance = acceptance_cache[text]
        stream = _bool(row.get("stream"), row_number)
        raw.append(
            (
                at,
                TraceRequest(
                    arrival=0.0,
                    prompt_tokens=prompt,
                    output_tokens=max(1, output),
                    tenant=(row.get("tenant") or "").strip() or None,
                    pool=pool,
                    max_tokens=_int(row.get("max_tokens"), "max_tokens", row_number, minimum=1),
                    n=_int(row.get("n"), "n", row_number, minimum=1) or 1,
                    stream=True if stream is None else stream,
                    acceptance=acceptance,
                    prefix=_prefix(row.get("prefix"), row_number),
                ),
            )
        )
    if not raw:
        raise WorkloadError("trace has no requests")
    raw.sort(key=lambda item: item[0])
    start = raw[0][0]
    requests = tuple(
        TraceRequest(
            arrival=(at - start) / time_scale,
            prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens,
            tenant=r.tenant,
            pool=r.pool,
            max_tokens=r.max_tokens,
            n=r.n,
            stream=r.stream,
            acceptance=r.acceptance,
            prefix=r.prefix,
        )
        for at, r in raw
    )
    return Trace(requests=requests, name=name)


def read_trace(path: str | Path, *, time_scale: float = 1.0) -> Trace:
    """Read a trace file (see the module docstring)."""
    name = Path(Path(path).name.removesuffix(".gz")).stem
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rt", newline="", encoding="utf-8") as handle:
                return parse_trace(handle, time_scale=time_scale, name=name)
        with open(path, newline="", encoding="utf-8") as handle:
            return parse_trace(handle, time_scale=time_scale, name=name)
    except (OSError, EOFError) as err:
        raise WorkloadError(f"cannot read trace {path}: {getattr(err, 'strerror', None) or err}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"trace {path} is not UTF-8 text") from None


@dataclass(frozen=True)
class ClosedLoop:
    """A closed-loop workload: `clients(t)` clients, each sending its next request when one finishes.

    `points` are (seconds, clients) pairs, linear in between. Request sizes cycle through `sizes`
    ((prompt tokens, generated tokens) pairs) in a seeded random order. Every client is its own
    client for the router; `acceptance_at` optionally changes the acceptance at a time (a content shift).
    """

    points: tuple[tuple[float, float], ...]
    sizes: tuple[tuple[int, int], ...]
    name: str = "closed-loop"
    pool: str | None = None
    acceptance_changes: tuple[tuple[float, tuple[float, ...]], ...] = ()

    @property
    def duration(self) -> float:
        return self.points[-1][0]

    def clients(self, t: float) -> int:
        pts = self.points
        if t <= pts[0][0]:
            return round(pts[0][1])
        for (t0, c0), (t1, c1) in itertools.pairwise(pts):
            if t <= t1:
                return round(c0 + (c1 - c0) * (t - t0) / (t1 - t0)) if t1 > t0 else round(c1)
        return round(pts[-1][1])

    def acceptance_at(self, t: float) -> tuple[float, ...] | None:
        current = None
        for at, values in self.acceptance_changes:
            if t >= at:
                current = values
        return current


def ramp(
    per_replica: Sequence[tuple[float, float]], replicas: int, sizes: Sequence[tuple[int, int]], name: str
) -> ClosedLoop:
    """A closed loop whose client count is `replicas` x the per-replica running requests given."""
    return ClosedLoop(points=tuple((t, c * replicas) for t, c in per_replica), sizes=tuple(sizes), name=name)


def shared_prefix_conversations(
    *,
    tenants: int = 32,
    conversations: int = 1200,
    duration: float = 3600.0,
    seed: int = 0,
    system_tokens: tuple[int, int] = (1024, 4096),
    turns: tuple[int, int] = (1, 8),
    user_tokens: tuple[int, int] = (32, 512),
    output_tokens: tuple[int, int] = (64, 512),
    think_seconds: float = 20.0,
    seconds_per_output_token: float = 0.02,
    hot_share: float = 0.0,
    name: str = "shared-prefix",
) -> Trace:
    """Multi-turn conversations of `tenants` tenants that each have a system prompt (open loop).

    The rule (every draw from one generator seeded by `seed`; integer ranges inclusive, uniform):
    tenant i's system prompt has S_i ~ `system_tokens` tokens. Each of `conversations` conversations
    belongs to a tenant drawn uniformly (with `hot_share` > 0, tenant 0 instead with that probability:
    one hot tenant), starts at a time uniform in [0, duration) and has T ~ `turns`
    turns. Turn j's prompt is the system prompt, the conversation so far (every earlier turn's user
    message and answer) and a new user message of U ~ `user_tokens` tokens; it asks for O ~
    `output_tokens` tokens. The next turn arrives when this one's answer would have streamed
    (O x `seconds_per_output_token`) plus a think time, exponential with mean `think_seconds`; turns
    past `duration` are dropped. Each request's prefix is (`t<i>`, S_i) then (`t<i>/c<n>`, its prompt
    length): the system prompt is shared by the tenant's conversations, and the whole prompt is the
    start of the conversation's next turn. Requests carry no tenant header (no tenant rule applies).
    """
    rng = np.random.default_rng([seed, 29])
    system = rng.integers(system_tokens[0], system_tokens[1] + 1, size=tenants)
    rows: list[TraceRequest] = []
    for conv in range(conversations):
        tenant = int(rng.integers(tenants))
        if hot_share > 0.0 and rng.random() < hot_share:
            tenant = 0
        at = float(rng.uniform(0.0, duration))
        history = int(system[tenant])
        for _ in range(int(rng.integers(turns[0], turns[1] + 1))):
            prompt = history + int(rng.integers(user_tokens[0], user_tokens[1] + 1))
            output = int(rng.integers(output_tokens[0], output_tokens[1] + 1))
            if at >= duration:
                break
            prefix = ((f"t{tenant}", int(system[tenant])), (f"t{tenant}/c{conv}", prompt))
            rows.append(TraceRequest(arrival=at, prompt_tokens=prompt, output_tokens=output, prefix=prefix))
            history = prompt + output
            at += output * seconds_per_output_token + float(rng.exponential(think_seconds))
    rows.sort(key=lambda r: r.arrival)
    return Trace(requests=tuple(rows), name=name)
