# Outpost's front doors: `make serve` (install, then the OpenAI-compatible server on the demo model,
# http://127.0.0.1:8080), `make test` (install, then ruff + mypy + pytest) and `make run` (answer one
# prompt in the terminal). All create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROMPT ?= Hello! What can you do?
SERVE_ARGS ?=

.PHONY: install system-deps serve run test lint typecheck unit integration e2e clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	# llama-cpp-python compiles llama.cpp on first install (~10 min on 2 cores); pip caches the wheel.
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Debian packages the e2e tests run for real: RabbitMQ (scripts/broker.sh, the cluster tests).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system-deps:
	test -x /usr/lib/rabbitmq/bin/rabbitmq-server || ($(SUDO) apt-get update && $(SUDO) apt-get install -y rabbitmq-server)

serve: install
	$(BIN)/outpost serve $(SERVE_ARGS)

run: install
	$(BIN)/outpost run --single-turn -n 64 -p "$(PROMPT)"

lint: install
	$(BIN)/ruff check outpost tests benchmarks
	$(BIN)/ruff format --check outpost tests benchmarks

typecheck: install
	$(BIN)/mypy

test: lint typecheck system-deps
	$(BIN)/pytest tests

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
