#!/usr/bin/env bash
# Where llama.cpp's CUDA build crashes in model load on a GPU machine, and whether loading its
# libraries first (outpost/preload.py) avoids it. Run on the device after
# `scripts/gpu-bench.sh --setup-only` (which leaves $BUILD/env.sh); each case is its own process:
#   crash-order   numpy.linalg, sentencepiece and gguf imported, then llama_cpp, then a model load
#   fixed-order   llama_cpp imported first, then the same modules, then the same load
#   outpost-run   `outpost run -ngl 99` as a user starts it (outpost/cli.py imports preload first)
#   backtrace     crash-order under gdb (where there is one) or a SIGSEGV handler that prints the
#                 native stack (built here with cc), and the libraries each order loads (LD_DEBUG)
# Results: $OUT/load-order.txt (one line per case: its exit status) and $OUT/load-order/*.log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${GPU_BUILD:-$ROOT/.gpu-build}
OUT=${OUT:-$ROOT/bench-results/gpu-load-order}
PY=${PYTHON:-python3}
# shellcheck disable=SC1091  # written by gpu-bench.sh --setup-only
source "$BUILD/env.sh"
SMALL=$BUILD/models/smollm2-135m-f16.gguf
[ -f "$SMALL" ] || "$PY" -m outpost.cli models synth --shape smollm2-135m --quant f16 -o "$SMALL" > /dev/null 2>&1
M=${DIAG_MODEL:-$SMALL}
mkdir -p "$OUT/load-order"
export PYTHONFAULTHANDLER=1
LOAD="import llama_cpp as l
l.llama_backend_init(); p = l.llama_model_default_params(); p.n_gpu_layers = 99
print('LOADED' if l.llama_model_load_from_file(b'$M', p) else 'NULL', flush=True)"
OTHERS="import numpy.linalg, sentencepiece, gguf"

case_() {  # name, then the command; its exit status and last lines to the summary
  local name=$1 rc
  shift
  timeout 120 "$@" > "$OUT/load-order/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $(grep -c LOADED "$OUT/load-order/$name.log") loaded" >> "$OUT/load-order.txt"
}

case_ crash-order "$PY" -c "$OTHERS
$LOAD"
case_ fixed-order "$PY" -c "import llama_cpp
$OTHERS
$LOAD"
for mod in numpy.linalg sentencepiece gguf; do
  case_ "only-$mod" "$PY" -c "import $mod
$LOAD"
done
case_ outpost-run "$PY" -m outpost.cli run -m "$M" -ngl 99 -n 8 -p hi --single-turn

# The native stack of the crash: gdb where the machine has it, else a SIGSEGV handler.
if command -v gdb > /dev/null; then
  timeout 180 gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args "$PY" -c "$OTHERS
$LOAD" > "$OUT/load-order/backtrace.log" 2>&1
elif command -v cc > /dev/null; then
  cat > "$BUILD/segv.c" <<'EOF'
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>
static void on_segv(int sig) {
  void *frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) { signal(SIGSEGV, on_segv); }
EOF
  cc -shared -fPIC -O1 -o "$BUILD/segv.so" "$BUILD/segv.c" \
    && PYTHONFAULTHANDLER= LD_PRELOAD=$BUILD/segv.so timeout 120 "$PY" -c "$OTHERS
$LOAD" > "$OUT/load-order/backtrace.log" 2>&1
fi
for order in crash fixed; do
  code="$OTHERS
$LOAD"
  [ $order = fixed ] && code="import llama_cpp
$code"
  LD_DEBUG=libs timeout 120 "$PY" -c "$code" 2>&1 | grep -E "calling init: |find library=" \
    | sed 's/^ *[0-9]*: *//' > "$OUT/load-order/libs-$order.log"
done
cat "$OUT/load-order.txt"
