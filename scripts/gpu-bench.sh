#!/usr/bin/env bash
# Outpost on a GPU, measured against llama.cpp's llama-server on the same card, in one call on a
# machine with no network (issue 29). Run scripts/gpu-carry.sh first (here, with network): it leaves
# .gpu-carry/ (the trimmed llama.cpp source and the wheels), which travels with the call:
#   run(command="bash scripts/gpu-bench.sh", carry=[".gpu-carry"], timeout_s=600)
# Steps, each logged with its time to $OUT/progress.log, results copied to $OUT as they come:
#   1. the card (nvidia-smi), nvcc, Python -> env.json
#   2. wheels into /tmp/site (--no-index --no-deps)
#   3. llama.cpp built ONCE with deploy/cuda-cmake-args (ninja): libllama + libggml* and llama-server,
#      in .gpu-build/<mode> (kept on a warm machine: a second call skips the build)
#   4. llama-cpp-python's Python package from the same sdist, built without its own llama.cpp
#      (-DLLAMA_BUILD=OFF) and pointed at that build (its lib/ and LLAMA_CPP_LIB_PATH)
#   5. llama.cpp's device list as Outpost reads it (outpost/engine/devices.py) -> env.json
#   6. a SmolLM2-1.7B-shaped f16 model with random weights (`outpost models synth`)
#   7. greedy token ids, Outpost -ngl 99 vs llama-server -ngl 99 (benchmarks/gpu/greedy.py) -> greedy.json
#   8. serve at 1, 32 and 64 streams, both servers with the same -ngl/-np/-c/-t (benchmarks/serve/,
#      one call per level so each level's figures land) -> serve.jsonl
#   9. the docs table from those files (benchmarks/gpu/report.py) -> table.md
# --setup-only: steps 1-6, then the environment for later commands in $BUILD/env.sh (diagnostics);
# --skip-greedy: no step 7 (a second call on a warm machine, for the serve levels alone).
# --resume: reuse what an earlier call on this (warm) machine finished with the same options (its
# greedy.json, ready.txt and each serve level, kept in $BUILD/done-*), copy it to $OUT and run the
# rest: after a call stopped at its limit, the same call with --resume goes on where it stopped.
# The model (step 6) is written in the background while llama.cpp builds (it needs no llama.cpp).
# --cpu: the same steps with a CPU build and no nvidia-smi (to check the plumbing where there is no
# GPU; e.g. --cpu --shape tiny --quant q8_0 --levels 1,2 --no-wheels with the project's venv).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
MODE=cuda SHAPE=smollm2-1.7b QUANT=f16 LEVELS=1,32,64 PARALLEL=64 NGL=99 WHEELS=1
PROMPTS=16 TOKENS=64 REQUESTS="" THREADS=${THREADS:-8} SETUP_ONLY=0 GREEDY=1 RESUME=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --shape) SHAPE=$2; shift ;;
    --quant) QUANT=$2; shift ;;
    --levels) LEVELS=$2; shift ;;
    --parallel) PARALLEL=$2; shift ;;
    --ngl) NGL=$2; shift ;;
    --prompts) PROMPTS=$2; shift ;;
    --tokens) TOKENS=$2; shift ;;
    --requests) REQUESTS=$2; shift ;;
    --no-wheels) WHEELS=0 ;;
    --setup-only) SETUP_ONLY=1 ;;
    --skip-greedy) GREEDY=0 ;;
    --resume) RESUME=1 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
