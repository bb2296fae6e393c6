"""`outpost pull NAME`: a catalog name or repo id -> the hub's file -> a resumable download ->
verification -> the model store. Messages and progress bars go to stderr.

Failure leaves nothing that looks like a model: the bytes stay in the store's .partial directory (for
the next pull to resume) or are deleted (checksum mismatch, not a GGUF), and a manifest is written
only after the verified file has been renamed into place.
"""

from __future__ import annotations

import sys
from pathlib import Path

from outpost.models import hub
from outpost.models.catalog import canonical_quant, catalog_name_for, parse_model_ref, quant_in_filename
from outpost.models.gguf_info import read_gguf_info
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


def _manifest(remote: hub.RemoteFile, local: Path, sha256: str, verified: str) -> Manifest:
    try:
        info = read_gguf_info(local)
    except ValueError as exc:
        local.unlink()
        raise RuntimeError(f"{remote.repo}/{remote.filename} is not a GGUF file; discarded ({exc})") from exc
    quant = _quant_label(remote.filename, info.file_type)
    return Manifest(
        name=catalog_name_for(remote.repo, quant) or f"{remote.repo}:{quant}",
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


def pull(name: str, store: ModelStore | None = None) -> Manifest:
    """Pull `name` into the store (a no-op when the same bytes are already there) and return it."""
    from huggingface_hub.utils._fixes import WeakFileLock

    store = store or ModelStore()
    remote = hub.locate(parse_model_ref(name))
    done = _up_to_date(store, remote)
    if done is not None:
        _say(f"{done.name} is up to date ({remote.repo} at {remote.revision[:12]})")
        return done
    _say(f"pulling {remote.repo}/{remote.filename} ({format_size(remote.size)}) at {remote.revision[:12]}")
    partial = store.partial_dir / remote.partial_name
    partial.parent.mkdir(parents=True, exist_ok=True)
    lock = partial.with_suffix(".lock")
    with WeakFileLock(lock):  # a second pull of the same file waits here, then finds it done
        done = _up_to_date(store, remote)
        if done is None:
            hub.download(remote, partial)
            sha256, verified = hub.verify(partial, remote)
            done = store.add(partial, _manifest(remote, partial, sha256, verified))
            _say(f"pulled {done.name} ({format_size(done.size)}, {verified} verified)")
        lock.unlink(missing_ok=True)
    return done
