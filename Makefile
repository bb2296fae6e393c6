# Outpost's front doors: `make serve` (install, then the OpenAI-compatible server on the demo model,
# http://127.0.0.1:8080), `make test` (install, then ruff + mypy + pytest) and `make run` (answer one
# prompt in the terminal). All create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROMPT ?= Hello! What can you do?
SERVE_ARGS ?=

.PHONY: install serve run test lint typecheck unit integration e2e clean browser

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	# llama-cpp-python compiles llama.cpp on first install (~10 min on 2 cores); pip caches the wheel.
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/outpost serve $(SERVE_ARGS)

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

test: lint typecheck browser
	$(BIN)/pytest tests

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
