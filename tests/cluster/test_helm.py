"""The Helm chart, linted, rendered and installed for real; its RBAC checked with `kubectl auth can-i`
and then used by a real operator process that has only the chart's ServiceAccount token."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from specfleet_sandbox.processes import OperatorProcess, events_by_time, wait_for, wait_for_event
from specfleet_testbed import ensure_keda_crds
from support.manifests import ROOT, apply_crds, load_yaml, merge

pytestmark = pytest.mark.cluster
CHART = ROOT / "charts" / "specfleet"
RELEASE = "specfleet"
SYSTEM_NS = "specfleet-system"
SA = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}"


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def test_lint_and_template(cluster):
    lint = helm(cluster, "lint", str(CHART), "--strict")
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
    docs = [
        d
        for d in yaml.safe_load_all(helm(cluster, "template", RELEASE, str(CHART), "-n", SYSTEM_NS).stdout)
        if d
    ]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "Deployment",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    assert deploy["spec"]["replicas"] == 1
    # Leader election (on by default): a rolling update is safe, the new pod waits on the Lease.
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--leader-election-namespace={SYSTEM_NS}" in args
    assert "--identity=$(POD_NAME)" in args
    # Two replicas without leader election would fight: the chart refuses to render them.
    fight = helm(
        cluster,
        "template",
        RELEASE,
        str(CHART),
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
        check=False,
    )
    assert fight.returncode != 0
    assert "needs leaderElection.enabled" in fight.stderr
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]
    # Namespaced mode binds the same rules per namespace instead of cluster-wide.
    scoped = helm(
        cluster, "template", RELEASE, str(CHART), "-n", SYSTEM_NS, "--set", "watchNamespaces={team-a,team-b}"
    ).stdout
    scoped_docs = [d for d in yaml.safe_load_all(scoped) if d]
    bindings = sorted(
        (d["kind"], d["metadata"].get("namespace", "")) for d in scoped_docs if "Binding" in d["kind"]
    )
    assert bindings == [
        ("ClusterRoleBinding", ""),
        ("RoleBinding", SYSTEM_NS),  # the Lease, for leader election
        ("RoleBinding", "team-a"),
        ("RoleBinding", "team-b"),
    ]
    # values.schema.json rejects a bad value with a clear message.
    bad = helm(cluster, "template", RELEASE, str(CHART), "--set", "logLevel=loud", check=False)
    assert bad.returncode != 0
    assert "logLevel" in bad.stderr


def test_prometheus_credentials_are_mounted_files_and_tls_is_verified(cluster):
    def operator_container(*values: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
        args = [a for v in values for a in ("--set", v)]
        out = helm(cluster, "template", RELEASE, str(CHART), "-n", SYSTEM_NS, *args).stdout
        deploy = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
        return deploy["spec"]["template"]["spec"]["containers"][0], deploy["spec"]["template"]["spec"]

    container, _ = operator_container()
    assert not [a for a in container["args"] if a.startswith("--prometheus-")], "verification on by default"
    container, pod = operator_container(
        "prometheus.caSecret=prom-ca",
        "prometheus.tokenSecret=prom-token",
        "prometheus.basicAuthSecret=prom-auth",
    )
    assert "--prometheus-ca-file=/etc/specfleet/prometheus/ca/ca.crt" in container["args"]
    assert "--prometheus-bearer-token-file=/etc/specfleet/prometheus/token/token" in container["args"]
    assert "--prometheus-basic-auth-file=/etc/specfleet/prometheus/basic-auth/auth" in container["args"]
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"prom-ca", "prom-token", "prom-auth"}
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"].startswith("prometheus-"))
    container, _ = operator_container("prometheus.insecureSkipVerify=true")
    assert "--prometheus-insecure-skip-verify" in container["args"]


@pytest.mark.parametrize(("tag", "image"), [("1", "1"), ("0", "0"), ("v0.2.0", "v0.2.0"), ("", None)])
def test_image_tag_is_taken_as_typed(cluster, tag, image):
    # --set parses 1 as a number: the schema accepts it and the template prints it as written.
    out = helm(cluster, "template", RELEASE, str(CHART), "--set", f"image.tag={tag}").stdout
    deploy = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    expected = f"ghcr.io/specfleet/specfleet:{image or yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"
    assert container["image"] == expected
    assert f"--router-image={expected}" in container["args"]


def test_chart_crd_is_the_generated_one():
    assert (CHART / "crds" / "specfleet.io_speculativedeployments.yaml").read_text() == (
        ROOT / "crds" / "specfleet.io_speculativedeployments.yaml"
    ).read_text()


@pytest.fixture(scope="module")
def installed(cluster) -> Iterator[object]:
    helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--create-namespace",
        "--wait",
        "--timeout=120s",
    )
    yield cluster
    helm(cluster, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", check=False)


def test_install_brings_the_operator_deployment_to_ready(installed):
    cluster = installed
    out = cluster.kubectl("get", "deployment", RELEASE, "-n", SYSTEM_NS, "-o", "json")
    deploy = json.loads(out.stdout)
    assert deploy["status"].get("readyReplicas") == 1
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/speculativedeployments.specfleet.io", "--timeout=30s"
    )


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("watch", "speculativedeployments.specfleet.io", True),
        ("patch", "speculativedeployments.specfleet.io", True),
        ("patch", "speculativedeployments.specfleet.io/status", True),
        ("create", "deployments.apps", True),
        ("patch", "deployments.apps", True),
        ("create", "services", True),
        ("create", "configmaps", True),
        ("create", "poddisruptionbudgets.policy", True),
        ("create", "roles.rbac.authorization.k8s.io", True),
        ("create", "rolebindings.rbac.authorization.k8s.io", True),
        ("create", "events", True),
        ("create", "jobs.batch", True),  # drafter retrain Jobs
        ("list", "endpointslices.discovery.k8s.io", True),
        ("get", "secrets", False),
        ("list", "secrets", False),
        ("delete", "deployments.apps", True),  # pruning what the spec no longer asks for
        ("create", "horizontalpodautoscalers.autoscaling", True),  # autoscaled pools
        ("delete", "horizontalpodautoscalers.autoscaling", True),  # autoscaling turned off
        ("update", "horizontalpodautoscalers.autoscaling", False),
        ("delete", "pods", False),
        ("list", "pods", True),  # to say why a pool is not ready
        ("delete", "speculativedeployments.specfleet.io", False),
        ("delete", "secrets", False),
        ("update", "speculativedeployments.specfleet.io", False),
        ("create", "pods", False),
        ("create", "clusterroles.rbac.authorization.k8s.io", False),
    ],
)
def test_operator_service_account_permissions(installed, verb, resource, allowed):
    result = installed.kubectl("auth", "can-i", verb, resource, "-n", "default", f"--as={SA}", check=False)
    assert result.stdout.strip() == ("yes" if allowed else "no"), (
        f"{verb} {resource}: {result.stdout} {result.stderr}"
    )


def test_operator_may_write_only_scaled_objects_of_keda(installed):
    # kubectl resolves a resource name through discovery: KEDA's CRDs must exist for can-i to answer.
    crd_dir = ensure_keda_crds()
    kinds = ("scaledobjects", "scaledjobs", "triggerauthentications")
    names = [f"crd/{kind}.keda.sh" for kind in kinds]
    try:
        apply_crds(installed, *(crd_dir / f"keda.sh_{kind}.yaml" for kind in kinds))
        for verb, resource, allowed in [
            ("create", "scaledobjects.keda.sh", True),
            ("patch", "scaledobjects.keda.sh", True),
            ("delete", "scaledobjects.keda.sh", True),
            ("update", "scaledobjects.keda.sh", False),
            ("create", "scaledjobs.keda.sh", False),
            ("create", "triggerauthentications.keda.sh", False),
        ]:
            args = ("auth", "can-i", verb, resource, "-n", "default", f"--as={SA}")
            result = installed.kubectl(*args, check=False)
            assert result.stdout.strip() == ("yes" if allowed else "no"), (
                f"{verb} {resource}: {result.stderr}"
            )
    finally:
        installed.kubectl("delete", *names, "--wait=true", "--timeout=60s", check=False)


def test_leases_only_in_the_release_namespace(installed):
    def can(verb: str, ns: str) -> str:
        args = ("auth", "can-i", verb, "leases.coordination.k8s.io", "-n", ns, f"--as={SA}")
        return str(installed.kubectl(*args, check=False).stdout.strip())

    assert (can("update", SYSTEM_NS), can("create", SYSTEM_NS)) == ("yes", "yes")
    assert (can("update", "default"), can("delete", SYSTEM_NS)) == ("no", "no")


@pytest.mark.parametrize(
    ("verb", "resource"), [("delete", "nodes"), ("get", "secrets"), ("create", "namespaces")]
)
def test_operator_has_nothing_cluster_wide(installed, verb, resource):
    result = installed.kubectl("auth", "can-i", verb, resource, "--all-namespaces", f"--as={SA}", check=False)
    assert result.stdout.strip() == "no"


def _token_kubeconfig(cluster, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (what the pod would use)."""
    token = cluster.kubectl("create", "token", RELEASE, "-n", SYSTEM_NS, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    admin["users"] = [{"name": "operator", "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = "operator"
    path.write_text(yaml.safe_dump(admin))
    return path


def test_operator_works_with_only_the_charts_rbac(installed, tmp_path, namespace, request):
    cluster = installed
    # With the Lease in the release namespace, as the chart's pods run it.
    operator = OperatorProcess(
        _token_kubeconfig(cluster, tmp_path / "sa.kubeconfig"),
        tmp_path / "op.log",
        extra_args=["--leader-election-namespace", SYSTEM_NS, "--leader-election-name", "rbac-check"],
    ).start()
    try:
        doc = merge(
            load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
            # No Prometheus in this tier: a closed loopback port (no DNS lookups, no traffic out).
            {
                "metadata": {"namespace": namespace},
                "spec": {"policy": {"prometheus": {"url": "http://127.0.0.1:9"}}},
            },
        )
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))

        def ready():
            out = cluster.kubectl("get", "sd", "llama", "-n", namespace, "-o", "json")
            conds = {
                c["type"]: c["status"] for c in json.loads(out.stdout).get("status", {}).get("conditions", [])
            }
            return conds.get("Ready") == "True" and conds.get("Degraded") == "False"

        wait_for("Ready=True with the chart's RBAC only", ready, timeout=90)
        # RBAC refusals name the ServiceAccount (other tests' namespaces being deleted refuse events too).
        refused = [line for line in operator.log().splitlines() if "Forbidden" in line and SA in line]
        assert refused == []
        assert "became leader" in operator.log()
        wait_for_event(cluster.kubectl, namespace, "ChildrenApplied")
        # No finalizer: with the operator gone (helm uninstall), deleting a resource must not hang.
        obj = json.loads(cluster.kubectl("get", "sd", "llama", "-n", namespace, "-o", "json").stdout)
        assert not obj["metadata"].get("finalizers"), obj["metadata"].get("finalizers")
        operator.stop()
        cluster.kubectl("delete", "sd", "llama", "-n", namespace, "--timeout=30s")
    except BaseException:
        print(f"\n===== operator log =====\n{operator.log()[-20000:]}")
        print(f"\n===== events =====\n{events_by_time(cluster.kubectl, namespace)}")
        raise
    finally:
        operator.stop()


def test_upgrade_then_uninstall_leaves_only_the_crd(cluster, installed):
    helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--set",
        "resyncSeconds=10",
        "--wait",
        "--timeout=120s",
    )
    deploy = json.loads(cluster.kubectl("get", "deployment", RELEASE, "-n", SYSTEM_NS, "-o", "json").stdout)
    assert "--resync-seconds=10" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    helm(cluster, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait")
    leftovers = cluster.kubectl(
        "get",
        "all,serviceaccounts,roles,rolebindings",
        "-n",
        SYSTEM_NS,
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    ).stdout.strip()
    assert leftovers == ""
    cluster_scoped = cluster.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name"
    ).stdout.strip()
    assert cluster_scoped == ""
    # Kept on purpose (Helm's crds/ folder): uninstalling must not delete users' resources.
    assert cluster.kubectl("get", "crd", "speculativedeployments.specfleet.io", check=False).returncode == 0
