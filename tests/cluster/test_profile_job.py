"""`specfleet profile --job` against the real apiserver: the manifests are accepted as they are, the
Job's ServiceAccount can write the profile ConfigMap with `specfleet profile --publish` (the Job's
second step, run here as that ServiceAccount) and nothing else, and what it writes is the profile the
operator's policy reads (`policy.goodput.costProfileConfigMap`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specfleet.cli.profile import profile_job
from specfleet.policy.inputs.profile_source import profile_from_config_map

pytestmark = pytest.mark.cluster

MEASUREMENT = {
    "name": "h200-measured",
    "batchSizes": [1, 64, 256],
    "numSpeculativeTokens": [0, 1, 3],
    "stepTimeMs": [[5.0, 5.6, 6.9], [6.1, 7.5, 10.2], [11.0, 20.5, 31.0]],
    "measuredWith": {"model": "m"},
}


def _token_kubeconfig(cluster, namespace: str, account: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["users"] = [{"name": "profiler", "user": {"token": token}}]
    doc["contexts"][0]["context"]["user"] = "profiler"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_profile_job_publishes_the_config_map_the_policy_reads(cluster, namespace, tmp_path):
    manifests = profile_job(
        "measure",
        namespace,
        "gpu-profile",
        ["--model", "m", "--ks", "0,1,3"],
        vllm_image="vllm/vllm-openai:v0.32.0",
        specfleet_image="ghcr.io/specfleet/specfleet:test",
    )
    for manifest in manifests:
        if manifest["kind"] == "Job":
            # Validated by the apiserver, not run: kwok's nodes have no GPU to measure on.
            cluster.kubectl(
                "apply", "--dry-run=server", "--server-side", "-f", "-", input=json.dumps(manifest)
            )
        else:
            cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(manifest))
    cluster.kubectl("create", "configmap", "someone-elses", "-n", namespace, "--from-literal=x=1")
    kubeconfig = _token_kubeconfig(cluster, namespace, "measure", tmp_path / "sa.kubeconfig")
    output = tmp_path / "measurement.txt"
    output.write_text("INFO vLLM logs first\n" + json.dumps(MEASUREMENT) + "\n")

    def publish(config_map: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "specfleet", "profile", "--publish", str(output)]
        argv += ["--config-map", config_map, "--namespace", namespace, "--kubeconfig", str(kubeconfig)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    first = publish("gpu-profile")
    assert first.returncode == 0, first.stderr
    again = publish("gpu-profile")  # a rerun of the Job updates it
    assert again.returncode == 0, again.stderr
    live = json.loads(
        cluster.kubectl("get", "configmap", "gpu-profile", "-n", namespace, "-o", "json").stdout
    )
    profile = profile_from_config_map(live, namespace, "gpu-profile")
    assert profile.name == "h200-measured"
    assert profile.step_time_ms(64, 3) == 10.2
    # Its Role reaches no other ConfigMap.
    as_job = f"--as=system:serviceaccount:{namespace}:measure"
    denied = cluster.kubectl("get", "configmap", "someone-elses", "-n", namespace, as_job, check=False)
    assert denied.returncode != 0
    overwrite = publish("someone-elses")
    assert overwrite.returncode != 0
    assert "forbidden" in (overwrite.stderr + overwrite.stdout).lower()
