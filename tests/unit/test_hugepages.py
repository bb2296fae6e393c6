"""When Outpost re-executes itself with glibc's hugetlb tunable, and what the environment becomes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outpost import cli, entry
from outpost.engine import hugepages
from outpost.engine.hugepages import (
    OPT_OUT,
    environ_with_hugepages,
    environ_without_hugepages,
    glibc_version,
    hugepages_enabled,
    thp_mode,
)

GLIBC = (2, 36)


def test_thp_mode_reads_the_bracketed_choice(tmp_path: Path) -> None:
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    f.write_text("[always] madvise never\n")
    assert thp_mode(f) == "always"
    f.write_text("garbage\n")
    assert thp_mode(f) is None
    assert thp_mode(tmp_path / "missing") is None


def test_the_tunable_is_added_only_where_it_changes_something() -> None:
    env = environ_with_hugepages({"PATH": "/bin"}, "madvise", GLIBC)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    env = environ_with_hugepages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC)
    assert env is not None
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    nothing_to_do = [
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", GLIBC),  # after our re-exec: no loop
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC),  # the user's own choice wins
        ({OPT_OUT: "0"}, "madvise", GLIBC),
        ({}, "always", GLIBC),  # the kernel already gives huge pages
        ({}, "never", GLIBC),
        ({}, None, GLIBC),  # no THP (not Linux, or a kernel without it)
        ({}, "madvise", None),  # musl or another libc
        ({}, "madvise", (2, 34)),  # glibc before the tunable
    ]
    for environ, mode, glibc in nothing_to_do:
        assert environ_with_hugepages(environ, mode, glibc) is None, (environ, mode, glibc)


def test_a_baseline_child_gets_plain_pages_and_keeps_other_tunables() -> None:
    env = environ_without_hugepages(
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "HOME": "/root"}
    )
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/root", OPT_OUT: "0"}
    assert environ_without_hugepages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) == {OPT_OUT: "0"}
    assert not hugepages_enabled(env)
    assert hugepages_enabled({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    # The opted-out child never turns it back on.
    assert environ_with_hugepages(env, "madvise", GLIBC) is None


def test_glibc_version_on_this_machine() -> None:
    version = glibc_version()
    assert version is None or version >= (2, 17)


def test_main_called_with_arguments_never_replaces_the_callers_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_exec(*args: object) -> None:
        raise AssertionError("main(argv) must not re-execute the calling process")

    monkeypatch.setattr(hugepages.os, "execve", no_exec)  # whatever path would get there
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(OPT_OUT, raising=False)
    assert cli.main(["run", "-m", str(tmp_path / "missing.gguf"), "-p", "hi"]) == 2
    assert "missing.gguf" in capsys.readouterr().err


def test_the_console_script_re_executes_only_the_model_loading_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(entry, "reexec_with_hugepages", lambda: calls.append(list(sys.argv[1:])))
    monkeypatch.setattr(cli, "main", lambda: 0)
    for argv in (["run", "-m", "x.gguf"], ["-v", "serve"], ["bench", "--url", "u"], ["models", "list"], []):
        monkeypatch.setattr(sys, "argv", ["outpost", *argv])
        assert entry.main() == 0
    assert calls == [["run", "-m", "x.gguf"], ["-v", "serve"]]
    assert entry.subcommand(["-v", "--verbose", "serve", "-m", "run"]) == "serve"
    assert entry.subcommand(["--help"]) is None
