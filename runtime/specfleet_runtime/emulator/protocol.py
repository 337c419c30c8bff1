"""The slice of the OpenAI API the emulator serves: request bodies, response bodies, errors.

Request bodies are pydantic models that ignore fields they do not know (as vLLM does), so clients
can send temperature, top_p, stop, logprobs...: the emulator always answers greedily with its
deterministic text and ignores them. vLLM's extension `ignore_eos` is honoured.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from specfleet_runtime.emulator.text import Prompt, render_chat


class ApiError(Exception):
    """An error answered as OpenAI's JSON error body with an HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def error_type(self) -> str:
        """The `type` field: the OpenAI client's exception class name for the status, as vLLM uses."""
        return {
            400: "BadRequestError",
            404: "NotFoundError",
            409: "ConflictError",
            503: "ServiceUnavailableError",
        }.get(self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        """The JSON body: {"error": {"message", "type", "param", "code"}}."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status,
            }
        }


def validation_error(err: ValidationError) -> ApiError:
    """A 400 naming the first invalid field of a request body."""
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    param = str(first["loc"][0]) if first["loc"] else None
    return ApiError(400, f"{loc}: {first['msg']}" if loc else first["msg"], param=param)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    """`stream_options`: whether the last streamed chunk carries usage."""

    include_usage: bool = False


class _GenerationRequest(_Body):
    model: StrictStr | None = None  # vLLM defaults to the served model
    n: Annotated[int, Field(ge=1, le=64)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False


class CompletionRequest(_GenerationRequest):
    """`POST /v1/completions`."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    # OpenAI's (and vLLM's) default for the legacy completions API.
    max_tokens: Annotated[int, Field(ge=1)] | None = 16

    def prompts(self) -> list[Prompt]:
        """One engine prompt per prompt in the body (a body may hold a batch of prompts)."""
        p = self.prompt
        if isinstance(p, str):
            return [Prompt.from_text(p)]
        if not p:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        # pydantic matched one member of the union, so the list is homogeneous.
        if isinstance(p[0], str):
            return [Prompt.from_text(text) for text in p]
        if isinstance(p[0], int):
            return [Prompt.from_token_ids(_checked_ids(p))]
        token_lists = p
        if any(not ids for ids in token_lists):
            raise ApiError(400, "prompt token lists must not be empty", param="prompt")
        return [Prompt.from_token_ids(_checked_ids(ids)) for ids in token_lists]


# No tokenizer has more ids than this; vLLM refuses ids outside its vocabulary with a 400.
MAX_TOKEN_ID = 2**31 - 1


def _checked_ids(ids: Any) -> list[int]:
    for token in ids:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise ApiError(400, f"Token id {str(token)[:40]} is out of vocabulary", param="prompt")
    return list(ids)


class ContentPart(_Body):
    """One part of a multi-part message content; only text parts carry text here."""

    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(_Body):
    """One message of a conversation."""

    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None

    def text(self) -> str:
        """The message's text (text parts joined; other parts ignored)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text or "" for part in self.content if part.type == "text")


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    def prompt(self) -> Prompt:
        """The conversation as one engine prompt."""
        return Prompt.from_chat([(m.role, m.text()) for m in self.messages])

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` (the newer name) wins over `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


class TokenizeCompletionRequest(_Body):
    """`POST /tokenize` with a prompt."""

    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: bool = True  # the emulator's tokenizer has none to add
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Body):
    """`POST /tokenize` with a conversation, rendered by the chat template first."""

    model: StrictStr | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False

    def rendered(self) -> str:
        """The conversation as the chat template renders it (as a chat completion's prompt)."""
        if self.add_generation_prompt and self.continue_final_message:
            raise ApiError(
                400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        messages = [(m.role, m.text()) for m in self.messages]
        return render_chat(messages, self.add_generation_prompt)


class DetokenizeRequest(_Body):
    """`POST /detokenize`."""

    model: StrictStr | None = None
    tokens: list[StrictInt]


def new_id(prefix: str) -> str:
    """A response id like OpenAI's (`cmpl-...`, `chatcmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now_s() -> int:
    """The `created` timestamp of a response."""
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The `usage` object of a response."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
