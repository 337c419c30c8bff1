"""Names the operator, router, renderer, dashboard, alerts and simulator share, each defined once here.

The data plane (`specfleet_runtime`) and the operator (`specfleet`) both import this module; it imports
nothing of either, so it can sit at the bottom of both. vLLM's own metric names are in `vllm_metrics`,
the routing contract in `routing_config`, the operator's per-resource gauges in `specfleet.observe.resource_metrics`.
"""

from __future__ import annotations

import re
from typing import Final, Literal, get_args

# The two pools every SpeculativeDeployment has, in the order the operator iterates them.
PoolName = Literal["latency", "batch"]
POOLS: Final[tuple[PoolName, ...]] = ("latency", "batch")
assert get_args(PoolName) == POOLS


def other_pool(pool: PoolName) -> PoolName:
    """The pool a request falls back to when its own has no ready engine."""
    return "batch" if pool == "latency" else "latency"


# Ports: every engine (vLLM, or its emulator) serves HTTP and /metrics on ENGINE_PORT, the router on
# ROUTER_PORT.
ENGINE_PORT: Final = 8000
ROUTER_PORT: Final = 8080
# A Standby pool's pods run a second engine, the speculative one (asleep until a flip wakes it), on this
# port; the plain engine serves on ENGINE_PORT (runtime/specfleet_runtime/standby.py).
STANDBY_SPECULATIVE_PORT: Final = 8001

# Pod labels the operator sets on engine and router pods (the router watches none; Prometheus copies them).
GROUP: Final = "specfleet.io"
LABEL_DEPLOYMENT: Final = f"{GROUP}/deployment"
LABEL_POOL: Final = f"{GROUP}/pool"
LABEL_SPECULATION: Final = f"{GROUP}/speculation"
# stable: the pool's main engines; canary: replicas of an Auto pool that keep speculating while it is off.
LABEL_TRACK: Final = f"{GROUP}/track"
# Standby: a pod of a Standby pool (two engines, one asleep); only these pods carry it, so a Standby pool
# that fell back to restart flips has no pod its speculative Service selects.
LABEL_FLIP: Final = f"{GROUP}/flip"


def series_label(pod_label: str) -> str:
    """A pod label as a Prometheus series label (PodMonitor podTargetLabels, a Kubernetes SD labelmap)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


SERIES_DEPLOYMENT: Final = series_label(LABEL_DEPLOYMENT)
SERIES_POOL: Final = series_label(LABEL_POOL)
SERIES_SPECULATION: Final = series_label(LABEL_SPECULATION)
SERIES_TRACK: Final = series_label(LABEL_TRACK)
# The labels one pool's engine series are told apart by: what the policy, recording rules, alerts and
# dashboard aggregate by.
POOL_LABELS: Final = ("namespace", SERIES_DEPLOYMENT, SERIES_POOL)
BY_POOL: Final = ", ".join(POOL_LABELS)

# Fewer drafts than this in a window say little about acceptance: the policy holds, and the recording
# rule leaves the acceptance series empty instead of alerting on noise.
MIN_DRAFTS_IN_WINDOW: Final = 100

# Metric names read by the dashboard and the alerts, as exposed (counters with their `_total` suffix,
# which prometheus_client adds whether or not the registered name has it).
ROUTER_REQUESTS: Final = "specfleet_router_requests_total"
FLIPS: Final = "specfleet_speculation_flips_total"
DECISIONS: Final = "specfleet_policy_decisions_total"

# The router workers' shared directory (on /dev/shm): prometheus_client's multiprocess metric files and
# prefix affinity's conversation table and placements; set by the router's supervisor for its workers.
MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
# Which of the supervisor's workers a router process is (0, 1, ...): its row of prefix affinity's
# shared placements (router/conversations.py `PlacedBoard`).
WORKER_INDEX_ENV: Final = "SPECFLEET_ROUTER_WORKER"
