#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-batched-bench for this CPU with the CMake flags
# Outpost's own install compiles llama-cpp-python with (scripts/llama-cpp-cmake-args), from the llama.cpp
# copy inside the pinned llama-cpp-python sdist (as ../shared/tools/build-llama-cpp.sh does, without
# those flags). So the baseline runs the kernels Outpost runs: on a CPU with AMX, a gcc 12 build without
# -fno-dse crashes on AMX's first multi-token matmul (scripts/install-llama-cpp.sh says why), and with it
# llama.cpp's own repack takes AMX, as Outpost's does. ~10 minutes on 2 cores.
# Usage: build-llama-cpp.sh [LLAMA_CPP_PYTHON_VERSION] ; prints the bin folder last.
# Output: ${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/VERSION-KEY/bin/ (KEY: the flags; reused)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
args=$(cat "$root/scripts/llama-cpp-cmake-args")
V=${1:-0.3.36}
D=${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/$V-$(echo "$args" | sha256sum | cut -c1-8)
if [ -x "$D/bin/llama-server" ] && [ -x "$D/bin/llama-batched-bench" ]; then echo "$D/bin"; exit 0; fi
mkdir -p "$D" && cd "$D"
[ -f "llama_cpp_python-$V.tar.gz" ] || python3 -m pip download -q --no-deps --no-binary :all: -d . "llama-cpp-python==$V"
[ -d src ] || { mkdir src && tar xzf "llama_cpp_python-$V.tar.gz" -C src; }
cd "src/llama_cpp_python-$V/vendor/llama.cpp"
echo "build-llama-cpp: compiling llama.cpp's tools with $args (~10 minutes on 2 cores)" >&2
# shellcheck disable=SC2086
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  $args >/dev/null
cmake --build build -j"$(nproc)" --target llama-server llama-bench llama-batched-bench >/dev/null 2>&1
mkdir -p "$D/bin" && cp -a build/bin/* "$D/bin/"
echo "$D/bin"
