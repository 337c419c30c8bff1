"""The main job as a user runs it: `specfleet sandbox up`, a shortened demo scenario, `down`.

Everything is the real thing the README's `make demo` starts (its own control plane, Debian's
Prometheus, the operator, the router and emulated engines as processes, load through the official
openai client); the scenario is the demo at 60% of its length. `up` measures the engines' cost
profile with `specfleet profile` and the Goodput policy decides on it: the scenario must produce the
four expected Goodput decisions (the memory-bound one included), in order, with zero failed requests, and `down` must leave none of
its processes behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet_sandbox.processes import Detached

pytestmark = pytest.mark.e2e


def _sandbox(work: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specfleet_sandbox", *args, "--dir", str(work)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_demo_scenario_flips_the_expected_pools_without_failed_requests(tmp_path: Path) -> None:
    work = tmp_path / "sandbox"
    up = _sandbox(work, "up", timeout=600)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "profile measured in" in up.stderr, up.stderr
        state = json.loads((work / "sandbox.json").read_text())
        assert {p["name"] for p in state["processes"]} == {"agent", "prometheus", "operator"}
        load = _sandbox(work, "load", "--scenario", "short", timeout=900)
        report = load.stdout + load.stderr
        if load.returncode != 0 or "decisions since" not in report:
            for log in ("operator.log", "agent.log"):
                path = work / log
                report += f"\n===== {log} =====\n" + (path.read_text()[-6000:] if path.exists() else "")
        assert load.returncode == 0, report
        summary = report[report.index("scenario short:") :]
        print(summary)  # each decision with its rollout's seconds (pytest -rP shows it)
        assert ", 0 failed" in summary, report
        kubectl = Path(state["bin_dir"]) / "kubectl"
        sd = subprocess.run(
            [
                str(kubectl),
                "--kubeconfig",
                state["kubeconfig"],
                "get",
                "sd",
                state["name"],
                "-n",
                state["namespace"],
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        status = json.loads(sd.stdout)["status"]
        assert any(
            c["type"] == "CostProfileLoaded" and c["status"] == "True" for c in status["conditions"]
        ), report
        # Flips only (a K retune keeps the mode), checked in order as a subsequence: while the surge
        # ramps up the batch pool may flip once more, which the policy is free to do.
        moves = [
            (h["pool"], h["from"], h["to"], h["reason"]) for h in status["history"] if h["from"] != h["to"]
        ]
        remaining = iter(moves)
        for move in (
            ("batch", "On", "Off", "GoodputBelowBreakEven"),
            ("batch", "Off", "On", "GoodputAboveBreakEven"),
            ("batch", "On", "Off", "GoodputMemoryBound"),
            ("latency", "On", "Off", "GoodputBelowBreakEven"),
        ):
            assert move in remaining, f"{move} missing (in order) from {moves}\n{report}"
        # The summary reports the same decisions with their numbers.
        assert summary.count(" -> ") >= 4
    finally:
        recorded = (
            json.loads((work / "sandbox.json").read_text())["processes"]
            if (work / "sandbox.json").exists()
            else []
        )
        down = _sandbox(work, "down", timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not any(Detached(**p).alive() for p in recorded), "down left a recorded process running"
    assert not (work / "cluster" / "state.json").exists()
