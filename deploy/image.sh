#!/usr/bin/env bash
# `make image [ARCH=arm64]`: builds outpost:VERSION (deploy/Dockerfile) for this machine's arch, or for
# ARCH (amd64|arm64; outpost:VERSION-ARCH when it is not this machine's), with docker if its daemon
# answers, else podman. Nothing compiles in the container, so a foreign arch builds in minutes under
# qemu-user: this host compiles llama.cpp's CPU builds (deploy/cpu-builds.sh; cross-compiled for arm64)
# and fetches ARCH's wheels (pip --platform, binary only); the container only installs them.
# With no registry reachable, a missing debian:bookworm-slim base is built from Debian's mirror
# (mmdebstrap; for a foreign arch with --arch, as localhost/outpost-base:bookworm-ARCH, its tarball kept
# in the cache). A foreign arch needs qemu-user-static registered with binfmt_misc: done here as root.
# Prints NAME:TAG as its last line.
# Environment: ARCH, IMAGE_NAME (outpost), IMAGE_TAG (the version in pyproject.toml, -ARCH if foreign),
#   ENGINE (docker|podman), DOCKERFILE (deploy/Dockerfile), BUILD_ARGS (extra `build` arguments),
#   OUTPOST_IMAGE_CACHE (~/.cache/outpost-image: the compiled builds, wheels, base tarballs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
CACHE=${OUTPOST_IMAGE_CACHE:-$HOME/.cache/outpost-image}
export OUTPOST_IMAGE_CACHE=$CACHE

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
host=$(uname -m)
case "$host" in x86_64) host=amd64 ;; aarch64) host=arm64 ;; esac
arch=${ARCH:-$host}
case "$arch" in amd64) pyplat=x86_64 ;; arm64) pyplat=aarch64 ;; *) echo "image: ARCH=$arch: amd64 or arm64" >&2; exit 2 ;; esac
name=${IMAGE_NAME:-outpost}
if [ "$arch" = "$host" ]; then tag=${IMAGE_TAG:-$version}; else tag=${IMAGE_TAG:-$version-$arch}; fi
dockerfile=${DOCKERFILE:-deploy/Dockerfile}

engine=${ENGINE:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker; else engine=podman; fi
fi
if [ "$engine" = podman ]; then
  # runc and the host's ulimits (deploy/podman/containers.conf), unless the caller has its own.
  export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/deploy/podman/containers.conf}
  command -v podman >/dev/null || { echo "image: podman is missing: make deploy-deps (as root)" >&2; exit 2; }
fi

have_image() {
  if [ "$engine" = podman ]; then podman image exists "$1"; else docker image inspect "$1" >/dev/null 2>&1; fi
}

