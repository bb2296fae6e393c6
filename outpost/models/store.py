"""The model store under $OUTPOST_HOME/models: pulled GGUF files and one manifest per model.

Layout (every write lands by an atomic rename, so a reader never sees half a file):
    models/gguf/<owner>/<repo>/<file>.gguf   the model, under its Hub file name (the served id is its stem)
    models/gguf/pypi/<name==version>/<file>  a model from the package index, under the file's own name
    models/manifests/<key>.json              a Manifest; a model exists in the store iff its manifest does
    models/.partial/<checksum>.part          downloads in progress, resumed by the next pull
A model is identified by (source, repo, file), so `pull smollm2:1.7b` and `pull bartowski/...:q4_K_M`
are the same model. `resolve()` maps whatever a user types after -m (catalog name, repo[:quant], store
name) onto a manifest; a catalog name without a quant means any stored quant of it, the hub's default
first.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from outpost.models.catalog import DEFAULT_QUANT, ModelRef, parse_model_ref
from outpost.models.files import temp_path_beside
from outpost.models.home import outpost_home

__all__ = [
    "AmbiguousModel",
    "Manifest",
    "ModelNotPulled",
    "ModelStore",
    "gguf_in_dir",
    "resolve_model_arg",
    "sagemaker_model",
]

# Where SageMaker puts the model artifacts (an uncompressed S3 prefix, or model.tar.gz unpacked).
SAGEMAKER_MODEL_DIR = "/opt/ml/model"


class ModelNotPulled(ValueError):
    """A valid model name that is not in the store (the CLI's exit 2, with the pull hint)."""


class AmbiguousModel(ValueError):
    """A name that matches several stored models."""


class Manifest(BaseModel):
    """Everything `outpost models show` says about a pulled model."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: int = 1
    name: str = Field(description="store name: family:size-quant for catalog repos, else owner/repo:quant")
    source: Literal["hub", "pypi"] = Field(default="hub", description="the model hub or a package index")
    source_repo: str = Field(description="hub: owner/repo; pypi: the pinned requirement(s)")
    catalog: str | None = Field(default=None, description="the catalog's family:size, if a catalog model")
    revision: str = Field(description="hub: commit sha the file was downloaded at; pypi: the version")
    endpoint: str = Field(description="hub: HF_ENDPOINT; pypi: the wheel's URL (without credentials)")
    file: str = Field(description="path of the file in the repo")
    path: str = Field(description="the file, relative to the store root")
    size: int
    sha256: str
    verified: str = Field(description="what pull checked the bytes against: sha256, git-sha1 or size")
    quant: str
    file_type: str = Field(description="general.file_type as llama.cpp names it")
    architecture: str
    parameters: int
    context_length: int | None
    chat_template: bool
    pulled_at: str


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = temp_path_beside(path)
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def utc_now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class ModelStore:
    """Pulled models on disk. Cheap to create; reads the manifests directory on each call."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else outpost_home() / "models"

    @property
    def partial_dir(self) -> Path:
        return self.root / ".partial"

    def file_path(self, repo: str, filename: str, source: str = "hub") -> Path:
        return self.root / "gguf" / (repo if source == "hub" else f"{source}/{repo}") / filename

    def _manifest_path(self, repo: str, filename: str, source: str = "hub") -> Path:
        key = f"{repo}/{filename}" if source == "hub" else f"{source}:{repo}/{filename}"
        return self.root / "manifests" / (quote(key, safe="") + ".json")

    def manifests(self) -> list[Manifest]:
        """All models in the store, by name. Unreadable manifests are skipped, not fatal."""
        found = []
        for path in sorted((self.root / "manifests").glob("*.json")):
            try:
                found.append(Manifest.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError, ValueError):
                continue
        return sorted(found, key=lambda m: m.name)

    def find(self, repo: str, filename: str, source: str = "hub") -> Manifest | None:
        path = self._manifest_path(repo, filename, source)
        try:
            return Manifest.model_validate_json(path.read_bytes())
        except (OSError, ValidationError, ValueError):
            return None

    def path_of(self, manifest: Manifest) -> Path:
        return self.root / manifest.path

    def add(self, verified_file: Path, manifest: Manifest) -> Manifest:
        """Move a verified download into place, then publish its manifest (the model exists from then)."""
        dest = self.file_path(manifest.source_repo, manifest.file, manifest.source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(verified_file, dest)
        manifest = manifest.model_copy(update={"path": dest.relative_to(self.root).as_posix()})
        mpath = self._manifest_path(manifest.source_repo, manifest.file, manifest.source)
        mpath.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(mpath, json.dumps(manifest.model_dump(), indent=2) + "\n")
        return manifest

    def remove(self, manifest: Manifest) -> Path:
        """Delete a model: the manifest first (so it is gone at once), then its file."""
        self._manifest_path(manifest.source_repo, manifest.file, manifest.source).unlink(missing_ok=True)
        path = self.path_of(manifest)
        path.unlink(missing_ok=True)
        for parent in (path.parent, path.parent.parent):  # tidy gguf/<owner>/<repo>; stops at non-empty
            if parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        return path

    def resolve(self, name: str) -> Manifest:
        """The stored model `name` means; ValueError (with the `outpost pull` hint) if none."""
        stored = self.manifests()
        by_name = [m for m in stored if m.name.lower() == name.strip().lower()]
        if by_name:
            return by_name[0]
        ref = parse_model_ref(name)
        found = [m for m in stored if _means(ref, m)]
        if len(found) > 1:
            found = [m for m in found if m.quant == DEFAULT_QUANT] or found
        if len(found) > 1:
            names = ", ".join(m.name for m in found)
            raise AmbiguousModel(f"{name!r} matches several pulled models ({names}); give the quant")
        if not found:
            raise ModelNotPulled(
                f"model {name!r} is not a file and not in the model store ({self.root}); "
                f"download it first: outpost pull {name}"
            )
        return found[0]


def _means(ref: ModelRef, m: Manifest) -> bool:
    """Whether a parsed name means a stored model: the same hub repo (and quant/file, if given), or the
    same catalog model (any quant, when the name gives none; the exact index file for its quant)."""
    if ref.entry is not None and m.catalog == ref.entry.name and m.source == "pypi":
        return not ref.quant_given or m.quant == ref.quant
    if m.source != "hub" or m.source_repo.lower() != ref.repo.lower():
        return False
    if not ref.quant_given:
        return True
    if ref.quant is not None and m.quant != ref.quant:
        return False
    return ref.filename is None or m.file.rsplit("/", 1)[-1].lower() == ref.filename.lower()


def _looks_like_path(arg: str) -> bool:
    return arg.lower().endswith(".gguf") or arg.startswith(("/", "./", "../", "~", "."))


def resolve_model_arg(arg: str) -> str:
    """What -m means: an existing path (or anything path-like) as given, else a store name's file.

    Never downloads: a name not in the store is a ValueError telling the user to `outpost pull` it.
    """
    if Path(arg).expanduser().is_dir():
        return str(gguf_in_dir(Path(arg).expanduser()))
    if Path(arg).expanduser().exists() or _looks_like_path(arg):
        return arg
    store = ModelStore()
    try:
        manifest = store.resolve(arg)
    except (ModelNotPulled, AmbiguousModel):
        raise
    except ValueError as exc:  # not even a valid name
        raise ValueError(f"{arg!r} is neither a file nor a model name: {exc}") from exc
    path = store.path_of(manifest)
    if not path.is_file():
        raise ValueError(f"the file of {manifest.name} is missing ({path}): outpost pull {manifest.name}")
    return str(path)


def gguf_in_dir(directory: Path) -> Path:
    """The one model in a directory tree: its only .gguf, or the first shard (`-00001-of-000NN`) of a
    split one. Several models is a ValueError naming them, since guessing would serve the wrong one."""
    files = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
    shards = [p for p in files if "-of-" in p.stem and not p.stem.rsplit("-of-", 1)[0].endswith("-00001")]
    models = [p for p in files if p not in shards]
    if len(models) == 1:
        return models[0]
    if not models:
        raise ValueError(f"no .gguf file under {directory}")
    names = ", ".join(str(p.relative_to(directory)) for p in models)
    raise ValueError(f"several .gguf files under {directory} ({names}): pick one with -m")


def sagemaker_model(directory: str = SAGEMAKER_MODEL_DIR) -> str | None:
    """The GGUF SageMaker mounted under /opt/ml/model, or None when that directory holds no .gguf."""
    root = Path(directory)
    if not root.is_dir() or not any(root.rglob("*.gguf")):
        return None
    return str(gguf_in_dir(root))
