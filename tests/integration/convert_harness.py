"""Building tiny random Hugging Face models and tokenizers, and running them in PyTorch and llama.cpp.

The converter tests compare Outpost's GGUF, run by llama.cpp through Outpost's engine, with the
same model run by transformers. Everything is made on the spot: a byte-level BPE (or SentencePiece)
tokenizer trained with the pre-tokenizer structure under test, and a model of the architecture under
test with random weights, 1-D weights (norms, biases) perturbed so that each maps to exactly one
GGUF tensor.

The weights are chosen so that argmax agreement measures the converter, not chance. The default
std 0.02 gives near-flat logits whose argmax flips on rounding. Gaussian logits over ~900 tokens are
flat at the top whatever their scale (q8_0's error is relative, so it scales with them): with every
matrix at std 0.2, llama.cpp's own quantizer flips 7-10% of argmaxes of a correctly converted model,
the layers being chaotic (gain ~1.6 per matrix). So: embeddings and the output head at std 0.4,
the layers' matrices at 0.1 (they still change the argmax at a large share of positions, checked
in the tests), and an untied head partly aligned with the embedding of a random successor token
(a bigram table, as a trained model's head is aligned with likely continuations): top-1 leads by a
clear margin, as in a trained model.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.output import BatchChunk

PROMPT_LEN = 32
N_PROMPTS = 7  # 7 x 32 = 224 positions compared per model
EMBED_STD = 0.4  # token embeddings and output head
LAYER_STD = 0.1  # every matrix inside the transformer blocks
NORM_NOISE = 0.1  # added to 1-D weights (norms start at 1 or 0, biases at 0)
VOCAB_SIZE = 900
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Tokenized by both sides and compared id for id: scripts, accents, digits, contractions, runs of
# spaces and newlines, emoji and characters the tokenizers never saw in training.
SAMPLE_TEXT = (
    "Hello, world! I'm testing THE tokenizer: don't, we'LL, they've.  Two  spaces,\ttab,\n\nnewlines.\n"
    "Numbers 1234567 and 3.14159, prices $42.50 or 1,000,000.\n"
    "Français: où est la bibliothèque? Deutsch: Grüße aus München, Straße.\n"
    "Español: ¿Dónde está el niño? Русский: Привет, как дела? Ελληνικά: Καλημέρα κόσμε.\n"
    "中文：你好，世界！日本語：こんにちは、世界。한국어: 안녕하세요 세계.\n"
    "العربية: مرحبا بالعالم. हिन्दी: नमस्ते दुनिया। Emoji 👍🏽🎉 and symbols ∑ ≠ → ©.\n"
    "    indented code():\n        return x ** 2  # comment\n"
)
_MULTILINGUAL = (
    "Le renard brun rapide saute par-dessus le chien paresseux. Où est la gare? C'est très bien.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München und Köln.",
    "El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la estación? Mañana.",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Привет, как дела? Спасибо.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από το τεμπέλικο σκυλί. Καλημέρα κόσμε.",
    "敏捷的棕色狐狸跳过了懒狗。你好，世界！今天天气很好。",
    "素早い茶色の狐がのろまな犬を飛び越える。こんにちは、世界。ありがとう。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요 세계. 감사합니다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया।",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 1,000 $5.99 50% #1 @user x=y+z;",
)


def training_texts() -> list[str]:
    """English (the synthetic models' shipped corpus, in lines) plus a few lines in other scripts."""
    from outpost.models.corpus import load_corpus

    english = [line for doc in load_corpus()[:4] for line in doc.splitlines() if line.strip()][:4000]
    return english + list(_MULTILINGUAL) * 20


def prompt_texts() -> list[str]:
    """Texts long enough for PROMPT_LEN tokens each."""
    from outpost.models.corpus import load_corpus

    text = "\n".join(load_corpus())
    english = [text[1000 + 100_000 * i : 4000 + 100_000 * i] for i in range(3)]
    return [*english, *(" ".join(_MULTILINGUAL[i::3]) for i in range(3)), SAMPLE_TEXT * 2]


# ---------------------------------------------------------------- tokenizers


def _split_regex(name: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    from outpost.models.convert import pretokenizer as pt

    regex = {"llama-bpe": pt.LLAMA3, "qwen2": pt.QWEN2, "gpt-4o": pt.GPT4O}[name]
    return pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)


def _bpe_pre_tokenizer(style: str) -> Any:
    """The HF pre-tokenizer structure the model family of `style` uses."""
    from tokenizers import pre_tokenizers

    if style == "smollm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if style == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence(
        [_split_regex(style), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def save_bpe_tokenizer(out: Path, style: str, add_bos: bool) -> None:
    """Train a byte-level BPE with `style`'s pre-tokenizer and save it as HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(ignore_merges=style == "llama-bpe"))
    tok.pre_tokenizer = _bpe_pre_tokenizer(style)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_texts(), trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{SPECIALS[0]} $A", special_tokens=[(SPECIALS[0], tok.token_to_id(SPECIALS[0]))]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[2], pad_token=SPECIALS[0]
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)


def save_spm_tokenizer(out: Path, add_dummy_prefix: bool, add_bos: bool) -> None:
    """Train a SentencePiece BPE (byte fallback, identity normalisation) and save tokenizer.model
    plus the HF files transformers derives from it."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_texts()),
        model_writer=model,
        vocab_size=VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        split_digits=True,
        character_coverage=1.0,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        minloglevel=2,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    # Llama/Mistral-style (a dummy prefix, "legacy" spaces after special tokens, as llama.cpp
    # does) or Gemma-style (no prefix): transformers builds tokenizer.json from tokenizer.model.
    cls = "LlamaTokenizer" if add_dummy_prefix else "GemmaTokenizer"
    config = {"tokenizer_class": cls, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    hf = AutoTokenizer.from_pretrained(out, add_bos_token=add_bos, legacy=True)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)


# ---------------------------------------------------------------- models


@dataclass(frozen=True)
class Variant:
    """One architecture/configuration under test."""

    id: str
    config_class: str
    tokenizer: str  # a BPE pre-tokenizer style, or "spm" / "spm-no-prefix"
    tied: bool
    add_bos: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    head_alignment: float = 2.0  # untied: weight of the successor-token embedding in the output head
    embed_std: float = EMBED_STD
    # f32 logits tolerance: only float summation order differs from PyTorch (~2e-5 measured). ggml's
    # CPU GELU reads an f16 table (GGML_GELU_FP16), which costs Gemma ~2e-3.
    f32_atol: float = 1e-3
    # A line of SAMPLE_TEXT llama.cpp's version of this pre-tokenizer is known to split differently.
    sample_skip: str = ""


_DIMS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "initializer_range": LAYER_STD,
}
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_theta": 10000.0,
}
_LONGROPE_FACTORS = [1.0, 1.3, 1.9, 2.6]  # rope_dim / 2 entries (partial rotary: 8 of 16 dims)

