"""`specfleet profile`: measure a step-time profile with vLLM and write it in the policy's format.

The profile carries the step-time table and the `memory` section (KV cache tokens of an engine
without and with the drafter, as vLLM reports them).

The measurement itself (`specfleet_runtime/vllm_profile.py`) runs with the Python of a vLLM
installation, which need not have specfleet installed: this module launches it by file path, reads
the JSON it prints, checks it with `StepTimeProfile.from_dict` and renders the profile file (or a
ConfigMap holding it, under `PROFILE_KEY`, for `policy.goodput.costProfileConfigMap`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

import specfleet_runtime
from specfleet.policy.inputs.profile_source import PROFILE_KEY
from specfleet_runtime.cost_profile import StepTimeProfile

# The measurement script, run by file path with the vLLM installation's python.
SCRIPT = Path(specfleet_runtime.__file__).resolve().parent / "vllm_profile.py"


class ProfileError(RuntimeError):
    """The measurement failed or printed something that is not a valid profile."""


def measure(
    python: str,
    options: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout_seconds: float = 3600,
) -> tuple[StepTimeProfile, dict[str, Any]]:
    """Run the measurement with `python` and return the profile and the document it printed.

    The measurement's log (its stderr: progress, and vLLM's own when VLLM_LOGGING_STREAM points
    there) is passed on to ours, so what vLLM reported can be checked against the profile.
    """
    argv = [python, str(SCRIPT), *options]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        raise ProfileError(f"cannot run {python}: no such interpreter") from None
    except subprocess.TimeoutExpired:
        raise ProfileError(f"the measurement did not finish within {timeout_seconds:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise ProfileError(f"the measurement failed (exit {done.returncode}):\n{tail}")
    sys.stderr.write(done.stderr)
    return parse_output(done.stdout)


def parse_output(stdout: str) -> tuple[StepTimeProfile, dict[str, Any]]:
    """The profile in the measurement's output (its last JSON line; vLLM may log to stdout too)."""
    for raw in reversed(stdout.strip().splitlines()):
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "stepTimeMs" in doc:
            try:
                return StepTimeProfile.from_dict(doc), doc
            except ValueError as err:
                raise ProfileError(f"the measurement printed an invalid profile: {err}") from None
    raise ProfileError("the measurement printed no profile")


def profile_document(profile: StepTimeProfile, measured_with: Mapping[str, Any] | None = None) -> str:
    """The profile file (YAML), with how it was measured as a comment-free extra key."""
    doc = profile.to_dict()
    if measured_with:
        doc["measuredWith"] = dict(measured_with)
    return yaml.safe_dump(doc, sort_keys=False)


def config_map(name: str, namespace: str | None, text: str) -> dict[str, Any]:
    """A ConfigMap holding the profile file, for policy.goodput.costProfileConfigMap."""
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "specfleet"}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {PROFILE_KEY: text}}


# Where the Job's containers share the measurement, and where the script is mounted.
JOB_OUTPUT = "/out/measurement.txt"
JOB_SCRIPT_DIR = "/specfleet"


def profile_job(
    name: str,
    namespace: str,
    config_map_name: str,
    options: Sequence[str],
    *,
    vllm_image: str,
    specfleet_image: str,
    gpus: int = 1,
    script_text: str | None = None,
) -> list[dict[str, Any]]:
    """The manifests of a Job that measures a profile on a GPU node and fills `config_map_name`.

    Its init container runs the measurement script (mounted from a ConfigMap; run with the vLLM
    image's python, which need not have specfleet) and writes what it prints to a shared emptyDir;
    its container, specfleet's image, runs `specfleet profile --publish`: the output is checked
    (`parse_output`) and applied as the profile ConfigMap the policy reads
    (`policy.goodput.costProfileConfigMap`). A ServiceAccount with a Role that can only create that
    ConfigMap and get/patch it by name goes with it.
    """
    labels = {"app.kubernetes.io/part-of": "specfleet", "app.kubernetes.io/component": "profile"}

    def meta(obj_name: str) -> dict[str, Any]:
        return {"name": obj_name, "namespace": namespace, "labels": dict(labels)}

    script = SCRIPT.read_text(encoding="utf-8") if script_text is None else script_text
    script_map = f"{name}-script"
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    measure = {
        "name": "measure",
        "image": vllm_image,
        "command": ["sh", "-c", f'python3 {JOB_SCRIPT_DIR}/{SCRIPT.name} "$@" > {JOB_OUTPUT}', "measure"],
        "args": list(options),
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [
            {"name": "script", "mountPath": JOB_SCRIPT_DIR, "readOnly": True},
            {"name": "out", "mountPath": str(Path(JOB_OUTPUT).parent)},
        ],
        "securityContext": restricted,
    }
    publish = {
        "name": "publish",
        "image": specfleet_image,
        "command": ["specfleet", "profile", "--publish", JOB_OUTPUT],
        "args": ["--config-map", config_map_name, "--namespace", namespace],
        "volumeMounts": [{"name": "out", "mountPath": str(Path(JOB_OUTPUT).parent), "readOnly": True}],
        "securityContext": {**restricted, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(name),
        "spec": {
            "backoffLimit": 1,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": name,
                    "restartPolicy": "Never",
                    "initContainers": [measure],
                    "containers": [publish],
                    "volumes": [
                        {"name": "script", "configMap": {"name": script_map}},
                        {"name": "out", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(name),
        "rules": [
            # create cannot be limited by name (the name is not known when it is authorised).
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [config_map_name],
                "verbs": ["get", "patch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)},
        role,
        binding,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(script_map),
            "data": {SCRIPT.name: script},
        },
        job,
    ]
