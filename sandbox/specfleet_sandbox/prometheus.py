"""A real Prometheus (Debian's 2.42) for the e2e tier: pods discovered from the test apiserver,
scraping the processes that play the pods on their loopback twins. Stopped by PID.

The binary comes from `specfleet_testbed.ensure_prometheus()`, which installs it on a fresh machine."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from specfleet.render.standby import SPECULATIVE_PORT_NAME
from specfleet_testbed import ensure_prometheus


def scrape_config(
    *,
    discovery_url: str,
    interval_seconds: float,
    rule_files: list[str] | None = None,
    static_targets: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The prometheus.yml: pods discovered from the apiserver, filtered by scrape annotations.

    `rule_files` (paths or globs) are evaluated every interval; `PrometheusProcess.reload()` picks up
    files written later. `static_targets` adds one job per entry (job name -> host:port), e.g. the
    operator's own /metrics, scraped with honor_labels as its ServiceMonitor does.

    Discovery comes through HTTP SD (see pod_discovery.py: Debian's build has no Kubernetes SD)
    with Kubernetes SD's labels, so the relabelling below is what a Kubernetes SD config says.
    Pod IPs in the test bed are fake (10.x); the process playing each pod listens on the loopback
    twin 127.x with the same last three octets, so __address__ is rewritten to that twin.

    A Standby pool's pods hold a second engine on their `speculative` container port: a second job
    scrapes that port, as the rendered PodMonitor's second endpoint does (the policy's queries count
    only the awake one of the two).
    """
    interval = f"{interval_seconds}s"
    pod_labels = [
        {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    running_pods = [
        {
            "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
            "regex": "true",
            "action": "keep",
        },
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
    ]
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        **({"rule_files": list(rule_files)} if rule_files else {}),
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "http_sd_configs": [{"url": discovery_url, "refresh_interval": interval}],
                "relabel_configs": [
                    *running_pods,
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_ip",
                            "__meta_kubernetes_pod_annotation_prometheus_io_port",
                        ],
                        "regex": r"\d+\.(\d+\.\d+\.\d+);(\d+)",
                        "replacement": "127.${1}:${2}",
                        "target_label": "__address__",
                    },
                    *pod_labels,
                ],
            },
            {
                "job_name": "kubernetes-pods-standby",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "http_sd_configs": [{"url": discovery_url, "refresh_interval": interval}],
                "relabel_configs": [
                    *running_pods,
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": SPECULATIVE_PORT_NAME,
                        "action": "keep",
                    },
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_ip",
                            "__meta_kubernetes_pod_container_port_number",
                        ],
                        "regex": r"\d+\.(\d+\.\d+\.\d+);(\d+)",
                        "replacement": "127.${1}:${2}",
                        "target_label": "__address__",
                    },
                    *pod_labels,
                ],
            },
            *(
                {
                    "job_name": job,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "honor_labels": True,
                    "static_configs": [{"targets": [target]}],
                }
                for job, target in (static_targets or {}).items()
            ),
        ],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusProcess:
    """Start, stop and restart one Prometheus; the data dir survives a restart (like a real outage)."""

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any],
        *,
        extra_args: list[str] | None = None,
        tls_ca_file: Path | None = None,
    ) -> None:
        """`extra_args` go to the binary (e.g. a --web.config.file serving TLS, whose CA is `tls_ca_file`)."""
        self.extra_args = extra_args or []
        self.tls_ca_file = tls_ca_file
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_ca_file is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> PrometheusProcess:
        log = (self.workdir / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [
                str(ensure_prometheus().prometheus),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        context = ssl.create_default_context(cafile=str(self.tls_ca_file)) if self.tls_ca_file else None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2, context=context) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"Prometheus did not become ready:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM our process only, SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def reload(self) -> None:
        """Re-read the configuration and rule files (SIGHUP, as Prometheus documents)."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("Prometheus is not running")
        self.proc.send_signal(signal.SIGHUP)

    def rule_groups(self) -> list[dict[str, Any]]:
        """The rule groups Prometheus evaluates now, with each rule's state (/api/v1/rules)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=5) as response:
            groups: list[dict[str, Any]] = json.load(response)["data"]["groups"]
        return groups

    def log(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            doc = json.load(response)
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=5) as response:
            targets: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
        return targets
