"""Names of the vLLM Prometheus metrics that specfleet depends on.

One list shared by the engine emulator (which must expose them exactly), the operator's PromQL
(which queries them) and the real-vLLM compatibility tests (which check they exist on a real server).
Counter names are given as exposed, with their `_total` suffix.
"""

from __future__ import annotations

from typing import Final

# Labels every vLLM engine metric carries.
LABEL_MODEL_NAME: Final = "model_name"
LABEL_ENGINE: Final = "engine"
# Extra label of the per-position acceptance counter ("0".."K-1").
LABEL_POSITION: Final = "position"

SPEC_DRAFTS: Final = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS: Final = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED_TOKENS: Final = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS: Final = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

REQUESTS_RUNNING: Final = "vllm:num_requests_running"
REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
NUM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
# Gauge of value 1 whose labels are the engine's CacheConfig (block_size, num_gpu_blocks,
# kv_cache_size_tokens, gpu_memory_utilization, ...) and `engine`; it has no `model_name` label.
# KV cache capacity in tokens = num_gpu_blocks x block_size.
CACHE_CONFIG_INFO: Final = "vllm:cache_config_info"
LABEL_NUM_GPU_BLOCKS: Final = "num_gpu_blocks"
LABEL_BLOCK_SIZE: Final = "block_size"
# Prefix caching, in tokens: those looked up for each new request, and those found cached.
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
# Histograms of each finished request's prompt and generated tokens (queried as _sum / _count).
REQUEST_PROMPT_TOKENS: Final = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS: Final = "vllm:request_generation_tokens"

GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
REQUEST_SUCCESS: Final = "vllm:request_success_total"

TIME_TO_FIRST_TOKEN: Final = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY: Final = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY: Final = "vllm:e2e_request_latency_seconds"
TIME_PER_OUTPUT_TOKEN: Final = "vllm:request_time_per_output_token_seconds"

# Bucket bounds (seconds) of vLLM's PrometheusStatLogger: TTFT, and every per-token latency (ITL, TPOT).
# The emulator exports them; an SLO's alerts and dashboard panel pick their `le` from them.
TIME_TO_FIRST_TOKEN_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip


def bucket_label(bound: float) -> str:
    """A bucket's `le` as vLLM (prometheus_client) writes it: `0.05`, `1.0`, `2560.0`."""
    return repr(float(bound))


def stored_bucket_label(bound: float) -> str:
    """A bucket's `le` as Prometheus 3 stores it (integral bounds lose their `.0`: `1`, `0.05`)."""
    return bucket_label(bound).removesuffix(".0")


def bucket_matcher(bound: float) -> str:
    """A PromQL matcher for one bucket, whether Prometheus kept vLLM's `le` (2.x) or normalised it (3.x)."""
    written, stored = bucket_label(bound), stored_bucket_label(bound)
    return f'le="{written}"' if written == stored else f'le=~"{stored}|{stored}[.]0"'


# Metric family name (as in `# TYPE` lines) -> Prometheus type.
SPEC_DECODE_FAMILIES: Final[dict[str, str]] = {
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}
LOAD_FAMILIES: Final[dict[str, str]] = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:cache_config_info": "gauge",
    "vllm:generation_tokens": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
}
# What the policy's memory reasoning queries (`fleet_queries`); missing ones only turn it off.
MEMORY_FAMILIES: Final[dict[str, str]] = {
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:cache_config_info": "gauge",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}
# Prefix-cache counters (the emulator exposes them; the operator does not query them yet).
PREFIX_CACHE_FAMILIES: Final[dict[str, str]] = {
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
}
# vLLM's sleep-mode gauge (vllm/v1/metrics/loggers.py, present on every engine, also without
# --enable-sleep-mode): one series per `sleep_state` label value, awake = 1 while awake,
# weights_offloaded = 1 asleep at level 1, discard_all = 1 asleep at level 2.
ENGINE_SLEEP_STATE: Final = "vllm:engine_sleep_state"
LABEL_SLEEP_STATE: Final = "sleep_state"
SLEEP_STATES: Final = ("awake", "weights_offloaded", "discard_all")
SLEEP_FAMILIES: Final[dict[str, str]] = {ENGINE_SLEEP_STATE: "gauge"}
# The labels that tell one scraped engine from another: a Standby pod's two engines share namespace and
# pod and differ in instance (address:port).
ENGINE_IDENTITY: Final = "namespace, pod, instance"


def awake_only(vector: str, selector: str) -> str:
    """`vector` (per-engine series) without the engines of `selector` asleep now: those whose
    vllm:engine_sleep_state{sleep_state="awake"} is 0. An engine without the gauge (vLLM before 0.32)
    is kept: it cannot sleep."""
    asleep = f'{ENGINE_SLEEP_STATE}{{{selector},{LABEL_SLEEP_STATE}="awake"}} == 0'
    return f"({vector} unless on ({ENGINE_IDENTITY}) ({asleep}))"


# Families whose samples carry `engine` but no `model_name` label (vLLM's info gauges).
ENGINE_ONLY_FAMILIES: Final[frozenset[str]] = frozenset({CACHE_CONFIG_INFO})
# Everything the operator queries: an engine started with speculation exposes all of these.
OPERATOR_FAMILIES: Final[dict[str, str]] = {**SPEC_DECODE_FAMILIES, **LOAD_FAMILIES}
