"""The Standby GPU check (benchmarks/standby_gpu.py) runs its steps end to end over two engine emulators
(`--emulate`): the pod's supervisor starts them in order, the operator's switch flips them three times,
and a flip under load fails no request. On a GPU the same script measures real vLLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_over_emulators_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "standby.md"
    argv = [sys.executable, str(ROOT / "benchmarks" / "standby_gpu.py"), "--emulate", "--prompts", "2"]
    argv += ["--max-tokens", "16", "--clients", "2", "--load-seconds", "1", "--out", str(out)]
    argv += [
        "--plain-port",
        str(free_port()),
        "--speculative-port",
        str(free_port()),
        "--startup-timeout",
        "120",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {
        cells[1].strip(): cells[2].strip()
        for line in out.read_text().splitlines()
        if line.startswith("| ") and len(cells := line.split("|")) == 4
    }
    assert rows["greedy output identical, plain vs woken speculative"] == "2/2"
    assert rows["greedy output identical, first wake vs third"] == "2/2"
    acceptance = [float(a) for a in rows["acceptance length after each wake"].split(", ")]
    assert len(acceptance) == 3
    assert all(a > 1.5 for a in acceptance)
    served, failed = (int(x) for x in rows["flip under load: requests served / failed"].split(" / "))
    assert served > 0
    assert failed == 0
    # The emulator times a level-1 sleep from the weights over the host link: 8B bf16 in under a second.
    assert 0 < float(rows["wake, s (mean of 6)"].split()[0]) < 5
