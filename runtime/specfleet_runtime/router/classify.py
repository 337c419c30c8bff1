"""Classification of one request into the latency or the batch pool (pure: no I/O, no clock).

Precedence, first match wins:

1. tenant / API-key rules, in config order (tenant header value, or sha256 of the Bearer token);
2. the client's explicit pool header (`RoutingConfig.pool_header`, value `latency` or `batch`), as far
   as `RoutingConfig.pool_header_trust` allows: `AfterTenantRules` (default) here, below the rules an
   operator wrote; `Always` above them (step 0); `Ignored` never;
3. request shape (`ShapeRules`: max_tokens, or none on a chat request; prompts x n; not streaming) -> batch;
4. auto-segmentation: a client whose in-flight count exceeded the threshold is batch until it has
   stayed at or below the threshold for `calm_seconds` (state in `ClientLoadTracker`);
5. the config's default pool.

Identity headers are believed only where the config trusts them (`tenant_header_trust`,
`client_header_trust`: an authenticating gateway in front sets them); otherwise a request has no
tenant, and its client for auto-segmentation is its API key, else its peer address.

The router turns an HTTP request into `RequestFacts` with `extract_facts`, asks the tracker whether
the client is segmented, and calls `classify`. Time is passed in, so everything here is testable
without sleeping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from specfleet_runtime.names import POOLS, PoolName
from specfleet_runtime.router.affinity import PrefixKeys
from specfleet_runtime.routing_config import AutoSegmentation, IdentityHeaderTrust, RoutingConfig


class Reason(StrEnum):
    """Why a request landed in its pool; used as a metric label, so the set is closed."""

    POOL_HEADER = "pool_header"
    TENANT = "tenant"
    API_KEY = "api_key"
    SHAPE_MAX_TOKENS = "shape_max_tokens"
    SHAPE_N = "shape_n"
    SHAPE_NOT_STREAMING = "shape_not_streaming"
    AUTO_SEGMENTATION = "auto_segmentation"
    DEFAULT = "default"


@dataclass(frozen=True)
class Classification:
    """The pool a request belongs to and the rule that put it there."""

    pool: PoolName
    reason: Reason
    # The reason as a plain str, for metric labels and the response header: an enum member's `.value`
    # and hash are Python-level calls, and every request needs the label twice.
    label: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", str(self.reason.value))


# Every possible classification, built once: `classify` hands out these (they are immutable).
_CLASSIFICATIONS: dict[tuple[PoolName, Reason], Classification] = {
    (pool, reason): Classification(pool, reason) for pool in POOLS for reason in Reason
}


def _classification(pool: PoolName, reason: Reason) -> Classification:
    return _CLASSIFICATIONS[pool, reason]


@dataclass(frozen=True)
class RequestFacts:
    """What classification needs to know about a request, already parsed and type-checked."""

    client_id: str
    pool_header: PoolName | None = None
    tenant: str | None = None
    api_key_sha256: str | None = None
    stream: bool = False
    # The output bound of each choice: what the client set, else the engine's default where it has one.
    max_tokens: int | None = None
    # No bound at all: a chat request without max_tokens runs to the end of the context.
    unbounded: bool = False
    # Choices the request asks for: its prompts times n.
    choices: int = 1
    # Not for classification: its prefix and conversation keys, for a pool with prefix affinity.
    prefix: PrefixKeys | None = None

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(
        self,
        client_id: str,
        pool_header: PoolName | None = None,
        tenant: str | None = None,
        api_key_sha256: str | None = None,
        stream: bool = False,
        max_tokens: int | None = None,
        unbounded: bool = False,
        choices: int = 1,
        prefix: PrefixKeys | None = None,
    ) -> None:
        object.__setattr__(self, "client_id", client_id)
        object.__setattr__(self, "pool_header", pool_header)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "api_key_sha256", api_key_sha256)
        object.__setattr__(self, "stream", stream)
        object.__setattr__(self, "max_tokens", max_tokens)
        object.__setattr__(self, "unbounded", unbounded)
        object.__setattr__(self, "choices", choices)
        object.__setattr__(self, "prefix", prefix)


# vLLM's default `max_tokens` for /v1/completions (a chat request's default is the rest of the context).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

Endpoint = Literal["chat", "completions"]


class InvalidRequest(ValueError):
    """A request the router refuses with 400; `param` names the offending field or header."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def sha256_hex(token: str) -> str:
    """Lowercase hex SHA-256, the form API keys take in `TenantRule.api_key_sha256`."""
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _optional_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int subclass in Python, but `"n": true` is a type error in the API.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{key}' must be an integer, got {type(value).__name__}", key)
    return value


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    # Chat accepts both spellings; the larger bound is the one that shapes the request.
    values = [
        v
        for v in (_optional_int(body, "max_tokens"), _optional_int(body, "max_completion_tokens"))
        if v is not None
    ]
    return max(values) if values else None


