#!/usr/bin/env bash
# Compiles llama.cpp's libraries once per CPU build of one architecture, on this (x86-64 Debian) host:
# natively for amd64, with Debian's crossbuild-essential-arm64 for arm64 (compiling inside an emulated
# container would take hours on 2 cores). Usage: deploy/cpu-builds.sh ARCH OUTDIR
#   OUTDIR/<build>/lib{llama,ggml,ggml-base,ggml-cpu}.so* (RPATH $ORIGIN: each folder is complete),
#   OUTDIR/<build>/CMAKE_ARGS (the flags it was built with). The build names are fixed
#   (outpost/engine/cpu_builds.py chooses among them at start; docs/deploy.md says what each is for).
# libllama, libggml and libggml-base do not depend on the CPU flags: they are compiled once, with the
# first build, and only libggml-cpu is compiled again per build. Results are cached under
# $OUTPOST_IMAGE_CACHE (~/.cache/outpost-image), keyed by the llama-cpp-python version, the flags and
# this script, so a second `make image` compiles nothing; the build folders stay too (one per build
# name), so a change of flags recompiles only what it touches. Compiles run under `nice` (shared machines).
set -euo pipefail
arch=${1:?usage: cpu-builds.sh amd64|arm64 OUTDIR}
out=${2:?usage: cpu-builds.sh amd64|arm64 OUTDIR}
cd "$(dirname "$0")/.."
version=$(python3 -c 'import re,tomllib; d=tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"]; print(next(re.split("==",x)[1] for x in d if x.startswith("llama-cpp-python==")))')
cache=${OUTPOST_IMAGE_CACHE:-$HOME/.cache/outpost-image}
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

common="-DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
# name|cmake flags. amd64-v3: x86-64-v3 (AVX2, FMA, F16C, BMI2), every x86 server CPU since 2013/2017.
# amd64-avx512: AVX-512 F/BW/DQ/VL with VNNI and BF16 (Cascade Lake with BF16 = Cooper Lake, Sapphire
# Rapids and later, AMD Zen 4+). arm64-n1: Graviton2's Neoverse N1, strictly armv8.2-a+dotprod+fp16.
# arm64-sve-i8mm: Graviton3's Neoverse V1, an armv8.4-a core with SVE, i8mm and bf16 (armv8.6-a would let
# the compiler use v8.5 instructions V1 lacks); Graviton4 runs it too (gcc-12 knows no armv9.2/neoverse-v2).
case "$arch" in
  amd64)
    builds=(
      "amd64-v3|-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF"
      "amd64-avx512|-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
    )
    toolchain=()
    ;;
  arm64)
    builds=(
      "arm64-n1|-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16"
      "arm64-sve-i8mm|-DGGML_CPU_ARM_ARCH=armv8.4-a+dotprod+fp16+sve+i8mm+bf16"
    )
    if [ "$(uname -m)" = aarch64 ]; then toolchain=(); else
      command -v aarch64-linux-gnu-gcc >/dev/null || { echo "cpu-builds: aarch64-linux-gnu-gcc is missing: make deploy-deps" >&2; exit 2; }
      toolchain=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
        -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
        -DCMAKE_FIND_ROOT_PATH=/usr/aarch64-linux-gnu -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER
        -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY)
    fi
    ;;
  *) echo "cpu-builds: no CPU builds for $arch" >&2; exit 2 ;;
esac

key=$( (echo "$version $common ${toolchain[*]}"; printf '%s\n' "${builds[@]}"; cat "$0") | sha256sum | cut -c1-16)
dest=$cache/cpu-builds/$arch-$version-$key
if [ ! -f "$dest/.complete" ]; then
  src=$cache/src/llama-cpp-python-$version
  if [ ! -d "$src/vendor/llama.cpp" ]; then
    mkdir -p "$cache/src"
    echo "cpu-builds: fetching llama-cpp-python $version's source" >&2
    python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache/src" >&2
    tar -xzf "$cache/src/llama_cpp_python-$version.tar.gz" -C "$cache/src"
    mv "$cache/src/llama_cpp_python-$version" "$src"
  fi
  work=$cache/work/$arch
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp" "$work"
  first=1
  for entry in "${builds[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    echo "cpu-builds: $name: $flags" >&2
    # shellcheck disable=SC2086
    cmake -S "$src/vendor/llama.cpp" -B "$work/$name" -G Ninja $common $flags "${toolchain[@]}" \
      -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' >"$work/$name.configure.log"
    mkdir -p "$dest.tmp/$name"
    if [ "$first" = 1 ]; then
      nice -n 10 cmake --build "$work/$name" --target llama -j "$jobs" >&2
      shared=$work/$name/bin
      first=0
    else
      nice -n 10 cmake --build "$work/$name" --target ggml-cpu -j "$jobs" >&2
    fi
    cp -a "$shared"/lib{llama,ggml,ggml-base}.so* "$dest.tmp/$name/"
    cp -a "$work/$name/bin"/libggml-cpu.so* "$dest.tmp/$name/"
    echo "$common $flags" >"$dest.tmp/$name/CMAKE_ARGS"
  done
  rm -rf "$dest" && mv "$dest.tmp" "$dest" && touch "$dest/.complete"
fi
rm -rf "$out" && mkdir -p "$out" && cp -a "$dest"/. "$out"/ && rm -f "$out/.complete"
echo "cpu-builds: $arch: $(cd "$out" && echo */ | tr -d /) in $out (cache $dest)" >&2
