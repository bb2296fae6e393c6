"""Engine pieces that need no model: chat template rendering and batch layout."""

from __future__ import annotations

import pytest

from outpost.engine.batch import TokenBatch
from outpost.engine.chat_template import ChatTemplate, ChatTemplateError
from outpost.scheduler.output import BatchChunk

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chatml_renders_like_hugging_face() -> None:
    t = ChatTemplate(CHATML, bos_token="<s>", eos_token="<|im_end|>")
    text = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith(
        "assistant\n"
    )


def test_template_globals_and_errors() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ messages[0]['content'] | tojson }}",
        bos_token="<s>",
    )
    assert t.render([{"role": "user", "content": "héllo"}]) == '<s>"héllo"'
    with pytest.raises(ChatTemplateError, match="user first"):
        t.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_sandbox_blocks_python_internals() -> None:
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        evil.render([{"role": "user", "content": "x"}])


def test_batch_lays_chunks_back_to_back() -> None:
    batch = TokenBatch(16)
    outputs = batch.fill(
        [BatchChunk(3, [7], 40, True), BatchChunk(0, [1, 2, 3, 4], 10, False), BatchChunk(5, [9, 9], 0, True)]
    )
    assert batch.struct.n_tokens == 7
    assert batch.tokens[:7].tolist() == [7, 1, 2, 3, 4, 9, 9]
    assert batch.pos[:7].tolist() == [40, 10, 11, 12, 13, 0, 1]
    assert batch.seq_ids[:7].tolist() == [3, 0, 0, 0, 0, 5, 5]
    assert batch.logits[:7].tolist() == [1, 0, 0, 0, 0, 0, 1]
    assert outputs == {3: 0, 5: 6}
    assert [batch.struct.seq_id[i][0] for i in range(7)] == [3, 0, 0, 0, 0, 5, 5]  # what llama.cpp reads
    # One-token chunks over the last step's values: nothing stale may survive, flags included.
    outputs = batch.fill([BatchChunk(2, [5], 8, False), BatchChunk(4, [6], 3, True)])
    assert batch.struct.n_tokens == 2
    assert (batch.tokens[:2].tolist(), batch.pos[:2].tolist()) == ([5, 6], [8, 3])
    assert (batch.seq_ids[:2].tolist(), batch.logits[:2].tolist()) == ([2, 4], [0, 1])
    assert outputs == {4: 1}
    with pytest.raises(ValueError, match="capacity"):
        batch.fill([BatchChunk(0, list(range(17)), 0, True)])