def parse_pool_header(value: str | None, header: str) -> PoolName | None:
    """The pool named by the explicit pool header; an unknown name is the client's error (400)."""
    if value is None or not value.strip():
        return None
    name = value.strip().lower()
    for pool in POOLS:
        if name == pool:
            return pool
    raise InvalidRequest(f"header {header} must be one of {', '.join(POOLS)}, got {value!r}", header)


def client_identity(client_header: str | None, api_key_sha256: str | None, remote: str | None) -> str:
    """Who a request comes from, for auto-segmentation: trusted client header, else API key, else address.

    Pass `client_header` only where the config trusts it (`trusted_header`).
    """
    if client_header and client_header.strip():
        return f"client:{client_header.strip()}"
    if api_key_sha256:
        # A prefix is enough to tell keys apart and keeps the full hash out of logs.
        return f"key:{api_key_sha256[:16]}"
    return f"addr:{remote or 'unknown'}"


def trusted_header(headers: Mapping[str, str], name: str, trust: IdentityHeaderTrust) -> str | None:
    """An identity header's stripped value where the config trusts it; None if untrusted or blank."""
    if trust != "Trusted":
        return None
    value = (headers.get(name) or "").strip()
    return value or None


def extract_facts(
    config: RoutingConfig,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    remote: str | None,
    *,
    prompts: int = 1,
    endpoint: Endpoint | None = None,
    prefix: PrefixKeys | None = None,
) -> RequestFacts:
    """Turn headers (case-insensitive mapping) and the body's top-level fields into `RequestFacts`.

    `body` is None for endpoints whose body the router does not inspect; `prompts` is how many
    prompts the body carries (a completion's list); `endpoint` says whose default output bound
    applies when the body sets none. Raises `InvalidRequest` for fields of the wrong type, so a
    malformed request never reaches classification.
    """
    token = bearer_token(headers.get("authorization"))
    key_hash = sha256_hex(token) if token else None
    tenant = trusted_header(headers, config.tenant_header, config.tenant_header_trust)
    client = trusted_header(headers, config.client_header, config.client_header_trust)
    stream = False
    max_tokens: int | None = None
    n: int | None = None
    unbounded = False
    if body is not None:
        raw_stream = body.get("stream", False)
        if raw_stream is None:
            raw_stream = False
        if not isinstance(raw_stream, bool):
            raise InvalidRequest(f"'stream' must be a boolean, got {type(raw_stream).__name__}", "stream")
        stream = raw_stream
        max_tokens = _max_tokens(body)
        n = _optional_int(body, "n")
        if max_tokens is None and endpoint == "completions":
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        unbounded = max_tokens is None and endpoint == "chat"
    return RequestFacts(
        client_id=client_identity(client, key_hash, remote),
        pool_header=(
            parse_pool_header(headers.get(config.pool_header), config.pool_header)
            if config.pool_header_trust != "Ignored"
            else None
        ),
        tenant=tenant,
        api_key_sha256=key_hash,
        stream=stream,
        max_tokens=max_tokens,
        unbounded=unbounded,
        choices=prompts * (1 if n is None else n),
        prefix=prefix,
    )


