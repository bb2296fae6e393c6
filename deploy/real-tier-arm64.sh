#!/usr/bin/env bash
# `make test-real-arm64`: the real tier (tests/real, the real SmolLM2-135M and Gemma 3 270M) on the arm64
# image's llama.cpp kernels, under qemu-user on an x86 host: the kernels another CPU runs (NEON dotprod
# on Graviton2, SVE+i8mm on Graviton3), whose rounding differs from the host's. Not part of `make test`
# (emulated, a test takes minutes, not seconds). This checkout's tests and `outpost` package (PYTHONPATH,
# read-only) run in the image's Python with its llama-cpp-python and CPU builds; the test clients
# (pytest and the dev pins of pyproject.toml that tests/real imports) are installed once over the arm64
# image into localhost/outpost-real-tier:VERSION-arm64 (arm64 wheels fetched by this host's pip, installed offline).
# Usage: deploy/real-tier-arm64.sh [PYTEST ARGS...]   (default: tests/real)
# Environment: QEMU_CPU (neoverse-n1: the arm64-n1 build; max,sve-default-vector-length=32: arm64-sve-i8mm),
#   OUTPOST_TEST_IMAGE_ARM64 (outpost:VERSION-arm64, built by ARCH=arm64 deploy/image.sh if absent),
#   OUTPOST_TEST_MODELS (~/.cache/outpost-test-models: the real models, shared with the host's runs),
#   PODMAN_RUN_ARGS (extra `podman run` arguments, e.g. --cpuset-cpus=1 on a shared machine),
#   OUTPOST_TEST_TIMEOUT_SCALE (6: the tier's waits x6; on one core give 12: the summarize test's
#   summaries, two at a time, then take ~40 min each, ~19 min alone).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/deploy/podman/containers.conf}
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image=${OUTPOST_TEST_IMAGE_ARM64:-localhost/outpost:$version-arm64}
podman image exists "$image" || image=$(ARCH=arm64 deploy/image.sh | tail -n 1)
qemu_cpu=${QEMU_CPU:-neoverse-n1}
models=${OUTPOST_TEST_MODELS:-$HOME/.cache/outpost-test-models}
mkdir -p "$models"

# The dev pins tests/real and its fixtures import (transformers for its chat-template rendering alone;
# the rest of [dev] is for other tiers: torch, browsers, linters).
pins=$(python3 -c '
import re, tomllib
wanted = {"pytest", "pytest-timeout", "openai", "anthropic", "ollama", "openai-agents", "jsonschema", "transformers"}
dev = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]
print(" ".join(d for d in dev if re.split("[=<>~!]", d)[0] in wanted))')
tier=localhost/outpost-real-tier:$version-arm64
# The image has no pip, and its container may not reach the index (this host's pip has the
# configuration: certificates, mirrors): this host's pip fetches the arm64 wheels of pip and the pins,
# constrained to the versions the image holds, as deploy/image.sh fetches the image's, and the image's
# Python installs them offline (pip too: tests/real's pull tests run `python -m pip`). Podman's layer
# cache keeps the result per image and wheels.
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
podman run --rm --entrypoint /opt/outpost/bin/python3 "$image" -c \
  'import importlib.metadata as m; print("\n".join(d.metadata["Name"] + "==" + d.version for d in m.distributions()))' \
  2>/dev/null | grep -v -e '^outpost==' -e '^llama_cpp_python==' >"$ctx/constraints.txt"
platforms=(--platform manylinux2014_aarch64)
for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
# shellcheck disable=SC2086
python3 -m pip download -q --only-binary=:all: "${platforms[@]}" --python-version 3.11 --implementation cp \
  --abi cp311 -c "$ctx/constraints.txt" -d "$ctx/wheels" "pip>=24" $pins >&2
cat >"$ctx/Containerfile" <<EOF
FROM $image
USER 0
COPY wheels /tmp/wheels
RUN pip=\$(ls /tmp/wheels/pip-*.whl) && /opt/outpost/bin/python3 "\$pip/pip" install -q --no-compile --no-index \\
      --find-links /tmp/wheels "\$pip" $pins && rm -rf /tmp/wheels
EOF
echo "real-tier-arm64: $tier over $image ($pins)" >&2
podman build -q --network=host --format docker --pull=never --arch arm64 -t "$tier" "$ctx" >&2

[ $# -gt 0 ] || set -- tests/real
echo "real-tier-arm64: QEMU_CPU=$qemu_cpu pytest $*" >&2
# Outpost chooses the CPU build (as at a server's start) before pytest runs: tests/real's reference
# imports llama_cpp itself, and every `outpost` it starts inherits the choice (LLAMA_CPP_LIB_PATH).
# Root in the container: the models' cache takes a lock file; the checkout stays read-only (no .pyc,
# no pytest cache). pytest's per-test timeout and the tier's waits (OUTPOST_TEST_TIMEOUT_SCALE, 6) are
# raised: emulation runs a test for minutes, and a server's start took over 10 on a loaded 2-core host.
run='import sys, pytest
from outpost.engine import cpu_builds
print("real-tier-arm64:", cpu_builds.apply().describe(), file=sys.stderr)
sys.exit(pytest.main(sys.argv[1:]))'
# shellcheck disable=SC2086
exec podman run --rm --network=host --user 0 ${PODMAN_RUN_ARGS:-} \
  -e "QEMU_CPU=$qemu_cpu" -e "OUTPOST_TEST_TIMEOUT_SCALE=${OUTPOST_TEST_TIMEOUT_SCALE:-6}" -e PYTHONPATH=/src -e PYTHONDONTWRITEBYTECODE=1 \
  -e OUTPOST_TEST_MODELS=/test-models -v "$models:/test-models" -v "$ROOT:/src:ro" -w /src \
  --entrypoint /opt/outpost/bin/python3 "$tier" -c "$run" -p no:cacheprovider -o timeout=5400 "$@"
