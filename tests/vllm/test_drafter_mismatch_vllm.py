"""Both refuse the same mismatched pair: the drafter preflight, and real vLLM when it loads it.

The drafter is the tier's EAGLE-3 checkpoint with `target_hidden_size` doubled in its config.json
(weights untouched), as in test_drafter_preflight_tiny. The preflight names the field; real vLLM,
started with the operator's rendered command line for that pair, exits with an error before it
ever serves. One server start-up (tens of seconds on CPU) and nothing else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tiny_models import TinyModels
from vllm_harness import engine_args, server_env, start_server

from conftest import rendered_command_line
from specfleet_runtime.drafter_preflight import REASON, check_directories
from specfleet_runtime.vllm_args import VLLM_SERVER_MODULE, SpeculativeConfig

pytestmark = pytest.mark.vllm

# A refusing vLLM exits once the drafter's weights fail to load; far less than a healthy start-up.
EXIT_TIMEOUT_S = 900


def _wide_drafter(tiny: TinyModels, where: Path) -> tuple[Path, int]:
    wide = where / "eagle3-wide"
    shutil.copytree(tiny.eagle3, wide)
    config = json.loads((wide / "config.json").read_text())
    hidden = int(json.loads((tiny.target / "config.json").read_text())["hidden_size"])
    config["target_hidden_size"] = hidden * 2
    (wide / "config.json").write_text(json.dumps(config))
    return wide, hidden


def test_preflight_and_vllm_both_refuse_a_drafter_for_another_hidden_size(
    vllm_python: Path, tiny: TinyModels, tmp_path: Path
):
    wide, hidden = _wide_drafter(tiny, tmp_path)
    assert check_directories("eagle3", tiny.target, wide) == [
        f"hidden size: the drafter's target_hidden_size is {hidden * 2}, the target's hidden_size is {hidden}"
    ]
    # The preflight as the init container runs it (a separate process, its exit status and stderr).
    preflight = subprocess.run(
        [
            str(vllm_python),
            "-m",
            "specfleet_runtime.drafter_preflight",
            "--method",
            "eagle3",
            "--target",
            str(tiny.target),
            "--drafter",
            str(wide),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**server_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "runtime")},
        timeout=120,
    )
    assert preflight.returncode == 1, preflight.stderr
    assert f"{REASON}: hidden size" in preflight.stderr

    engine = engine_args(
        tiny.target, SpeculativeConfig(method="eagle3", model=str(wide), num_speculative_tokens=3)
    )
    server = start_server(
        "eagle3-wide",
        [str(vllm_python), "-m", VLLM_SERVER_MODULE],
        engine,
        rendered_command_line(engine),
        server_env(),
        tmp_path,
    )
    try:
        code = server.process.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(server.describe_failure(f"still running after {EXIT_TIMEOUT_S} s"), pytrace=False)
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert code != 0, server.describe_failure("exited 0 with a drafter for another hidden size")
    # vLLM's own words: the drafter's fc layer built for 3 x the declared width cannot take the weights
    # trained for 3 x the target's (seen: "AssertionError: Tried to load weights of size
    # torch.Size([256, 768])to a parameter of size torch.Size([256, 1536])").
    errors = [line for line in log.splitlines() if "Error" in line and not line.lstrip().startswith("File ")]
    print(f"vLLM exited {code}; its error lines:\n" + "\n".join(errors))
    refused = [line for line in errors if "Tried to load weights of size" in line]
    assert refused, server.log_tail()
    assert f"torch.Size([{hidden}, {3 * hidden}])" in refused[0]
    assert f"torch.Size([{hidden}, {6 * hidden}])" in refused[0]
