"""The emulator's HTTP server: vLLM's OpenAI-compatible endpoints in front of an `Engine`.

Endpoints, as vLLM serves them:
    GET  /health                 200 while the step loop runs, 503 otherwise
    GET  /version                {"version": "<vLLM version>"}
    GET  /v1/models              the served model
    GET  /metrics                Prometheus exposition (vLLM names, see metrics.py)
    POST /v1/completions         prompt(s) -> text; SSE when "stream": true
    POST /v1/chat/completions    messages -> message; SSE when "stream": true
    POST /tokenize               prompt or messages -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize             tokens -> {"prompt"}  (the emulator's own tokenizer: tokenizer.py)

vLLM's sleep mode, only with VLLM_SERVER_DEV_MODE=1 in the environment (`server_dev_mode`), 404
otherwise; what they do, and where the emulator departs from vLLM, is in sleep.py:
    POST /sleep?level=1&mode=abort   200, empty body; 409 while requests are in flight (unless mode=wait)
    POST /wake_up[?tags=weights&tags=kv_cache]   200, empty body
    GET  /is_sleeping            {"is_sleeping": bool}
While asleep, generation requests are answered 503.

Emulator-only endpoints, to steer a test or a sandbox:
    GET  /admin/state            load, KV cache, preemptions, K of the last step, acceptance, switches,
                                 sleep mode (phase, level, asleep tags, host bytes, transitions)
    GET  /admin/acceptance       {"perPosition": [...]}
    POST /admin/acceptance       {"perPosition": [0.7, 0.4, ...]}   content shift, from the next step
    POST /admin/losslessness     {"broken": true|false}             make speculation lossy (or not)

Bad input never crashes the server: it is answered with OpenAI's error body
{"error": {"message", "type", "param", "code"}} and status 400 (malformed JSON, missing or invalid
fields, too long a request) or 404 (unknown model).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from specfleet_runtime.emulator.config import EMULATED_VLLM_VERSION, EmulatorConfig
from specfleet_runtime.emulator.engine import (
    Completion,
    Engine,
    EngineDeadError,
    EnginePausedError,
    EngineRequest,
    StepOutput,
)
from specfleet_runtime.emulator.metrics import METRICS_CONTENT_TYPE
from specfleet_runtime.emulator.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    new_id,
    now_s,
    usage,
    validation_error,
)
from specfleet_runtime.emulator.sleep import DEFAULT_PAUSE_MODE, SleepConflictError, SleepMode
from specfleet_runtime.emulator.text import Prompt
from specfleet_runtime.emulator.tokenizer import detokenize, tokenize

log = logging.getLogger(__name__)


class FastApiError(Exception):
    """An error vLLM's web framework answers itself, as `{"detail": ...}` rather than OpenAI's shape."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


ENGINE_KEY = web.AppKey("engine", Engine)
SLEEP_KEY = web.AppKey("sleep", SleepMode)
MAX_BODY_BYTES = 256 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Kind = Literal["completion", "chat"]


def create_app(config: EmulatorConfig) -> web.Application:
    """The emulator as an aiohttp application; its engine starts and stops with the app."""
    # vLLM (uvicorn + FastAPI) sets no body limit; this one is far above what the router forwards.
    app = web.Application(middlewares=[_errors_as_json], client_max_size=MAX_BODY_BYTES)
    engine = Engine(config)
    app[ENGINE_KEY] = engine
    app[SLEEP_KEY] = SleepMode(engine)

    async def start_engine(_: web.Application) -> None:
        await engine.start()

    async def stop_engine(_: web.Application) -> None:
        await engine.stop()

    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    if config.server_dev_mode:  # as vLLM's sleep router: attached only with VLLM_SERVER_DEV_MODE
        app.router.add_post("/sleep", _sleep)
        app.router.add_post("/wake_up", _wake_up)
        app.router.add_get("/is_sleeping", _is_sleeping)
    app.router.add_get("/admin/state", _admin_state)
    app.router.add_get("/admin/acceptance", _admin_get_acceptance)
    app.router.add_post("/admin/acceptance", _admin_set_acceptance)
    app.router.add_post("/admin/losslessness", _admin_losslessness)
    return app


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return web.json_response(err.body(), status=err.status)
    except FastApiError as err:
        return web.json_response({"detail": err.detail}, status=err.status)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return web.json_response(ApiError(err.status, err.reason).body(), status=err.status)
    except EngineDeadError as err:
        return web.json_response(ApiError(500, f"engine is dead: {err}").body(), status=500)
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return web.json_response(ApiError(500, "internal error").body(), status=500)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read())
    except json.JSONDecodeError as err:
        raise ApiError(400, f"malformed JSON body: {err}") from None
    except (ValueError, RecursionError):
        # Bad UTF-8, integers past Python's digit limit, nesting too deep: FastAPI (so vLLM) answers
        # these 400 in its own shape, not OpenAI's (tests/vllm compares the two).
        raise FastApiError(400, "There was an error parsing the body") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _engine(request: web.Request) -> Engine:
    return request.app[ENGINE_KEY]


