"""The synthetic models' tokenizer, checked through llama.cpp's own tokenizer (vocab-only loads).

The held-out text below was written for this test and is not in the training corpus (checked).
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path

import jinja2
import pytest
from gguf import TokenType

from outpost.models.corpus import load_corpus
from outpost.models.synth import write_vocab_only_gguf
from outpost.models.tokenizer import (
    BOS_ID,
    CHAT_TEMPLATE,
    EOS_ID,
    SPECIAL_TOKENS,
    build_vocab,
    is_visible,
    normalize_text,
    piece_bytes,
    train_bpe,
)

llama_cpp = pytest.importorskip("llama_cpp")

# One line per paragraph, as a user would paste it (hard-wrapped lines would add newline tokens).
NARRATIVE = "\n\n".join(
    [
        (
            "The small town sat at the edge of a wide valley, where the river turned slowly toward the "
            "sea. Every morning the baker opened his shop before sunrise, and the smell of fresh bread "
            "drifted down the empty street. Children walked to school in pairs, carrying books and "
            "lunches, while their parents hurried to catch the early train into the city."
        ),
        (
            "In the spring, farmers planted wheat and corn in the fields beyond the old stone bridge. "
            "They worked long hours and talked about the weather, the price of seed, and the news from "
            "neighboring villages. When the rain came late, they worried; when it came too early, they "
            "worried even more. Still, most years the harvest was good enough to keep everyone fed "
            "through the winter."
        ),
        (
            "Travelers who visit the coast in autumn are often surprised by how calm it feels. The summer "
            "crowds are gone, the hotels are cheaper, and the beaches are nearly empty. On clear "
            "evenings, people gather on the cliffs to watch the sun disappear behind the water, and for a "
            "few minutes nobody says a word."
        ),
    ]
)

TECHNICAL = "\n\n".join(
    [
        (
            "Good software is written for people as much as for machines. Clear names, short functions, "
            "and honest comments make a program easier to understand and safer to change. When a team "
            "agrees on simple habits, such as reviewing each other's work and writing tests before fixing "
            "a bug, the whole project tends to move faster, even if each single step feels slower at "
            "first."
        ),
        (
            "A cache keeps recent results close at hand so that a second request for the same data can be "
            "answered without repeating the expensive work. The hard part is deciding when an entry is "
            "stale. If the source changes and the cache does not notice, users see old values; if the "
            "cache throws entries away too eagerly, it stops saving any time at all. Most designs pick a "
            "size limit, evict the least recently used entry when the limit is reached, and let callers "
            "invalidate a key explicitly after a write."
        ),
        (
            "Scientists often describe discovery as a long conversation between ideas and evidence. A "
            "researcher proposes an explanation, designs an experiment to test it, and then carefully "
            "measures what happens. If the results do not match the prediction, the explanation must be "
            "changed or abandoned."
        ),
    ]
)


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("vocab")
    return {s: write_vocab_only_gguf(s, out / f"{s}.gguf") for s in ("tiny", "smollm2-135m")}


def _llama_vocab(path: Path):  # type: ignore[no-untyped-def]
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def test_held_out_text_is_not_in_the_corpus() -> None:
    corpus_words = normalize_text("\n".join(load_corpus())).split()
    shingles = {tuple(corpus_words[i : i + 6]) for i in range(len(corpus_words) - 5)}
    held = normalize_text(NARRATIVE + TECHNICAL).split()
    overlaps = [held[i : i + 6] for i in range(len(held) - 5) if tuple(held[i : i + 6]) in shingles]
    assert len(overlaps) <= 3, overlaps  # a stray common phrase is fine, copied passages are not


@pytest.mark.parametrize("shape", ["tiny", "smollm2-135m"])
def test_tokens_per_word_on_held_out_english(vocab_files: dict[str, Path], shape: str) -> None:
    llm = _llama_vocab(vocab_files[shape])
    ratios = {}
    for name, text in (("narrative", NARRATIVE), ("technical", TECHNICAL)):
        ratios[name] = len(llm.tokenize(text.encode(), add_bos=False)) / len(text.split())
    text = NARRATIVE + "\n" + TECHNICAL
    overall = len(llm.tokenize(text.encode(), add_bos=False)) / len(text.split())
    print(f"{shape}: tokens/word {overall:.3f} {ratios}")
    assert 1.2 <= overall <= 1.6, ratios
    # The corpus is technical prose, so everyday narrative splits into more pieces than docs do.
    assert 1.1 <= ratios["technical"] <= 1.5 and 1.3 <= ratios["narrative"] <= 1.8, ratios


def test_llama_cpp_round_trips_any_text(vocab_files: dict[str, Path]) -> None:
    llm = _llama_vocab(vocab_files["tiny"])
    text = "Hello,  world!\n\tTabs, digits 12345, café — naïve 東京 🙂 <b>tags</b>"
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert llm.detokenize(ids).decode() == text
    assert all(i >= len(SPECIAL_TOKENS) for i in ids)  # special text is not special without special=True


def test_specials_are_control_tokens_at_low_ids(vocab_files: dict[str, Path]) -> None:
    llm = _llama_vocab(vocab_files["tiny"])
    assert (llm.token_bos(), llm.token_eos()) == (BOS_ID, EOS_ID)
    ids = llm.tokenize(b"<|im_start|>user\nhi<|im_end|>\n", add_bos=False, special=True)
    assert ids[0] == 1 and 2 in ids
    vocab = build_vocab(8192)
    assert vocab.tokens[:3] == SPECIAL_TOKENS
    assert all(vocab.token_types[i] == TokenType.CONTROL for i in range(3))
    assert all(t == TokenType.NORMAL for t in vocab.token_types[3:])


@pytest.mark.parametrize("size", [8192, 49152, 151936])
def test_vocab_pieces_are_distinct_and_visible(size: int) -> None:
    vocab = build_vocab(size)
    assert vocab.size == size and len(set(vocab.tokens)) == size
    pieces = [piece_bytes(t) for t in vocab.tokens]
    assert len(set(pieces)) == size
    invisible = [i for i in range(3, size) if not is_visible(pieces[i])]
    # Only the byte-fallback alphabet may be invisible (control bytes, space, newline, lone UTF-8
    # bytes): the tokenizer needs them to encode any input. Everything learned or padded renders.
    assert all(len(vocab.tokens[i]) == 1 for i in invisible)
    assert len(invisible) == 162
    assert set(vocab.hidden_ids()) == {0, 1, 2, *invisible}
    assert vocab.n_learned > 7000 and all(is_visible(p) for p in pieces[vocab.n_learned :])


def test_training_is_deterministic() -> None:
    assert train_bpe(2048) == train_bpe(2048)


def test_chat_template_is_chatml() -> None:
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert template.render(messages=messages) == expected
    assert template.render(messages=messages, add_generation_prompt=True) == (
        expected + "<|im_start|>assistant\n"
    )


def test_corpus_is_small_and_documented() -> None:
    data = resources.files("outpost.models").joinpath("data")
    blob = data.joinpath("corpus.jsonl.gz").read_bytes()
    docs = [json.loads(line) for line in gzip.decompress(blob).decode().splitlines()]
    assert sum(len(d["text"].encode()) for d in docs) < 1_500_000
    assert all(d["source"] and d["license"] for d in docs)
    assert "corpus.jsonl.gz" in data.joinpath("README.md").read_text()
