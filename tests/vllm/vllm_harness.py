"""Configuration, process and metrics helpers of the real-vLLM tier (for `conftest.py` and the tests).

Servers are started as subprocesses in their own session (process group) so that a stop reaches the
engine-core and worker processes vLLM forks, by the group id of the process we started and nothing
else. Metrics are read from the Prometheus exposition with `prometheus_client`'s own parser.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tiny_models import SpecStats, TinyModels

from specfleet_runtime import vllm_metrics as vm
from specfleet_runtime.vllm_args import DynamicSpeculationRange, EngineArgs, SpeculativeConfig
from support.ports import free_port

LOOPBACK = "127.0.0.1"
# The label a histogram adds per bucket; not one of the metric's own labels.
BUCKET_LABEL = "le"
K = 3  # num_speculative_tokens of the speculating servers
MAX_NUM_SEQS = 16
MAX_MODEL_LEN = 256
SERVED_MODEL_NAME = "tiny-llama"
# Flags the tests add after the operator's: loopback only, the tiny model's dtype, and no
# torch.compile warm-up (minutes on CPU; it changes nothing the tests check).
TEST_FLAGS = ("--host", LOOPBACK, "--dtype", "float32", "--enforce-eager")


def server_env() -> dict[str, str]:
    """Environment of a vLLM server: offline, small KV cache, no telemetry, one thread per server."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    cache = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    env.update(
        HF_HUB_OFFLINE="1",  # nothing may be downloaded: the models are local folders
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_NO_USAGE_STATS="1",  # vLLM otherwise reports usage to an outside host
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; the default takes a large share of RAM per server
        # Three servers share two cores: no pinning (all would pin core 0) and no OpenMP spinning.
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS="1",
        VLLM_CACHE_ROOT=str(cache / "vllm-cache"),
    )
    return env


def engine_args(model: Path, speculative: SpeculativeConfig | None) -> EngineArgs:
    """What the operator would render for a pool of this model (on a free port), plus TEST_FLAGS."""
    return EngineArgs(
        model=str(model),
        served_model_name=SERVED_MODEL_NAME,
        port=free_port(),
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        speculative=speculative,
        extra_args=TEST_FLAGS,
    )


def fleet_specs(tiny: TinyModels) -> dict[str, SpeculativeConfig | None]:
    """The speculation settings of the tier's four servers."""
    return {
        "eagle3": SpeculativeConfig(method="eagle3", model=str(tiny.eagle3), num_speculative_tokens=K),
        # EAGLE-3 (always a full draft of the step's K) under the kind of schedule the policy renders:
        # K at batch size 1, one draft token above (two draft lengths, as policy/predict/dynamic_sd.py unmixes).
        "eagle3-dynamic": SpeculativeConfig(
            method="eagle3",
            model=str(tiny.eagle3),
            num_speculative_tokens=K,
            dynamic_schedule=(
                DynamicSpeculationRange(1, 1, K),
                DynamicSpeculationRange(2, MAX_NUM_SEQS, 1),
            ),
        ),
        "off": None,
        "ngram": SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=K,
            prompt_lookup_min=2,
            prompt_lookup_max=4,
            # Dynamic SD: K at batch size 1, a single draft token for any larger batch.
            dynamic_schedule=(
                DynamicSpeculationRange(1, 1, K),
                DynamicSpeculationRange(2, MAX_NUM_SEQS, 1),
            ),
        ),
    }


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """Status and body of a GET; connection errors raise, HTTP errors return their status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@dataclass
class ServerProcess:
    """One OpenAI-compatible server (real vLLM or the emulator) started by the tests."""

    name: str
    engine: EngineArgs
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    started_at: float = field(default_factory=time.monotonic)
    healthy_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.engine.port}"

    @property
    def served_model_name(self) -> str:
        return self.engine.served_model_name

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as err:
            return f"(no log: {err})"

    def describe_failure(self, what: str) -> str:
        code = self.process.poll()
        state = f"exited with {code}" if code is not None else f"still running as pid {self.pid}"
        return (
            f"{self.name}: {what} ({state}); command: {' '.join(self.argv)}\n"
            f"log {self.log_path}, last lines:\n{self.log_tail()}"
        )

    def poll_healthy(self) -> bool:
        """True once /health answers 200; raises RuntimeError if the process has died."""
        if self.process.poll() is not None:
            raise RuntimeError(self.describe_failure("died during start-up"))
        try:
            status, _ = http_get(f"{self.base_url}/health", timeout=5)
        except OSError:
            return False  # the port opens only once the model has loaded
        if status == 200 and self.healthy_after_s is None:
            self.healthy_after_s = time.monotonic() - self.started_at
        return status == 200

    def metrics_text(self) -> str:
        status, body = http_get(f"{self.base_url}/metrics")
        if status != 200:
            raise RuntimeError(f"{self.name}: GET /metrics answered {status}")
        return body

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM our process group (vLLM shuts its children down), SIGKILL it after `grace_s`."""
        if self.process.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        # Children can outlive the leader briefly: make sure nothing of this group is left.
        _signal_group(self.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pgid, sig)


