"""A real Prometheus that discovers the engine pods but whose scrape config selects none of them: the
operator says, in MetricsAvailable and one Warning Event, that Prometheus is not scraping the pool's
Ready pods and names the series and the scrape annotations to check; a Prometheus that scrapes them
clears it (the e2e tier: real control plane, operator process, emulated engines)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from specfleet.api import reasons
from specfleet.policy.inputs.scraping import NOT_SCRAPING_EVALUATIONS
from specfleet_sandbox.processes import wait_for
from specfleet_sandbox.prometheus import PrometheusProcess
from support.e2e_env import Env, fleet, latency, print_dump_if_failed, running_env, wait_metrics

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory) -> Iterator[Env]:
    with running_env(cluster, tmp_path_factory.mktemp("not-scraping")) as e:
        yield e


@pytest.fixture(autouse=True)
def dump_on_failure(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_dump_if_failed(env, request)


def _blind_config(env: Env) -> dict[str, Any]:
    """The env's pod job (same discovery from the apiserver, same relabelling), keeping only pods of
    the namespace `monitoring`: a scrape config that selects none of the engines."""
    assert env.prometheus is not None
    config = yaml.safe_load(env.prometheus.config_path.read_text())
    (pods,) = [job for job in config["scrape_configs"] if job["job_name"] == "kubernetes-pods"]
    keep = {"source_labels": ["__meta_kubernetes_namespace"], "regex": "monitoring", "action": "keep"}
    pods["relabel_configs"].insert(0, keep)
    return {"global": config["global"], "scrape_configs": [pods]}


def _dropped_targets(prometheus: PrometheusProcess, namespace: str) -> int:
    """Targets of `namespace` that Prometheus discovered and its scrape config dropped."""
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/targets?state=dropped", timeout=5) as response:
        dropped = json.load(response)["data"]["droppedTargets"]
    return sum(1 for t in dropped if t["discoveredLabels"].get("__meta_kubernetes_namespace") == namespace)


def test_ready_pods_a_prometheus_does_not_scrape_are_reported_with_what_to_check(env: Env) -> None:
    blind = PrometheusProcess(env.tmp / "blind-prometheus", _blind_config(env)).start()
    name = "unscraped"
    try:
        fleet(env, name, {"spec": {"policy": {"prometheus": {"url": blind.url}}}})  # waits for Ready
        assert latency(env, name)["readyReplicas"] == 1
        # The pods are discovered: the scrape config, not discovery, leaves them out.
        wait_for("engine pods discovered and dropped", lambda: _dropped_targets(blind, env.namespace) > 0, 30)
        condition = wait_for(
            "MetricsAvailable=False PrometheusNotScraping",
            lambda: (
                (c := env.conditions(name).get("MetricsAvailable", {})).get("reason")
                == reasons.PROMETHEUS_NOT_SCRAPING
                and c
            ),
            timeout=60,
        )
        assert condition["status"] == "False"
        message = condition["message"]
        series = (
            f'{{namespace="{env.namespace}",specfleet_io_deployment="{name}",specfleet_io_pool="latency"}}'
        )
        assert "latency: Prometheus is not scraping this pool's pods: 1 pod is Ready" in message
        assert f"no series {series} for {NOT_SCRAPING_EVALUATIONS} evaluations in a row" in message
        assert f"specfleet.io/deployment={name}, specfleet.io/pool=latency" in message
        assert f"keeps the pods of namespace {env.namespace} annotated prometheus.io/scrape=true" in message
        assert message.endswith("troubleshooting/#prometheusnotscraping)")
        assert latency(env, name)["unscrapedEvaluations"] == NOT_SCRAPING_EVALUATIONS
        events = json.loads(
            env.kubectl(
                "get",
                "events",
                "-n",
                env.namespace,
                "--field-selector",
                f"reason={reasons.EVENT_PROMETHEUS_NOT_SCRAPING}",
                "-o",
                "json",
            ).stdout
        )["items"]
        assert [(e["type"], e["message"]) for e in events] == [("Warning", message)]
        # The same pods behind a Prometheus that scrapes them: the condition and the count clear.
        assert env.prometheus is not None
        patch = {"spec": {"policy": {"prometheus": {"url": env.prometheus.url}}}}
        env.kubectl("patch", "sd", name, "-n", env.namespace, "--type=merge", "-p", json.dumps(patch))
        wait_metrics(env, name)
        assert "unscrapedEvaluations" not in latency(env, name)
    finally:
        env.kubectl("delete", "sd", name, "-n", env.namespace, "--wait=false")
        blind.stop()
