#!/usr/bin/env bash
# Installs the pinned llama-cpp-python into the environment of PYTHON, compiled with the CMake flags in
# scripts/llama-cpp-cmake-args (plus any CMAKE_ARGS of the caller's), once per machine: the wheel is kept
# under $OUTPOST_HOME/wheels (~/.cache/outpost/wheels), keyed by the version, the flags, the compiler and
# the CPU's flags (the build is -march=native), so pip's own cache, which keys a wheel by its source alone,
# never hands back one built otherwise.
#
# Why the flags: gcc 12 (Debian 12's) deletes the stores that fill llama.cpp's AMX tile configuration
# before `ldtilecfg` (its dead-store pass does not see the instruction read them), so on a CPU with AMX
# every multi-token matmul dies on its first tile instruction (SIGILL or a general protection fault).
# -fno-dse keeps the stores; docs/performance.md ("AMX tiles work") has the disassembly and the figures.
# Usage: scripts/install-llama-cpp.sh PYTHON
set -euo pipefail
py=${1:?usage: install-llama-cpp.sh PYTHON}
cd "$(dirname "$0")/.."
version=$("$py" scripts/llama-cpp-version)
args="$(cat scripts/llama-cpp-cmake-args) ${CMAKE_ARGS:-}"
cpu=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || uname -m)
key=$( (echo "$version $args"; "${CC:-cc}" --version 2>/dev/null | head -1; echo "$cpu"; cat "$0") | sha256sum | cut -c1-16)
dir=${OUTPOST_HOME:-$HOME/.cache/outpost}/wheels/llama-cpp-python-$version-$key
if ! compgen -G "$dir/llama_cpp_python-*.whl" >/dev/null; then
  echo "install-llama-cpp: compiling llama-cpp-python $version (llama.cpp: ~10 minutes on 2 cores, once per machine), CMAKE_ARGS=$args" >&2
  rm -rf "$dir.tmp"
  CMAKE_ARGS="$args" "$py" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$version" -w "$dir.tmp"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
"$py" -m pip install -q --no-deps --force-reinstall "$dir"/llama_cpp_python-*.whl
