"""Huge pages for llama.cpp's weights and KV cache, through glibc's `hugetlb` tunable.

llama.cpp allocates repacked weights, the KV cache and its compute buffers with posix_memalign.
Where the kernel's transparent-huge-page mode is `madvise` (Debian's and Ubuntu's default) that
memory stays on 4 KiB pages, and streaming the weights once per token costs a page-table walk
every 4 KiB. Started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, glibc advises huge pages on its
own large allocations; it reads tunables only when a process starts, so the commands that load a
model (`outpost run`, `outpost serve`) re-execute themselves once with it set. On this project's
2-core VM: decode +4% (SmolLM2-135M shape) and +6% (1.7B), and the 1.7B loads in 2.5 s instead of
4.5 s (a page fault per 2 MiB instead of per 4 KiB).

OUTPOST_HUGEPAGES=0 turns it off. Code that runs `outpost.serving.assembly.Engine` in its own process sets
the tunable itself (or calls `reexec_with_hugepages()` first thing).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "OUTPOST_HUGEPAGES"
THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_MIN_GLIBC = (2, 35)  # the first glibc with the hugetlb tunable

_log = logging.getLogger(__name__)


def thp_mode(path: Path = THP_MODE_FILE) -> str | None:
    """The kernel's THP mode (`always`, `madvise` or `never`); None where it has none."""
    try:
        match = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library this process runs on, None if it is not glibc."""
    try:
        name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    except (ValueError, OSError):  # not a GNU system
        return None
    match = re.match(r"(\d+)\.(\d+)", version)
    if name != "glibc" or match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def environ_with_hugepages(
    environ: Mapping[str, str], mode: str | None, glibc: tuple[int, int] | None
) -> dict[str, str] | None:
    """The environment to re-execute with, or None where re-executing would change nothing:
    opted out, THP `always` (the kernel already does it) or `never`, no glibc that knows the
    tunable, or a hugetlb tunable already set (ours after the re-exec, or the user's own)."""
    if environ.get(OPT_OUT) == "0" or mode != "madvise" or glibc is None or glibc < _MIN_GLIBC:
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if TUNABLE in tunables:
        return None
    env = dict(environ)
    env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1"
    return env


def environ_without_hugepages(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a child that must run on plain pages (a baseline measured as its users run it)."""
    env = dict(environ)
    kept = [t for t in env.pop("GLIBC_TUNABLES", "").split(":") if t and not t.startswith(TUNABLE)]
    if kept:
        env["GLIBC_TUNABLES"] = ":".join(kept)
    env[OPT_OUT] = "0"
    return env


def hugepages_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process was started with glibc's huge-page advice on."""
    return f"{TUNABLE}=1" in environ.get("GLIBC_TUNABLES", "").split(":")


def reexec_with_hugepages() -> None:
    """Replaces this process with the same command plus the tunable where that helps; else
    returns. Call it before any thread starts: exec keeps the pid, the open files and stdin."""
    env = environ_with_hugepages(os.environ, thp_mode(), glibc_version())
    if env is None:
        return
    _log.debug("re-executing with GLIBC_TUNABLES=%s", env["GLIBC_TUNABLES"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
