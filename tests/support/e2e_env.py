"""The e2e tier's shared environment: one namespace of the session's cluster with a real Prometheus,
the pod runner (emulated engines, the compiled router), and the real operator process; plus the
fleet every e2e module starts from (a Threshold policy on seconds-scale windows).

Each e2e module builds one `Env` in a module fixture with `running_env`; a failing test prints
`Env.dump()` (events, operator log, pod processes, Prometheus log).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet_sandbox.discovery import PodDiscovery
from specfleet_sandbox.pods import PodRunner, compiled_router
from specfleet_sandbox.processes import OperatorProcess, events_by_time, wait_for
from specfleet_sandbox.prometheus import PrometheusProcess, scrape_config
from support.manifests import CRD, ROOT, apply_crds, load_yaml, merge
from support.operator_log import wait_sweeps
from support.ports import free_port

# Emulated engines run 10x slower than the H100 profile so a few dozen clients saturate a replica.
EMULATOR_ARGS = ["--time-scale", "10", "--acceptance", "0.68,0.39,0.2"]
PUBLISHED_ACCEPTANCE = [0.68, 0.39, 0.2]
# info: endpoint changes and config reloads are logged (a few lines, never per request), so a failure's
# dump says what the router saw.
ROUTER_ARGS = ["--endpoint-address-map", "10.0.0.0/8=127.0.0.0/8", "--log-level", "info"]


class Env:
    """Everything one e2e module shares."""

    def __init__(self, cluster: Any, namespace: str, tmp: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.tmp = tmp
        self.prometheus: PrometheusProcess | None = None
        self.rules_dir = tmp / "rules"
        self.runner: PodRunner | None = None
        self.operator: OperatorProcess | None = None

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl(*args, **kw)

    def sd(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "sd", name, "-n", self.namespace, "-o", "json").stdout)

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in self.sd(name).get("status", {}).get("conditions", [])}

    def wait_sweeps(self, count: int) -> None:
        """Wait for `count` more policy sweeps: evaluations that would act (flip, retrain) if due."""
        assert self.operator is not None
        wait_sweeps(self.operator, count)

    def router_url(self, name: str) -> str:
        """The fleet's router, once it answers /readyz (as its readiness probe would)."""
        assert self.runner is not None
        runner = self.runner

        def ready() -> list[Any]:
            return [
                p
                for p in runner.processes("router")
                if p.ready_marked and p.name.startswith(f"{name}-router-")
            ]

        return runner.url(wait_for(f"{name} router ready", ready, timeout=60)[0])

    def dump(self) -> str:
        parts = [
            f"===== events by time =====\n{events_by_time(self.cluster.kubectl, self.namespace)}",
            f"===== operator log =====\n{self.operator.log()[-15000:] if self.operator else ''}",
            f"===== pod processes =====\n{self.runner.logs()[-15000:] if self.runner else ''}",
            f"===== prometheus =====\n{self.prometheus.log()[-3000:] if self.prometheus else ''}",
        ]
        return "\n".join(parts)


