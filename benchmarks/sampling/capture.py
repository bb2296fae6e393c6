"""Logits rows of the real SmolLM2-135M generating answers to real chat prompts, as a server sees
them (peaked: the model follows its own text), and a context whose output buffer holds them.

The rows are captured once (a few decode steps of 32 sequences, sampled at temperature 0.8 with
numpy so the text does not loop), then `LogitsStage` writes any of them into the output rows of one
wide decode, so a sampler reads them through llama.cpp's own `llama_get_logits_ith`, as in service.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from outpost.engine.batch import TokenBatch
from outpost.engine.lib import llama
from outpost.engine.logits import logits_row
from outpost.engine.model import LoadedModel
from outpost.scheduler.output import BatchChunk

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain how a rainbow forms.",
    "Give me three tips for learning to cook.",
    "What does a compiler do?",
    "Summarise the plot of Romeo and Juliet.",
    "How do plants make food?",
    "Why is the sky blue?",
    "Write a short story about a lost dog.",
    "What is the difference between weather and climate?",
    "List five fruits that are red.",
    "How does a bicycle stay upright?",
    "Describe your ideal weekend.",
    "What is machine learning?",
    "Translate 'good morning' into Spanish and French.",
    "Why do we need sleep?",
    "Write a polite email asking for a day off.",
    "How many legs does a spider have?",
    "What causes earthquakes?",
    "Suggest a name for a coffee shop.",
    "Explain recursion to a child.",
    "What is the tallest mountain in the world?",
    "How do I make a paper airplane?",
    "Write a limerick about a cat.",
    "What are the planets of the solar system?",
    "Why do leaves change colour in autumn?",
    "Give me a recipe for pancakes.",
    "What is photosynthesis?",
    "How do vaccines work?",
    "Describe the water cycle.",
    "What is the Pythagorean theorem?",
    "Write a motivational quote.",
)


def chat_prompt(model: LoadedModel, question: str) -> list[int]:
    text = model.codec.render_chat([{"role": "user", "content": question}])
    return model.vocab.tokenize(text, add_special=False)


def capture_rows(model: LoadedModel, steps: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """(len(QUESTIONS) * steps, n_vocab) rows: each sequence's next-token logits for `steps` steps."""
    n_vocab = model.vocab.n_tokens
    rng = np.random.default_rng(seed)
    batch = TokenBatch(model.n_batch)
    prompts = [chat_prompt(model, q) for q in QUESTIONS]
    pos = [0] * len(prompts)
    pending = [list(p) for p in prompts]  # what each sequence decodes next
    rows: list[npt.NDArray[np.float32]] = []
    llama.llama_memory_clear(model.memory, True)
    for _ in range(steps + 1):
        chunks = [BatchChunk(seq, pending[seq], pos[seq], True) for seq in range(len(prompts))]
        outputs = batch.fill(chunks)
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            raise RuntimeError("llama_decode failed while capturing logits")
        for seq, index in outputs.items():
            row = logits_row(model.ctx, index, n_vocab).copy()
            rows.append(row)
            z = row.astype(np.float64) / 0.8
            p = np.exp(z - z.max())
            pos[seq] += len(pending[seq])
            pending[seq] = [int(rng.choice(n_vocab, p=p / p.sum()))]
    llama.llama_memory_clear(model.memory, True)
    # The first step's rows follow the prompt, the rest the model's own text: all as in service.
    return np.stack(rows[: len(prompts) * steps])


class LogitsStage:
    """One decode whose batch asks logits at `width` positions; `load` overwrites those output rows
    with given logits, so samplers read them from the context exactly as after a real step."""

    def __init__(self, model: LoadedModel, width: int) -> None:
        self.model = model
        self.width = width
        batch = TokenBatch(max(width, model.n_batch))
        chunks = [BatchChunk(seq, [max(model.vocab.bos, 0)], 0, True) for seq in range(width)]
        self.outputs = batch.fill(chunks)  # seq -> batch index
        llama.llama_memory_clear(model.memory, True)
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            raise RuntimeError("llama_decode failed for the staging batch")
        n_vocab = model.vocab.n_tokens
        self._rows = [logits_row(model.ctx, self.outputs[seq], n_vocab) for seq in range(width)]

    def load(self, rows: npt.NDArray[np.float32]) -> list[int]:
        """Writes rows[i] into output row i; returns the batch indices to sample at."""
        for view, row in zip(self._rows, rows, strict=False):
            view[:] = row
        return [self.outputs[seq] for seq in range(len(rows))]
