"""The router in front of real vLLM: the official openai client through the router, each pool a real
server (latency: EAGLE-3 speculation, batch: none), classification by header and request shape."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from tiny_models import TinyModels
from vllm_harness import LOOPBACK, SERVED_MODEL_NAME, ServerProcess, free_port, http_get

from specfleet_runtime.routing_config import PoolBackend, RoutingConfig, ShapeRules

pytestmark = pytest.mark.vllm
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def router(fleet: dict[str, ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m specfleet_runtime.router` on loopback, pools on the real servers; stopped by PID."""
    work = tmp_path_factory.mktemp("router")
    config = RoutingConfig(
        served_model_name=SERVED_MODEL_NAME,
        pools={
            "latency": PoolBackend(static_urls=(fleet["eagle3"].base_url,)),
            "batch": PoolBackend(static_urls=(fleet["off"].base_url,)),
        },
        shape=ShapeRules(batch_if_n_at_least=2),
    )
    (work / "routing.json").write_text(config.to_json())
    port = free_port()
    log = (work / "router.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specfleet_runtime.router",
            "--config-file",
            str(work / "routing.json"),
            "--host",
            LOOPBACK,
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if http_get(f"{url}/readyz", timeout=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail(f"router not ready: {Path(work / 'router.log').read_text()[-3000:]}")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)


def test_chat_through_router_to_real_vllm_by_pool(router: str, tiny: TinyModels) -> None:
    tok = tiny.classes["accept"][0]
    api = _client(router)
    answers = {}
    for pool in ("latency", "batch"):
        raw = api.chat.completions.with_raw_response.create(
            model=SERVED_MODEL_NAME,
            messages=[{"role": "user", "content": tiny.prompt(tok)}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_headers={"x-specfleet-pool": pool},
        )
        assert raw.headers["x-specfleet-served-pool"] == pool
        answers[pool] = raw.parse().choices[0].message.content
    # Greedy output is the same whether the speculating or the plain pool served it.
    assert answers["latency"]
    assert answers["latency"] == answers["batch"]


def test_streamed_completion_through_router_is_the_greedy_output(router: str, tiny: TinyModels) -> None:
    tok = tiny.classes["partial2"][0]
    stream = _client(router).completions.create(
        model=SERVED_MODEL_NAME, prompt=tiny.prompt(tok), max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text.split() == tiny.text(tiny.greedy(tok, MAX_TOKENS)).split()


def test_request_shape_sends_n_completions_to_batch(router: str, tiny: TinyModels) -> None:
    raw = _client(router).completions.with_raw_response.create(
        model=SERVED_MODEL_NAME,
        prompt=tiny.prompt(tiny.classes["accept"][0]),
        max_tokens=4,
        n=2,
        temperature=1.0,  # vLLM refuses n > 1 with greedy sampling
    )
    assert raw.headers["x-specfleet-served-pool"] == "batch"
    assert len(raw.parse().choices) == 2


def test_router_errors_in_openai_format_before_reaching_vllm(router: str) -> None:
    api = _client(router)
    with pytest.raises(openai.NotFoundError) as err:
        api.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert err.value.body is not None
    status, body = http_get(f"{router}/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == [SERVED_MODEL_NAME]
