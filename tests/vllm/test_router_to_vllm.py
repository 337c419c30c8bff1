"""The router in front of real vLLM: the official openai client through the router, each pool a real
server (latency: EAGLE-3 speculation, batch: none), classification by header and request shape."""

from __future__ import annotations

import http.client
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
from vllm_harness import LOOPBACK, SERVED_MODEL_NAME, ServerProcess, http_get

from specfleet_runtime.routing_config import PoolBackend, RoutingConfig, ShapeRules
from support.ports import free_port

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


# ---- what the router lets through ---------------------------------------------------------------

# Real vLLM endpoints outside the two routes the router serves (GET ones, then POST ones).
ENGINE_GET = ["/metrics", "/version", "/server_info", "/load", "/is_paused", "/ping", "/health"]
# (/tokenize and /detokenize are forwarded on purpose: vLLM's benchmark client asks for them.)
ENGINE_POST = ["/pause", "/reset_prefix_cache", "/v1/load_lora_adapter", "/v1/responses"]


def _spellings(path: str) -> list[str]:
    """Ways to reach `path` from under /v1 that an engine's own path handling would resolve."""
    tail = path.lstrip("/")
    return [
        f"/v1/../{tail}",
        f"/v1/%2e%2e/{tail}",
        f"/v1/%2E%2E/{tail}",
        f"/v1/..%2f{tail}",
        f"/v1%2f..%2f{tail}",
        f"/v1/completions/../../{tail}",
        f"/v1/./../{tail}",
        f"//{tail}",
        f"/{tail}",
    ]


def _raw(url: str, method: str, target: str, body: bytes = b"") -> tuple[int, str, bytes]:
    """Status, content type and body of a request sent with its target exactly as written."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, target, body=body or None, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def test_vllm_endpoints_outside_v1_are_unreachable_through_the_router(
    router: str, fleet: dict[str, ServerProcess]
) -> None:
    engines = [s.base_url for s in fleet.values()]
    # The engines serve these (so each check below could fail) ...
    status, _, body = _raw(engines[0], "GET", "/metrics")
    assert status == 200
    assert b"vllm:" in body
    assert _raw(engines[0], "GET", "/version")[0] == 200
    # ... and none of them answers through the router, however the path is spelled.
    probes = [("GET", p) for p in ENGINE_GET] + [("POST", p) for p in ENGINE_POST]
    for method, path in probes:
        for target in _spellings(path):
            status, content_type, body = _raw(router, method, target, b"{}" if method == "POST" else b"")
            assert b"vllm:" not in body, target
            assert b'"version"' not in body, target
            if path == "/metrics" and method == "GET":
                assert status == 200, target  # the router's own metrics under the normalized path
                assert b"specfleet_router_" in body
                continue
            assert status == 404, (method, target, status, body[:200])
            assert content_type.startswith("application/json")
            error = json.loads(body)["error"]
            assert error["code"] == "not_found"
    # The engine was not paused by any of the POSTs above.
    for engine in engines:
        status, _, body = _raw(engine, "GET", "/is_paused")
        if status == 200 and b"true" in body:
            _raw(engine, "POST", "/resume")
            pytest.fail(f"{engine} was paused through the router")
    # A dot-spelled inference path still gets the router's body checks before any engine sees it.
    bad = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "x", "max_tokens": "5"}).encode()
    status, _, body = _raw(router, "POST", "/v1/./completions", bad)
    assert status == 400
    assert json.loads(body)["error"]["param"] == "max_tokens"


# ---- the emulator answers bad input as vLLM does ---------------------------------------------------


def _bad_inputs() -> dict[str, bytes]:
    model = json.dumps(SERVED_MODEL_NAME)
    return {
        "not-json": b"{not json",
        "not-an-object": b"[1, 2, 3]",
        "deep-nesting": b'{"model": ' + model.encode() + b', "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "int-past-digit-limit": b'{"model": ' + model.encode() + b', "prompt": "x", "max_tokens": '
        + b"9" * 5000 + b"}",
        "huge-max-tokens": json.dumps({"model": SERVED_MODEL_NAME, "prompt": "x", "max_tokens": 10**30}).encode(),
        "huge-n": json.dumps({"model": SERVED_MODEL_NAME, "prompt": "x", "max_tokens": 2, "n": 10**30}).encode(),
        "huge-token-id": json.dumps({"model": SERVED_MODEL_NAME, "prompt": [10**30], "max_tokens": 2}).encode(),
        "two-mib-prompt": json.dumps({"model": SERVED_MODEL_NAME, "prompt": "x " * (1024 * 1024)}).encode(),
    }  # fmt: skip


def test_emulator_answers_bad_input_as_vllm_does(off_server: ServerProcess) -> None:
    port = free_port()
    emulator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specfleet_runtime.emulator",
            "--model",
            "m",
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--max-model-len",
            "256",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    emu = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http_get(f"{emu}/health", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "emulator did not come up"
            time.sleep(0.1)
        seen = {}
        for name, body in _bad_inputs().items():
            real = _raw(off_server.base_url, "POST", "/v1/completions", body)
            fake = _raw(emu, "POST", "/v1/completions", body)
            seen[name] = (real[0], fake[0])
            assert 400 <= real[0] < 500, (name, real[0], real[2][:300])
            assert fake[0] == real[0], (name, real[0], fake[0], real[2][:300], fake[2][:300])
            docs = []
            for who, (_, content_type, text) in (("vLLM", real), ("emulator", fake)):
                assert content_type.startswith("application/json"), (name, who, content_type)
                docs.append(json.loads(text))
            # The same shape: OpenAI's error object, or FastAPI's {"detail": ...} where vLLM's web
            # framework refuses the body before vLLM sees it (the router rewrites that one).
            assert set(docs[0]) == set(docs[1]), (name, real[2][:300], fake[2][:300])
            if "detail" in docs[0]:
                assert docs[1] == docs[0], (name, real[2][:300], fake[2][:300])
            else:
                assert docs[0]["error"]["code"] == docs[1]["error"]["code"] == real[0], name
        print("vLLM vs emulator on bad input:", seen, file=sys.stderr)
        # Both still serve a normal request afterwards.
        ok = json.dumps({"model": SERVED_MODEL_NAME, "prompt": "x", "max_tokens": 2}).encode()
        assert _raw(off_server.base_url, "POST", "/v1/completions", ok)[0] == 200
        assert _raw(emu, "POST", "/v1/completions", ok)[0] == 200
    finally:
        emulator.terminate()
        emulator.wait(10)
