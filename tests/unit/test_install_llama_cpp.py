"""scripts/install-llama-cpp.sh: llama-cpp-python compiled once per machine with Outpost's CMake flags.

A stand-in `python` answers the script's pip calls (it records them and writes an empty wheel), so no
compiler runs: what is checked is which builds happen, with which CMAKE_ARGS, and what is installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-llama-cpp.sh"

FAKE_PYTHON = """#!/bin/sh
# pip calls are recorded; anything else (the script reads the pin with -c) goes to the real Python.
if [ "$1" = -m ] && [ "$2" = pip ]; then
  echo "$3 CMAKE_ARGS=$CMAKE_ARGS $*" >> "$CALLS"
  if [ "$3" = wheel ]; then
    while [ $# -gt 0 ]; do
      [ "$1" = -w ] && mkdir -p "$2" && : > "$2/llama_cpp_python-0.3.36-py3-none-any.whl"
      shift
    done
  fi
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


def run_script(tmp_path: Path, **env: str) -> list[str]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.unlink(missing_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}
    base |= {"CALLS": str(calls), "REAL_PYTHON": sys.executable, "OUTPOST_HOME": str(tmp_path / "home")}
    subprocess.run(["bash", str(SCRIPT), str(fake)], env=base | env, check=True, capture_output=True)
    return calls.read_text().splitlines()


def test_compiled_once_with_the_flags_then_reused(tmp_path: Path) -> None:
    flags = (ROOT / "scripts" / "llama-cpp-cmake-args").read_text().strip()
    assert "-DCMAKE_CXX_FLAGS=-fno-dse" in flags  # gcc 12 deletes AMX's tile configuration without it
    first = run_script(tmp_path)
    builds = [c for c in first if c.startswith("wheel ")]
    assert len(builds) == 1 and f"CMAKE_ARGS={flags}" in builds[0]
    assert "--no-cache-dir" in builds[0]  # pip's cache would hand back a wheel built without the flags
    assert "llama-cpp-python==0.3.36" in builds[0]
    installs = [c for c in first if c.startswith("install ")]
    assert len(installs) == 1 and "--force-reinstall" in installs[0]
    wheels = list((tmp_path / "home" / "wheels").glob("llama-cpp-python-0.3.36-*/llama_cpp_python-*.whl"))
    assert len(wheels) == 1 and str(wheels[0]) in installs[0]

    again = run_script(tmp_path)
    assert not [c for c in again if c.startswith("wheel ")]  # kept: nothing compiles twice
    assert len([c for c in again if c.startswith("install ")]) == 1


def test_other_cmake_args_are_another_build(tmp_path: Path) -> None:
    run_script(tmp_path)
    cuda = run_script(tmp_path, CMAKE_ARGS="-DGGML_CUDA=on")
    builds = [c for c in cuda if c.startswith("wheel ")]
    assert len(builds) == 1 and "-fno-dse" in builds[0] and "-DGGML_CUDA=on" in builds[0]
    assert len(list((tmp_path / "home" / "wheels").iterdir())) == 2