@contextmanager
def running_env(cluster: Any, tmp: Path, router_args: list[str] | None = None) -> Iterator[Env]:
    """A fresh namespace with Prometheus, the pod runner and the operator; all stopped at the end."""
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    apply_crds(cluster, CRD)
    e = Env(cluster, namespace, tmp)
    discovery = PodDiscovery(Path(cluster.kubeconfig), namespace).start()
    # Rules rendered for a resource are written here and loaded with PrometheusProcess.reload().
    e.rules_dir.mkdir()
    # The operator's own /metrics is scraped too (as its ServiceMonitor would): the dashboard reads it.
    operator_metrics_port = free_port()
    config = scrape_config(
        discovery_url=discovery.url,
        interval_seconds=1,
        rule_files=[str(e.rules_dir / "*.yaml")],
        static_targets={"specfleet-operator": f"127.0.0.1:{operator_metrics_port}"},
    )
    try:
        e.prometheus = PrometheusProcess(tmp / "prometheus", config).start()
        e.runner = PodRunner(
            Path(cluster.kubeconfig),
            namespace,
            tmp / "pods",
            emulator_args=EMULATOR_ARGS,
            router_args=[*ROUTER_ARGS, *(router_args or [])],
            router_pythonpath=compiled_router(),  # the router as the image ships it
        ).start()
        e.operator = OperatorProcess(
            Path(cluster.kubeconfig),
            tmp / "operator.log",
            resync_seconds=2,
            metrics_port=operator_metrics_port,
        ).start()
        yield e
    finally:
        for part in (e.operator, e.runner, e.prometheus, discovery):
            if part is not None:
                part.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def print_dump_if_failed(env: Env, request: pytest.FixtureRequest) -> None:
    """After a test (from an autouse fixture): when it failed, print what `Env.dump` gathers."""
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        reporter = request.config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(env.dump())


def fleet(env: Env, name: str, patch: dict[str, Any] | None = None) -> str:
    """A SpeculativeDeployment whose latency pool is Auto and fed by the router; Prometheus at env's."""
    assert env.prometheus is not None
    doc = merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {
            "metadata": {"name": name, "namespace": env.namespace},
            "spec": {
                "model": {"servedModelName": "llama"},
                "engine": {"maxNumSeqs": 64},
                "pools": {
                    "latency": {"replicas": 1, "speculation": "Auto"},
                    "batch": {"replicas": 0, "speculation": "Off"},
                },
                "routing": {"autoSegmentation": {"enabled": False}, "router": {"replicas": 1}},
                "policy": {
                    "mode": "Threshold",
                    "prometheus": {"url": env.prometheus.url, "timeoutSeconds": 2},
                    "evaluationIntervalSeconds": 2,
                    "windowSeconds": 6,
                    "thresholds": {
                        "stopBelowAcceptanceLengthMilli": 1400,
                        "resumeAboveAcceptanceLengthMilli": 1700,
                        "stopAboveConcurrencyPerReplica": 12,
                        "resumeBelowConcurrencyPerReplica": 4,
                    },
                    "minDwellSeconds": 15,
                    "cooldownSeconds": 5,
                    "maxFlipsPerHour": 20,
                },
            },
        },
    )
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(merge(doc, patch or {})))
    wait_for(
        f"{name} Ready", lambda: env.conditions(name).get("Ready", {}).get("status") == "True", timeout=90
    )
    return name


def latency(env: Env, name: str) -> dict[str, Any]:
    """The latency pool's status."""
    pool: dict[str, Any] = env.sd(name)["status"]["pools"]["latency"]
    return pool


def wait_mode(env: Env, name: str, mode: str, timeout: float) -> dict[str, Any]:
    return wait_for(
        f"{name} latency pool {mode}",
        lambda: (s := latency(env, name))["speculation"] == mode and s,
        timeout=timeout,
    )


def wait_settled(env: Env, name: str, timeout: float = 60) -> None:
    wait_for(
        f"{name} settled",
        lambda: env.conditions(name).get("SpeculationSettled", {}).get("status") == "True",
        timeout=timeout,
    )


def wait_metrics(env: Env, name: str) -> None:
    wait_for(
        f"{name} MetricsAvailable",
        lambda: env.conditions(name).get("MetricsAvailable", {}).get("status") == "True",
        timeout=60,
    )


def engine_args(env: Env, name: str) -> list[str]:
    deploy = json.loads(
        env.kubectl("get", "deployment", f"{name}-latency", "-n", env.namespace, "-o", "json").stdout
    )
    args: list[str] = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def history(env: Env, name: str) -> list[tuple[str, str]]:
    """The resource's recorded flips, as (from, to)."""
    return [(h["from"], h["to"]) for h in env.sd(name)["status"].get("history", [])]
