"""The emulator's tokenizer behind /tokenize and /detokenize: token ids for its own token counting.

The pieces are those `text.count_tokens` counts (words and punctuation marks), so a prompt's `count`
here is the `prompt_tokens` its completion reports. Ids, in three ranges:

* the output vocabulary (`text.OUTPUT_VOCAB`, each word with its leading space, as BPE stores words);
* ASCII punctuation marks;
* every other piece: a stable hash into the rest of the id space. Such an id detokenizes to a
  placeholder word (` t<id>`) that tokenizes back to the same id.

So `tokenize(detokenize(ids)) == ids` for every valid id, and generated text round-trips through
`detokenize(tokenize(text))` up to whitespace. There are no special tokens: `add_special_tokens` adds
nothing.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Sequence
from typing import Final

from specfleet_runtime.emulator.text import OUTPUT_VOCAB, split_tokens

# vLLM refuses ids outside its vocabulary; ids here are non-negative 31-bit integers.
MAX_TOKEN_ID: Final = 2**31 - 1
_FIXED: Final = (*OUTPUT_VOCAB, *string.punctuation)
_ID_OF: Final = {text.strip(): i for i, text in enumerate(_FIXED)}
HASHED_BASE: Final = len(_FIXED)
_PLACEHOLDER: Final = re.compile(r"t([0-9]{1,10})")


def piece_id(piece: str) -> int:
    """The id of one piece (a word or a punctuation mark)."""
    fixed = _ID_OF.get(piece)
    if fixed is not None:
        return fixed
    placeholder = _PLACEHOLDER.fullmatch(piece)
    if placeholder is not None and HASHED_BASE <= int(placeholder[1]) <= MAX_TOKEN_ID:
        return int(placeholder[1])
    digest = int.from_bytes(hashlib.blake2b(piece.encode("utf-8"), digest_size=4).digest(), "little")
    return HASHED_BASE + digest % (MAX_TOKEN_ID + 1 - HASHED_BASE)


def token_str(token_id: int) -> str:
    """The text of one id (`ValueError` outside the vocabulary)."""
    if not 0 <= token_id <= MAX_TOKEN_ID:
        raise ValueError(f"Token id {str(token_id)[:40]} is out of vocabulary")
    return _FIXED[token_id] if token_id < HASHED_BASE else f" t{token_id}"


def tokenize(text: str) -> tuple[list[int], list[str]]:
    """The ids of `text` and the text of each."""
    pieces = split_tokens(text)
    ids = [piece_id(p) for p in pieces]
    return ids, [token_str(i) for i in ids]


def detokenize(ids: Sequence[int]) -> str:
    """The text of `ids` (`ValueError` for an id outside the vocabulary)."""
    return "".join(token_str(i) for i in ids)
