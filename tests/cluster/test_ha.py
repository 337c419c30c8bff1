"""Two operator processes against the real control plane: exactly one acts (it holds the Lease), the
other stands by, and takes over when the first is stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from specfleet_sandbox.processes import OperatorProcess, wait_for
from support.failure_report import print_if_failed
from support.fleet import as_yaml, small_fleet
from support.manifests import merge

pytestmark = pytest.mark.cluster
LEASE = "specfleet-ha-test"
# No Prometheus in this tier: a closed loopback port (no DNS lookups, no traffic out).
NO_PROMETHEUS = "http://127.0.0.1:9"


@pytest.fixture
def operators(crd, namespace, tmp_path, request) -> Iterator[dict[str, OperatorProcess]]:
    """Two operators contending for one Lease, not started: the test starts (and stops) each."""
    cluster = crd
    procs = {
        name: OperatorProcess(
            cluster.kubeconfig,
            tmp_path / f"operator-{name}.log",
            extra_args=[
                # Only this test's namespace: other tests' resources must not slow either operator.
                "--namespace",
                namespace,
                "--leader-election-namespace",
                namespace,
                "--leader-election-name",
                LEASE,
                "--identity",
                f"operator-{name}",
            ],
        )
        for name in ("a", "b")
    }
    yield procs
    for proc in procs.values():
        proc.stop()
    print_if_failed(request, cluster, procs, namespace, log_chars=10000)


def _holder(cluster, namespace: str) -> str | None:
    out = cluster.kubectl("get", "lease", LEASE, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout)["spec"].get("holderIdentity") if out.returncode == 0 else None


def _reconciled(cluster, namespace: str, name: str, generation: int) -> bool | None:
    sd = json.loads(cluster.kubectl("get", "sd", name, "-n", namespace, "-o", "json").stdout)
    ok = (
        sd["metadata"]["generation"] == generation
        and sd.get("status", {}).get("observedGeneration") == generation
    )
    return ok or None


def test_exactly_one_operator_acts_and_the_other_takes_over(cluster, namespace, operators):
    a, b = operators["a"].start(), None
    wait_for("operator a leads", lambda: "became leader" in a.log() or None, timeout=60)
    b = operators["b"].start()
    wait_for("operator b stands by", lambda: "waiting for leadership" in b.log() or None, timeout=60)

    doc = small_fleet(namespace, "ha", prometheus_url=NO_PROMETHEUS)
    cluster.kubectl("apply", "-f", "-", input=as_yaml([doc]))
    wait_for("reconciled by the leader", lambda: _reconciled(cluster, namespace, "ha", 1), timeout=90)
    assert "Handler 'on_change' succeeded" in a.log()
    # The standby has run nothing: no handler, no leadership, and the Lease names the leader.
    assert b.alive()
    assert "became leader" not in b.log()
    assert "on_change" not in b.log()
    assert _holder(cluster, namespace) == "operator-a"

    a.stop()  # SIGTERM: a clean shutdown releases the Lease
    assert "released lease" in a.log()
    wait_for("operator b takes over", lambda: "became leader" in b.log() or None, timeout=60)
    assert _holder(cluster, namespace) == "operator-b"

    changed = merge(doc, {"spec": {"pools": {"batch": {"engine": {"maxNumSeqs": 64}}}}})
    cluster.kubectl("apply", "-f", "-", input=as_yaml([changed]))
    wait_for(
        "the change reconciled by the new leader",
        lambda: _reconciled(cluster, namespace, "ha", 2),
        timeout=90,
    )
    batch = json.loads(cluster.kubectl("get", "deployment", "ha-batch", "-n", namespace, "-o", "json").stdout)
    assert "64" in batch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "Handler 'on_change' succeeded" in b.log()
