"""The emulator's tokenizer: what counts as a token, the words the model generates, and the token ids
behind /tokenize and /detokenize.

A simple stand-in for a real tokenizer: words and punctuation marks each count as one token
(`count_tokens`, what a completion reports as its `prompt_tokens`), so a prompt's `count` from
/tokenize is that same number. Ids, in three ranges:

* the output vocabulary (`OUTPUT_VOCAB`, each word with its leading space, as BPE stores words; what
  `text` generates from);
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

# Output vocabulary. Every token is one word with a leading space, as BPE vocabularies store words.
_WORDS: Final = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no will can more
other into some could them than then its time only new these two may first any like now my such
over our even most made after also did many before must through back years where much your way
well down should because each just those people how too little state good very make world still
own see men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three
"""
OUTPUT_VOCAB: Final = tuple(" " + word for word in _WORDS.split())
_TOKEN_RE: Final = re.compile(r"\w+|[^\w\s]")

# vLLM refuses ids outside its vocabulary; ids here are non-negative 31-bit integers.
MAX_TOKEN_ID: Final = 2**31 - 1
_FIXED: Final = (*OUTPUT_VOCAB, *string.punctuation)
_ID_OF: Final = {text.strip(): i for i, text in enumerate(_FIXED)}
HASHED_BASE: Final = len(_FIXED)
_PLACEHOLDER: Final = re.compile(r"t([0-9]{1,10})")


def split_tokens(text: str) -> list[str]:
    """The pieces of `text` the emulator counts as tokens: words and punctuation marks."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """Tokens in `text` by the emulator's rule (words and punctuation marks); at least 1."""
    return max(1, len(split_tokens(text)))


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
