"""One operator, a hundred resources: all reconciled, and a spec change still lands while the policy
sweeps a hung Prometheus (the freeze of issue 9, where one worker thread per resource's policy loop
starved every handler past ~32 resources, must never come back).

Asserted as "reconciled" (waiting for the condition with a generous timeout), never timed: speed
targets live in `make bench-scale`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from specfleet_sandbox.processes import wait_for
from support.fleet import SilentServer, as_yaml, list_resources, small_fleet, unreconciled
from support.manifests import merge

pytestmark = pytest.mark.cluster
RESOURCES = 100
# Deployments each resource owns: latency, batch, router.
DEPLOYMENTS_EACH = 3


@pytest.fixture
def hung_prometheus() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def operator_options() -> dict[str, Any]:
    # The default resync (30 s), as in production: a 2 s resync of 100 resources would only load the bed.
    return {"resync_seconds": 30}


def _metrics_unavailable(cluster, namespace: str) -> int:
    """Resources whose last policy evaluation reported the hung Prometheus."""
    count = 0
    for sd in list_resources(cluster, namespace):
        for cond in (sd.get("status") or {}).get("conditions", []):
            if cond["type"] == "MetricsAvailable" and cond["status"] == "False":
                count += 1
    return count


def test_hundred_resources_reconcile_and_a_change_lands_while_the_policy_sweeps(
    cluster, namespace, hung_prometheus, operator
):
    docs = [
        small_fleet(
            namespace,
            f"fleet-{i:03d}",
            prometheus_url=hung_prometheus.url,
            evaluation_interval_seconds=5,
            timeout_seconds=2,
        )
        for i in range(RESOURCES)
    ]
    cluster.kubectl("apply", "-f", "-", input=as_yaml(docs))

    wait_for(
        f"all {RESOURCES} resources reconciled",
        lambda: not unreconciled(cluster, DEPLOYMENTS_EACH, namespace) or None,
        timeout=300,
        interval=3,
    )
    # The policy has evaluated every resource against the hung Prometheus (so sweeps are running).
    wait_for(
        "every resource evaluated by the policy",
        lambda: _metrics_unavailable(cluster, namespace) == RESOURCES or None,
        timeout=180,
        interval=3,
    )
    assert hung_prometheus.connections > 0

    # Change the last resource while sweeps keep waiting on the hung Prometheus.
    last = merge(docs[-1], {"spec": {"pools": {"batch": {"engine": {"maxNumSeqs": 64}}}}})
    cluster.kubectl("apply", "-f", "-", input=as_yaml([last]))
    name = last["metadata"]["name"]

    def changed() -> bool | None:
        sd = json.loads(cluster.kubectl("get", "sd", name, "-n", namespace, "-o", "json").stdout)
        generation = sd["metadata"]["generation"]
        if generation < 2 or sd.get("status", {}).get("observedGeneration") != generation:
            return None
        batch = json.loads(
            cluster.kubectl("get", "deployment", f"{name}-batch", "-n", namespace, "-o", "json").stdout
        )
        return "64" in batch["spec"]["template"]["spec"]["containers"][0]["args"] or None

    wait_for(f"{name}'s spec change reconciled", changed, timeout=120, interval=1)
    assert operator.alive()
