"""Tiny, locally built models for the real-vLLM tier: a Llama target and an EAGLE-3 drafter whose
greedy proposals agree with the target at a rate fixed by construction.

No model can be downloaded here, so everything is made from seeded random numbers:

* Tokenizer: a word-level tokenizer trained with `tokenizers` on a synthetic corpus, saved as a
  Hugging Face fast tokenizer with a chat template. Exactly 256 ids (= hidden size), so token
  embeddings can be an orthogonal basis and every lookup below is exact, not approximate.
* Target (`LlamaForCausalLM`, hidden 256, 4 heads, 2 KV heads, intermediate 512, 8 layers, float32):
  every layer's `o_proj` and `down_proj` are zero, so the residual stream stays the embedding of the
  current token; `lm_head` row j is the embedding of pi^-1(j), so greedy decoding emits pi(last token)
  for a fixed permutation pi of the vocabulary (a set of short cycles).
* Drafter (`LlamaForCausalLMEagle3`, one layer): `fc` passes the first target hidden state through,
  attention is switched off (`o_proj` = 0), and the MLP is an exact lookup table e(z) -> e(pi(z)), so the
  drafter's state walks the same cycles as the target. Its `lm_head` is the target's with the rows of a
  set S of ids swapped in pairs (sigma): whenever the correct next token is in S, the drafter proposes its
  partner instead, and verification rejects it.

After a verified token y, draft position i (0-based) is accepted iff pi^(i+1)(y) is not in S (and all
earlier positions were), so each cycle has a known steady acceptance pattern:

* ``accept``: fixed points and 5-cycles outside S - every draft fully accepted (mean length K+1);
* ``reject``: 2-cycles inside S - nothing accepted (mean length 1);
* ``partial1``: 2-cycles (x y) with only x in S - one token accepted per draft;
* ``partial2``: 3-cycles (a b c) with only c in S - two tokens accepted per draft.

`TinyModels.simulate` replays vLLM's draft/verify loop on this construction, so tests compare the
server's counters with exact expectations for any mix of prompts.

Run with the vLLM venv's python (needs torch, transformers, tokenizers, safetensors):
``python tests/vllm/tiny_models.py`` builds once into ``$SPECFLEET_CACHE/tiny-models/<source hash>/``
and prints that folder. Importing this module needs only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 20261129
HIDDEN = 256
VOCAB = 256  # = HIDDEN: embeddings form an orthogonal basis, so lookups are exact
TARGET_LAYERS = 8  # 4 layers collide with EAGLE-3's default aux layers (2, n//2, n-3)
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# The chat template's generation prompt ends with this word, so chat requests land in a known class.
CHAT_REPLY_WORD = "reply"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|> {{ message['content'] }} <|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|> " + CHAT_REPLY_WORD + "{%- endif -%}"
)
# Cycle counts per class; the rest of the words become accept-class fixed points.
N_ACCEPT_CYCLES5 = 16
N_REJECT_CYCLES2 = 16
N_PARTIAL1_CYCLES2 = 16
N_PARTIAL2_CYCLES3 = 16
CLASSES = ("accept", "reject", "partial1", "partial2")
METASPACE = "\u2581"  # the word-start marker of Metaspace pieces


def source_hash() -> str:
    """Key of the model cache: any change to this file builds new models."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def cache_dir() -> Path:
    """Where built models live, outside the checkout (same root as the project's venvs)."""
    root = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    return root / "tiny-models" / source_hash()


@dataclass(frozen=True)
class SpecStats:
    """vLLM's speculative-decoding counters for one or more requests."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    def _combine(self, other: SpecStats, sign: int) -> SpecStats:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + (0,) * (width - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + (0,) * (width - len(other.accepted_per_pos))
        return SpecStats(
            drafts=self.drafts + sign * other.drafts,
            draft_tokens=self.draft_tokens + sign * other.draft_tokens,
            accepted=self.accepted + sign * other.accepted,
            accepted_per_pos=tuple(a + sign * b for a, b in zip(mine, theirs, strict=True)),
        )

    def __add__(self, other: SpecStats) -> SpecStats:
        return self._combine(other, 1)

    def __sub__(self, other: SpecStats) -> SpecStats:
        """Counter deltas: the stats of a load are `after - before`."""
        return self._combine(other, -1)

    @property
    def tokens_per_draft(self) -> float:
        """Draft tokens per draft: K, or less where Dynamic SD or a short n-gram match cut it."""
        return self.draft_tokens / self.drafts if self.drafts else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's formula: 1 + accepted / drafts (the bonus token included)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def per_position_rates(self) -> tuple[float, ...]:
        """vLLM's cumulative per-position acceptance: accepted_per_pos[i] / drafts."""
        return tuple(a / self.drafts for a in self.accepted_per_pos) if self.drafts else ()


