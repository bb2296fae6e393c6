"""Hugging Face Hub access for `outpost pull`: find the GGUF file a ModelRef means, download it
resumably, verify it. All network traffic goes through huggingface_hub (pinned), so HF_ENDPOINT,
HF_TOKEN / a saved login, HF_HUB_OFFLINE and the hub's redirects behave as everywhere else.

Why not hf_hub_download: since huggingface_hub 2.x it deletes a partial download when the process
fails, so a pull of a multi-GB model over an edge link that drops would start again from zero. Here
the bytes go to a partial file named after the file's checksum (so only the same bytes are ever
resumed) through the library's own `http_get`, which sends `Range: bytes=N-` for what is already
there, retries dropped connections itself and draws the progress bar on stderr.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from outpost.models.catalog import DEFAULT_QUANT, ModelRef, quant_in_filename

__all__ = ["ChecksumError", "DownloadError", "RemoteFile", "choose_file", "download", "locate", "verify"]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_HASH_CHUNK = 8 << 20


class DownloadError(RuntimeError):
    """The transfer failed (network, server); what arrived is kept for the next pull to resume."""


class ChecksumError(RuntimeError):
    """The bytes are complete but not the file the hub described; they have been deleted."""


@dataclass(frozen=True)
class RemoteFile:
    """One file at one commit, with what the hub told us to check it against."""

    repo: str
    revision: str  # commit sha
    filename: str
    size: int
    sha256: str | None  # LFS files (all real GGUFs): X-Linked-Etag / the LFS pointer's oid
    git_sha1: str | None  # small files kept in git: the blob id (ETag)
    url: str  # where the bytes are, after the hub's redirect (a CDN for LFS files)
    send_token: bool  # the token never leaves the hub's host (signed CDN URLs need none)
    endpoint: str

    @property
    def partial_name(self) -> str:
        """Content-addressed, so a partial file is only ever resumed with the same bytes."""
        return f"{self.sha256 or self.git_sha1 or self.revision + '-' + self.filename.replace('/', '_')}.part"


@contextlib.contextmanager
def _hub_errors(repo: str, endpoint: str) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-line errors: ValueError (bad name, exit 2) or
    DownloadError (the network or the hub failed, exit 1)."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError as exc:
        raise ValueError(
            f"{repo} is gated: accept its terms on the Hub, then set HF_TOKEN to a token that has access"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ValueError(
            f"no Hugging Face repo {repo!r} at {endpoint} (check the name; private repos need HF_TOKEN)"
        ) from exc
    except (RevisionNotFoundError, RemoteEntryNotFoundError) as exc:
        raise ValueError(f"{repo}: {_first_line(exc)}") from exc
    except OfflineModeIsEnabled as exc:
        raise DownloadError("HF_HUB_OFFLINE is set: pulling needs the Hub") from exc
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
        raise DownloadError(f"cannot get {repo} from {endpoint}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:2]) or type(exc).__name__


def choose_file(ref: ModelRef, filenames: Sequence[str]) -> str:
    """The GGUF in a repo's file list that `ref` means; ValueError listing the choices otherwise."""
    ggufs = [f for f in filenames if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    if not ggufs:
        raise ValueError(f"{ref.repo} has no GGUF files (for safetensors repos: outpost convert {ref.repo})")
    quant = ref.quant or DEFAULT_QUANT
    if ref.filename is not None:
        wanted = ref.filename.lower()
        matches = [f for f in ggufs if f.lower() == wanted or f.lower().rsplit("/", 1)[-1] == wanted]
    else:
        matches = [f for f in ggufs if quant_in_filename(f) == quant]
        if not matches and ref.quant is None and len(ggufs) == 1 and not _SPLIT.search(ggufs[0]):
            matches = ggufs  # a repo with one GGUF: that is the model, whatever its name says
    top_level = [f for f in matches if "/" not in f]
    if len(matches) == 1 or len(top_level) == 1:
        return (top_level or matches)[0]
    if matches:
        raise ValueError(f"{ref.repo} has several files for that quant: {', '.join(sorted(matches))}")
    if any(_SPLIT.search(f) and quant.lower() in f.lower() for f in ggufs):
        raise ValueError(f"{ref.repo} has {quant} only as split GGUF parts, which pull does not support yet")
    available = sorted({q for f in ggufs if (q := quant_in_filename(f))})
    hint = f"; available: {', '.join(available)}" if available else f"; files: {', '.join(sorted(ggufs))}"
    raise ValueError(f"{ref.repo} has no {quant} GGUF{hint}")


def locate(ref: ModelRef) -> RemoteFile:
    """Ask the hub which file `ref` means, at which commit, how big, with which checksum."""
    from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url

    endpoint = constants.ENDPOINT
    with _hub_errors(ref.repo, endpoint):
        info = HfApi().model_info(ref.repo, revision="main", files_metadata=True)
        siblings = {s.rfilename: s for s in info.siblings or []}
        filename = choose_file(ref, list(siblings))
        if info.sha is None:
            raise DownloadError(f"{endpoint} did not say which commit {ref.repo} is at")
        url = hf_hub_url(ref.repo, filename, revision=info.sha)
        meta = get_hf_file_metadata(url)
    sibling = siblings[filename]
    lfs_sha = sibling.lfs.sha256 if sibling.lfs is not None else None
    etag = (meta.etag or "").lower()
    sha256 = etag if _SHA256.match(etag) else lfs_sha
    if lfs_sha and sha256 != lfs_sha:
        raise DownloadError(
            f"{endpoint} gave two checksums for {ref.repo}/{filename}: {sha256} and {lfs_sha}"
        )
    size = meta.size if meta.size is not None else sibling.size
    if size is None:
        raise DownloadError(f"{endpoint} did not give the size of {ref.repo}/{filename}")
    return RemoteFile(
        repo=ref.repo,
        revision=meta.commit_hash or info.sha,
        filename=filename,
        size=int(size),
        sha256=sha256,
        git_sha1=etag if sha256 is None and _SHA1.match(etag) else None,
        url=meta.location,
        send_token=urlsplit(meta.location).netloc == urlsplit(url).netloc,
        endpoint=endpoint,
    )


def download(remote: RemoteFile, partial: Path) -> None:
    """Fetch `remote` into `partial`, continuing from whatever `partial` already holds."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils._headers import build_hf_headers

    headers = build_hf_headers()  # HF_TOKEN or the saved login, and huggingface_hub's user agent
    if not remote.send_token:
        headers.pop("authorization", None)
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if have > remote.size:  # cannot be our bytes: start over
        partial.unlink()
        have = 0
    free = shutil.disk_usage(partial.parent).free
    if free < remote.size - have:  # fail now, not with a full disk an hour into the download
        raise DownloadError(
            f"not enough disk space in {partial.parent} for {remote.filename}: "
            f"{remote.size - have} bytes needed, {free} free"
        )
    if have:
        sys.stderr.write(f"outpost: resuming {remote.filename} at {have} of {remote.size} bytes\n")
    try:
        with _hub_errors(remote.repo, remote.endpoint), partial.open("ab") as out:
            http_get(
                remote.url,
                out,
                resume_size=have,
                headers=headers,
                expected_size=remote.size,
                displayed_filename=remote.filename.rsplit("/", 1)[-1],
            )
            out.flush()
            os.fsync(out.fileno())
    except DownloadError as exc:
        kept = partial.stat().st_size if partial.exists() else 0
        if kept > remote.size:
            partial.unlink()
            kept = 0
        raise DownloadError(
            f"{exc} ({kept} of {remote.size} bytes kept; run the same pull again to resume)"
        ) from exc


def verify(path: Path, remote: RemoteFile) -> tuple[str, str]:
    """Check size and the hub's checksum. Returns (the file's sha256, what was checked: "sha256",
    "git-sha1" or "size"); raises ChecksumError, having deleted the file, on a mismatch."""
    from tqdm import tqdm  # huggingface_hub depends on it and draws the download bar with it

    size = path.stat().st_size
    if size != remote.size:
        path.unlink()
        raise ChecksumError(f"{remote.filename}: got {size} bytes, the hub says {remote.size}; discarded")
    sha256 = hashlib.sha256()
    git = hashlib.sha1(b"blob %d\0" % size) if remote.git_sha1 else None
    with (
        path.open("rb") as f,
        tqdm(total=size, unit="B", unit_scale=True, desc="verifying", file=sys.stderr, disable=None) as bar,
    ):
        for block in iter(lambda: f.read(_HASH_CHUNK), b""):  # ends at EOF: at most size/8 MiB reads
            sha256.update(block)
            if git is not None:
                git.update(block)
            bar.update(len(block))
    got = sha256.hexdigest()
    if remote.sha256 is not None:
        expected, actual, kind = remote.sha256, got, "sha256"
    elif git is not None and remote.git_sha1 is not None:
        expected, actual, kind = remote.git_sha1, git.hexdigest(), "git-sha1"
    else:
        return got, "size"
    if actual != expected:
        path.unlink()
        raise ChecksumError(
            f"{kind} mismatch for {remote.repo}/{remote.filename}: expected {expected}, got {actual}; "
            "the download was discarded, pull again"
        )
    return got, kind
