"""A Standby pod on a real GPU: two vLLM engines, one asleep, switched the way the operator switches them.

    python benchmarks/standby_gpu.py --out docs/benchmarks/standby-gpu.md            (where a GPU is lent)
    python benchmarks/standby_gpu.py --emulate --prompts 4 --out /tmp/standby.md      (any machine)

Runs the pod's own supervisor (runtime/specfleet_runtime/standby.py, as the init container installs it)
over Llama-3.1-8B-Instruct and its EAGLE-3 drafter on one GPU: the speculative engine starts, is checked
and sleeps (level 1) before the plain one starts. Then, with the operator's own switch
(`specfleet.controller.standby_flips`: sleep the serving engine, wake the other, check it):

- GPU memory (nvidia-smi) with the plain engine serving, and after each switch;
- the time to fall asleep and to wake, per switch (three round trips);
- greedy output of the same prompts from the plain engine and the woken speculative one (speculative
  decoding is lossless: identical text expected), and again after a second wake;
- the woken drafter's acceptance length after each wake, measured as the operator's check measures it (a drafter whose weights did not come back
  accepts next to nothing: vllm#52479's failure);
- a flip under load: clients keep sending to the serving engine; the flip stops new requests (as the
  pod leaving its Service does), waits for the in-flight ones, switches and resumes on the other
  engine: failed requests (0 expected) and seconds from the drain's start to serving.

It writes its figures as a markdown table (`--out`) and prints it. Never run in CI (it needs a GPU and
the models); `--emulate` runs the same steps over two engine emulators, which speak vLLM's sleep API
and time it from the weights over the host link, so the script itself is tested
(tests/unit/test_standby_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from specfleet.controller.standby_flips import EngineClient, SwitchError, acceptance_length, switch_engines
from specfleet_runtime import standby
from specfleet_runtime.names import ENGINE_PORT, STANDBY_SPECULATIVE_PORT
from specfleet_runtime.vllm_args import EngineArgs, SpeculativeConfig, build_vllm_args

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DRAFTER = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a haiku about a lighthouse.",
    "List five prime numbers and say why each is prime.",
    "Summarise the plot of Hamlet in two sentences.",
    "Give a recipe for pancakes in five steps.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Translate 'good morning, how are you' into French and Spanish.",
    "Describe how a bicycle gear works.",
)
# The emulator standing in for vLLM's server module (`--emulate`): its own sleep timing at real speed.
SHIM = """
import sys
from specfleet_runtime.emulator.__main__ import main
main(sys.argv[1:] + ["--host", "127.0.0.1"])
"""


@dataclass
class Figures:
    sleep_seconds: list[float] = field(default_factory=list)
    wake_seconds: list[float] = field(default_factory=list)
    gpu_mib: dict[str, str] = field(default_factory=dict)
    identical: tuple[int, int] = (0, 0)
    identical_after_rewake: tuple[int, int] = (0, 0)
    acceptance: list[float | None] = field(default_factory=list)
    load_requests: int = 0
    load_failed: int = 0
    load_flip_seconds: float = 0.0


def gpu_memory_mib(emulated: bool) -> str:
    if emulated:
        return "n/a (emulated)"
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    return (
        done.stdout.strip().replace("\n", " + ")
        if done.returncode == 0
        else f"nvidia-smi failed: {done.stderr}"
    )


def complete(url: str, model: str, prompt: str, max_tokens: int, timeout: float = 300.0) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(json.load(resp)["choices"][0]["text"])


def timed_switch(urls: dict[str, str], to: str, figures: Figures) -> None:
    """The operator's switch, with the sleep and the wake timed apart (the same calls, in order)."""
    source, target = EngineClient(urls["Off" if to == "On" else "On"], 600), EngineClient(urls[to], 600)
    start = time.monotonic()
    source.sleep()
    figures.sleep_seconds.append(time.monotonic() - start)
    start = time.monotonic()
    target.wake()
    figures.wake_seconds.append(time.monotonic() - start)


def under_load(urls: dict[str, str], model: str, clients: int, seconds: float, figures: Figures) -> None:
    """Clients send to the serving engine; the flip drains it (no new request), switches, resumes."""
    serving = {"url": urls["Off"]}
    gate = threading.Event()
    gate.set()
    stop = threading.Event()
    lock = threading.Lock()

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            gate.wait()
            url = serving["url"]
            try:
                complete(url, model, PROMPTS[(i + n) % len(PROMPTS)], 64)
                with lock:
                    figures.load_requests += 1
            except OSError:
                with lock:
                    figures.load_failed += 1
            n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    start = time.monotonic()
    gate.clear()  # the pod leaves its Service: no new request reaches it
    plain = EngineClient(urls["Off"], 30)
    while plain.in_flight() > 0 and time.monotonic() - start < 120:
        time.sleep(0.05)
    result = switch_engines(urls, "On", model, None)
    if not result.ok:
        raise SwitchError(result.why)
    serving["url"] = urls["On"]
    figures.load_flip_seconds = time.monotonic() - start
    gate.set()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=300)