@dataclass(frozen=True)
class TinyModels:
    """The built models and the facts about them that tests need (read from `manifest.json`)."""

    root: Path
    words: dict[int, str]  # token id -> word (ordinary words only)
    perm: tuple[int, ...]  # pi: the target's greedy next token for each last token
    swapped: frozenset[int]  # S: ids whose drafter lm_head rows are swapped
    classes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    chat_last_token: int = -1

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def eagle3(self) -> Path:
        return self.root / "eagle3"

    @classmethod
    def load(cls, root: Path) -> TinyModels:
        doc = json.loads((root / "manifest.json").read_text())
        return cls(
            root=root,
            words={int(k): v for k, v in doc["words"].items()},
            perm=tuple(doc["perm"]),
            swapped=frozenset(doc["swapped"]),
            classes={k: tuple(v) for k, v in doc["classes"].items()},
            chat_last_token=doc["chat_last_token"],
        )

    def prompt(self, last_token: int, index: int = 0, length: int = 6) -> str:
        """A text prompt whose last token is `last_token`; `index` varies the words before it."""
        filler = self.classes["accept"]
        rng = random.Random(f"{last_token}/{index}")
        head = [self.words[rng.choice(filler)] for _ in range(length - 1)]
        return " ".join([*head, self.words[last_token]])

    def greedy(self, last_token: int, max_tokens: int) -> list[int]:
        """The target's greedy continuation (what a server must return, speculation on or off)."""
        out, tok = [], last_token
        for _ in range(max_tokens):
            tok = self.perm[tok]
            out.append(tok)
        return out

    def text(self, token_ids: list[int]) -> str:
        """Detokenized text as vLLM returns it for a completion (words joined by spaces)."""
        return "".join(" " + self.words[t] for t in token_ids)

    def simulate(self, last_token: int, k: int, max_tokens: int) -> SpecStats:
        """Replay vLLM's loop: prefill emits one token, then each step verifies K drafts."""
        stats = SpecStats(accepted_per_pos=(0,) * k)
        y = self.perm[last_token]  # the token sampled at prefill
        generated = 1
        while generated < max_tokens:
            accepted, nxt = 0, y
            for _ in range(k):
                nxt = self.perm[nxt]
                if nxt in self.swapped:  # the drafter proposes sigma(nxt) != nxt here
                    break
                accepted += 1
            pos = tuple(1 if i < accepted else 0 for i in range(k))
            stats = stats + SpecStats(1, k, accepted, pos)
            for _ in range(accepted + 1):  # accepted drafts plus the target's bonus token
                y = self.perm[y]
            generated += accepted + 1
        return stats


# ----------------------------------------------------------------------------------------------------
# Building (needs torch, transformers, tokenizers, safetensors: run with the vLLM venv's python)
# ----------------------------------------------------------------------------------------------------


def _synthetic_words(n: int, rng: random.Random) -> list[str]:
    """`n` distinct pronounceable lowercase words (two or three syllables)."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables) for _ in range(rng.choice((2, 3)))))
    return sorted(words)


def _train_tokenizer(out: Path, rng: random.Random) -> Any:
    """Train a word-level tokenizer with exactly VOCAB ids and save it as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_words = VOCAB - len(SPECIAL_TOKENS)
    words = [CHAT_REPLY_WORD, *_synthetic_words(n_words - 1, rng)]
    # Distinct frequencies make the trainer's id order a pure function of the corpus.
    corpus = [" ".join([w] * (n_words - i)) for i, w in enumerate(words)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    # Metaspace: "▁word" pieces, so decoding restores the spaces (incremental detokenization too).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    trainer = trainers.WordLevelTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL_TOKENS))
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, want {VOCAB}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=list(SPECIAL_TOKENS[4:]),
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )
    fast.save_pretrained(out)
    return fast