CARRY=${GPU_CARRY:-$ROOT/.gpu-carry}
BUILD=${GPU_BUILD:-$ROOT/.gpu-build}
OUT=${OUT:-$ROOT/bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
WORK=$BUILD/run-$(date +%Y%m%d-%H%M%S)
SITE=$BUILD/site-$MODE
PY=${PYTHON:-python3}
# What this call finishes, kept for a --resume call on the same machine (keyed by the options).
DONE=$BUILD/done-$MODE-$SHAPE-$QUANT-ngl$NGL-np$PARALLEL-t$THREADS-p$PROMPTS-n$TOKENS-r${REQUESTS:-default}
mkdir -p "$OUT" "$WORK" "$BUILD/models" "$DONE"
[ "$RESUME" = 1 ] || rm -f "$DONE"/*  # a fresh call: nothing of an earlier one is reused
export PYTHONUNBUFFERED=1

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/progress.log" >&2; }
step() { log "--- $*"; }
fail() { log "FAILED: $*"; tail -n 40 "$1" >> "$OUT/logs.txt" 2>/dev/null || true; exit 1; }
env_json() { "$PY" - "$OUT/env.json" "$@" <<'EOF'
import json, sys
path, key, value = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    data = json.load(open(path))
except (OSError, ValueError):
    data = {}
try:
    data[key] = json.loads(value)
except ValueError:
    data[key] = value
json.dump(data, open(path, "w"), indent=1)
EOF
}

# cuBLAS and the driver library, which ggml's CUDA backend links: in the toolkit where it is a full
# one, else cuBLAS from the NVIDIA wheels a Python environment holds (nvidia/cu13/{include,lib}; the
# device image's PyTorch has them) and the driver's libcuda.so.1, none of them under the unversioned
# names CMake's find_library looks for: symlinked in a shim folder.
cuda_flags() {
  local nvcc_dir inc header lib shim so driver
  nvcc_dir=$(dirname "$(readlink -f "$(command -v nvcc)")")
  shim=$BUILD/cuda-shim
  mkdir -p "$shim"
  driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  if [ ! -e "$nvcc_dir/../lib64/stubs/libcuda.so" ] && [ -n "$driver" ]; then
    ln -sf "$driver" "$shim/libcuda.so"
  fi
  for inc in "$nvcc_dir/../include" "$nvcc_dir/../targets/x86_64-linux/include" /usr/local/cuda/include; do
    [ -f "$inc/cublas_v2.h" ] && { echo "-DCMAKE_LIBRARY_PATH=$shim"; return 0; }
  done
  header=$( { "$PY" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null || true
              ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia 2>/dev/null || true; } |
            while read -r dir; do find "$dir" -maxdepth 3 -name cublas_v2.h; done | head -1)
  [ -n "$header" ] || { log "cuBLAS not found (no cublas_v2.h)"; return 1; }
  inc=$(dirname "$header")
  lib=$(cd "$inc/../lib" && pwd)
  for so in "$lib"/lib*.so.*; do  # the linker's name and the loader's (the soname)
    ln -sf "$so" "$shim/$(basename "$so" | sed 's/\.so\..*/.so/')"
    ln -sf "$so" "$shim/$(basename "$so")"
  done
  echo "-DCMAKE_LIBRARY_PATH=$shim -DCMAKE_CUDA_FLAGS=-I$inc"
}

step "1. machine ($MODE)"
env_json mode "\"$MODE\""
if [ "$MODE" = cuda ]; then
  command -v nvcc > /dev/null || export PATH=$PATH:/usr/local/cuda/bin
  env_json card "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1 | "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')"
  env_json nvcc "$(nvcc --version | tail -1 | "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')"
fi
env_json python "\"$("$PY" -c 'import sys; print(sys.version.split()[0])')\""
env_json cpus "$(nproc)"
log "$(cat "$OUT/env.json")"
if [ "$MODE" = cuda ]; then  # an earlier call's processes still on the card would skew the figures
  log "processes on the GPU: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
fi