VARIANTS = (
    Variant("llama-tied", "LlamaConfig", "smollm", True),
    Variant(
        "llama-untied-llama3rope-bias",
        "LlamaConfig",
        "llama-bpe",
        False,
        True,
        {"rope_scaling": _LLAMA3_ROPE, "attention_bias": True, "mlp_bias": True},
    ),
    Variant("mistral-spm", "MistralConfig", "spm", False, True, {"sliding_window": None}),
    Variant(
        "qwen2-tied-bias-linear",
        "Qwen2Config",
        "qwen2",
        True,
        config={"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
    ),
    Variant(
        "qwen3-untied-yarn",
        "Qwen3Config",
        "qwen2",
        False,
        config={"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    Variant(
        "gemma3-tied-swa",
        "Gemma3TextConfig",
        "spm-no-prefix",
        True,
        True,
        {
            "num_hidden_layers": 3,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "query_pre_attn_scalar": 16,
        },
        embed_std=0.15,  # Gemma scales embeddings by sqrt(hidden) = 8: smaller, or they drown the layers
        f32_atol=5e-3,
    ),
    Variant(
        "gemma3-untied",
        "Gemma3TextConfig",
        "spm-no-prefix",
        False,
        True,
        {"query_pre_attn_scalar": 16},
        head_alignment=1.0,
        embed_std=0.2,
        f32_atol=5e-3,
    ),
    Variant(
        "phi3-untied-longrope",
        "Phi3Config",
        "spm",
        False,
        False,
        {
            "partial_rotary_factor": 0.5,
            # llama.cpp picks the short factors while its context (rounded up to 256 cells) is within
            # the original length; transformers while the sequence is: both short here.
            "max_position_embeddings": 2048,
            "original_max_position_embeddings": 512,
            "rope_scaling": {
                "rope_type": "longrope",
                "long_factor": [f * 2 for f in _LONGROPE_FACTORS],
                "short_factor": _LONGROPE_FACTORS,
            },
        },
    ),
    # llama.cpp runs an adapted GPT-4o regex whose letter classes miss combining marks (\\p{M}), so
    # Devanagari splits differently there than in HF tokenizers (a llama.cpp limitation).
    Variant("phi3-tied-gpt4o", "Phi3Config", "gpt-4o", True, sample_skip="हिन्दी"),
)


def sample_text(variant: Variant) -> str:
    lines = SAMPLE_TEXT.splitlines(keepends=True)
    return "".join(line for line in lines if not variant.sample_skip or variant.sample_skip not in line)


def without_layers(model: Any) -> Any:
    """A copy whose blocks add nothing to the residual stream (output projections zeroed)."""
    import copy

    import torch

    bare = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in bare.named_parameters():
            if any(key in name for key in ("o_proj", "down_proj")):
                param.zero_()
    return bare


def save_tokenizer(variant: Variant, out: Path) -> None:
    if variant.tokenizer.startswith("spm"):
        save_spm_tokenizer(out, add_dummy_prefix=variant.tokenizer == "spm", add_bos=variant.add_bos)
    else:
        save_bpe_tokenizer(out, variant.tokenizer, add_bos=variant.add_bos)


def build_hf_model(variant: Variant, out: Path) -> Any:
    """Tokenizer + random model saved as a HF folder at `out`; returns the (eval mode) torch model."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_tokenizer(variant, out)
    tok = AutoTokenizer.from_pretrained(out)
    n_vocab = len(tok) + 5  # spare embedding rows, as real checkpoints have
    kwargs = {**_DIMS, **variant.config, "vocab_size": n_vocab, "tie_word_embeddings": variant.tied}
    specials = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    config = getattr(transformers, variant.config_class)(**kwargs, **specials)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:  # norms start at 1 (Gemma: 0) and biases at 0: make each distinct
                param.add_(torch.randn_like(param) * NORM_NOISE)
            elif "embed" in name or "lm_head" in name:
                param.normal_(0.0, variant.embed_std)
        if not variant.tied:
            embed = model.get_input_embeddings().weight
            successor = torch.randperm(embed.shape[0], generator=torch.Generator().manual_seed(1))
            model.get_output_embeddings().weight.add_(variant.head_alignment * embed[successor])
    model.eval()
    model.save_pretrained(out)
    return model


def torch_logits(model: Any, prompts: list[list[int]]) -> list[np.ndarray]:
    """Logits at every position of each prompt, float32, from PyTorch."""
    import torch

    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].float().numpy() for p in prompts]


# ---------------------------------------------------------------- llama.cpp side


def load_gguf(path: Path) -> LoadedModel:
    """The GGUF with an f32 KV cache and flash attention off: both round K/V or Q to f16 otherwise,
    which would hide a converter error of the same size."""
    config = EngineConfig(
        model_path=str(path),
        n_ctx=64,
        n_batch=64,
        n_ubatch=64,
        n_seq_max=1,
        n_threads=2,
        kv_cache_type="f32",
        flash_attn="off",
    )
    return LoadedModel(config)


def llama_logits(model: LoadedModel, prompts: list[list[int]]) -> list[np.ndarray]:
    """Logits at every position of each prompt from llama.cpp (one cold decode per prompt)."""
    batch = TokenBatch(model.n_batch)
    out = []
    for prompt in prompts:
        llama.llama_memory_clear(model.memory, True)
        batch.fill([BatchChunk(0, prompt, 0, False)])
        batch.logits[: len(prompt)] = 1  # every position, not only the last
        assert llama.llama_decode(model.ctx, batch.struct) == 0
        out.append(np.stack([model.output_logits(i) for i in range(len(prompt))]))
    return out


@dataclass(frozen=True)
class Agreement:
    """How llama.cpp's logits compare with PyTorch's over all positions of all prompts."""

    max_abs_diff: float
    argmax_agree: float  # fraction of positions with the same top token
    positions: int
    logit_std: float  # spread of the reference logits: the scale max_abs_diff is measured against

    def __str__(self) -> str:
        return (
            f"max|dlogit|={self.max_abs_diff:.2e} (logit std {self.logit_std:.2f}), "
            f"argmax {self.argmax_agree:.1%} of {self.positions}"
        )


def compare(reference: list[np.ndarray], got: list[np.ndarray]) -> Agreement:
    ref, new = np.concatenate(reference), np.concatenate(got)
    assert ref.shape == new.shape, (ref.shape, new.shape)
    agree = float(np.mean(ref.argmax(-1) == new.argmax(-1)))
    return Agreement(float(np.max(np.abs(ref - new))), agree, len(ref), float(ref.std()))