def _design(word_ids: list[int], special_ids: list[int], reply: int, rng: random.Random) -> dict[str, Any]:
    """Choose the permutation pi, the swapped set S with its pairing sigma, and the class of each id."""
    ids = [t for t in word_ids if t != reply]
    rng.shuffle(ids)
    perm = {t: t for t in special_ids}
    sigma: dict[int, int] = {}
    classes: dict[str, list[int]] = {c: [] for c in CLASSES}

    def cycle(members: list[int], cls: str) -> None:
        for a, b in zip(members, members[1:] + members[:1], strict=True):
            perm[a] = b
        classes[cls].extend(members)

    def take(n: int) -> list[int]:
        return [ids.pop() for _ in range(n)]

    cycle([reply, *take(4)], "accept")  # chat replies: the generation prompt ends with `reply`
    for _ in range(N_ACCEPT_CYCLES5 - 1):
        cycle(take(5), "accept")
    for _ in range(N_REJECT_CYCLES2):
        a, b = take(2)
        cycle([a, b], "reject")
        sigma |= {a: b, b: a}  # the drafter proposes the other member: always wrong
    for _ in range(N_PARTIAL1_CYCLES2 // 2):
        (x1, y1), (x2, y2) = take(2), take(2)
        cycle([x1, y1], "partial1")
        cycle([x2, y2], "partial1")
        sigma |= {x1: x2, x2: x1}  # wrong only when the next token is x
    for _ in range(N_PARTIAL2_CYCLES3 // 2):
        (a1, b1, c1), (a2, b2, c2) = take(3), take(3)
        cycle([a1, b1, c1], "partial2")
        cycle([a2, b2, c2], "partial2")
        sigma |= {c1: c2, c2: c1}  # wrong only when the next token is c
    for t in ids:  # leftovers: fixed points ("repeat the last token"), accepted
        cycle([t], "accept")
    return {"perm": perm, "sigma": sigma, "classes": classes}


def _orthogonal(n: int, seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))  # unique QR: a deterministic basis
    return (q * n**0.5).to(torch.float32)  # rows of norm sqrt(n): RMS 1, so RMSNorm leaves them as is


def _build_target(out: Path, emb: Any, perm_t: Any, bos: int, eos: int, pad: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=512,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4,  # head_dim 64; 16 is refused by the CPU attention backend
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    inv = torch.argsort(perm_t)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(emb)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()  # attention still runs, but adds nothing
            layer.mlp.down_proj.weight.zero_()  # so the residual stays the token embedding
        model.lm_head.weight.copy_(emb[inv])  # logits_j = e(pi^-1(j)) . e(x): argmax pi(x)
    model.save_pretrained(out, safe_serialization=True)


def _build_drafter(out: Path, emb: Any, perm_t: Any, sigma_t: Any, bos: int, eos: int) -> None:
    import torch
    from safetensors.torch import save_file

    h, v, heads, kv_heads = HIDDEN, VOCAB, 4, 2
    head_dim = h // heads
    gate_scale = 4.0  # any value works: non-matching rows get gate 0 and silu(0) = 0 exactly
    gen = torch.Generator().manual_seed(SEED + 1)
    inv = torch.argsort(perm_t)
    target_head = emb[inv]
    drafter_head = torch.empty_like(target_head)
    drafter_head[sigma_t] = target_head  # row sigma(j) holds row j: S ids proposed as their partners
    silu_a = torch.nn.functional.silu(torch.tensor(gate_scale)).item()
    tensors = {
        # Pass the first of the three target hidden states (each is the token embedding) through.
        "fc.weight": torch.cat([torch.eye(h), torch.zeros(h, 2 * h)], dim=1),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": torch.randn(heads * head_dim, 2 * h, generator=gen) * 0.02,
        "midlayer.self_attn.k_proj.weight": torch.randn(kv_heads * head_dim, 2 * h, generator=gen) * 0.02,
        "midlayer.self_attn.v_proj.weight": torch.randn(kv_heads * head_dim, 2 * h, generator=gen) * 0.02,
        "midlayer.self_attn.o_proj.weight": torch.zeros(h, heads * head_dim),
        # Exact lookup e(z) -> e(pi(z)) - e(z): one hidden unit per token, gate = scale on its own row.
        "midlayer.mlp.gate_proj.weight": emb * (gate_scale / h),
        "midlayer.mlp.up_proj.weight": emb / h,
        "midlayer.mlp.down_proj.weight": (emb[perm_t] - emb).T / silu_a,
        "norm.weight": torch.ones(h),
        "lm_head.weight": drafter_head,
    }
    out.mkdir(parents=True)
    save_file({k: t.to(torch.float32).contiguous() for k, t in tensors.items()}, out / "model.safetensors")
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "target_hidden_size": h,
        "intermediate_size": v,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "vocab_size": v,
        "draft_vocab_size": v,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _check(root: Path, emb: Any, perm_t: Any, sigma_t: Any) -> None:
    """Fail the build unless the saved checkpoints implement the construction exactly."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(root / "target")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    last = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"][-1])
    if last != METASPACE + CHAT_REPLY_WORD:
        raise RuntimeError(f"chat prompt ends with {last!r}, not {CHAT_REPLY_WORD!r}")
    model = LlamaForCausalLM.from_pretrained(root / "target", dtype=torch.float32).eval()
    words = list(range(len(SPECIAL_TOKENS), VOCAB))
    batch = torch.tensor([[words[(i * 7 + j) % len(words)] for j in range(5)] for i in range(len(words))])
    with torch.no_grad():
        got = model(batch).logits[:, -1].argmax(-1)
    if not torch.equal(got, perm_t[batch[:, -1]]):
        raise RuntimeError("target does not emit pi(last token)")

    # The drafter's forward as vLLM runs it, attention omitted (its o_proj is zero).
    w = load_file(root / "eagle3" / "model.safetensors")

    def rms(x: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    state = emb @ w["fc.weight"][:, :HIDDEN].T  # row z: drafting after a target position holding z
    walked = torch.arange(VOCAB)
    for step in range(3):
        x = rms(state)
        gate = torch.nn.functional.silu(x @ w["midlayer.mlp.gate_proj.weight"].T)
        state = (
            state + (gate * (x @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
        )
        proposal = (rms(state) @ w["lm_head.weight"].T).argmax(-1)
        walked = perm_t[walked]
        if not torch.equal(proposal, sigma_t[perm_t[walked]]):
            raise RuntimeError(f"drafter step {step}: proposals differ from sigma(pi(state))")


def build(dest: Path) -> Path:
    """Build tokenizer, target and drafter into `dest` (atomically) unless it is already there."""
    if (dest / "manifest.json").exists():
        return dest
    import torch

    rng = random.Random(SEED)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))  # same filesystem: atomic rename
    try:
        tok = _train_tokenizer(tmp / "target", rng)
        special_ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
        word_ids = sorted(set(range(VOCAB)) - set(special_ids))
        reply = tok.convert_tokens_to_ids(METASPACE + CHAT_REPLY_WORD)
        design = _design(word_ids, special_ids, reply, rng)
        perm_t = torch.tensor([design["perm"][t] for t in range(VOCAB)])
        sigma_t = torch.tensor([design["sigma"].get(t, t) for t in range(VOCAB)])
        emb = _orthogonal(HIDDEN, SEED)
        bos, eos, pad = (tok.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>"))
        _build_target(tmp / "target", emb, perm_t, bos, eos, pad)
        _build_drafter(tmp / "eagle3", emb, perm_t, sigma_t, bos, eos)
        manifest = {
            "source_hash": source_hash(),
            "words": {t: tok.convert_ids_to_tokens(t).removeprefix(METASPACE) for t in word_ids},
            "perm": [design["perm"][t] for t in range(VOCAB)],
            "swapped": sorted(design["sigma"]),
            "classes": design["classes"],
            "chat_last_token": reply,
        }
        _check(tmp, emb, perm_t, sigma_t)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(tmp, dest)  # atomic: a concurrent or interrupted build never leaves half a model
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder (default: the cache, keyed on source)")
    args = parser.parse_args(argv)
    dest = args.out or cache_dir()
    build(dest)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
