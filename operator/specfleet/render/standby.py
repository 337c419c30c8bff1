"""The pieces of a Standby pool's render (rollout.flip Standby): its supervisor, volume and memory (pure).

A Standby pool's engine pod runs one engine container (the device plugin gives a GPU to one container
only) whose command is the supervisor, runtime/specfleet_runtime/standby.py: it starts the speculative
engine on STANDBY_SPECULATIVE_PORT, checks that it can sleep and parks it asleep, then starts the plain
engine on ENGINE_PORT. The engine image is vLLM's, without specfleet, so an init container running the
operator's image copies the supervisor (one stdlib-only file) into an emptyDir the engine container runs
it from; the supervisor writes its ready file there too.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final

from specfleet.api.constants import PoolName
from specfleet.api.pools import PoolSpec
from specfleet.api.validation import SpeculativeDeployment
from specfleet.render.common import RenderOptions, pool_name
from specfleet_runtime.standby import STANDBY_DIR, SUPERVISOR_PATH

STANDBY_VOLUME: Final = "standby"
SUPERVISOR_INIT_CONTAINER: Final = "standby-supervisor"
SUPERVISOR_MODULE: Final = "specfleet_runtime.standby"
# The container port name of the speculative engine (at most 15 characters).
SPECULATIVE_PORT_NAME: Final = "speculative"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def standby_pool(sd: SpeculativeDeployment, pool: PoolName) -> bool:
    """Whether the spec asks for Standby flips for `pool` (the plan may still render it as Restart)."""
    pool_spec: PoolSpec = getattr(sd.spec.pools, pool)
    return pool_spec.rollout.flip == "Standby"


def speculative_service_name(sd: SpeculativeDeployment, pool: PoolName) -> str:
    """The Service over a Standby pool's awake speculative engines. `-spec`, not `-speculative`: names
    are at most 48 + len("-latency-canary") = 63 characters, a Service name's limit."""
    return f"{pool_name(sd, pool)}-spec"


def _bytes(quantity: str) -> Decimal:
    for suffix, factor in (*_BINARY.items(), *_DECIMAL.items()):
        if quantity.endswith(suffix):
            return Decimal(quantity[: -len(suffix)]) * factor
    if quantity.endswith("m"):
        return Decimal(quantity[:-1]) / 1000
    return Decimal(quantity)


def add_quantities(a: str, b: str) -> str:
    """a + b as one memory quantity, in the largest unit that holds it exactly ("64Gi" + "80Gi" ->
    "144Gi"; "1G" + "1Gi" -> bytes)."""
    total = _bytes(a) + _bytes(b)
    for suffix, factor in sorted((*_BINARY.items(), *_DECIMAL.items()), key=lambda item: -item[1]):
        if total >= factor and total % factor == 0:
            return f"{int(total // factor)}{suffix}"
    return str(int(total.to_integral_value(rounding="ROUND_CEILING")))


def standby_memory(memory: str | None, host_memory: str) -> tuple[str, str | None]:
    """(request, limit) of a Standby engine container's memory: the pool's memory plus the parked
    weights. Without a pool memory the pod requests the parked weights (so it lands on a node with the
    host RAM) and gets no limit: one sized to the weights alone would OOM-kill the two vLLM processes,
    whose own memory nobody gave."""
    if memory is None:
        return host_memory, None
    total = add_quantities(memory, host_memory)
    return total, total


def supervisor_init_container(
    sd: SpeculativeDeployment, options: RenderOptions, security: dict[str, Any]
) -> dict[str, Any]:
    """Copies the supervisor from the operator's image into the pod's standby volume."""
    return {
        "name": SUPERVISOR_INIT_CONTAINER,
        "image": sd.spec.routing.router.image or options.router_image,
        "imagePullPolicy": sd.spec.engine.image_pull_policy,
        "command": ["python", "-m", SUPERVISOR_MODULE, "--install-to", SUPERVISOR_PATH],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [standby_mount()],
        "securityContext": security,
    }


def standby_mount() -> dict[str, Any]:
    return {"name": STANDBY_VOLUME, "mountPath": STANDBY_DIR}


def standby_volume() -> dict[str, Any]:
    return {"name": STANDBY_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}
