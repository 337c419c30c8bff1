"""An ephemeral, real Kubernetes control plane on 127.0.0.1, with kwok standing in for kubelets.

``Cluster`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok as plain
processes (no containers), each on a free loopback port chosen at start-up, with certificates made
by openssl in a work dir. It then creates fake GPU Nodes that kwok keeps Ready, so Deployments turn
into Running, Ready Pods with IPs, Services get EndpointSlices, and garbage collection works.

    with Cluster() as cluster:
        cluster.kubectl("get", "nodes")

Every process is recorded by PID (plus its start time, so a reused PID is never signalled) and
logs to ``<work dir>/logs/<name>.log``. ``stop()`` terminates exactly those processes, newest
first, and removes the work dir unless ``keep=True``.

Network: everything listens on 127.0.0.1. Service IPs (``service_cidr``) and, by default, pod IPs
(``pod_cidr``) are fake addresses that only exist as data in the API: never send traffic to them.
Kubernetes refuses loopback addresses in EndpointSlices, so pod IPs cannot simply be 127.x.y.z;
``local_address()`` maps a pod IP to a 127.x.y.z twin that a local process can listen on instead.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from .binaries import ensure_binaries, kwok_stages_file
from .pki import CertPair, Pki, make_pki
from .processes import ProcessRecord, die_with_parent, free_port, is_zombie, process_start_time, tail
from .stages import write_stages

__all__ = [
    "DEFAULT_POD_CIDR",
    "DEFAULT_SERVICE_CIDR",
    "Cluster",
    "ClusterError",
    "KubectlError",
    "local_address",
]

# Fake pod range. Same last three octets as its loopback twin 127.244.0.0/16 (see local_address).
DEFAULT_POD_CIDR = "10.244.0.0/16"
# Fake Service range; the first address (10.96.0.1) is the in-cluster "kubernetes" Service.
DEFAULT_SERVICE_CIDR = "10.96.0.0/16"
STATE_FILE = "state.json"
CLUSTER_NAME = "specfleet-testbed"


class ClusterError(RuntimeError):
    """The cluster failed to start or to answer."""


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call failed; unlike CalledProcessError, its message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {self.stderr}"


def local_address(pod_ip: str) -> str:
    """The loopback twin of a pod IP: same last three octets, first octet 127.

    kwok hands out fake pod IPs (10.244.0.0/16 by default) that Kubernetes accepts in
    EndpointSlices; a local process that plays a pod listens on the twin (e.g. 10.244.0.7 ->
    127.244.0.7), which Linux routes to the loopback interface without any setup.
    """
    octets = ipaddress.IPv4Address(pod_ip).packed
    return str(ipaddress.IPv4Address(bytes([127]) + octets[1:]))


@dataclass(frozen=True)
class Ports:
    """Loopback ports, chosen free at start-up."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass
class _Running:
    record: ProcessRecord
    popen: subprocess.Popen[bytes] | None = field(default=None)
    env: dict[str, str] | None = field(default=None)  # what it was started with (None: inherited)


def _kubeconfig_text(server: str, ca: Path, user: CertPair, user_name: str) -> str:
    """A kubeconfig with the certificates embedded, so the file stands on its own."""

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    # JSON is valid YAML, and kubectl, client-go and Kopf all read it.
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": user_name,
                "user": {
                    "client-certificate-data": b64(user.cert),
                    "client-key-data": b64(user.key),
                },
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user_name}}],
        "current-context": CLUSTER_NAME,
        "preferences": {},
    }
    return json.dumps(config, indent=2) + "\n"