if [ "$WHEELS" = 1 ]; then
  step "2. wheels -> $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$CARRY"/wheels/*.whl > "$WORK/pip.log" 2>&1 || fail "$WORK/pip.log"
fi
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}

# Step 6 starts here, in the background: `outpost models synth` loads no llama.cpp (numpy and gguf).
MODEL=$BUILD/models/$SHAPE-$QUANT.gguf
synth_pid=""
if [ ! -f "$MODEL" ]; then
  log "6. model $SHAPE $QUANT: written in the background during steps 3-5"
  "$PY" -m outpost.cli models synth --shape "$SHAPE" --quant "$QUANT" -o "$MODEL.tmp" > "$WORK/synth.log" 2>&1 &
  synth_pid=$!
fi

step "3. llama.cpp ($MODE), built once"
B=${LLAMA_BUILD_DIR:-$BUILD/$MODE}  # LLAMA_BUILD_DIR: an existing build with bin/llama-server
flags="-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
flags="$flags -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
flags="$flags -DGGML_CCACHE=OFF"
if [ "$MODE" = cuda ]; then
  flags="$flags $(cat "$ROOT/deploy/cuda-cmake-args") $(cuda_flags)"
fi
if [ -n "${LLAMA_BUILD_DIR:-}" ]; then
  [ -x "$B/bin/llama-server" ] || { log "no $B/bin/llama-server"; exit 1; }
elif [ ! -x "$B/bin/llama-server" ]; then
  start=$(date +%s)
  # shellcheck disable=SC2086  # one word per flag
  cmake -S "$CARRY/llama-cpp-python/vendor/llama.cpp" -B "$B" -G Ninja $flags > "$WORK/build.log" 2>&1 \
    || fail "$WORK/build.log"
  ninja -C "$B" llama llama-server >> "$WORK/build.log" 2>&1 || fail "$WORK/build.log"
  echo "$(($(date +%s) - start))" > "$B/build_seconds"
fi
[ -f "$B/build_seconds" ] && env_json build_seconds "$(cat "$B/build_seconds")"
env_json cmake_flags "\"$flags\""
log "built: $(ls "$B/bin" | tr '\n' ' ')"

step "4. llama-cpp-python against that build"
if [ ! -f "$SITE/llama_cpp/__init__.py" ]; then
  # scikit-build-core and its needs (pure Python), carried apart: also where --no-wheels
  "$PY" -m pip install -q --no-index --no-deps --target "$BUILD/build-tools" \
    "$CARRY"/wheels/build/*.whl > "$WORK/lcp.log" 2>&1 || fail "$WORK/lcp.log"
  PYTHONPATH=$BUILD/build-tools:$PYTHONPATH CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" \
    "$CARRY/llama-cpp-python" >> "$WORK/lcp.log" 2>&1 || fail "$WORK/lcp.log"
fi
mkdir -p "$SITE/llama_cpp/lib"
cp -a "$B"/bin/lib*.so* "$SITE/llama_cpp/lib/"  # what llama_cpp and llama_cpp._ggml load
export LLAMA_CPP_LIB_PATH=$SITE/llama_cpp/lib
[ -d "$BUILD/cuda-shim" ] && export LD_LIBRARY_PATH=$BUILD/cuda-shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
devices=$("$PY" -c 'import dataclasses, json; from outpost.engine.devices import list_devices
print(json.dumps([dataclasses.asdict(d) for d in list_devices()]))' 2>"$WORK/devices.log") || fail "$WORK/devices.log"
env_json devices "$devices"
log "5. devices: $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["devices"])' "$OUT/env.json")"

step "6. model: $SHAPE $QUANT"
if [ -n "$synth_pid" ]; then
  wait "$synth_pid" || fail "$WORK/synth.log"
  mv "$MODEL.tmp" "$MODEL"
fi
env_json model "\"$(basename "$MODEL") $(stat -c %s "$MODEL") bytes\""
if [ "$SETUP_ONLY" = 1 ]; then
  { echo "export PYTHONPATH=$PYTHONPATH LLAMA_CPP_LIB_PATH=$LLAMA_CPP_LIB_PATH"
    echo "export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} MODEL=$MODEL LLAMA_BIN=$B/bin"; } > "$BUILD/env.sh"
  log "setup done: $BUILD/env.sh"
  exit 0
fi

step "7. greedy ids, -ngl $NGL on both"
if [ "$GREEDY" = 1 ] && [ "$RESUME" = 1 ] && [ -f "$DONE/greedy.json" ]; then
  cp "$DONE/greedy.json" "$OUT/greedy.json"
  log "greedy: from an earlier call on this machine ($DONE)"
elif [ "$GREEDY" = 1 ]; then
  "$PY" -m benchmarks.gpu greedy --model "$MODEL" --llama-server "$B/bin/llama-server" --ngl "$NGL" \
    --prompts "$PROMPTS" --tokens "$TOKENS" --threads "$THREADS" --out "$OUT/greedy.json" \
    > "$WORK/greedy.out" 2> "$WORK/greedy.log" || fail "$WORK/greedy.log"
  log "greedy: $(tail -1 "$WORK/greedy.out")"
  cp "$OUT/greedy.json" "$DONE/greedy.json"
fi

step "7b. ready lines: -ngl auto sized from the card; -sm row (one GPU: accepted, nothing to split)"
ready_line() {  # outpost serve ARGS... until its ready line (or 300 s), then stopped; the line -> ready.txt
  local log=$WORK/ready-$RANDOM.log pid i port
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$PY" -m outpost.cli serve -m "$MODEL" --port "$port" "$@" > "$log" 2>&1 &
  pid=$!
  for i in $(seq 1 300); do
    grep -q "ready:\|error" "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  { echo "\$ outpost serve -m $(basename "$MODEL") $*"; grep "ready:\|error" "$log" || tail -5 "$log"; } >> "$OUT/ready.txt"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
if [ "$RESUME" = 1 ] && [ -f "$DONE/ready.txt" ]; then
  cp "$DONE/ready.txt" "$OUT/ready.txt"
  log "ready lines: from an earlier call on this machine ($DONE)"
else
  ready_line -ngl auto
  ready_line -ngl "$NGL" -sm row -np 4 -c 4096
  cp "$OUT/ready.txt" "$DONE/ready.txt"
fi
log "$(cat "$OUT/ready.txt")"

step "8. serve at $LEVELS streams"
for level in ${LEVELS//,/ }; do
  if [ "$RESUME" = 1 ] && [ -f "$DONE/serve-$level.json" ]; then
    cat "$DONE/serve-$level.json" >> "$OUT/serve.jsonl"
    cat "$DONE/logs-$level.txt" >> "$OUT/logs.txt" 2>/dev/null || true
    log "level $level: from an earlier call on this machine ($DONE)"
    continue
  fi
  extra=()
  [ -n "$REQUESTS" ] && extra=(--requests "$REQUESTS" --warmup "$level")
  LLAMA_SERVER=$B/bin/llama-server "$PY" -m benchmarks.serve --model "$MODEL" --ngl "$NGL" \
    --parallel "$PARALLEL" --threads "$THREADS" --levels "$level" --rounds 1 --scenarios throughput \
    --no-llama-cpp-python --out "$WORK/serve-$level" "${extra[@]}" \
    > "$WORK/serve-$level.out" 2> "$WORK/serve-$level.log" || fail "$WORK/serve-$level.log"
  tail -1 "$WORK/serve-$level.out" > "$DONE/serve-$level.json"
  : > "$DONE/logs-$level.txt"
  cat "$DONE/serve-$level.json" >> "$OUT/serve.jsonl"
  log "level $level: $(tail -1 "$WORK/serve-$level.out" | cut -c1-400)"
  for f in "$WORK/serve-$level"/logs/*.log; do
    { echo "== $level $(basename "$f")"; grep -iE "ready|offload|CUDA|error|warn" "$f" | head -20; } >> "$DONE/logs-$level.txt" || true
  done
  cat "$DONE/logs-$level.txt" >> "$OUT/logs.txt" 2>/dev/null || true
done

step "9. table"
"$PY" -m benchmarks.gpu report "$OUT" > "$OUT/table.md" || fail "$OUT/table.md"
cat "$OUT/table.md" >&2
log "done: $OUT"
