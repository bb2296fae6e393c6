#!/usr/bin/env bash
# `make image`: builds outpost:VERSION (deploy/Dockerfile) for this machine's arch with docker if its
# daemon answers, else podman. With no registry reachable, a missing debian:bookworm-slim base is built
# from Debian's mirror (mmdebstrap) and imported under that name. Prints NAME:TAG as its last line.
# Environment: IMAGE_NAME (outpost), IMAGE_TAG (the version in pyproject.toml), ENGINE (docker|podman),
#   DOCKERFILE (deploy/Dockerfile), BUILD_ARGS (extra `build` arguments, e.g. "--build-arg CMAKE_ARGS_AMD64=...").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=debian:bookworm-slim
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
name=${IMAGE_NAME:-outpost}
tag=${IMAGE_TAG:-$version}
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

if ! have_image "$BASE"; then
  command -v mmdebstrap >/dev/null || { echo "image: mmdebstrap is missing: make deploy-deps" >&2; exit 2; }
  echo "image: $BASE is not here and no registry is reachable: building it with mmdebstrap" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # minbase without docs/man/locales, as Docker's -slim images are.
  mmdebstrap --variant=minbase --quiet \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$tmp/rootfs.tar" \
    "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main"
  "$engine" import --change 'CMD ["bash"]' "$tmp/rootfs.tar" "$BASE" >&2
  if [ "$engine" = podman ]; then podman tag "$BASE" "docker.io/library/$BASE"; fi
fi

build=("$engine" build --network=host -f "$dockerfile" -t "$name:$tag")
# podman 4.3 does not set TARGETARCH itself (BuildKit does); the Dockerfile picks llama.cpp's flags by it.
arch=$(uname -m)
case "$arch" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
if [ "$engine" = podman ]; then build+=(--format docker --pull=never --build-arg "TARGETARCH=$arch"); fi
# The host's CA bundle as a build secret: pip inside the build trusts what the host trusts (a TLS proxy).
ca=${PIP_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
if [ -s "$ca" ]; then build+=(--secret "id=pip_ca,src=$ca"); fi
# shellcheck disable=SC2206
build+=(${BUILD_ARGS:-} .)
echo "image: ${build[*]}" >&2
"${build[@]}" >&2
size=$("$engine" image inspect --format '{{.Size}}' "$name:$tag")
echo "image: $name:$tag is $((size / 1000000)) MB ($engine)" >&2
echo "$name:$tag"
