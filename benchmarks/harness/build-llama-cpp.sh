#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-bench and llama-batched-bench for this CPU, from the llama.cpp copy
# inside the pinned llama-cpp-python sdist (as ../shared/tools/build-llama-cpp.sh does), for the baselines.
#
# By default with the CMake flags Outpost's own install compiles llama-cpp-python with
# (scripts/llama-cpp-cmake-args), so the baseline runs the kernels Outpost runs: on a CPU with AMX, a gcc 12
# build without -fno-dse crashes on AMX's first multi-token matmul (scripts/install-llama-cpp.sh says why),
# and with it llama.cpp's own repack takes AMX, as Outpost's does.
# --no-amx: without AMX (-march=native less AMX), for an Outpost whose llama.cpp faults on AMX and so runs
# CPU_REPACK: such a build's own repack takes that layout too (benchmarks/harness/common.py reads the
# build's ggml_cpu_has_amx_int8() to pick its flags).
# ~5-10 minutes on 2 cores. Usage: build-llama-cpp.sh [--no-amx] [LLAMA_CPP_PYTHON_VERSION]; prints the
# bin folder last. Output: ${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/VERSION-KEY/bin/
# (KEY: the flags' hash, or no-amx; reused once built).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
no_amx=0
if [ "${1:-}" = --no-amx ]; then no_amx=1; shift; fi
V=${1:-$("$root/scripts/llama-cpp-version")}
if [ "$no_amx" = 1 ]; then
  # -march=native (GGML_NATIVE) turns every feature of this CPU on; gcc's explicit -mno-* win over it.
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  flags=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
  D=${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/$V-no-amx
else
  read -r -a flags <"$root/scripts/llama-cpp-cmake-args"
  D=${LLAMA_CPP_BASELINES:-$HOME/.cache/llama-cpp-baselines}/$V-$(echo "${flags[*]}" | sha256sum | cut -c1-8)
fi
if [ -x "$D/bin/llama-server" ] && [ -x "$D/bin/llama-batched-bench" ]; then echo "$D/bin"; exit 0; fi
mkdir -p "$D" && cd "$D"
[ -f "llama_cpp_python-$V.tar.gz" ] || python3 -m pip download -q --no-deps --no-binary :all: -d . "llama-cpp-python==$V"
[ -d src ] || { mkdir src && tar xzf "llama_cpp_python-$V.tar.gz" -C src; }
cd "src/llama_cpp_python-$V/vendor/llama.cpp"
echo "build-llama-cpp: compiling llama.cpp's tools with ${flags[*]} (~5-10 minutes on 2 cores)" >&2
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  "${flags[@]}" >/dev/null
cmake --build build -j"$(nproc)" --target llama-server llama-bench llama-batched-bench >/dev/null 2>&1
mkdir -p "$D/bin" && cp -a build/bin/* "$D/bin/"
echo "$D/bin"
