"""The workload: three copy-heavy tasks over real text and one free chat task.

Real text, as a user would paste it: a README section, the definitions of Apache-2.0 (from Outpost's
own tokenizer corpus, outpost/models/data, see data/README.md) and `textwrap.dedent` from Python's
standard library. Each document is short (200-460 tokens) so a step's prefill stays short next to
the 256 tokens decoded.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass

from outpost.models.corpus import load_corpus


@dataclass(frozen=True)
class Task:
    name: str
    copy: bool  # copy-heavy (the output repeats much of the input)
    prompt: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


def _license(name: str) -> str:
    for doc in load_corpus():
        if name in doc[:400]:
            return doc
    raise LookupError(f"no {name} text in the corpus")


# A README section as a user would paste it: the edit asked touches one line, the answer repeats the
# rest (SmolLM2-135M copies it nearly whole; see copy_share).
README = """## Install

Outpost needs Python 3.11 or newer. Install it with pip, then pull a model and start the server:

    pip install outpost
    outpost pull smollm2:135m
    outpost serve -m smollm2:135m --port 8080

The server speaks the OpenAI API. Point any OpenAI client at http://localhost:8080/v1 and use the
model name you pulled. To stop the server, press Ctrl-C; requests in flight finish first.
"""


def make_tasks() -> list[Task]:
    """Copy-heavy means the model's answer repeats its input: each copy task here was chosen because
    the real 135M model's greedy answer does (`copy_share` of the plain arm, in the report). An
    earlier set (repeat a GPL passage, quote sentences of Apache-2.0, rename `chunks` in
    `TextWrapper._wrap_chunks`) asked for copying the model did not do: it paraphrased the passage,
    answered the quote in one sentence of its own and looped on its own code."""
    apache = _license("Apache License")
    definitions = apache[apache.index('"License"') :][:1400]
    code = inspect.getsource(textwrap.dedent)
    return [
        Task(
            "doc-edit",
            True,
            "Change the port 8080 to 9000 everywhere in this README section and output the whole "
            f"section.\n\n{README}",
        ),
        Task(
            "extract",
            True,
            f'{definitions}\n\nCopy the definition of "Source" form and the definition of "Object" form '
            "from the text above.",
        ),
        Task(
            "code-edit",
            True,
            "Rewrite this Python function with the parameter `text` renamed to `source`. Output the whole "
            f"function and nothing else.\n\n```python\n{code}```",
        ),
        Task(
            "chat",
            False,
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        ),
    ]


def copy_share(prompt: str, answer: str, n: int = 4) -> float:
    """The share of the answer's words that prompt lookup predicts: the word after the latest earlier
    occurrence of the `n` words before it, in the prompt and the answer so far. What an n-gram
    drafter could have drafted, in words rather than tokens (no tokenizer needed)."""
    words = prompt.split()
    start = len(words)
    words += answer.split()
    last: dict[tuple[str, ...], int] = {}  # n words -> where the latest occurrence ends
    hits = 0
    for i in range(n, len(words)):
        key = tuple(words[i - n : i])
        if i >= start and key in last and words[last[key]] == words[i]:
            hits += 1
        last[key] = i
    return hits / (len(words) - start) if len(words) > start else 0.0
