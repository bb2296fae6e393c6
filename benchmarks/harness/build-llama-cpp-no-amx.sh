#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-batched-bench for this CPU *without* AMX, from the
# llama.cpp copy inside the pinned llama-cpp-python sdist (as ../shared/tools/build-llama-cpp.sh does).
#
# Why: on a CPU that advertises AMX but whose tiles fault (docs/performance.md), a native build's repack
# picks AMX first and crashes on any multi-token batch, so its tools can only run plain weights there. With
# AMX left out of the build, their own repack takes llama.cpp's CPU_REPACK layout, the one Outpost runs on
# such a CPU: the baseline then decodes on the same kernels (benchmarks/harness/common.py reads the build's
# ggml_cpu_has_amx_int8() to pick its flags). ~10 minutes on 2 cores.
# Usage: build-llama-cpp-no-amx.sh [LLAMA_CPP_PYTHON_VERSION] ; prints the bin folder last.
# Output: ${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/VERSION-no-amx/bin/ (reused if built)
set -eu
V=${1:-0.3.36}
D=${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/$V-no-amx
if [ -x "$D/bin/llama-server" ] && [ -x "$D/bin/llama-batched-bench" ]; then echo "$D/bin"; exit 0; fi
mkdir -p "$D" && cd "$D"
[ -f "llama_cpp_python-$V.tar.gz" ] || python3 -m pip download -q --no-deps --no-binary :all: -d . "llama-cpp-python==$V"
[ -d src ] || { mkdir src && tar xzf "llama_cpp_python-$V.tar.gz" -C src; }
cd "src/llama_cpp_python-$V/vendor/llama.cpp"
# -march=native (GGML_NATIVE) turns every feature of this CPU on; gcc's explicit -mno-* win over it.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >/dev/null
cmake --build build -j"$(nproc)" --target llama-server llama-bench llama-batched-bench >/dev/null 2>&1
mkdir -p "$D/bin" && cp -a build/bin/* "$D/bin/"
echo "$D/bin"