# --------------------------------------------------------------------------------------------------
# Plain endpoints


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _engine(request).healthy else 503)


async def _version(_: web.Request) -> web.Response:
    return web.json_response({"version": EMULATED_VLLM_VERSION})


async def _models(request: web.Request) -> web.Response:
    cfg = _engine(request).config
    model = {
        "id": cfg.served_model_name,
        "object": "model",
        "created": now_s(),
        "owned_by": "vllm",
        "root": cfg.model or cfg.served_model_name,
        "parent": None,
        "max_model_len": cfg.max_model_len,
    }
    return web.json_response({"object": "list", "data": [model]})


async def _metrics(request: web.Request) -> web.Response:
    body = _engine(request).metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


# --------------------------------------------------------------------------------------------------
# Tokenizer


async def _tokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    try:
        req: TokenizeChatRequest | TokenizeCompletionRequest
        if "messages" in body:
            req = TokenizeChatRequest.model_validate(body)
        else:
            req = TokenizeCompletionRequest.model_validate(body)
    except ValidationError as err:
        raise validation_error(err) from None
    engine = _engine(request)
    _check_model(engine, req.model)
    text = req.rendered() if isinstance(req, TokenizeChatRequest) else req.prompt
    ids, strs = tokenize(text)
    return web.json_response(
        {
            "count": len(ids),
            "max_model_len": engine.config.max_model_len,
            "tokens": ids,
            "token_strs": strs if req.return_token_strs else None,
        }
    )


async def _detokenize(request: web.Request) -> web.Response:
    body = await _json_body(request)
    try:
        req = DetokenizeRequest.model_validate(body)
    except ValidationError as err:
        raise validation_error(err) from None
    _check_model(_engine(request), req.model)
    try:
        return web.json_response({"prompt": detokenize(req.tokens)})
    except ValueError as err:
        raise ApiError(400, str(err), param="tokens") from None


# --------------------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True)
class _Job:
    """One choice of a response: which engine prompt, how many tokens at most."""

    index: int
    prompt: Prompt
    max_tokens: int


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    try:
        req = CompletionRequest.model_validate(body)
    except ValidationError as err:
        raise validation_error(err) from None
    engine = _engine(request)
    _check_model(engine, req.model)
    prompts = req.prompts()
    jobs = _jobs(engine.config, prompts, req.n, req.max_tokens)
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    if req.stream:
        return await _stream(request, engine, "completion", jobs, req.ignore_eos, include_usage, prompts)
    return await _respond(engine, "completion", jobs, req.ignore_eos, prompts)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as err:
        raise validation_error(err) from None
    engine = _engine(request)
    _check_model(engine, req.model)
    prompts = [req.prompt()]
    jobs = _jobs(engine.config, prompts, req.n, req.requested_max_tokens())
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    if req.stream:
        return await _stream(request, engine, "chat", jobs, req.ignore_eos, include_usage, prompts)
    return await _respond(engine, "chat", jobs, req.ignore_eos, prompts)


def _check_model(engine: Engine, model: str | None) -> None:
    if model is not None and model != engine.config.served_model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")
    if not engine.healthy:
        raise ApiError(503, "the engine is not running")


def _jobs(config: EmulatorConfig, prompts: list[Prompt], n: int, max_tokens: int | None) -> list[_Job]:
    """The choices to generate, after vLLM's context-length checks."""
    jobs: list[_Job] = []
    for i, prompt in enumerate(prompts):
        limit = config.max_model_len - prompt.num_tokens
        wanted = limit if max_tokens is None else max_tokens
        if wanted > limit or limit < 1:
            raise ApiError(
                400,
                f"This model's maximum context length is {config.max_model_len} tokens. However, you "
                f"requested {prompt.num_tokens + wanted} tokens ({prompt.num_tokens} in the messages, "
                f"{wanted} in the completion). Please reduce the length of the messages or completion.",
                param="max_tokens" if max_tokens is not None else "messages",
            )
        jobs.extend(_Job(i * n + j, prompt, wanted) for j in range(n))
    return jobs


