"""The English text the synthetic tokenizer is trained on: loading it, and rebuilding it.

The corpus ships as `data/corpus.jsonl.gz` (one JSON object per document: source, license, text) so
that training is reproducible everywhere without network access. `build_corpus` is the maintainer
tool that produced it from files present on a Debian + CPython 3.11 machine; run
`python -m outpost.models.corpus OUT` to rebuild (see data/README.md for the provenance).
"""

from __future__ import annotations

import ast
import gzip
import html
import json
import re
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

CORPUS_RESOURCE = "corpus.jsonl.gz"

# Verbatim, whole files only: the GNU texts allow verbatim copies, not edited ones. Older versions
# that mostly repeat a newer one (GPL-1, LGPL-2, GFDL-1.2, MPL-1.1) are left out as duplicates.
LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = (
    "Apache-2.0",
    "Artistic",
    "BSD",
    "CC0-1.0",
    "GFDL-1.3",
    "GPL-2",
    "GPL-3",
    "LGPL-2.1",
    "LGPL-3",
    "MPL-2.0",
)
PSF = "PSF-2.0"
# The Rust Programming Language (rust-lang/book), shipped with every rustup toolchain's docs.
RUST_BOOK_GLOB = ".rustup/toolchains/*/share/doc/rust/html/book"
RUST_BOOK_LICENSE = "MIT OR Apache-2.0"
# Stdlib parts that are tests, demos or vendored text rather than documentation prose.
_SKIP_STDLIB = re.compile(
    r"(^|/)(test|tests|idlelib|lib2to3|turtledemo|site-packages|pydoc_data|ensurepip)(/|$)"
)
_MAX_BYTES = 1_450_000  # keep the shipped corpus under ~1.5 MB of text


def load_corpus() -> list[str]:
    """Return the shipped corpus documents in their fixed order."""
    blob = resources.files("outpost.models").joinpath("data", CORPUS_RESOURCE).read_bytes()
    lines = gzip.decompress(blob).decode("utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line]


def _docstring_paragraphs(stdlib: Path) -> Iterator[str]:
    """Yield prose-like docstring paragraphs from the stdlib, in sorted file order."""
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib).as_posix()
        if _SKIP_STDLIB.search(rel):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    yield from re.split(r"\n\s*\n", doc)


def _is_prose(paragraph: str, min_words: int) -> bool:
    """Keep paragraphs that read as sentences, not code samples, tables or signatures."""
    words = paragraph.split()
    if len(words) < min_words or ">>>" in paragraph:
        return False
    letters = sum(ch.isalpha() or ch.isspace() for ch in paragraph)
    return letters / len(paragraph) > 0.9


def _rust_book_paragraphs(book: Path) -> Iterator[str]:
    """Yield the <p> paragraphs of the current edition's chapters, tags stripped, in chapter order."""
    for page in sorted(book.glob("ch*.html")) + sorted(book.glob("appendix-*.html")):
        main = re.search(r"<main>(.*)</main>", page.read_text(encoding="utf-8"), re.S)
        for raw in re.findall(r"<p>(.*?)</p>", main.group(1) if main else "", re.S):
            yield " ".join(html.unescape(re.sub(r"<[^>]+>", "", raw)).split())


def _dedup_prose(paragraphs: Iterator[str], seen: set[str], min_words: int = 12) -> str:
    """Join the prose paragraphs not seen before (whitespace-insensitive), recording them in `seen`."""
    kept = []
    for paragraph in paragraphs:
        key = " ".join(paragraph.split())
        if key and key not in seen and _is_prose(paragraph, min_words):
            seen.add(key)
            kept.append(paragraph.strip())
    return "\n\n".join(kept)


def _prose_docs(stdlib: Path, book: Path) -> Iterator[tuple[str, str, str]]:
    """(source, license, text) for the Rust Book, pydoc's reference topics, then stdlib docstrings."""
    from pydoc_data import topics  # the running interpreter's copy of the Python reference

    seen: set[str] = set()
    yield (
        "rust-lang/book (The Rust Programming Language)",
        RUST_BOOK_LICENSE,
        _dedup_prose(_rust_book_paragraphs(book), seen),
    )
    reference = (p for key in sorted(topics.topics) for p in topics.topics[key].split("\n\n"))
    yield "python-3.11 pydoc_data/topics.py", PSF, _dedup_prose(reference, seen)
    yield "python-3.11 stdlib docstrings", PSF, _dedup_prose(_docstring_paragraphs(stdlib), seen)


def build_corpus(out: Path) -> int:
    """Write the corpus file from this machine's license texts and Python docs; return its text bytes."""
    stdlib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    docs: list[dict[str, str]] = [
        {
            "source": f"debian common-licenses/{name}",
            "license": "the license text itself, verbatim (its terms allow verbatim copies)",
            "text": (LICENSE_DIR / name).read_text(encoding="utf-8"),
        }
        for name in LICENSE_FILES
    ]
    docs.append(
        {
            "source": "python-3.11 LICENSE.txt",
            "license": PSF,
            "text": (stdlib / "LICENSE.txt").read_text(encoding="utf-8"),
        }
    )
    book = sorted(Path.home().glob(RUST_BOOK_GLOB))[0]
    budget = _MAX_BYTES - sum(len(d["text"].encode()) for d in docs)
    for source, license_, text in _prose_docs(stdlib, book):
        if len(text.encode()) > budget:  # cut at a paragraph boundary
            text = text.encode()[:budget].decode("utf-8", "ignore").rsplit("\n\n", 1)[0]
        budget -= len(text.encode())
        docs.append({"source": source, "license": license_, "text": text})
    payload = "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs)
    # mtime=0 keeps the gzip bytes reproducible across rebuilds.
    out.write_bytes(gzip.compress(payload.encode("utf-8"), compresslevel=9, mtime=0))
    return sum(len(d["text"].encode()) for d in docs)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / CORPUS_RESOURCE
    print(f"wrote {target}: {build_corpus(target)} bytes of text")
