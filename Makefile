# Outpost's front doors: `make serve` (install, then the OpenAI-compatible server on the demo model,
# http://127.0.0.1:8080), `make test` (install, then ruff + mypy + pytest) and `make run` (answer one
# prompt in the terminal). All create .venv themselves. `make image` builds the container image
# (deploy/Dockerfile; `make image ARCH=arm64` the arm64 one, on any host) and `make test-deploy` builds
# the host's and the arm64 image and tests them (podman, qemu-user; installs what it needs).
# `make test-real-arm64` runs the real tier on the arm64 image's kernels under qemu (slow; not in `make test`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROMPT ?= Hello! What can you do?
SERVE_ARGS ?=

.PHONY: install system-deps serve run test lint typecheck unit integration e2e clean browser deploy-deps image test-deploy test-real-arm64

$(STAMP): pyproject.toml scripts/install-llama-cpp.sh scripts/llama-cpp-cmake-args scripts/llama-cpp-version
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	# llama-cpp-python compiles llama.cpp once per machine (~10 min on 2 cores), with the flags in
	# scripts/llama-cpp-cmake-args (gcc 12 breaks AMX without them); the script keeps the wheel.
	scripts/install-llama-cpp.sh $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# A real small instruct model where the hub answers (pulled once into the store), else the demo model.
FIRST_MODEL ?= smollm2:135m

# Debian packages the e2e tests run for real: RabbitMQ (scripts/broker.sh, the cluster tests).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system-deps:
	test -x /usr/lib/rabbitmq/bin/rabbitmq-server || ($(SUDO) apt-get update && $(SUDO) apt-get install -y rabbitmq-server)

serve: install
	$(BIN)/python -m outpost.quickstart $(FIRST_MODEL) -- $(SERVE_ARGS)

run: install
	$(BIN)/outpost run --single-turn -n 64 -p "$(PROMPT)"

lint: install
	$(BIN)/ruff check outpost tests benchmarks
	$(BIN)/ruff format --check outpost tests benchmarks

typecheck: install
	$(BIN)/mypy

# The chat page's browser tests drive Debian's chromium through Playwright (which never downloads one).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && apt-get install -y -q chromium; } \
		|| echo "chromium is missing: run 'sudo apt-get install -y chromium' for the browser tests" >&2

test: lint typecheck system-deps browser
	$(BIN)/pytest tests

# Debian packages the image build and the deploy tier need (root; once per machine): podman, mmdebstrap,
# the compilers of llama.cpp's CPU builds (crossbuild-essential-arm64 for arm64 on x86), qemu-user to
# run arm64 (image.sh registers it with binfmt_misc).
DEPLOY_PKGS := podman runc uidmap fuse-overlayfs slirp4netns mmdebstrap systemd \
	build-essential cmake ninja-build python3-pip crossbuild-essential-arm64 qemu-user-static binfmt-support
deploy-deps:
	@missing=$$(for p in $(DEPLOY_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

# outpost:VERSION for this machine's arch, or outpost:VERSION-arm64 with ARCH=arm64 (amd64|arm64);
# its NAME:TAG is the last line printed.
ARCH ?=
image: deploy-deps
	ARCH=$(ARCH) deploy/image.sh

# bash with pipefail: a failed image.sh must stop the tier, not leave `tail` an empty name to pass on.
test-deploy: SHELL := /bin/bash
test-deploy: .SHELLFLAGS := -o pipefail -c
test-deploy: install deploy-deps
	$(BIN)/python -m pip install -q -e ".[dev,deploy]"
	OUTPOST_TEST_IMAGE=$$(deploy/image.sh | tail -n 1) && export OUTPOST_TEST_IMAGE && \
	OUTPOST_TEST_IMAGE_ARM64=$$(ARCH=arm64 deploy/image.sh | tail -n 1) && export OUTPOST_TEST_IMAGE_ARM64 && \
		$(BIN)/pytest -m deploy tests/deploy -p no:cacheprovider

# tests/real on the arm64 build's llama.cpp kernels under qemu-user (deploy/real-tier-arm64.sh): QEMU_CPU
# (neoverse-n1, or max,sve-default-vector-length=32 for the SVE+i8mm build), REAL_TESTS (tests/real).
# Emulated: a test takes minutes. Not part of `make test`.
QEMU_CPU ?= neoverse-n1
REAL_TESTS ?= tests/real
test-real-arm64: deploy-deps
	QEMU_CPU='$(QEMU_CPU)' deploy/real-tier-arm64.sh $(REAL_TESTS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
