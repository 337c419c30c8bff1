"""Certificates and keys for the local test cluster, made with the ``openssl`` command-line tool.

Everything is throw-away: a fresh CA per cluster, short-lived leaf certificates, files under the
cluster's work dir. ECDSA P-256 keys are used for TLS because they are generated instantly; the
service-account signing key is RSA (RS256), the algorithm every Kubernetes client expects.
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CertPair", "Pki", "make_pki", "make_server_tls"]


@dataclass(frozen=True)
class CertPair:
    """A certificate and its private key, both PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """All the credentials one cluster needs."""

    ca: CertPair
    front_proxy_ca: CertPair
    front_proxy_client: CertPair
    apiserver: CertPair
    admin: CertPair
    controller_manager: CertPair
    scheduler: CertPair
    service_account_key: Path
    service_account_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    """Run openssl quietly; raise with its stderr if it fails."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command-line tool is required (apt-get install openssl)")
    result = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def _ec_key(path: Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        str(path),
        cwd=path.parent,
    )


def _make_ca(directory: Path, name: str = "ca") -> CertPair:
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    _ec_key(pair.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pair.key),
        "-out",
        str(pair.cert),
        "-days",
        "3650",
        "-subj",
        f"/CN=specfleet-testbed-{name}",
        # Explicit CA extensions: Go's verifier wants keyCertSign on the CA.
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )
    return pair


def _make_leaf(
    directory: Path,
    ca: CertPair,
    name: str,
    subject: str,
    *,
    server: bool = False,
    sans: tuple[str, ...] = (),
) -> CertPair:
    """Sign a client (and optionally server) certificate for ``subject`` with the cluster CA."""
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    _ec_key(pair.key)
    _openssl("req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject, cwd=directory)
    usages = "serverAuth,clientAuth" if server else "clientAuth"
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usages}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        "-set_serial",
        str(secrets.randbits(63) | 1),
        "-days",
        "365",
        "-extfile",
        str(ext),
        "-out",
        str(pair.cert),
        cwd=directory,
    )
    csr.unlink()
    ext.unlink()
    return pair


def make_pki(directory: Path, *, service_ip: str) -> Pki:
    """Create a CA and every certificate/key the control plane needs, under ``directory``.

    ``service_ip`` is the first address of the service range: in-cluster clients reach the
    apiserver as ``kubernetes.default`` at that IP, so the serving certificate names it too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ipaddress.ip_address(service_ip)  # fail early on a typo rather than inside openssl
    ca = _make_ca(directory)
    apiserver = _make_leaf(
        directory,
        ca,
        "apiserver",
        "/CN=kube-apiserver",
        server=True,
        sans=(
            "IP:127.0.0.1",
            f"IP:{service_ip}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ),
    )
    # O=system:masters is the built-in superuser group: the admin kubeconfig bypasses RBAC.
    admin = _make_leaf(directory, ca, "admin", "/O=system:masters/CN=specfleet-admin")
    # The bootstrap RBAC policy grants these exact user names what each component needs.
    controller_manager = _make_leaf(
        directory, ca, "kube-controller-manager", "/CN=system:kube-controller-manager"
    )
    scheduler = _make_leaf(directory, ca, "kube-scheduler", "/CN=system:kube-scheduler")
    # Aggregation layer ("front proxy"): the apiserver authenticates itself to extension API
    # servers with this client cert, and controller-manager/scheduler expect the CA to exist.
    front_proxy_ca = _make_ca(directory, "front-proxy-ca")
    front_proxy_client = _make_leaf(directory, front_proxy_ca, "front-proxy-client", "/CN=front-proxy-client")
    sa_key = directory / "service-account.key"
    sa_pub = directory / "service-account.pub"
    _openssl(
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        str(sa_key),
        cwd=directory,
    )
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub), cwd=directory)
    return Pki(
        ca=ca,
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=front_proxy_client,
        apiserver=apiserver,
        admin=admin,
        controller_manager=controller_manager,
        scheduler=scheduler,
        service_account_key=sa_key,
        service_account_pub=sa_pub,
    )


def make_server_tls(directory: Path, name: str, *, sans: tuple[str, ...]) -> tuple[CertPair, CertPair]:
    """A private CA and a server certificate it signs for `sans` (e.g. "IP:127.0.0.1"): (ca, server)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(directory, f"{name}-ca")
    return ca, _make_leaf(directory, ca, name, f"/CN={name}", server=True, sans=sans)
