"""The routing configuration the operator renders into a ConfigMap and the router reads.

This is the contract between control plane and data plane: the operator's renderer produces
`RoutingConfig(...).to_json()` under the ConfigMap key `ROUTING_CONFIG_KEY`; the router parses it with
`RoutingConfig.from_json` and reloads it when it changes. Pure data, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final, Literal, TypeVar

from specfleet_runtime.names import ENGINE_PORT, POOLS, PoolName

ROUTING_CONFIG_KEY: Final = "routing.json"
# How far a client's own pool header is trusted: never, only where no tenant/API-key rule matched
# (the default: an operator's rules beat a client's wish), or above every rule.
PoolHeaderTrust = Literal["Ignored", "AfterTenantRules", "Always"]
POOL_HEADER_TRUST_VALUES: Final = ("Ignored", "AfterTenantRules", "Always")
# Whether an identity header (tenant, client) is believed: only where an authenticating gateway in front
# of the router sets it on every request (Trusted); otherwise any client could claim any identity.
IdentityHeaderTrust = Literal["Ignored", "Trusted"]
IDENTITY_HEADER_TRUST_VALUES: Final = ("Ignored", "Trusted")
# When a pool has no ready endpoint: send its traffic to the other pool, or answer 503.
Fallback = Literal["otherPool", "reject"]
FALLBACK_VALUES: Final = ("otherPool", "reject")
# How the router picks one endpoint of a pool: the fewest outstanding requests, or the endpoint a hash of
# the request's leading text maps to while it is under the load bound (router/affinity.py).
EndpointStrategy = Literal["LeastOutstanding", "PrefixAffinity"]
ENDPOINT_STRATEGY_VALUES: Final = ("LeastOutstanding", "PrefixAffinity")
# PrefixAffinity's load bound where none is set: an endpoint takes a prefix's requests while it has fewer
# than 1.25 times the mean outstanding requests (plus the arriving one).
DEFAULT_LOAD_BOUND_PERCENT: Final = 125
LOAD_BOUND_PERCENT_RANGE: Final = (100, 1000)
# ... and in any case while it has fewer than the mean plus this many: at a few requests per engine a
# percentage of the mean is less than one request, and a request would leave the engine holding its cache
# for a difference of one or two. A few more running sequences cost a continuous-batching engine little
# (the published Llama-3.1-8B profile's decode step: 6.52 ms at 1, 6.66 at 8, 6.82 at 16), while leaving
# costs a prefill of the cached prompt (1-4k tokens: 41-164 ms, stalling the other engine's step too);
# benchmarks/prefix_bounds.py and prefix_spills.py (--slack) measure it.
LOAD_BOUND_SLACK: Final = 8
# The leading text PrefixAffinity hashes: characters of a prompt, or of the chat messages up to and
# including the first user turn (2 KiB of text is ~500 tokens: past a system prompt and into the turn
# that tells one conversation from another); token ids of a prompt given as ids (router/body.py).
PREFIX_CHARS: Final = 2048
PREFIX_TOKENS: Final = 512


_Rule = TypeVar("_Rule", "TenantRule", "ShapeRules", "AutoSegmentation", "EndpointSelection")


@dataclass(frozen=True)
class ServicePort:
    """One more Service of a pool, and the port its endpoints serve on."""

    service: str
    port: int


@dataclass(frozen=True)
class PoolBackend:
    """Where a pool's engines are: a Service whose EndpointSlices list ready pods, or static URLs.

    `extra_services`: further Services whose ready endpoints join the pool's, each at its own port (a
    Standby pool's speculative engines). A router of the previous version ignores them.
    """

    service: str | None = None
    port: int = ENGINE_PORT
    static_urls: tuple[str, ...] = ()
    extra_services: tuple[ServicePort, ...] = ()

    def services(self) -> tuple[ServicePort, ...]:
        """Every Service of the pool with its port: `service` first."""
        first = (ServicePort(self.service, self.port),) if self.service else ()
        return first + self.extra_services


@dataclass(frozen=True)
class TenantRule:
    """Requests matching any listed tenant or API key hash go to `pool`.

    API keys are given as lowercase hex SHA-256 of the bearer token, so no secret sits in a ConfigMap.
    """

    pool: PoolName
    tenants: tuple[str, ...] = ()
    api_key_sha256: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShapeRules:
    """Request-shape classification; a request matching any enabled rule is batch traffic."""

    batch_if_max_tokens_at_least: int | None = None
    batch_if_n_at_least: int | None = None
    batch_if_not_streaming: bool = False


@dataclass(frozen=True)
class AutoSegmentation:
    """A client with more than `in_flight_threshold` requests in flight is batch until it calms down."""

    enabled: bool = True
    in_flight_threshold: int = 8
    calm_seconds: int = 30


@dataclass(frozen=True)
class EndpointSelection:
    """How the router picks one endpoint of a pool for each request."""

    # PrefixAffinity by default: docs/benchmarks/prefix-routing.md measures it against least outstanding
    # on shared prefixes, and `benchmarks/prefix_bounds.py` on prompts that share nothing.
    strategy: EndpointStrategy = "PrefixAffinity"
    # PrefixAffinity's load bound c in percent; None: DEFAULT_LOAD_BOUND_PERCENT.
    load_bound_percent: int | None = None

    @property
    def bound_percent(self) -> int:
        return DEFAULT_LOAD_BOUND_PERCENT if self.load_bound_percent is None else self.load_bound_percent


@dataclass(frozen=True)
class PoolEndpointSelection:
    """Endpoint selection of each pool."""

    latency: EndpointSelection = field(default_factory=EndpointSelection)
    batch: EndpointSelection = field(default_factory=EndpointSelection)

    def of(self, pool: str) -> EndpointSelection:
        return self.batch if pool == "batch" else self.latency


@dataclass(frozen=True)
class RoutingConfig:
    """The whole router configuration of one SpeculativeDeployment."""

    served_model_name: str
    pools: dict[str, PoolBackend]
    default_pool: PoolName = "latency"
    pool_header: str = "x-specfleet-pool"
    pool_header_trust: PoolHeaderTrust = "AfterTenantRules"
    tenant_header: str = "x-specfleet-tenant"
    tenant_header_trust: IdentityHeaderTrust = "Ignored"
    client_header: str = "x-specfleet-client"
    client_header_trust: IdentityHeaderTrust = "Ignored"
    tenant_rules: tuple[TenantRule, ...] = ()
    shape: ShapeRules = field(default_factory=ShapeRules)
    auto_segmentation: AutoSegmentation = field(default_factory=AutoSegmentation)
    fallback: Fallback = "otherPool"
    endpoint_selection: PoolEndpointSelection = field(default_factory=PoolEndpointSelection)

    def to_json(self) -> str:
        """Key-sorted camelCase JSON, stable so an unchanged config renders an unchanged ConfigMap."""
        doc = asdict(self)
        for backend in doc["pools"].values():
            if not backend["extra_services"]:
                del backend["extra_services"]  # a pool of one Service reads as it always did
        return json.dumps(_camel(doc), sort_keys=True, indent=2)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RoutingConfig:
        """Build from snake_case data: parsed JSON, or the API's routing spec as the renderer dumps it.

        Absent keys take the defaults declared above; unknown keys of a nested rule raise TypeError.
        Not validated (see `validate`)."""
        pools = {
            name: PoolBackend(
                service=p.get("service"),
                port=int(p.get("port", ENGINE_PORT)),
                static_urls=tuple(p.get("static_urls", ())),
                extra_services=tuple(
                    ServicePort(service=str(e["service"]), port=int(e.get("port", ENGINE_PORT)))
                    for e in p.get("extra_services", ())
                ),
            )
            for name, p in doc["pools"].items()
        }
        rules = tuple(_build(TenantRule, r) for r in doc.get("tenant_rules", ()))
        return cls(
            served_model_name=doc["served_model_name"],
            pools=pools,
            tenant_rules=tuple(
                replace(r, api_key_sha256=tuple(k.lower() for k in r.api_key_sha256)) for r in rules
            ),
            shape=_build(ShapeRules, doc.get("shape", {})),
            auto_segmentation=_build(AutoSegmentation, doc.get("auto_segmentation", {})),
            endpoint_selection=PoolEndpointSelection(
                **{
                    pool: _build(EndpointSelection, selection)
                    for pool, selection in doc.get("endpoint_selection", {}).items()
                }
            ),
            **{key: doc[key] for key in _PLAIN_FIELDS if key in doc},
        )

    @classmethod
    def from_json(cls, text: str) -> RoutingConfig:
        """Parse and validate; raises ValueError with a readable message on a bad document."""
        try:
            config = cls.from_dict(_snake(json.loads(text)))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as err:
            raise ValueError(f"invalid routing config: {err!r}") from None
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ValueError if the config names unknown pools or has no way to reach a pool."""
        for name, backend in self.pools.items():
            if name not in POOLS:
                raise ValueError(f"invalid routing config: unknown pool {name!r}")
            if backend.service is None and not backend.static_urls:
                raise ValueError(f"invalid routing config: pool {name!r} has neither service nor staticUrls")
        if self.default_pool not in self.pools:
            raise ValueError(f"invalid routing config: defaultPool {self.default_pool!r} is not configured")
        for rule in self.tenant_rules:
            if rule.pool not in self.pools:
                raise ValueError(f"invalid routing config: tenant rule targets unknown pool {rule.pool!r}")
        if self.pool_header_trust not in POOL_HEADER_TRUST_VALUES:
            raise ValueError(
                "invalid routing config: poolHeaderTrust must be one of "
                f"{', '.join(POOL_HEADER_TRUST_VALUES)}, not {self.pool_header_trust!r}"
            )
        for name, trust in (
            ("tenantHeaderTrust", self.tenant_header_trust),
            ("clientHeaderTrust", self.client_header_trust),
        ):
            if trust not in IDENTITY_HEADER_TRUST_VALUES:
                raise ValueError(
                    f"invalid routing config: {name} must be one of "
                    f"{', '.join(IDENTITY_HEADER_TRUST_VALUES)}, not {trust!r}"
                )
        if self.fallback not in FALLBACK_VALUES:
            raise ValueError(
                f"invalid routing config: fallback must be otherPool or reject, not {self.fallback!r}"
            )
        for pool in POOLS:
            selection = self.endpoint_selection.of(pool)
            if selection.strategy not in ENDPOINT_STRATEGY_VALUES:
                raise ValueError(
                    f"invalid routing config: endpointSelection.{pool}.strategy must be one of "
                    f"{', '.join(ENDPOINT_STRATEGY_VALUES)}, not {selection.strategy!r}"
                )
            low, high = LOAD_BOUND_PERCENT_RANGE
            bound = selection.load_bound_percent
            if bound is not None and (type(bound) is not int or not low <= bound <= high):
                raise ValueError(
                    f"invalid routing config: endpointSelection.{pool}.loadBoundPercent must be an "
                    f"integer from {low} to {high}, not {bound!r}"
                )


# Top-level fields that are plain values (the rest are built by `from_dict`).
_PLAIN_FIELDS: Final = tuple(
    f.name
    for f in fields(RoutingConfig)
    if f.name
    not in ("served_model_name", "pools", "tenant_rules", "shape", "auto_segmentation", "endpoint_selection")
)


def _build(cls: type[_Rule], values: Mapping[str, Any]) -> _Rule:
    """A nested rule from its fields (lists become the tuples the frozen dataclasses hold)."""
    converted: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**converted)


def _camel_key(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake_key(key: str) -> str:
    out = [f"_{c.lower()}" if c.isupper() else c for c in key]
    return "".join(out).replace("sha_256", "sha256")


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            (_camel_key(k) if isinstance(k, str) and k not in POOLS else k): _camel(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_camel(v) for v in value]
    return value


def _snake(value: Any) -> Any:
    if isinstance(value, dict):
        return {(_snake_key(k) if isinstance(k, str) else k): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value
