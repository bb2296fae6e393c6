"""The baselines' weight layout on AMX-fault CPUs: a llama.cpp build with AMX kernels runs plain
weights beside Outpost's repacked ones (its own repack would pick AMX and crash), a build without them
repacks itself. Whether a build has them is read from its libggml-cpu, here a real shared library
compiled for the test that answers ggml_cpu_has_amx_int8() as a build with or without AMX does."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.harness import common, servers
from benchmarks.harness.common import baseline_layout, build_has_amx

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def fake_build(folder: Path, has_amx: int) -> str:
    """A bin folder like build-llama-cpp*.sh's: a llama-server file beside libggml-cpu.so."""
    folder.mkdir()
    source = folder / "amx.c"
    source.write_text(f"int ggml_cpu_has_amx_int8(void) {{ return {has_amx}; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / "libggml-cpu.so"), str(source)], check=True)
    server = folder / "llama-server"
    server.write_text("#!/bin/sh\n")
    return str(server)


def test_a_build_without_amx_repacks_itself_where_outpost_avoids_amx(tmp_path: Path) -> None:
    binary = fake_build(tmp_path / "no-amx", 0)
    assert not build_has_amx(binary)
    assert baseline_layout("repacked-no-amx", binary) == "repacked"
    assert baseline_layout("amx-gemv", binary) == "repacked"
    assert baseline_layout("plain", binary) == "plain"


def test_a_build_with_amx_keeps_the_safe_layouts(tmp_path: Path) -> None:
    binary = fake_build(tmp_path / "amx", 1)
    assert build_has_amx(binary)
    assert baseline_layout("repacked-no-amx", binary) == "repacked-no-amx"
    assert baseline_layout("amx-gemv", binary) == "amx-gemv"
    assert baseline_layout("repacked", binary) == "repacked"


def test_an_unreadable_build_counts_as_one_with_amx(tmp_path: Path) -> None:
    static = tmp_path / "static"
    static.mkdir()
    (static / "llama-server").write_text("#!/bin/sh\n")  # no libggml-cpu.so beside it
    assert build_has_amx(str(static / "llama-server"))
    assert build_has_amx(None)


@pytest.mark.parametrize(
    ("has_amx", "repack_flag", "layout"), [(0, False, "repacked-no-amx"), (1, True, "plain")]
)
def test_llama_server_command_on_an_amx_fault_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_amx: int, repack_flag: bool, layout: str
) -> None:
    binary = fake_build(tmp_path / "bin", has_amx)
    monkeypatch.setattr(servers, "weight_layout", lambda *_: "repacked-no-amx")  # an AMX-fault CPU's
    setup = servers.Setup(tmp_path / "m.gguf", 2, 16, None, binary)
    spec = servers.server_spec("llama_server", setup, 8099)
    assert ("--no-repack" in spec.argv) is repack_flag
    assert spec.layout == layout


def test_the_answer_is_read_once_per_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = fake_build(tmp_path / "once", 0)
    calls: list[object] = []
    real_run = subprocess.run
    monkeypatch.setattr(common.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    assert not build_has_amx(binary)
    assert not build_has_amx(binary)
    assert len(calls) == 1
