"""The operator's Prometheus client against a real Prometheus served over TLS: certificates are
verified by default, a CA bundle makes them trusted, skipping verification must be asked for, and
credentials from mounted files reach the server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.observe.prometheus import PrometheusAuth, PrometheusQuerier, QueryError
from specfleet_sandbox.prometheus import PrometheusProcess
from specfleet_testbed.pki import make_server_tls

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tls_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Debian's Prometheus serving HTTPS with a certificate from a private CA; (https url, CA file)."""
    work = tmp_path_factory.mktemp("tls-prometheus")
    ca, server = make_server_tls(work, "prometheus", sans=("IP:127.0.0.1",))
    web_config = work / "web.yml"
    web_config.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(server.cert), "key_file": str(server.key)}})
    )
    prometheus = PrometheusProcess(
        work / "prometheus",
        {"global": {"scrape_interval": "5s"}},
        extra_args=[f"--web.config.file={web_config}"],
        tls_ca_file=ca.cert,
    ).start()
    try:
        yield prometheus.url, ca.cert
    finally:
        prometheus.stop()


def test_certificates_are_verified_by_default(tls_prometheus: tuple[str, Path]) -> None:
    url, _ = tls_prometheus
    with pytest.raises(QueryError):
        PrometheusQuerier(url, 5)("vector(1)")


def test_a_ca_bundle_makes_the_server_trusted(tls_prometheus: tuple[str, Path]) -> None:
    url, ca = tls_prometheus
    result = PrometheusQuerier(url, 5, auth=PrometheusAuth(ca_file=str(ca)))("vector(1)")
    assert result[0]["value"][1] == "1"


def test_skipping_verification_works_only_when_asked(tls_prometheus: tuple[str, Path]) -> None:
    url, _ = tls_prometheus
    result = PrometheusQuerier(url, 5, auth=PrometheusAuth(insecure_skip_verify=True))("vector(2)")
    assert result[0]["value"][1] == "2"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_bearer_token_and_basic_auth_come_from_files(tmp_path: Path) -> None:
    # Prometheus itself checks only bcrypt basic auth; what matters here is what the client sends.
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        token = tmp_path / "token"
        token.write_text("s3cret-token\n")
        PrometheusQuerier(url, 5, auth=PrometheusAuth(bearer_token_file=str(token)))("up")
        token.write_text("rotated-token\n")  # a rotated token is read again by the next querier
        PrometheusQuerier(url, 5, auth=PrometheusAuth(bearer_token_file=str(token)))("up")
        basic = tmp_path / "basic"
        basic.write_text("operator:pa:ss\n")
        PrometheusQuerier(url, 5, auth=PrometheusAuth(basic_auth_file=str(basic)))("up")
    finally:
        server.shutdown()
    auths = [h.get("Authorization") for h in _Recorder.seen]
    assert auths[0] == "Bearer s3cret-token"
    assert auths[1] == "Bearer rotated-token"
    assert auths[2] == "Basic b3BlcmF0b3I6cGE6c3M="  # operator:pa:ss


def test_a_malformed_basic_auth_file_is_a_clear_error(tmp_path: Path) -> None:
    basic = tmp_path / "basic"
    basic.write_text("no-colon\n")
    with pytest.raises(ValueError, match="username:password"):
        PrometheusAuth(basic_auth_file=str(basic)).basic_auth()
