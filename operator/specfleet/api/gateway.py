"""spec.routing.gateway: serve the pools through a Gateway API inference gateway instead of the router.

In gateway mode the operator renders, per pool, an InferencePool (inference.networking.k8s.io/v1) and
the endpoint picker it names, plus one HTTPRoute that carries the resource's routing rules to the
Gateway(s) named here; it runs no router. The versions it renders for are pinned here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from specfleet.api.base import ApiModel

# The Gateway API Inference Extension release whose CRDs and endpoint picker the renderer targets
# (InferencePool v1, InferenceObjective v1alpha2), and the Gateway API release of the HTTPRoute.
INFERENCE_EXTENSION_VERSION = "v1.4.0"
GATEWAY_API_VERSION = "v1.6.3"
DEFAULT_PICKER_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{INFERENCE_EXTENSION_VERSION}"
# Matches an HTTPRoute carries in all (the Gateway API's own limit is 128 across its rules), less the
# pool header's two: what tenant rules may list in gateway mode.
MAX_GATEWAY_TENANTS = 120

FailureMode = Literal["FailOpen", "FailClose"]
_DNS_1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class GatewayParentRef(ApiModel):
    """A Gateway (or a listener of one) the HTTPRoute attaches to."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_1123_SUBDOMAIN)] = Field(
        description="Name of the Gateway."
    )
    namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_1123_LABEL)] | None = Field(
        default=None,
        description="Namespace of the Gateway; defaults to the resource's own. A Gateway elsewhere must "
        "allow routes from this namespace (its listeners' allowedRoutes).",
    )
    section_name: Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_1123_SUBDOMAIN)] | None = (
        Field(default=None, description="One listener of the Gateway, by name; all of them when unset.")
    )


class PickerService(ApiModel):
    """An endpoint picker the user runs: a Service speaking the endpoint picker protocol (ext_proc)."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_1123_LABEL)] = Field(
        description="Service in the resource's namespace."
    )
    port: int = Field(default=9002, ge=1, le=65535, description="The Service's ext_proc (gRPC) port.")


class PoolPickerServices(ApiModel):
    """Existing endpoint pickers, per pool; a pool left out gets one the operator runs."""

    latency: PickerService | None = Field(default=None, description="The latency pool's picker.")
    batch: PickerService | None = Field(default=None, description="The batch pool's picker.")


class EndpointPickerSpec(ApiModel):
    """Which endpoint picker each pool's InferencePool names, and what the gateway does without it."""

    image: str = Field(
        default=DEFAULT_PICKER_IMAGE,
        min_length=1,
        max_length=512,
        description="Image of the pickers the operator runs (the Gateway API Inference Extension's "
        f"endpoint picker, {INFERENCE_EXTENSION_VERSION} by default: the version the rendered "
        "InferencePools are written for).",
    )
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Flags appended to the operator's own for the pickers it runs (after --pool-name, "
        "--pool-namespace, --zap-encoder, --tracing and --metrics-endpoint-auth; a later flag wins).",
    )
    failure_mode: FailureMode = Field(
        default="FailOpen",
        description="What the gateway does when a pool's picker does not answer. FailOpen (default): it "
        "sends the request to an endpoint of the same pool by its own load balancing, so a picker outage "
        "costs load-aware picking, not the service; FailClose: it refuses the request.",
    )
    services: PoolPickerServices = Field(
        default_factory=PoolPickerServices,
        description="Existing pickers by pool; the operator runs one for every pool not named here.",
    )


class GatewaySpec(ApiModel):
    """Gateway mode: the pools are served through Gateway API inference gateways, not the router."""

    parent_refs: list[GatewayParentRef] = Field(
        min_length=1,
        max_length=32,
        description="The Gateways the rendered HTTPRoute attaches to.",
    )
    endpoint_picker: EndpointPickerSpec = Field(
        default_factory=EndpointPickerSpec,
        description="The endpoint picker each pool's InferencePool names: one the operator runs per pool "
        "(image and flags settable), or an existing Service.",
    )
