PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint format venv clean demo demo-stop smoke browser

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The dashboard test drives headless Chromium; install it where we may (CI runs as root on
# Debian). Quiet, and never fatal: without a browser that one test is skipped.
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the dashboard test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
			>/dev/null 2>&1 || echo "could not install chromium; the dashboard test will be skipped"; \
	fi

# Tests against a real llama-server run when it is built (../shared/tools/get-llama-server.sh
# caches it here); elsewhere they are skipped. LLAMA_SERVER/LLAMA_MODEL in the environment win.
REAL := $(HOME)/.cache/crossbar-real
LLAMA_SERVER ?= $(wildcard $(REAL)/llama.cpp/build/bin/llama-server)
LLAMA_MODEL ?= $(wildcard $(REAL)/gemma-3-270m-q4_k_m.gguf)
export LLAMA_SERVER LLAMA_MODEL

test: lint browser
	$(BIN)/python -m pytest -q -rs

# Two fake llama-servers and crossbar (examples/demo.toml), driven by two short conversations,
# left running; pids and logs in demo/.
demo: $(STAMP)
	$(BIN)/python -m crossbar.demo run

demo-stop:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m crossbar.demo stop; \
	else $(PY) -m crossbar.demo stop; fi

# The demo on free ports with a temporary db; fails on any wrong answer; stops everything.
smoke: $(STAMP)
	$(BIN)/python -m crossbar.demo smoke

clean:
	rm -rf $(VENV) build *.egg-info
