# Outpost's two front doors: `make run` (install, then answer a prompt with the demo model) and
# `make test` (install, then ruff + mypy + pytest). Both create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROMPT ?= Hello! What can you do?

.PHONY: install run test lint typecheck unit integration e2e clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	# llama-cpp-python compiles llama.cpp on first install (~10 min on 2 cores); pip caches the wheel.
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/outpost run --single-turn -n 64 -p "$(PROMPT)"

lint: install
	$(BIN)/ruff check outpost tests benchmarks
	$(BIN)/ruff format --check outpost tests benchmarks

typecheck: install
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest tests

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
