"""Choosing llama.cpp's pre-tokenizer (`tokenizer.ggml.pre`) from the structure of tokenizer.json.

llama.cpp does not run tokenizer.json: it knows a fixed set of named pre-tokenizers, each a list of
split regexes (src/llama-vocab.cpp). Rather than recognising known models by hashing their
tokenizers (which refuses every fine-tuned or custom tokenizer), Outpost reduces the HF
pre-tokenizer to what it does, an ordered list of "isolate matches of REGEX" steps plus the BPE
model's ignore_merges flag, and looks that up in a table built from the regexes HF tokenizers use
for each llama.cpp name. ByteLevel(use_regex=True) is GPT-2's regex; Digits is \\p{N} or \\p{N}+.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SEED_CODER = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CJK_KANA = "[一-龥぀-ゟ゠-ヿ]+"


@dataclass(frozen=True)
class PreTokenizer:
    """The pre-tokenization a tokenizer.json performs, reduced to what llama.cpp can reproduce."""

    splits: tuple[str, ...]  # regexes whose matches are isolated, applied in order
    ignore_merges: bool  # BPE: a pre-token that is itself a vocab entry is not split further

    def describe(self) -> str:
        steps = [f"Split(/{regex}/)" for regex in self.splits] or ["(no split)"]
        return " + ".join(steps) + f", ignore_merges={str(self.ignore_merges).lower()}"


# llama.cpp name -> the HF structure that pre-tokenizer reproduces. Where llama.cpp maps several
# names to one behaviour, the first of them is used (e.g. "smollm" = starcoder = refact).
KNOWN: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer((GPT2,), False),
    "smollm": PreTokenizer((r"\p{N}", GPT2), False),
    "llama-bpe": PreTokenizer((LLAMA3,), True),
    "smaug-bpe": PreTokenizer((LLAMA3,), False),
    "qwen2": PreTokenizer((QWEN2,), False),
    "qwen35": PreTokenizer((QWEN35,), False),
    "gpt-4o": PreTokenizer((GPT4O,), False),
    "tekken": PreTokenizer((TEKKEN,), True),
    "seed-coder": PreTokenizer((SEED_CODER,), False),
    "deepseek-v3": PreTokenizer((r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3_WORDS), False),
}

# Every name llama.cpp 0.3.36 (llama-cpp-python 0.3.36's vendored llama-vocab.cpp) accepts for a BPE
# vocabulary; --pre-tokenizer may name any of them.
LLAMA_CPP_NAMES = frozenset(
    """default minicpm5 llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano
    deepseek-llm deepseek-coder deepseek-v3 spark2_5 youtu falcon mpt starcoder gpt-2 phi-2 jina-es
    jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jais-2 gemma4
    granite-embed-multi-311m sarvam-moe jina-v1-en jina-v2-code roberta-bpe whitespace refact command-r
    qwen2 deepseek-r1-qwen kormo f2llmv2 qwen35 stablelm2 olmo dbrx smaug-bpe poro-chat chatglm-bpe glm4
    glm5 viking jais tekken smollm codeshell bloom gpt3-finnish exaone exaone4 exaone-moe chameleon
    minerva-7b megrez gpt-4o llama4 kanana2 talkie granite-embed-multi-97m tiny_aya cohere2moe superbpe
    trillion granite-docling bailingmoe bailingmoe2 llada-moe seed-coder hunyuan hunyuan-dense hy_v4
    joyai-llm kimi-k2 ufakzeka grok-2 afmoe laguna minimax-m2 solar-open mellum2""".split()
)

# Normalizers llama.cpp's BPE path can ignore: none, or NFC (text arriving as NFC is unchanged).
_HARMLESS_NORMALIZERS = (None, "NFC")


class UnknownPreTokenizer(ValueError):
    """tokenizer.json pre-tokenizes in a way no llama.cpp pre-tokenizer reproduces."""


def _normalize_regex(regex: str) -> str:
    # Some tokenizer.json files hold raw CR/LF characters inside the pattern, others the escapes.
    return regex.replace("\r", r"\r").replace("\n", r"\n")


def _steps(node: dict[str, Any] | None) -> list[str]:
    """The split regexes of one pre-tokenizer node (recursing through Sequence)."""
    if node is None:
        return []
    kind = node.get("type")
    if kind == "Sequence":
        return [regex for child in node.get("pretokenizers", []) for regex in _steps(child)]
    if kind == "ByteLevel":
        if node.get("add_prefix_space"):
            raise UnknownPreTokenizer("ByteLevel(add_prefix_space=true)")
        return [GPT2] if node.get("use_regex", True) else []
    if kind == "Digits":
        return [r"\p{N}" if node.get("individual_digits") else r"\p{N}+"]
    if kind == "Split":
        pattern = node.get("pattern") or {}
        if "Regex" not in pattern or node.get("behavior") != "Isolated" or node.get("invert"):
            raise UnknownPreTokenizer(f"Split({pattern}, behavior={node.get('behavior')})")
        return [_normalize_regex(str(pattern["Regex"]))]
    raise UnknownPreTokenizer(f"{kind} pre-tokenizer")


def structure_of(tokenizer_json: dict[str, Any]) -> PreTokenizer:
    """What tokenizer.json's normalizer + pre_tokenizer + BPE model do, as a PreTokenizer."""
    normalizer = tokenizer_json.get("normalizer")
    norm_type = normalizer.get("type") if isinstance(normalizer, dict) else None
    if norm_type == "Sequence" and not normalizer.get("normalizers"):  # type: ignore[union-attr]
        norm_type = None
    if norm_type not in _HARMLESS_NORMALIZERS:
        raise UnknownPreTokenizer(f"{norm_type} normalizer")
    model = tokenizer_json.get("model") or {}
    return PreTokenizer(tuple(_steps(tokenizer_json.get("pre_tokenizer"))), bool(model.get("ignore_merges")))


def choose_pre_tokenizer(tokenizer_json: dict[str, Any], override: str | None = None) -> str:
    """llama.cpp's name for tokenizer.json's pre-tokenizer, or `override` (checked against llama.cpp's list).

    Raises ValueError naming the structure when no known pre-tokenizer matches it.
    """
    if override is not None:
        if override not in LLAMA_CPP_NAMES:
            raise ValueError(
                f"--pre-tokenizer {override!r} is not a name llama.cpp knows; one of: "
                + ", ".join(sorted(LLAMA_CPP_NAMES))
            )
        return override
    hint = f"pass --pre-tokenizer NAME to choose one (structural matches: {', '.join(KNOWN)})"
    try:
        found = structure_of(tokenizer_json)
    except UnknownPreTokenizer as exc:
        raise UnknownPreTokenizer(
            f"tokenizer.json uses a {exc} that llama.cpp cannot reproduce; {hint}"
        ) from None
    for name, known in KNOWN.items():
        if known == found:
            return name
    raise UnknownPreTokenizer(
        f"no llama.cpp pre-tokenizer matches tokenizer.json's {found.describe()}; {hint}"
    )