def start_server(
    name: str,
    command: Sequence[str],
    engine: EngineArgs,
    args: Sequence[str],
    env: Mapping[str, str],
    log_dir: Path,
) -> ServerProcess:
    """Start `command + args` (args from `build_vllm_args`) in a new session, logging to a file."""
    argv = [*command, *args]
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,  # its own process group: stopped as one, never by name
        )
    (log_dir / f"{name}.pid").write_text(f"{process.pid}\n")
    return ServerProcess(name=name, engine=engine, argv=argv, log_path=log_path, process=process)


def wait_all_healthy(servers: Sequence[ServerProcess], timeout_s: float) -> None:
    """Wait until every server answers /health; RuntimeError naming the first that cannot."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not s.poll_healthy()]
        if pending and time.monotonic() > deadline:
            raise RuntimeError(pending[0].describe_failure(f"not healthy after {timeout_s:.0f} s"))
        if pending:
            time.sleep(1.0)


# ----------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One metric family as exposed: its type, label names and samples."""

    name: str
    type: str
    samples: tuple[Sample, ...]

    @property
    def label_names(self) -> frozenset[str]:
        """The metric's own labels (a histogram's `le` excluded)."""
        return frozenset(k for s in self.samples for k in s.labels if k != BUCKET_LABEL)


def parse_families(text: str) -> dict[str, Family]:
    """Families by name as `prometheus_client` parses them (counters lose their `_total`)."""
    return {f.name: Family(f.name, f.type, tuple(f.samples)) for f in text_string_to_metric_families(text)}


def counter_value(family: Family, **labels: str) -> float:
    """The `_total` sample of a counter family with exactly these label values (0 if absent)."""
    for sample in family.samples:
        if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    return 0.0


def spec_stats(text: str, model_name: str = SERVED_MODEL_NAME, k: int = K) -> SpecStats:
    """vLLM's speculative-decoding counters for one served model, as a `SpecStats`."""
    families = parse_families(text)

    def value(metric: str, **extra: str) -> int:
        family = families.get(metric.removesuffix("_total"))
        if family is None:
            raise AssertionError(f"{metric} is not exposed")
        return round(counter_value(family, model_name=model_name, **extra))

    return SpecStats(
        drafts=value(vm.SPEC_DRAFTS),
        draft_tokens=value(vm.SPEC_DRAFT_TOKENS),
        accepted=value(vm.SPEC_ACCEPTED_TOKENS),
        accepted_per_pos=tuple(
            value(vm.SPEC_ACCEPTED_PER_POS, **{vm.LABEL_POSITION: str(i)}) for i in range(k)
        ),
    )


_ABS_PATH = re.compile(r"(?<![\w.-])/(?:[\w.+-]+/)*[\w.+-]+")


def sanitize_exposition(text: str) -> str:
    """A /metrics text fit to commit: absolute paths and `_created` timestamps neutralized."""
    out = []
    for raw in text.splitlines():
        line = _ABS_PATH.sub("<path>", raw)
        if not line.startswith("#") and re.match(r"^[\w:]+_created[{ ]", line):
            line = line.rsplit(" ", 1)[0] + " 0.0"  # wall-clock start times: noise in a fixture
        out.append(line)
    return "\n".join(out) + "\n"