def classify(config: RoutingConfig, facts: RequestFacts, client_segmented: bool) -> Classification:
    """Apply the precedence in the module docstring; `client_segmented` comes from the tracker."""
    trust = config.pool_header_trust
    if facts.pool_header is not None and trust == "Always":
        return _classification(facts.pool_header, Reason.POOL_HEADER)
    for rule in config.tenant_rules:
        if facts.tenant is not None and facts.tenant in rule.tenants:
            return _classification(rule.pool, Reason.TENANT)
        if facts.api_key_sha256 is not None and facts.api_key_sha256 in rule.api_key_sha256:
            return _classification(rule.pool, Reason.API_KEY)
    if facts.pool_header is not None and trust == "AfterTenantRules":
        return _classification(facts.pool_header, Reason.POOL_HEADER)
    shape = config.shape
    if shape.batch_if_max_tokens_at_least is not None and (
        facts.unbounded
        or (facts.max_tokens is not None and facts.max_tokens >= shape.batch_if_max_tokens_at_least)
    ):
        return _classification("batch", Reason.SHAPE_MAX_TOKENS)
    if shape.batch_if_n_at_least is not None and facts.choices >= shape.batch_if_n_at_least:
        return _classification("batch", Reason.SHAPE_N)
    if shape.batch_if_not_streaming and not facts.stream:
        return _classification("batch", Reason.SHAPE_NOT_STREAMING)
    if client_segmented and config.auto_segmentation.enabled:
        return _classification("batch", Reason.AUTO_SEGMENTATION)
    return _classification(config.default_pool, Reason.DEFAULT)


Transition = Literal["to_batch", "from_batch"]


@dataclass
class _ClientState:
    in_flight: int = 0
    segmented: bool = False
    # Monotonic time since which in_flight has stayed at or below the threshold (None: above it).
    calm_since: float | None = None

    # Written out so that mypyc compiles it (a dataclass's own runs as interpreted Python on every
    # request); test_router_dataclass_init checks that it takes the fields.
    def __init__(self, in_flight: int = 0, segmented: bool = False, calm_since: float | None = None) -> None:
        self.in_flight = in_flight
        self.segmented = segmented
        self.calm_since = calm_since


@dataclass(frozen=True)
class ClientVerdict:
    """The tracker's answer when a request starts: is the client batch, and did that just change."""

    segmented: bool
    transition: Transition | None = None


# The verdicts without a transition, shared (they are immutable).
_BATCH = ClientVerdict(True)
_NOT_BATCH = ClientVerdict(False)


class ClientLoadTracker:
    """In-flight requests per client and which clients are auto-segmented as batch.

    A state machine with time passed in. Entries for idle, unsegmented clients are dropped at once, so
    memory is bounded by the number of clients with requests in flight or still calming down.
    """

    def __init__(self) -> None:
        self._clients: dict[str, _ClientState] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def in_flight(self, client: str) -> int:
        state = self._clients.get(client)
        return state.in_flight if state else 0

    def segmented_count(self) -> int:
        return sum(1 for s in self._clients.values() if s.segmented)

    def begin(self, client: str, now: float, policy: AutoSegmentation) -> ClientVerdict:
        """Count a request that starts now (it counts itself) and say whether its client is batch."""
        state = self._clients.get(client)
        if state is None:
            state = self._clients[client] = _ClientState()
        state.in_flight += 1
        if not policy.enabled:
            return _NOT_BATCH
        if state.in_flight > policy.in_flight_threshold:
            state.calm_since = None
            if not state.segmented:
                state.segmented = True
                return ClientVerdict(True, "to_batch")
            return _BATCH
        if state.segmented:
            if state.calm_since is None:
                state.calm_since = now
            if now - state.calm_since >= policy.calm_seconds:
                state.segmented = False
                state.calm_since = None
                return ClientVerdict(False, "from_batch")
        return _BATCH if state.segmented else _NOT_BATCH

    def end(self, client: str, now: float, policy: AutoSegmentation) -> None:
        """Count a request that finished now."""
        state = self._clients.get(client)
        if state is None:
            return
        state.in_flight = max(0, state.in_flight - 1)
        if state.segmented and state.calm_since is None and state.in_flight <= policy.in_flight_threshold:
            state.calm_since = now
        if state.in_flight == 0 and not state.segmented:
            del self._clients[client]

    def expire(self, now: float, policy: AutoSegmentation) -> list[str]:
        """Release segmented clients that have been calm long enough; returns the released ones."""
        released = []
        for client, state in list(self._clients.items()):
            calm = state.calm_since is not None and now - state.calm_since >= policy.calm_seconds
            if state.segmented and (calm or not policy.enabled):
                state.segmented = False
                state.calm_since = None
                released.append(client)
            if state.in_flight == 0 and not state.segmented:
                del self._clients[client]
        return released
