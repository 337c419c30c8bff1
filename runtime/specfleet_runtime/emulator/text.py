"""Deterministic fake text: what the emulated model "generates" for a prompt.

The token at output position i is a pure function of (prompt, i). So the output of a prompt is the same
whether the engine produces one token per step (no speculation) or several (speculation): that is the
losslessness of speculative decoding, and a check of it can be tested against the emulator. The
`drafted_token_text` variant is what a broken verifier would emit instead (see the engine's
`break_losslessness` switch).

The words it generates and how its tokens are counted are the emulator's tokenizer's (`tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from specfleet_runtime.emulator.tokenizer import OUTPUT_VOCAB, count_tokens, tokenize


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engine sees it: a stable 32-bit seed for its output, and its length in tokens.

    `token_ids` are its tokens as the emulator's tokenizer gives them (what prefix caching hashes);
    a prompt built from a seed and a length alone has none, and never hits the prefix cache.
    """

    seed: int
    num_tokens: int
    token_ids: tuple[int, ...] = field(default=(), compare=False, repr=False)
    # The text it was rendered from ("" for token ids): what the content's acceptance is looked up in.
    text: str = field(default="", compare=False, repr=False)

    @classmethod
    def from_text(cls, text: str) -> Prompt:
        """A text prompt (completions API)."""
        return cls(_seed(b"text\0" + text.encode("utf-8")), count_tokens(text), _token_ids(text), text)

    @classmethod
    def from_token_ids(cls, token_ids: Sequence[int]) -> Prompt:
        """A pre-tokenized prompt (completions API with a list of token ids)."""
        payload = b"ids\0" + ",".join(str(t) for t in token_ids).encode("ascii")
        return cls(_seed(payload), max(1, len(token_ids)), tuple(token_ids))

    @classmethod
    def from_chat(cls, messages: Sequence[tuple[str, str]]) -> Prompt:
        """A chat conversation given as (role, text) pairs, rendered with a fixed template."""
        rendered = render_chat(messages)
        seed = _seed(b"chat\0" + json.dumps(list(messages)).encode("utf-8"))
        return cls(seed, count_tokens(rendered), _token_ids(rendered), rendered)


def _token_ids(text: str) -> tuple[int, ...]:
    """`text`'s token ids from the emulator's tokenizer."""
    return tuple(tokenize(text)[0])


def render_chat(messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """A conversation as the emulator's fixed chat template renders it (its prompt's tokens)."""
    rendered = "".join(f"<|{role}|>\n{text}\n" for role, text in messages)
    return rendered + "<|assistant|>\n" if add_generation_prompt else rendered


def _seed(payload: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(payload, digest_size=4).digest(), "little")


_M32: Final = 0xFFFFFFFF


def _mix(seed: int, position: int) -> int:
    """A 32-bit integer hash of (seed, position) (lowbias32): cheap, portable, well spread.

    Cheap matters: one step emits tokens for hundreds of requests.
    """
    x = (seed + (position + 1) * 0x9E3779B9) & _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def token_text(seed: int, position: int) -> str:
    """The token the model generates at output `position` (0-based) for the prompt with `seed`."""
    return OUTPUT_VOCAB[_mix(seed, position) % len(OUTPUT_VOCAB)]


def drafted_token_text(seed: int, position: int) -> str:
    """A token that always differs from `token_text`: what a lossy verifier lets through."""
    return OUTPUT_VOCAB[(_mix(seed, position) + 1) % len(OUTPUT_VOCAB)]


def generated_text(prompt: Prompt, num_tokens: int) -> str:
    """The first `num_tokens` tokens the model generates for `prompt`, without speculation."""
    return "".join(token_text(prompt.seed, pos) for pos in range(num_tokens))


def natural_length(seed: int, shortest: int, longest: int) -> int:
    """How many tokens the model generates before its end-of-sequence token (shortest..longest)."""
    if longest <= shortest:
        return shortest
    return shortest + _mix(seed, -2) % (longest - shortest + 1)
