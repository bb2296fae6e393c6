#!/usr/bin/env bash
# amd64-avx512 vs amd64-v3, interleaved: the engine benchmark on the synthetic SmolLM2-135M shape, q4_0.
set -u
cd "$(dirname "$0")/../../.."
B=$(ls -d ~/.cache/outpost-image/cpu-builds/amd64-*/ | head -1)
for round in 1 2; do
  for build in amd64-v3 amd64-avx512; do
    echo "round $round $build $(date +%T)" >&2
    OUTPOST_CPU_BUILDS_DIR=$B OUTPOST_CPU_BUILD=$build LLAMA_CPP_LIB_PATH=$B/$build \
      timeout 600 .venv/bin/python -m benchmarks.engine --shapes smollm2-135m --threads 2 \
      --repeats 3 --single-repeats 3 --batched-rounds 1 2>/dev/null \
      | tail -1 > docs/data/cpu-builds-2026-11-28/$build-$round.json
  done
done
