"""Real vLLM serves with speculation inside the locked-down engine pod the renderer produces.

A resource with `engine.security.runAsUser` and `readOnlyRootFilesystem` is rendered; the latency
pool's engine container then runs as `pod_sandbox.py` applies that pod's security context without a
container runtime (a private mount namespace with a read-only root, a tmpfs per emptyDir volume,
`setpriv` to the pod's user and groups with no capabilities and no new privileges, only the
container's environment). vLLM must start, speculate with the EAGLE-3 drafter and answer; the test
then reads the engine's own /proc entries to show it ran that way. The UID has no passwd entry, as
with an arbitrary `runAsUser` in an image that does not know it. Not applied: the seccomp profile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pod_sandbox import PodSandbox, Volume
from tiny_models import TinyModels
from vllm_harness import (
    LOOPBACK,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SERVED_MODEL_NAME,
    TEST_FLAGS,
    K,
    server_env,
    spec_stats,
    start_server,
    wait_all_healthy,
)

from conftest import STARTUP_TIMEOUT_S
from specfleet.api.validation import parse_resource
from specfleet.render import plan_of, render_children
from specfleet_runtime.vllm_args import EngineArgs
from support.ports import free_port

pytestmark = pytest.mark.vllm

ENGINE_UID = 10101  # no passwd entry on this machine or in the vLLM images
SANDBOX = Path(__file__).with_name("pod_sandbox.py")
MAX_TOKENS = 16
# The test's own environment for the engine on top of the container's: offline, CPU sizing.
_TEST_ENV_PREFIXES = ("HF_HUB_", "TRANSFORMERS_", "VLLM_", "OMP_", "DO_NOT_TRACK")


def _image_copy(folder: Path, where: Path) -> Path:
    """`folder` copied as an image for a non-root user has it: world-readable (the tier builds its
    model files owner-only; a pod's engine downloads them into its volume as its own user)."""
    copy = Path(shutil.copytree(folder, where / folder.name))
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def _hardened_pod(target: Path, drafter: Path) -> dict[str, Any]:
    resource = {
        "apiVersion": "specfleet.io/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "hardened", "namespace": "default"},
        "spec": {
            "model": {"name": str(target), "servedModelName": SERVED_MODEL_NAME},
            "drafter": {"method": "eagle3", "model": str(drafter), "numSpeculativeTokens": K},
            "engine": {
                "maxNumSeqs": MAX_NUM_SEQS,
                "maxModelLen": MAX_MODEL_LEN,
                "security": {"runAsUser": ENGINE_UID, "readOnlyRootFilesystem": True},
            },
            "pools": {"latency": {"speculation": "On"}},
        },
    }
    children = render_children(parse_resource(resource), plan_of({"latency": "On", "batch": "Off"}))
    deployment = next(
        c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == "hardened-latency"
    )
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _sandbox(pod: dict[str, Any], vllm_python: Path, models: list[Path], port: int) -> PodSandbox:
    """The engine container of `pod` as pod_sandbox.py runs it (every field read from the render)."""
    container = pod["containers"][0]
    security, pod_security = container["securityContext"], pod["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = []
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]]
        assert "emptyDir" in source, f"only emptyDir volumes can be reproduced here: {source}"
        size = source["emptyDir"].get("sizeLimit")
        mounts.append(Volume(mount["mountPath"], size.replace("Gi", "g") if size else None))
    env = {k: v for k, v in server_env().items() if k.startswith(_TEST_ENV_PREFIXES)}
    env.pop("VLLM_CACHE_ROOT")  # the pod sets none: vLLM's cache goes under HOME, a volume
    env["PATH"] = "/usr/bin:/bin"
    env.update({e["name"]: e["value"] for e in container["env"]})
    venv = vllm_python.parent.parent.resolve()
    base = _venv_home(venv).resolve()
    # The rendered command and args; then, as for every server of the tier, a free port (vLLM takes
    # the last --port) and TEST_FLAGS.
    command = [str(venv / "bin" / "python"), *container["command"][1:], *container["args"]]
    return PodSandbox(
        argv=[*command, "--port", str(port), *TEST_FLAGS],
        env=env,
        uid=security["runAsUser"],
        gid=pod_security["runAsGroup"],
        fs_group=pod_security["fsGroup"],
        read_only_root=security["readOnlyRootFilesystem"],
        volumes=mounts,
        readable=[str(venv), str(base), *(str(m) for m in models)],
    )


def _venv_home(venv: Path) -> Path:
    """The base installation of a venv: the parent of pyvenv.cfg's `home` (its bin folder)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    raise AssertionError(f"{venv}/pyvenv.cfg names no home")


def _proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _root_mount_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError("no root mount")


def _complete(base_url: str, prompt: str) -> dict[str, Any]:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    request = urllib.request.Request(
        f"{base_url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def test_vllm_speculates_as_non_root_on_a_read_only_root(
    vllm_python: Path, tiny: TinyModels, tmp_path: Path
) -> None:
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and util-linux's setpriv to apply a pod's security context")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")

    port = free_port()
    target, drafter = _image_copy(tiny.target, tmp_path), _image_copy(tiny.eagle3, tmp_path)
    box = _sandbox(_hardened_pod(target, drafter), vllm_python, [target, drafter], port)
    box.dump(tmp_path / "sandbox.json")
    launcher = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, str(SANDBOX)]
    engine = EngineArgs(model=str(target), served_model_name=SERVED_MODEL_NAME, port=port)
    server = start_server(
        "hardened", launcher, engine, [str(tmp_path / "sandbox.json")], os.environ, tmp_path
    )
    try:
        try:
            wait_all_healthy([server], STARTUP_TIMEOUT_S)
        except RuntimeError as err:
            pytest.fail(str(err), pytrace=False)
        assert server.base_url == f"http://{LOOPBACK}:{port}"

        # The engine process is the one started (unshare, the launcher and setpriv each exec).
        status = _proc_status(server.pid)
        assert status["Uid"].split() == [str(ENGINE_UID)] * 4, status["Uid"]
        assert status["Gid"].split() == [str(box.gid)] * 4, status["Gid"]
        assert status["Groups"].split() == [str(box.fs_group)], status["Groups"]
        assert int(status["CapEff"], 16) == 0
        assert int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"] == "1"
        assert "ro" in _root_mount_options(server.pid)

        before = spec_stats(server.metrics_text())
        token = tiny.classes["accept"][0]  # a prompt whose continuation the drafter predicts
        answer = _complete(server.base_url, tiny.prompt(token))
        # Lossless: the greedy continuation the tiny target is built to produce.
        assert answer["choices"][0]["text"].split() == tiny.text(tiny.greedy(token, MAX_TOKENS)).split()
        spent = spec_stats(server.metrics_text()) - before
        assert spent.drafts > 0, f"no drafts while answering: {spent}"
        assert spent.accepted > 0, f"no accepted draft tokens while answering: {spent}"

        # What vLLM wrote, seen through its own root: only in the pod's volumes.
        root = Path(f"/proc/{server.pid}/root")
        written = sorted(
            f"/{Path(dirpath).relative_to(root)}"
            for volume in box.volumes
            for dirpath, _, _ in os.walk(f"{root}{volume.path}")
            if not any(Path(f"/{Path(dirpath).relative_to(root)}").is_relative_to(r) for r in box.readable)
        )
        print("folders in the engine's writable volumes:\n" + "\n".join(written[:40]))
    finally:
        server.stop()
