"""spec.routing: how the router classifies each request into a pool. Its fields take their types and
defaults from the routing contract the router reads (`specfleet_runtime.routing_config`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator

from specfleet.api.base import ApiModel, Rule
from specfleet.api.constants import PoolName
from specfleet.api.gateway import MAX_GATEWAY_TENANTS, GatewaySpec
from specfleet_runtime import routing_config as contract

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# Whether an identity header is believed: the routing contract's own type.
IdentityHeaderTrust = contract.IdentityHeaderTrust
# UpperCamelCase enum values, as the Kubernetes API conventions ask. The earlier camelCase spellings
# are deprecated for one version: accepted (the CRD's enum lists them) and read as the new ones.
RoutingFallback = Literal["OtherPool", "Reject"]
DEPRECATED_FALLBACK: dict[str, RoutingFallback] = {"otherPool": "OtherPool", "reject": "Reject"}
# The routing contract the router reads: `spec.routing` declares its fields with the contract's types and
# defaults (`render.router.routing_config` passes them through; a unit test holds the field sets equal).
_ROUTING = contract.RoutingConfig
_SHAPE = contract.ShapeRules
_SEGMENTATION = contract.AutoSegmentation
_SELECTION = contract.EndpointSelection


class TenantRule(ApiModel):
    """Send the requests of some tenants or API keys to one pool."""

    rules = (
        Rule(
            cel="size(self.tenants) > 0 || size(self.apiKeySha256) > 0",
            message="a tenant rule needs at least one tenant or apiKeySha256",
            check=lambda r: bool(r.tenants or r.api_key_sha256),
        ),
    )

    pool: PoolName = Field(description="Pool these requests go to.")
    tenants: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list,
        max_length=256,
        description="Values of the tenant header (needs routing.tenantHeaderTrust: Trusted).",
    )
    api_key_sha256: list[Sha256Hex] = Field(
        default_factory=list,
        max_length=256,
        description="Lowercase hex SHA-256 of bearer tokens (never the tokens themselves).",
    )


class ShapeRules(ApiModel):
    """Classify by request shape: a request matching any set rule is batch traffic."""

    batch_if_max_tokens_at_least: int | None = Field(
        default=_SHAPE.batch_if_max_tokens_at_least,
        ge=1,
        description="max_tokens at or above this marks a batch request.",
    )
    batch_if_n_at_least: int | None = Field(
        default=_SHAPE.batch_if_n_at_least,
        ge=2,
        description="n (completions per prompt) at or above this marks a batch request.",
    )
    batch_if_not_streaming: bool = Field(
        default=_SHAPE.batch_if_not_streaming, description="Non-streaming requests are batch."
    )


class AutoSegmentation(ApiModel):
    """A client with too many requests in flight is treated as batch traffic until it calms down."""

    enabled: bool = Field(default=_SEGMENTATION.enabled, description="Turn auto-segmentation on.")
    in_flight_threshold: int = Field(
        default=_SEGMENTATION.in_flight_threshold,
        ge=1,
        le=100000,
        description="In-flight requests above which a client counts as batch.",
    )
    calm_seconds: int = Field(
        default=_SEGMENTATION.calm_seconds,
        ge=0,
        le=86400,
        description="Time below the threshold before a client is latency again.",
    )


class EndpointSelection(ApiModel):
    """How the router picks one engine of a pool for each request."""

    rules = (
        Rule(
            cel="self.strategy == 'PrefixAffinity' || !has(self.loadBoundPercent)",
            message="loadBoundPercent applies only to strategy PrefixAffinity",
            check=lambda s: s.strategy == "PrefixAffinity" or s.load_bound_percent is None,
        ),
    )

    strategy: contract.EndpointStrategy = Field(
        default=_SELECTION.strategy,
        description="PrefixAffinity (default): a chat turn goes to the engine that last served its conversation "
        "(the longest of its message-boundary prefixes the router pod remembers); other requests, and "
        "turns of conversations it has not seen, to the engine their leading text (a completion's prompt, "
        f"or the chat messages up to the first user turn, at most {contract.PREFIX_CHARS} characters, such "
        "as a tenant's system prompt) was placed on, a new leading text on the engine holding the least of them. "
        "Either way only to an engine under the load bound, past which the request goes to the next "
        "engine of a consistent-hashing ring on its leading text, so requests sharing a prefix reach the "
        "engine whose prefix cache holds it while it has room; requests without such text are sent by "
        "least outstanding. LeastOutstanding: the engine with the fewest requests in flight from this "
        "router worker, whatever the request.",
    )
    load_bound_percent: int | None = Field(
        default=_SELECTION.load_bound_percent,
        ge=contract.LOAD_BOUND_PERCENT_RANGE[0],
        le=contract.LOAD_BOUND_PERCENT_RANGE[1],
        description="PrefixAffinity only: an engine takes the requests of a leading text placed on it "
        "while it has fewer than this percentage of the mean requests in flight across the pool's "
        "engines (counting the arriving one, rounded up), and a conversation's turns while it has fewer "
        "than twice the percentage (moving a conversation prefills its whole history again); past it the "
        "request goes to the next engine on the ring (and the conversation stays there). Both also stay "
        f"while their engine has fewer than the mean plus {contract.LOAD_BOUND_SLACK}, so at a few "
        "requests per engine a difference of one or two does not move them off their cache. An integer "
        "percent rather "
        f"than a fraction; default {contract.DEFAULT_LOAD_BOUND_PERCENT}. Lower spreads a hot prefix "
        "sooner, higher keeps more requests on their prefix's engine.",
    )


class PoolEndpointSelection(ApiModel):
    """Endpoint selection of each pool."""

    latency: EndpointSelection = Field(
        default_factory=EndpointSelection, description="How the latency pool's engines are picked."
    )
    batch: EndpointSelection = Field(
        default_factory=EndpointSelection, description="How the batch pool's engines are picked."
    )


class RouterSpec(ApiModel):
    """The router Deployment in front of the pools."""

    replicas: int = Field(
        default=2, ge=0, le=100, description="Router pods, behind the Service named after the resource."
    )
    image: str | None = Field(
        default=None, max_length=512, description="Router image. Defaults to the operator's own image."
    )


class RoutingSpec(ApiModel):
    """How the router classifies each request into the latency or the batch pool."""

    rules = (
        Rule(
            cel="self.tenantHeaderTrust == 'Trusted' || !has(self.tenantRules) "
            "|| self.tenantRules.all(r, !has(r.tenants) || size(r.tenants) == 0)",
            message="tenant rules that list tenants need tenantHeaderTrust: Trusted (the tenant header is "
            "read only where an authenticating gateway sets it)",
            check=lambda r: r.tenant_header_trust == "Trusted" or not any(t.tenants for t in r.tenant_rules),
        ),
        Rule(
            cel="!has(self.gateway) || !has(self.tenantRules) "
            f"|| self.tenantRules.map(r, has(r.tenants) ? size(r.tenants) : 0).sum() <= {MAX_GATEWAY_TENANTS}",
            message=f"gateway mode routes at most {MAX_GATEWAY_TENANTS} tenants (an HTTPRoute holds at most 128 "
            "header matches)",
            check=lambda r: (
                r.gateway is None or sum(len(t.tenants) for t in r.tenant_rules) <= MAX_GATEWAY_TENANTS
            ),
        ),
    )

    default_pool: PoolName = Field(
        default=_ROUTING.default_pool, description="Pool for requests no rule classifies."
    )
    pool_header: str = Field(
        default=_ROUTING.pool_header, max_length=128, description="Header that names the pool explicitly."
    )
    pool_header_trust: contract.PoolHeaderTrust = Field(
        default=_ROUTING.pool_header_trust,
        description="How far a client's own pool header is trusted. AfterTenantRules (default): it counts "
        "only where no tenant or API-key rule matched, so a client cannot move itself out of the pool "
        "its rules assign; Always: it beats every rule (only where every client is trusted); Ignored: "
        "never read.",
    )
    tenant_header: str = Field(
        default=_ROUTING.tenant_header,
        max_length=128,
        description="Header carrying the tenant name; read only where tenantHeaderTrust is Trusted.",
    )
    tenant_header_trust: IdentityHeaderTrust = Field(
        default=_ROUTING.tenant_header_trust,
        description="Whether the tenant header is believed. Ignored (default): never read, so no client "
        "can claim a tenant, and tenant rules match API keys only; Trusted: read on every request. Set "
        "Trusted only where an authenticating gateway in front of the router sets this header on every "
        "request, replacing any value the client sent.",
    )
    client_header: str = Field(
        default=_ROUTING.client_header,
        max_length=128,
        description="Header naming the client for auto-segmentation; read only where clientHeaderTrust "
        "is Trusted.",
    )
    client_header_trust: IdentityHeaderTrust = Field(
        default=_ROUTING.client_header_trust,
        description="Whether the client header is believed. Ignored (default): a client is its API key, "
        "else its network address, so no client can push another's requests into the batch pool; "
        "Trusted: read on every request. Set Trusted only where an authenticating gateway in front of "
        "the router sets this header on every request, replacing any value the client sent.",
    )
    tenant_rules: list[TenantRule] = Field(
        default_factory=list, max_length=64, description="Tenant and API-key rules, first match wins."
    )
    shape: ShapeRules = Field(
        default_factory=ShapeRules, description="Send a request to the batch pool by its shape."
    )
    auto_segmentation: AutoSegmentation = Field(
        default_factory=AutoSegmentation, description="Per-client in-flight based segmentation."
    )
    fallback: RoutingFallback = Field(
        default="OtherPool",
        description="When a pool has no ready engine: OtherPool sends its requests to the other pool, "
        "Reject answers 503. The spellings otherPool and reject are deprecated (read as OtherPool and "
        "Reject) and will be refused by a later version.",
        json_schema_extra={"enum": [*get_args(RoutingFallback), *DEPRECATED_FALLBACK]},
    )
    endpoint_selection: PoolEndpointSelection = Field(
        default_factory=PoolEndpointSelection,
        description="How the router picks an engine within each pool: least outstanding requests, or "
        "prefix affinity (consistent hashing with bounded loads).",
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router deployment settings.")
    gateway: GatewaySpec | None = Field(
        default=None,
        description="Gateway mode: serve the pools through Gateway API inference gateways (an "
        "InferencePool and endpoint picker per pool, one HTTPRoute) instead of the router, which is then "
        "not run. Rules a route cannot express (shape, auto-segmentation, API keys) do not apply; the "
        "GatewayAccepted condition names them.",
    )

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback_spelling(cls, value: Any) -> Any:
        return DEPRECATED_FALLBACK.get(value, value) if isinstance(value, str) else value
