"""The emulated engine's Prometheus metrics: vLLM's names, types, labels and buckets.

Each engine has its own `CollectorRegistry`, so several emulators can run in one process (tests).
As in vLLM, the speculative-decoding counters exist only on an engine started with speculation, the
per-position counter has one series per position 0..num_speculative_tokens-1, and the request
counter has one series per finish reason from the start. `vllm:cache_config_info` carries vLLM's
CacheConfig as labels (and `engine`, no `model_name`), value 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specfleet_runtime import vllm_metrics as vm

if TYPE_CHECKING:
    from specfleet_runtime.emulator.config import EmulatorConfig

# vLLM's FinishReason strings (vllm/v1/engine/__init__.py), each pre-created on request_success.
FINISH_REASONS: Final = ("stop", "length", "abort", "error", "repetition")
ENGINE_INDEX: Final = "0"
METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

# Bucket boundaries copied from vLLM's PrometheusStatLogger (the latency ones shared with the operator).
_REQUEST_LATENCY_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


# The labels of vLLM 0.32.0's vllm:cache_config_info (CacheConfig.metrics_info(), as in
# tests/vllm/data/vllm-0.32.0-metrics.txt) at their defaults; `cache_config_labels` sets the cache's size.
_CACHE_CONFIG_DEFAULTS: Final[dict[str, str]] = {
    "_block_size_resolved": "True",
    "block_size": "16",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "effective_attention_block_size": "16",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.9",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_cache_max_concurrency": "None",
    "kv_cache_memory_bytes": "None",
    "kv_cache_size_tokens": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "num_gpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def cache_config_labels(config: EmulatorConfig) -> dict[str, str]:
    """vllm:cache_config_info's labels (without `engine`) for an engine with `config`'s KV cache."""
    blocks = config.num_gpu_blocks
    tokens = blocks * config.block_size
    return {
        **_CACHE_CONFIG_DEFAULTS,
        "block_size": str(config.block_size),
        "effective_attention_block_size": str(config.block_size),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "num_gpu_blocks": str(blocks),
        "kv_cache_size_tokens": str(tokens),
        # As vLLM: how many requests of max_model_len the cache holds at once.
        "kv_cache_max_concurrency": str(round(tokens / config.max_model_len, 2)),
    }


def _family(exposed_name: str) -> str:
    """prometheus_client takes a counter's name without `_total` and appends it when exposing."""
    return exposed_name.removesuffix("_total")


class EngineMetrics:
    """The metric children of one engine, already bound to its `model_name` and `engine` labels."""

    def __init__(self, served_model_name: str, num_speculative_tokens: int | None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = [vm.LABEL_MODEL_NAME, vm.LABEL_ENGINE]
        values = (served_model_name, ENGINE_INDEX)
        r = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(_family(name), doc, labels, registry=r).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets).labels(*values)

        self.spec_enabled = num_speculative_tokens is not None
        if num_speculative_tokens is not None:
            self.spec_drafts = counter(vm.SPEC_DRAFTS, "Number of spec decoding drafts.")
            self.spec_draft_tokens = counter(vm.SPEC_DRAFT_TOKENS, "Number of draft tokens.")
            self.spec_accepted_tokens = counter(vm.SPEC_ACCEPTED_TOKENS, "Number of accepted tokens.")
            per_pos = Counter(
                _family(vm.SPEC_ACCEPTED_PER_POS),
                "Accepted tokens per draft position.",
                [*labels, vm.LABEL_POSITION],
                registry=r,
            )
            self.spec_accepted_per_pos = [
                per_pos.labels(*values, str(pos)) for pos in range(num_speculative_tokens)
            ]

        self.running = gauge(vm.REQUESTS_RUNNING, "Number of requests in model execution batches.")
        self.waiting = gauge(vm.REQUESTS_WAITING, "Number of requests waiting to be processed.")
        self.kv_cache_usage = gauge(vm.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.")
        sleep_state = Gauge(
            vm.ENGINE_SLEEP_STATE,
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*labels, vm.LABEL_SLEEP_STATE],
            registry=r,
        )
        self.sleep_state = {state: sleep_state.labels(*values, state) for state in vm.SLEEP_STATES}
        self.record_sleep_state(asleep=False, level=0)
        self.num_preemptions = counter(vm.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.")

        # In tokens, as vLLM V1 counts them (PrefixCacheStats): queries = the tokens of each new
        # request looked up at admission, hits = those found cached (a preempted request's
        # recomputation is not counted). Present, at 0, also with prefix caching off.
        self.prefix_cache_queries = counter(
            vm.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_cache_hits = counter(
            vm.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens."
        )

        self.prompt_tokens = counter(vm.PROMPT_TOKENS, "Number of prefill tokens processed.")
        self.generation_tokens = counter(vm.GENERATION_TOKENS, "Number of generation tokens processed.")
        success = Counter(
            _family(vm.REQUEST_SUCCESS),
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.request_success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}

        self.ttft = histogram(
            vm.TIME_TO_FIRST_TOKEN,
            "Histogram of time to first token in seconds.",
            vm.TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.itl = histogram(
            vm.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", vm.TOKEN_LATENCY_BUCKETS
        )
        self.e2e = histogram(
            vm.E2E_REQUEST_LATENCY,
            "Histogram of e2e request latency in seconds.",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            vm.TIME_PER_OUTPUT_TOKEN,
            "Histogram of time_per_output_token_seconds per request.",
            vm.TOKEN_LATENCY_BUCKETS,
        )

    def set_cache_config(self, labels: Mapping[str, str]) -> None:
        """Export vllm:cache_config_info with `labels` (plus `engine`), value 1, as vLLM does at start."""
        values = {**labels, vm.LABEL_ENGINE: ENGINE_INDEX}
        info = Gauge(
            vm.CACHE_CONFIG_INFO,
            "Information of the LLMEngine CacheConfig",
            list(values),
            registry=self.registry,
        )
        info.labels(**values).set(1)

    def exposition(self) -> bytes:
        """The text exposition a `GET /metrics` returns."""
        return generate_latest(self.registry)

    def record_sleep_state(self, *, asleep: bool, level: int) -> None:
        """Set vllm:engine_sleep_state as vLLM's PrometheusStatLogger.record_sleep_state(sleep, level)."""
        self.sleep_state["awake"].set(0 if asleep else 1)
        self.sleep_state["weights_offloaded"].set(1 if asleep and level == 1 else 0)
        self.sleep_state["discard_all"].set(1 if asleep and level == 2 else 0)