def gpu_node(name: str, index: int, gpus: int = 8) -> dict[str, Any]:
    """A fake GPU Node for kwok: 32 CPUs, 256Gi, ``gpus`` nvidia.com/gpu, no taints.

    kwok's node-initialize stage keeps the capacity given here and adds the Ready condition.
    Real kwok setups often taint fake nodes (kwok.x-k8s.io/node=fake:NoSchedule); these are
    deliberately taint-free so ordinary workloads schedule without tolerations.
    """
    resources = {
        "cpu": "32",
        "memory": "256Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        "nvidia.com/gpu": str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(gpus),
            },
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {},
        # Status may be set on create for Nodes; kwok keeps capacity/allocatable/addresses.
        "status": {
            "capacity": resources,
            "allocatable": resources,
            # A loopback address: anything that dials a "node" stays on this machine.
            "addresses": [
                {"type": "InternalIP", "address": f"127.10.0.{index + 1}"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


class Cluster:
    """A local control plane (etcd, apiserver, controller-manager, scheduler) plus kwok.

    Args:
        bin_dir: directory with the binaries; default: ``ensure_binaries()`` (builds if needed).
        work_dir: where certificates, data and logs go; must be empty or absent. Default: a new
            temp dir. It is removed by ``stop()`` unless ``keep`` is true.
        nodes: how many fake GPU nodes (``gpu-node-0`` ...) to create.
        gpus_per_node: ``nvidia.com/gpu`` capacity of each node.
        pod_cidr: where kwok takes pod IPs from (fake; see ``local_address``).
        service_cidr: the Service IP range (fake).
        detach: start the processes so they outlive this Python process (for the ``up`` command).
        keep: keep the work dir after ``stop()`` (to read the logs).
        startup_timeout: seconds allowed for the whole start-up.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        work_dir: Path | None = None,
        *,
        nodes: int = 3,
        gpus_per_node: int = 8,
        pod_cidr: str = DEFAULT_POD_CIDR,
        service_cidr: str = DEFAULT_SERVICE_CIDR,
        detach: bool = False,
        keep: bool = False,
        startup_timeout: float = 180.0,
    ) -> None:
        self._bin_dir = bin_dir
        self._work_dir = work_dir
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.pod_cidr = str(ipaddress.IPv4Network(pod_cidr))
        self.service_cidr = str(ipaddress.IPv4Network(service_cidr))
        self.detach = detach
        self.keep = keep
        self.startup_timeout = startup_timeout
        self.ports: Ports | None = None
        self._pki: Pki | None = None
        self._procs: list[_Running] = []
        self._owns_work_dir = False
        self._started = False

    # --- public properties -------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            raise ClusterError("the cluster has not been started")
        return self._bin_dir

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            raise ClusterError("the cluster has not been started")
        return self._work_dir

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (O=system:masters), certificates embedded."""
        return self.work_dir / "kubeconfig"

    @property
    def server(self) -> str:
        if self.ports is None:
            raise ClusterError("the cluster has not been started")
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def node_names(self) -> list[str]:
        return [f"gpu-node-{i}" for i in range(self.nodes)]

    @property
    def processes(self) -> list[ProcessRecord]:
        return [p.record for p in self._procs]

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG for this cluster and the pinned binaries first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    # --- start -------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Start every component and wait until Pods can be scheduled and run."""
        if self._started:
            raise ClusterError("the cluster is already started")
        self._started = True
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries()
        self._prepare_work_dir()
        try:
            self._start_all()
        except BaseException as err:
            # Never leave half a cluster behind: stop what did start, keep the logs to read.
            keep = self.keep
            self.keep = True
            self.stop()
            self.keep = keep
            if isinstance(err, ClusterError):
                raise ClusterError(f"{err}\n(logs kept in {self.work_dir / 'logs'})") from err
            raise
        return self

    def _prepare_work_dir(self) -> None:
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="specfleet-testbed-"))
        else:
            self._work_dir = self._work_dir.resolve()
            if self._work_dir.exists() and any(self._work_dir.iterdir()):
                raise ClusterError(f"work dir {self._work_dir} is not empty (is a cluster already up there?)")
            self._work_dir.mkdir(parents=True, exist_ok=True)
        self._owns_work_dir = True
        (self.work_dir / "logs").mkdir()

    def _start_all(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        service_net = ipaddress.IPv4Network(self.service_cidr)
        self.ports = Ports(*(free_port() for _ in range(5)))
        self._pki = make_pki(self.work_dir / "pki", service_ip=str(service_net[1]))
        pki = self._pki
        kubeconfigs = {
            "admin": (pki.admin, "specfleet-admin", self.kubeconfig),
            "controller-manager": (
                pki.controller_manager,
                "system:kube-controller-manager",
                self.work_dir / "kube-controller-manager.kubeconfig",
            ),
            "scheduler": (
                pki.scheduler,
                "system:kube-scheduler",
                self.work_dir / "kube-scheduler.kubeconfig",
            ),
        }
        for pair, user, path in kubeconfigs.values():
            path.write_text(_kubeconfig_text(self.server, pki.ca.cert, pair, user))
            path.chmod(0o600)
        self._write_state()

        self._start_etcd()
        self._wait("etcd /health", self._etcd_healthy, deadline, ["etcd"])
        self._start_apiserver()
        self._wait("kube-apiserver /readyz", self._apiserver_ready, deadline, ["kube-apiserver"])
        self._start_controller_manager()
        self._start_scheduler()
        self._start_kwok()
        self._create_nodes()
        self._wait(
            "kube-scheduler and kube-controller-manager /healthz",
            self._components_healthy,
            deadline,
            ["kube-controller-manager", "kube-scheduler"],
        )
        self._wait("all nodes Ready (kwok)", self._nodes_ready, deadline, ["kwok"])
        # Pods cannot be created before their namespace's "default" ServiceAccount exists.
        self._wait(
            "ServiceAccount default/default",
            lambda: self._api_status("/api/v1/namespaces/default/serviceaccounts/default") == 200,
            deadline,
            ["kube-controller-manager"],
        )
        self._write_state()

    # --- the components ----------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, at: int | None = None
    ) -> None:
        """Start one component, logging to logs/<name>.log; recorded last, or at index `at` (a restart
        keeps its place in the stop order)."""
        log_path = self.work_dir / "logs" / f"{name}.log"
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                env=env,
                # Own session: a Ctrl-C in the terminal reaches Python, which stops us in order.
                start_new_session=True,
                # Attached clusters die with their Python process; detached ones outlive it.
                # (preexec_fn only calls prctl, which is safe after fork even with threads.)
                preexec_fn=None if self.detach else die_with_parent,  # noqa: PLW1509
            )
        start_time = process_start_time(popen.pid) or 0
        record = ProcessRecord(name, popen.pid, start_time, list(argv), str(log_path))
        self._procs.insert(len(self._procs) if at is None else at, _Running(record, popen, env))
        self._write_state()

    def _start_etcd(self) -> None:
        assert self.ports is not None
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=testbed",
                f"--data-dir={self.work_dir / 'etcd-data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testbed={peer}",
                "--initial-cluster-state=new",
                # Throw-away data: skipping fsync makes every API write much faster.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        assert self.ports is not None
        assert self._pki is not None
        pki = self._pki
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                # Keeps any self-generated files out of /var/run/kubernetes.
                f"--cert-dir={self.work_dir / 'apiserver'}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.service_account_pub}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                "--allow-privileged=true",
                # Front proxy (aggregation layer) trust, as kubeadm sets it up.
                f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
                f"--proxy-client-key-file={pki.front_proxy_client.key}",
                # The "kubernetes" Service would point at 127.0.0.1, which Endpoints refuse.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
            ],
        )

    def _component_serving_flags(self, name: str, port: int, kubeconfig: Path) -> list[str]:
        """Flags for the HTTPS endpoint (/healthz) of controller-manager and scheduler."""
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.work_dir / name}",
            # One instance: no leases, no waiting for leadership.
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _start_controller_manager(self) -> None:
        assert self.ports is not None
        assert self._pki is not None
        pki = self._pki
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                *self._component_serving_flags(
                    "kube-controller-manager",
                    self.ports.controller_manager,
                    self.work_dir / "kube-controller-manager.kubeconfig",
                ),
                f"--cluster-name={CLUSTER_NAME}",
                # Signs ServiceAccount tokens and publishes the CA as kube-root-ca.crt.
                f"--service-account-private-key-file={pki.service_account_key}",
                f"--root-ca-file={pki.ca.cert}",
                # Each controller acts as its own ServiceAccount, as on a kubeadm cluster.
                "--use-service-account-credentials=true",
                # Lets CertificateSigningRequests be signed, like a real cluster.
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                "--controllers=*",
            ],
        )

    def _start_scheduler(self) -> None:
        assert self.ports is not None
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                *self._component_serving_flags(
                    "kube-scheduler",
                    self.ports.scheduler,
                    self.work_dir / "kube-scheduler.kubeconfig",
                ),
            ],
        )

    def _start_kwok(self) -> None:
        home = self.work_dir / "kwok-home"
        home.mkdir()
        env = dict(os.environ)
        # kwok also loads ~/.kwok/kwok.yaml when present: an empty HOME keeps the user's out.
        env["HOME"] = str(home)
        self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={write_stages(kwok_stages_file(self.bin_dir), self.work_dir / 'kwok-stages.yaml')}",
                "--manage-all-nodes=true",
                f"--cidr={self.pod_cidr}",
                # Fallback node address for nodes created without one: loopback, never dialled.
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
            env=env,
        )

    def _create_nodes(self) -> None:
        items = [gpu_node(name, i, self.gpus_per_node) for i, name in enumerate(self.node_names)]
        self.kubectl(
            "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )

    # --- faults: one component stopped and started again ------------------------------------

    def _component(self, name: str) -> _Running:
        for running in self._procs:
            if running.record.name == name:
                return running
        raise ClusterError(f"no component named {name!r} (have: {[p.record.name for p in self._procs]})")

    def stop_component(self, name: str, timeout: float = 15.0) -> None:
        """Stop one component (e.g. "kube-apiserver") by its recorded PID: SIGTERM, then SIGKILL after
        `timeout`. The rest of the cluster runs on; `start_component` brings it back."""
        self._terminate(self._component(name), timeout)

    def start_component(self, name: str, timeout: float = 120.0) -> None:
        """Start a component stopped by `stop_component` again, with the same command line, environment
        and log (appended), and wait until it answers (etcd /health, kube-apiserver /readyz)."""
        running = self._component(name)
        if running.popen is None:
            raise ClusterError(f"{name} was started by another process (attached cluster): not restartable")
        if running.popen.poll() is None:
            raise ClusterError(f"{name} is still running (pid {running.record.pid})")
        at = self._procs.index(running)
        self._procs.remove(running)
        self._spawn(name, running.record.argv, running.env, at=at)
        ready = {"etcd": self._etcd_healthy, "kube-apiserver": self._apiserver_ready}.get(name)
        if ready is not None:
            self._wait(f"{name} answering again", ready, time.monotonic() + timeout, [name])

    # --- readiness checks --------------------------------------------------------------------

    def _wait(
        self,
        what: str,
        ready: Callable[[], bool],
        deadline: float,
        watch: Sequence[str],
    ) -> None:
        """Poll ``ready`` until true; fail fast if one of our processes exits meanwhile."""
        while True:
            for running in self._procs:
                popen = running.popen
                if popen is not None and popen.poll() is not None:
                    log = Path(running.record.log)
                    raise ClusterError(
                        f"{running.record.name} exited with code {popen.returncode} while "
                        f"waiting for {what}; last lines of {log}:\n{tail(log)}"
                    )
            try:
                if ready():
                    return
            except (OSError, ValueError, subprocess.SubprocessError):
                pass  # not answering yet
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {r.name} ({r.log}):\n{tail(Path(r.log))}" for r in self.processes if r.name in watch
                )
                raise ClusterError(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.25)

    def _opener(self, ctx: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
        # No proxies: a proxy from the environment must never see loopback traffic.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if ctx is not None:
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        return urllib.request.build_opener(*handlers)

    def _admin_ssl(self) -> ssl.SSLContext:
        assert self._pki is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca.cert))
        ctx.load_cert_chain(str(self._pki.admin.cert), str(self._pki.admin.key))
        return ctx

    def _api_status(self, path: str) -> int:
        try:
            with self._opener(self._admin_ssl()).open(self.server + path, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return err.code

    def api_get(self, path: str) -> Any:
        """GET an API path as the admin and return the decoded JSON (raises on HTTP errors)."""
        with self._opener(self._admin_ssl()).open(self.server + path, timeout=10) as resp:
            return json.loads(resp.read())

    def _etcd_healthy(self) -> bool:
        assert self.ports is not None
        url = f"http://127.0.0.1:{self.ports.etcd_client}/health"
        with self._opener().open(url, timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    def _apiserver_ready(self) -> bool:
        return self._api_status("/readyz") == 200

    def _components_healthy(self) -> bool:
        assert self.ports is not None
        # Their serving certificates are self-signed; /healthz is readable without credentials.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        for port in (self.ports.controller_manager, self.ports.scheduler):
            url = f"https://127.0.0.1:{port}/healthz"
            with self._opener(ctx).open(url, timeout=2) as resp:
                if resp.status != 200:
                    return False
        return True

    def _nodes_ready(self) -> bool:
        nodes = self.api_get("/api/v1/nodes")["items"]
        ready = {
            n["metadata"]["name"]
            for n in nodes
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        }
        return ready >= set(self.node_names)

    def create_namespace(self, name: str, timeout: float = 30.0) -> None:
        """Create a namespace and wait for its "default" ServiceAccount (Pods need it)."""
        self.kubectl("create", "namespace", name)
        self._wait(
            f"ServiceAccount {name}/default",
            lambda: self._api_status(f"/api/v1/namespaces/{name}/serviceaccounts/default") == 200,
            time.monotonic() + timeout,
            ["kube-controller-manager"],
        )

    # --- kubectl -----------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # same name as subprocess.run's argument
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster; raise KubectlError if ``check`` and it fails."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """`kubectl wait --for=condition=Established` on CRDs (e.g. "crd/NAME") just applied.

        Right after a CRD is created it may have no conditions yet, and kubectl then fails at once
        ("status.conditions accessor error") instead of waiting; that one error is retried.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = max(1, int(deadline - time.monotonic()))
            try:
                self.kubectl("wait", "--for=condition=Established", f"--timeout={left}s", *crds)
                return
            except KubectlError as err:
                if "accessor error" not in str(err.stderr) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    # --- state, attach, stop -----------------------------------------------------------------

    def _write_state(self) -> None:
        state = {
            "bin_dir": str(self._bin_dir),
            "work_dir": str(self._work_dir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server if self.ports else None,
            "ports": asdict(self.ports) if self.ports else None,
            "pod_cidr": self.pod_cidr,
            "service_cidr": self.service_cidr,
            "nodes": self.node_names,
            "processes": [asdict(p.record) for p in self._procs],
        }
        tmp = self.work_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.work_dir / STATE_FILE)  # atomic: a reader never sees half a file

    @classmethod
    def attach(cls, work_dir: Path) -> Cluster:
        """A handle on a cluster started elsewhere (``up``), from ``<work_dir>/state.json``."""
        work_dir = work_dir.resolve()
        try:
            state = json.loads((work_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster state in {work_dir} ({STATE_FILE} missing)") from None
        cluster = cls(
            Path(state["bin_dir"]),
            work_dir,
            nodes=len(state["nodes"]),
            pod_cidr=state["pod_cidr"],
            service_cidr=state["service_cidr"],
            detach=True,
        )
        cluster.ports = Ports(**state["ports"]) if state["ports"] else None
        cluster._procs = [_Running(ProcessRecord(**p)) for p in state["processes"]]
        cluster._owns_work_dir = True
        cluster._started = True
        return cluster

    def alive(self) -> dict[str, bool]:
        """Which of the recorded processes are still running (same PID and start time)."""
        return {r.record.name: self._is_ours(r.record) for r in self._procs}

    @staticmethod
    def _is_ours(record: ProcessRecord) -> bool:
        return process_start_time(record.pid) == record.start_time and not is_zombie(record.pid)

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate exactly the recorded processes, newest first, then remove the work dir.

        Each gets SIGTERM, then SIGKILL after ``timeout`` seconds. Safe to call twice.
        """
        survivors: list[str] = []
        for running in reversed(self._procs):
            try:
                self._terminate(running, timeout)
            except ClusterError as err:  # keep going: stop the others anyway
                survivors.append(str(err))
        self._procs = []
        if survivors:
            raise ClusterError("; ".join(survivors))
        if self._work_dir is not None and self._work_dir.exists():
            if self.keep or not self._owns_work_dir:
                self._write_state()
            else:
                shutil.rmtree(self._work_dir, ignore_errors=True)

    def _terminate(self, running: _Running, timeout: float) -> None:
        record, popen = running.record, running.popen
        if popen is not None:
            # Our own child: Popen knows it, and wait() reaps it.
            if popen.poll() is None:
                popen.terminate()
                try:
                    popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    popen.kill()
                    popen.wait()
            return
        # Started by another Python process (``up``): check it is still the same process first.
        if not self._is_ours(record):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(record.pid, sig)
            except ProcessLookupError:
                return  # exited (and was reaped) since the check above
            deadline = time.monotonic() + timeout
            while self._is_ours(record) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self._is_ours(record):
                return
        raise ClusterError(f"{record.name} (pid {record.pid}) survived SIGKILL")