def _choice(kind: Kind, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    if kind == "completion":
        return {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def _delta(kind: Kind, index: int, text: str | None, finish_reason: str | None) -> dict[str, Any]:
    """A streamed choice; for chat, text None means the opening delta that names the role."""
    if kind == "completion":
        return _choice(kind, index, text or "", finish_reason)
    delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _envelope(kind: Kind, rid: str, model: str, *, chunk: bool) -> dict[str, Any]:
    obj = {"completion": "text_completion", "chat": "chat.completion.chunk" if chunk else "chat.completion"}
    return {"id": rid, "object": obj[kind], "created": now_s(), "model": model}


def _submit_all(
    engine: Engine,
    jobs: list[_Job],
    ignore_eos: bool,
    on_output: Callable[[int], Callable[[StepOutput], None]] | None = None,
) -> list[EngineRequest]:
    try:
        return [
            engine.submit(
                job.prompt,
                job.max_tokens,
                ignore_eos=ignore_eos,
                on_output=None if on_output is None else on_output(job.index),
            )
            for job in jobs
        ]
    except EngineDeadError:
        raise ApiError(503, "the engine is not running") from None
    except EnginePausedError as err:  # asleep: vLLM would queue it until the wake (sleep.py)
        raise ApiError(503, str(err)) from None


async def _respond(
    engine: Engine, kind: Kind, jobs: list[_Job], ignore_eos: bool, prompts: list[Prompt]
) -> web.Response:
    reqs = _submit_all(engine, jobs, ignore_eos)
    try:
        completions: list[Completion] = await asyncio.gather(*(r.finished for r in reqs))
    finally:  # the client went away or the engine died: stop generating for it
        for r in reqs:
            engine.abort(r)
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    body = _envelope(kind, new_id(prefix), engine.config.served_model_name, chunk=False)
    body["choices"] = [
        _choice(kind, job.index, c.text, c.finish_reason) for job, c in zip(jobs, completions, strict=True)
    ]
    body["usage"] = usage(sum(p.num_tokens for p in prompts), sum(c.completion_tokens for c in completions))
    return web.json_response(body)


async def _stream(
    request: web.Request,
    engine: Engine,
    kind: Kind,
    jobs: list[_Job],
    ignore_eos: bool,
    include_usage: bool,
    prompts: list[Prompt],
) -> web.StreamResponse:
    """Server-sent events as vLLM frames them: for chat, the role deltas with the first engine output;
    one chunk per engine step and choice; then usage (if asked, last, with no choices) and [DONE]."""
    # Step outputs, and a None once a request's future resolved (the end, also on abort or crash).
    events: asyncio.Queue[tuple[int, StepOutput | None]] = asyncio.Queue()

    def on_output(index: int) -> Callable[[StepOutput], None]:
        return lambda out: events.put_nowait((index, out))

    reqs = _submit_all(engine, jobs, ignore_eos, on_output)

    def on_end(index: int) -> Callable[[asyncio.Future[Completion]], None]:
        return lambda _: events.put_nowait((index, None))

    for job, r in zip(jobs, reqs, strict=True):
        r.finished.add_done_callback(on_end(job.index))

    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    rid = new_id(prefix)
    model = engine.config.served_model_name
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    async def send(data: dict[str, Any] | str) -> None:
        text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        await response.write(f"data: {text}\n\n".encode())

    def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {**_envelope(kind, rid, model, chunk=True), "choices": choices}

    by_index = {job.index: r for job, r in zip(jobs, reqs, strict=True)}
    finished: set[int] = set()
    # Chat opens with one role delta per choice, sent (as vLLM does) with the first engine output, not
    # when the response starts: a client takes the first chunk with choices as its first token (TTFT).
    opened = kind != "chat"

    async def open_choices() -> None:
        nonlocal opened
        if not opened:
            opened = True
            for job in jobs:
                await send(chunk([_delta(kind, job.index, None, None)]))

    try:
        await response.prepare(request)
        remaining = len(jobs)
        while remaining:
            index, out = await events.get()
            if out is not None:
                await open_choices()
                if out.finish_reason is not None:
                    finished.add(index)
                await send(chunk([_delta(kind, index, "".join(out.tokens), out.finish_reason)]))
                continue
            remaining -= 1
            if index in finished:
                continue
            # Ended without a final step: the engine crashed (an error event, as vLLM sends one
            # mid-stream) or the request was aborted.
            fut = by_index[index].finished
            if fut.exception() is not None:
                await send(ApiError(500, f"engine is dead: {fut.exception()}").body())
            else:
                await open_choices()
                await send(chunk([_delta(kind, index, "", fut.result().finish_reason)]))
        if include_usage:
            generated = sum(len(r.tokens) for r in reqs)
            await send(
                {
                    **_envelope(kind, rid, model, chunk=True),
                    "choices": [],
                    "usage": usage(sum(p.num_tokens for p in prompts), generated),
                }
            )
        await send("[DONE]")
    except ConnectionResetError:  # the client went away: nothing left to answer
        log.debug("client of %s went away", rid)
    finally:
        for r in reqs:
            engine.abort(r)
    return response


# --------------------------------------------------------------------------------------------------
# Sleep mode (vLLM's dev-mode routes; see sleep.py)


async def _sleep(request: web.Request) -> web.Response:
    try:
        level = int(request.query.get("level", "1"))
        await request.app[SLEEP_KEY].sleep(level, request.query.get("mode", DEFAULT_PAUSE_MODE))
    except ValueError as err:  # vLLM's exception handler answers a ValueError 400
        raise ApiError(400, str(err)) from None
    except SleepConflictError as err:
        raise ApiError(409, str(err)) from None
    return web.Response(status=200)


async def _wake_up(request: web.Request) -> web.Response:
    tags = request.query.getall("tags", [])
    await request.app[SLEEP_KEY].wake_up(tags or None)  # no tags: wake everything, as vLLM
    return web.Response(status=200)


async def _is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": request.app[SLEEP_KEY].is_sleeping})


# --------------------------------------------------------------------------------------------------
# Admin


class _AcceptanceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    perPosition: list[float]  # the JSON field name


class _LosslessnessBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    broken: StrictBool


async def _admin_state(request: web.Request) -> web.Response:
    engine = _engine(request)
    spec = engine.config.speculative
    s = engine.stats
    return web.json_response(
        {
            "servedModelName": engine.config.served_model_name,
            "speculative": json.loads(spec.to_json()) if spec is not None else None,
            "running": engine.num_running,
            "waiting": engine.num_waiting,
            "numGpuBlocks": engine.kv.num_gpu_blocks,
            "blockSize": engine.kv.block_size,
            "kvCacheUsage": engine.kv.usage,
            "preemptions": s.preemptions,
            "steps": s.steps,
            "generationTokens": s.generation_tokens,
            "lastBatch": s.last_batch,
            "lastK": s.last_k,
            "behindSeconds": s.behind_s,
            "lagForgivenSeconds": s.lag_forgiven_s,
            "perPosition": list(engine.acceptance),
            "losslessnessBroken": engine.break_losslessness,
            "timeScale": engine.config.time_scale,
            "profile": engine.config.profile.name,
            "sleep": request.app[SLEEP_KEY].state(),
        }
    )


async def _admin_get_acceptance(request: web.Request) -> web.Response:
    return web.json_response({"perPosition": list(_engine(request).acceptance)})


async def _admin_set_acceptance(request: web.Request) -> web.Response:
    engine = _engine(request)
    try:
        body = _AcceptanceBody.model_validate(await _json_body(request))
        engine.set_acceptance(body.perPosition)
    except ValidationError as err:
        raise validation_error(err) from None
    except ValueError as err:
        raise ApiError(400, str(err), param="perPosition") from None
    log.info("acceptance set to %s", list(engine.acceptance))
    return web.json_response({"perPosition": list(engine.acceptance)})


async def _admin_losslessness(request: web.Request) -> web.Response:
    engine = _engine(request)
    try:
        body = _LosslessnessBody.model_validate(await _json_body(request))
    except ValidationError as err:
        raise validation_error(err) from None
    engine.break_losslessness = body.broken
    log.info("losslessness %s", "broken" if body.broken else "restored")
    return web.json_response({"broken": engine.break_losslessness})
