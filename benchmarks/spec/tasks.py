"""The workload: three copy-heavy tasks over real text and one free chat task.

Real text, shipped with Outpost or with Python: the GPL-3 and Apache-2.0 texts of Outpost's own
tokenizer corpus (outpost/models/data, see data/README.md) and a function of the standard library's
`textwrap`, as a user would paste them. Each prompt's document is cut to about `DOC_WORDS` words so
a step's prefill stays short next to the 256 tokens decoded.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass

from outpost.models.corpus import load_corpus

DOC_WORDS = 120


@dataclass(frozen=True)
class Task:
    name: str
    copy: bool  # copy-heavy (the output repeats much of the input)
    prompt: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


def _words(text: str, n: int, skip: int = 0) -> str:
    return " ".join(text.split()[skip : skip + n])


def _license(name: str) -> str:
    for doc in load_corpus():
        if name in doc[:400]:
            return doc
    raise LookupError(f"no {name} text in the corpus")


def make_tasks() -> list[Task]:
    gpl = _words(_license("GNU GENERAL PUBLIC LICENSE"), DOC_WORDS, skip=120)
    apache = _words(_license("Apache License"), DOC_WORDS, skip=60)
    code = inspect.getsource(textwrap.TextWrapper._wrap_chunks)
    return [
        Task("quote", True, f"Repeat the following text exactly, word for word:\n\n{gpl}\n\nRepeat it now:"),
        Task(
            "extract",
            True,
            f"Here is a license text:\n\n{apache}\n\nQuote, word for word, every sentence of it that "
            "mentions the word Work.",
        ),
        Task(
            "code-edit",
            True,
            "Rewrite this Python method with the variable `chunks` renamed to `pieces`. Output the whole "
            f"method and nothing else.\n\n```python\n{code}```",
        ),
        Task(
            "chat",
            False,
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        ),
    ]
