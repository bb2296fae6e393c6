"""The synthetic models' tokenizer: a real byte-level BPE trained on the shipped English corpus.

Owns training (deterministic, cached per vocab size), padding the vocabulary to an architecture's
size with visible filler pieces, the ChatML special tokens and chat template, and writing all of it
as GGUF `tokenizer.*` metadata in the layout llama.cpp expects for a GPT-2 style ("gpt2") vocab.

Token text is stored the way llama.cpp and HF store byte-level BPE: every byte mapped to a printable
stand-in character (space is "Ġ", newline "Ċ"); `piece_bytes` undoes that mapping.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from gguf import GGUFWriter, TokenType

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2, as in SmolLM2
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
# SmolLM2-Instruct: bos <|im_start|>, eos and pad <|im_end|>, and no BOS added to prompts (ChatML).
BOS_ID, EOS_ID, EOT_ID, PAD_ID = IM_START_ID, IM_END_ID, IM_END_ID, IM_END_ID

# SmolLM2's template without its default system message, so prompt token counts stay predictable.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# "smollm" in llama.cpp = individual digits, then the GPT-2 regex: exactly the pre-tokenizer below.
GGUF_PRE_TOKENIZER = "smollm"
# Upper bound on learned entries; the corpus supports ~12k merges at min_frequency 2 anyway.
MAX_LEARNED = 32768
_FILLER_SEED = 0x5EED

# Curly quotes and dashes to ASCII, so learned merges never hold part of a multi-byte character.
_ASCII_PUNCT = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2014": "--",
        "\u2013": "-",
        "\u2026": "...",
        "\u00a0": " ",
        "\f": "\n",
    }
)


@dataclass(frozen=True)
class Vocab:
    """A complete GGUF vocabulary: id i is tokens[i]; the first n_learned ids are BPE-reachable."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    n_learned: int

    @property
    def size(self) -> int:
        return len(self.tokens)

    def hidden_ids(self) -> list[int]:
        """Ids a random model should never emit: control tokens and the invisible single bytes."""
        return [
            i
            for i, tok in enumerate(self.tokens)
            if self.token_types[i] != TokenType.NORMAL or not is_visible(piece_bytes(tok))
        ]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode table (printable bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def piece_bytes(token: str) -> bytes:
    """The raw bytes a byte-level token stands for (control tokens decode to their own text)."""
    if token in SPECIAL_TOKENS:
        return token.encode()
    table = _byte_decoder()
    return bytes(table[ch] for ch in token)


def is_visible(piece: bytes) -> bool:
    """True for valid UTF-8 made of printable characters with at least one non-space."""
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text.strip()) and all(ch.isprintable() for ch in text)


def normalize_text(text: str) -> str:
    """Training-time normalization: NFKC, typographic punctuation to ASCII, other non-ASCII dropped."""
    text = unicodedata.normalize("NFKC", text).translate(_ASCII_PUNCT)
    return text.encode("ascii", "ignore").decode("ascii")


def train_bpe(vocab_size: int) -> tuple[list[str], list[str]]:
    """Train byte-level BPE on the corpus; return (tokens in id order, merges as "left right")."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # heavy import, used once

    from outpost.models.corpus import load_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([normalize_text(doc) for doc in load_corpus()], trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def _drop_invisible_merges(tokens: list[str], merges: list[str]) -> tuple[list[str], list[str]]:
    """Remove learned multi-character tokens that do not render (runs of spaces or newlines) and their merges.

    The pre-tokenizer keeps whitespace runs apart from words, so such tokens only ever merge with
    each other and removing them never orphans a visible token's merge chain; checked below.
    """
    dropped = {t for t in tokens if len(t) > 1 and t not in SPECIAL_TOKENS and not is_visible(piece_bytes(t))}
    kept_merges = [m for m in merges if m.replace(" ", "", 1) not in dropped]
    for merge in kept_merges:
        left, right = merge.split(" ")
        if left in dropped or right in dropped:
            raise RuntimeError(f"merge {merge!r} depends on a dropped token")
    return [t for t in tokens if t not in dropped], kept_merges


def _fillers(learned: list[str], count: int) -> list[str]:
    """`count` distinct visible pieces not in `learned`: a word start glued to a word continuation.

    They are unreachable by the tokenizer (no merges) but a random model samples them, so they look
    like plausible made-up words (" thereforeing") instead of noise.
    """
    starts = [t for t in learned if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 2]
    tails = [t for t in learned if t.isalpha() and t.islower() and len(t) > 1]
    rng = np.random.default_rng(_FILLER_SEED)
    taken = set(learned)
    out: list[str] = []
    while len(out) < count:
        picks = rng.integers(0, [len(starts), len(tails)], size=(4 * (count - len(out)) + 64, 2))
        for i, j in picks:
            piece = starts[i] + tails[j]
            if piece not in taken:
                taken.add(piece)
                out.append(piece)
                if len(out) == count:
                    break
    return out


@lru_cache(maxsize=8)
def build_vocab(vocab_size: int) -> Vocab:
    """Train (once per size, per process) and pad a vocabulary of exactly `vocab_size` entries."""
    if vocab_size < 512:
        raise ValueError(f"vocab_size {vocab_size} too small for a byte-level BPE")
    tokens, merges = _drop_invisible_merges(*train_bpe(min(vocab_size, MAX_LEARNED)))
    n_learned = len(tokens)
    tokens += _fillers(tokens, vocab_size - n_learned)
    types = [TokenType.CONTROL if t in SPECIAL_TOKENS else TokenType.NORMAL for t in tokens]
    return Vocab(tuple(tokens), tuple(int(t) for t in types), tuple(merges), n_learned)


def add_tokenizer_metadata(writer: GGUFWriter, vocab: Vocab, rerank: bool = False) -> None:
    """Write the tokenizer.ggml.* keys and the chat template; `rerank`: a reranker's, which adds
    BOS and EOS around its inputs (llama-server's format_rerank reads these flags)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_PRE_TOKENIZER)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_eot_token_id(EOT_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_add_bos_token(rerank)
    writer.add_add_eos_token(rerank)
    writer.add_chat_template(CHAT_TEMPLATE)