# qemu-user-static for a foreign arch's RUN steps (and mmdebstrap's): the F flag opens the emulator at
# registration, so it also runs inside containers.
ensure_binfmt() {
  local entry=/proc/sys/fs/binfmt_misc/qemu-$pyplat
  [ "$arch" = "$host" ] && return 0
  [ -f "$entry" ] && grep -q '^enabled' "$entry" && return 0
  [ "$(id -u)" = 0 ] || { echo "image: qemu-$pyplat is not registered with binfmt_misc: run make image as root" >&2; exit 2; }
  [ -f /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  command -v update-binfmts >/dev/null || { echo "image: binfmt-support is missing: make deploy-deps" >&2; exit 2; }
  update-binfmts --enable "qemu-$pyplat" >&2
}

base_image() {
  if [ "$arch" = "$host" ]; then echo debian:bookworm-slim; else echo "localhost/outpost-base:bookworm-$arch"; fi
}

# Debian bookworm, minbase without docs/man/locales as Docker's -slim images are, imported as $1.
build_base() {
  local tarball=$CACHE/base/bookworm-$arch.tar platform
  command -v mmdebstrap >/dev/null || { echo "image: mmdebstrap is missing: make deploy-deps" >&2; exit 2; }
  if [ ! -s "$tarball" ]; then
    echo "image: $1 is not here: building it with mmdebstrap --arch $arch" >&2
    mkdir -p "$CACHE/base"
    mmdebstrap --variant=minbase --quiet --arch="$arch" \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
      bookworm "${tarball%.tar}.tmp.tar" \
      "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main"
    mv "${tarball%.tar}.tmp.tar" "$tarball"  # mmdebstrap picks its output format by the name: .tar
  fi
  if [ "$engine" = podman ]; then platform=(--arch "$arch"); else platform=(--platform "linux/$arch"); fi
  "$engine" import "${platform[@]}" --change 'CMD ["bash"]' "$tarball" "$1" >&2
  if [ "$engine" = podman ] && [ "$1" = debian:bookworm-slim ]; then podman tag "$1" "docker.io/library/$1"; fi
}

# Everything the container installs, in build/image/ARCH (the build context lets only that in):
# cpu-builds/<name>/ (llama.cpp's libraries), wheels/deps (ARCH's wheels of the dependencies and pip,
# llama-cpp-python's bindings without libraries among them), wheels/outpost (Outpost's wheel).
stage_context() {
  local ctx=$ROOT/build/image/$arch reqs key wheels platforms minor
  mkdir -p "$ctx/wheels"
  deploy/cpu-builds.sh "$arch" "$ctx/cpu-builds"
  for b in "$ctx"/cpu-builds/*/; do echo "$(basename "$b"): $(cat "$b/CMAKE_ARGS")"; done >"$ctx/LLAMA_CPP_CMAKE_ARGS"
  reqs=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
  key=$(printf '%s\n' "$reqs" "$arch" | sha256sum | cut -c1-16)
  wheels=$CACHE/wheels/$arch-$key
  if [ ! -f "$wheels/.complete" ]; then
    echo "image: $arch wheels of the dependencies (pip download --platform manylinux_2_*_$pyplat)" >&2
    rm -rf "$wheels" && mkdir -p "$wheels"
    printf '%s\n' "$reqs" >"$wheels/requirements.txt"
    # bookworm's glibc is 2.36; pip takes each manylinux tag it may use, none implied by another.
    platforms=(--platform "manylinux2014_$pyplat")
    for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_$pyplat"); done
    bindings_wheel "$CACHE/wheels/bindings"  # llama-cpp-python's, found there: PyPI has only its sdist
    python3 -m pip download -q --only-binary=:all: "${platforms[@]}" --python-version 3.11 \
      --implementation cp --abi cp311 --find-links "$CACHE/wheels/bindings" \
      -d "$wheels" -r "$wheels/requirements.txt" "pip>=24" >&2
    touch "$wheels/.complete"
  fi
  rm -rf "$ctx/wheels/deps" && cp -a "$wheels" "$ctx/wheels/deps" && rm -f "$ctx/wheels/deps/.complete"
  rm -rf "$ctx/wheels/outpost" && mkdir -p "$ctx/wheels/outpost"
  # A fixed zip timestamp: the same code gives the same wheel, so podman's layer cache holds.
  SOURCE_DATE_EPOCH=315532800 python3 -m pip wheel -q --no-deps -w "$ctx/wheels/outpost" . >&2
}

# llama-cpp-python's Python package alone (LLAMA_BUILD=OFF: no library; cpu-builds/ has those) in $1.
bindings_wheel() {
  local llama_version src
  llama_version=$(python3 -c 'import tomllib; print(next(d.split("==")[1] for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("llama-cpp-python==")))')
  src=$CACHE/src/llama_cpp_python-$llama_version.tar.gz
  [ -s "$1/llama_cpp_python-$llama_version-py3-none-any.whl" ] && return 0
  [ -s "$src" ] || python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$llama_version" -d "$CACHE/src" >&2
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" python3 -m pip wheel -q --no-deps \
    --config-settings=wheel.platlib=false -w "$1" "$src" >&2
}

ensure_binfmt
base=$(base_image)
have_image "$base" || build_base "$base"
stage_context

build=("$engine" build --network=host -f "$dockerfile" -t "$name:$tag" --build-arg "BASE_IMAGE=$base")
# podman 4.3 does not set TARGETARCH itself (BuildKit does); the Dockerfile copies build/image/TARGETARCH.
build+=(--build-arg "TARGETARCH=$arch")
if [ "$engine" = podman ]; then build+=(--format docker --pull=never --arch "$arch"); else build+=(--platform "linux/$arch"); fi
# shellcheck disable=SC2206
build+=(${BUILD_ARGS:-} .)
echo "image: ${build[*]}" >&2
"${build[@]}" >&2
size=$("$engine" image inspect --format '{{.Size}}' "$name:$tag")
echo "image: $name:$tag is $((size / 1000000)) MB, $arch ($engine)" >&2
echo "$name:$tag"
