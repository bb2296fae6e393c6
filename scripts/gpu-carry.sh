#!/usr/bin/env bash
# Prepares what a GPU machine with no network needs to build and benchmark Outpost on CUDA
# (scripts/gpu-bench.sh runs there), in one ignored folder small enough to carry (<= ~40 MiB):
#   .gpu-carry/llama-cpp-python/  the pinned llama-cpp-python sdist, its vendor/llama.cpp trimmed to
#                                 what a CUDA build of libllama + llama-server needs (ggml's CPU and
#                                 CUDA backends, src, common, tools/server, ui, mtmd, vendor): no
#                                 other backends, models/, docs, tests, examples, web UI sources
#   .gpu-carry/wheels/            wheels (CPython 3.12, manylinux x86-64) of Outpost's runtime
#                                 dependencies that the device image lacks; wheels/build/:
#                                 scikit-build-core and its needs, for llama-cpp-python's build
# Usage: scripts/gpu-carry.sh [OUT_DIR]   (default: .gpu-carry in the repository root)
# The sdist is downloaded once into ${OUTPOST_GPU_CACHE:-~/.cache/outpost-gpu}. The CUDA flags live
# in deploy/cuda-cmake-args, which deploy/Dockerfile.cuda and scripts/gpu-bench.sh read too.
set -euo pipefail
V=0.3.36
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/.gpu-carry}
CACHE=${OUTPOST_GPU_CACHE:-$HOME/.cache/outpost-gpu}
PY=${PYTHON:-python3}
SDIST=$CACHE/llama_cpp_python-$V.tar.gz

mkdir -p "$CACHE" "$OUT"
if [ ! -f "$SDIST" ]; then
  # --no-binary for this one package only: its build requirements may still come as wheels.
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$CACHE" "llama-cpp-python==$V"
fi

# --- the trimmed source tree ---------------------------------------------------------------------
SRC=$OUT/llama-cpp-python
rm -rf "$SRC" "$OUT/llama_cpp_python-$V"
tar xzf "$SDIST" -C "$OUT"
mv "$OUT/llama_cpp_python-$V" "$SRC"
cd "$SRC"
rm -rf .git .github .gitmodules docs docker examples tests scripts Makefile mkdocs.yml CHANGELOG.md
cd vendor/llama.cpp
keep_top="CMakeLists.txt LICENSE licenses cmake ggml src include common tools vendor scripts"
for entry in * .[!.]*; do
  [ -e "$entry" ] || continue
  case " $keep_top " in *" $entry "*) ;; *) rm -rf "$entry" ;; esac
done
# scripts/: only the UI provisioning CMake script (llama-server's empty-UI fallback) is read.
find scripts -mindepth 1 -maxdepth 1 ! -name ui-assets.cmake -exec rm -rf {} +
# ggml: the CPU and CUDA backends only (the other backends are added only when their GGML_* is on).
for dir in ggml/src/ggml-*/; do
  case "$dir" in ggml/src/ggml-cpu/|ggml/src/ggml-cuda/) ;; *) rm -rf "$dir" ;; esac
done
# tools: llama-server and the libraries it links; its web UI is not built (LLAMA_USE_PREBUILT_UI=OFF).
for dir in tools/*/; do
  case "$dir" in tools/server/|tools/ui/|tools/mtmd/) ;; *) rm -rf "$dir" ;; esac
done
find tools/ui -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name ui.cpp.in ! -name ui.h.in \
  ! -name sources.cmake -exec rm -rf {} +
rm -rf tools/mtmd/tests tools/mtmd/test-* tools/server/tests tools/server/public* tools/server/webui
cat > tools/CMakeLists.txt <<'EOF'
# Trimmed by Outpost's scripts/gpu-carry.sh: llama-server and the libraries it links.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(ui)
add_subdirectory(server)
add_subdirectory(mtmd)
EOF
find . \( -name '*.md' -o -name '*.png' -o -name '*.jpg' -o -name '*.gguf' -o -name '*.mp3' \
  -o -name '*.mp4' -o -name '*.wav' \) ! -path './LICENSE*' -delete
cd "$OUT"
echo "trimmed source: $(du -sh "$SRC" | cut -f1)"

# --- wheels for the device's Python 3.12 ---------------------------------------------------------
# Resolved with their dependencies, then every package the device image already has is dropped
# (its list: /work/.library/device/KINDS.md, "Python packages already there"): the image's numpy,
# jinja2, httpx, matplotlib, tokenizers, ... serve, and only what it lacks travels, one version each.
WHEELS=$OUT/wheels
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_24_x86_64; do
  platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086  # one word per flag
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d "$WHEELS" gguf==0.19.0 pydantic==2.14.3 fastapi==0.165.0 uvicorn==0.54.0 httpx2==2.16.2 \
  aio-pika==9.6.2 diskcache sniffio 2>&1 | grep -v "^WARNING: Location" || true
IMAGE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
build certifi charset-normalizer click cloudpickle cmake colorama contourpy coverage cycler cython
filelock fonttools frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub idna iniconfig jinja2
kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl multidict mypy-extensions networkx
ninja numpy packaging pathspec pillow pip pluggy prometheus-client propcache protobuf psutil pygments
pyparsing python-dateutil pyyaml regex requests rich safetensors scipy sentencepiece setuptools
shellingham six sympy tokenizers tqdm typer typing-extensions urllib3 uvloop wheel yarl zipp"
for whl in "$WHEELS"/*.whl; do
  name=$(basename "$whl" | cut -d- -f1 | tr '_A-Z' '-a-z')
  case " $(echo $IMAGE_HAS) " in *" $name "*) rm -f "$whl" ;; esac
done
# llama-cpp-python's build backend and its needs, apart: only its build reads them.
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms -d "$WHEELS/build" scikit-build-core pathspec packaging 2>&1 | grep -v "^WARNING: Location" || true
ls -R "$WHEELS"
echo "carry: $(du -sh "$OUT" | cut -f1) in $OUT"