def run(args: argparse.Namespace) -> Figures:
    work = Path(tempfile.mkdtemp(prefix="standby-gpu-"))
    script = work / "standby.py"
    standby.install(str(script))
    spec = SpeculativeConfig(method="eagle3", model=args.drafter, num_speculative_tokens=args.k)
    common = {"model": args.model, "served_model_name": "model", "enable_sleep_mode": True}
    util = None if args.emulate else args.gpu_memory_utilization
    speculative = EngineArgs(
        port=args.speculative_port, speculative=spec, gpu_memory_utilization=util, **common
    )
    plain = EngineArgs(port=args.plain_port, gpu_memory_utilization=util, **common)
    env = dict(os.environ)
    if args.emulate:
        shim = work / "shim" / "vllm" / "entrypoints" / "openai"
        shim.mkdir(parents=True)
        for d in (shim, shim.parent, shim.parent.parent):
            (d / "__init__.py").touch()
        (shim / "api_server.py").write_text(SHIM)
        repo = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = os.pathsep.join(
            [str(work / "shim"), str(repo / "runtime"), env.get("PYTHONPATH", "")]
        )
    supervisor_args = standby.StandbyArgs(
        speculative=tuple(build_vllm_args(speculative)),
        plain=tuple(build_vllm_args(plain)),
        ready_file=str(work / "ready"),
        termination_log=str(work / "termination-log"),
        startup_timeout_seconds=args.startup_timeout,
    )
    log = (work / "supervisor.log").open("wb")
    proc = subprocess.Popen(
        [args.python, str(script), *standby.build_standby_args(supervisor_args)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    urls = {"On": f"http://127.0.0.1:{args.speculative_port}", "Off": f"http://127.0.0.1:{args.plain_port}"}
    figures = Figures()
    try:
        deadline = time.monotonic() + args.startup_timeout
        while not (work / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (work / "supervisor.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the supervisor did not get both engines up:\n{tail}")
            time.sleep(1)
        prompts = PROMPTS[: args.prompts]
        figures.gpu_mib["plain serving, speculative asleep"] = gpu_memory_mib(args.emulate)
        plain_out = [complete(urls["Off"], "model", p, args.max_tokens) for p in prompts]
        spec_outs: list[list[str]] = []
        for round_trip in range(3):
            timed_switch(urls, "On", figures)
            figures.gpu_mib[f"speculative serving (wake {round_trip + 1})"] = gpu_memory_mib(args.emulate)
            spec_outs.append([complete(urls["On"], "model", p, args.max_tokens) for p in prompts])
            # The operator's own check of a woken drafter (the same completions, the same counters).
            figures.acceptance.append(acceptance_length(EngineClient(urls["On"]), "model"))
            timed_switch(urls, "Off", figures)
        figures.identical = (sum(a == b for a, b in zip(plain_out, spec_outs[0], strict=True)), len(prompts))
        figures.identical_after_rewake = (
            sum(a == b for a, b in zip(spec_outs[0], spec_outs[-1], strict=True)),
            len(prompts),
        )
        under_load(urls, "model", args.clients, args.load_seconds, figures)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return figures


def table(args: argparse.Namespace, f: Figures) -> str:
    def span(values: list[float]) -> str:
        return f"{statistics.mean(values):.2f} (max {max(values):.2f})" if values else "-"

    shown = ", ".join("-" if a is None else f"{a:.2f}" for a in f.acceptance)
    rows = [
        (
            "engines",
            "emulated (two engine emulators)" if args.emulate else f"{args.model} + EAGLE-3 {args.drafter}",
        ),
        ("K", str(args.k)),
        ("fall asleep, s (level 1; mean of 6)", span(f.sleep_seconds)),
        ("wake, s (mean of 6)", span(f.wake_seconds)),
        *((f"GPU memory used, MiB: {k}", v) for k, v in f.gpu_mib.items()),
        ("greedy output identical, plain vs woken speculative", f"{f.identical[0]}/{f.identical[1]}"),
        (
            "greedy output identical, first wake vs third",
            f"{f.identical_after_rewake[0]}/{f.identical_after_rewake[1]}",
        ),
        ("acceptance length after each wake", shown),
        ("flip under load: seconds from drain to serving", f"{f.load_flip_seconds:.2f}"),
        ("flip under load: requests served / failed", f"{f.load_requests} / {f.load_failed}"),
    ]
    lines = [
        "# A Standby pod on a GPU",
        "",
        f"`python benchmarks/standby_gpu.py{' --emulate' if args.emulate else ''}` "
        f"(prompts {args.prompts}, max tokens {args.max_tokens}, clients {args.clients}).",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--drafter", default=DRAFTER)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--load-seconds", type=float, default=5.0, help="load before and after the flip")
    parser.add_argument("--plain-port", type=int, default=ENGINE_PORT)
    parser.add_argument("--speculative-port", type=int, default=STANDBY_SPECULATIVE_PORT)
    parser.add_argument("--python", default=sys.executable, help="the python that runs vLLM")
    parser.add_argument("--startup-timeout", type=int, default=1800)
    parser.add_argument("--emulate", action="store_true", help="two engine emulators instead of vLLM")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument("--out", help="write the table here too")
    args = parser.parse_args()
    text = table(args, run(args))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
