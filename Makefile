PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-pure lint format venv clean demo demo-stop smoke browser real agents

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# The request path's modules compiled by mypyc where a C compiler is present (crossbar/build.py
# says which, and why those); rebuilt when their source changes. One line says which build it
# made; a missing compiler or a failed compile leaves the pure build, never a failed make.
COMPILED_SRC := $(shell $(PY) crossbar/build.py sources)
BUILD_STAMP := $(VENV)/.built

$(BUILD_STAMP): $(STAMP) crossbar/build.py $(COMPILED_SRC)
	@$(BIN)/python crossbar/build.py compile
	@touch $(BUILD_STAMP)

venv: $(BUILD_STAMP)

lint: $(BUILD_STAMP)
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

# The real llama-server and a tiny real model (Gemma 3 270M) for tests/real/, built by the shared
# script into REAL_CACHE: about 9 minutes on 2 cores the first time, then reused. On failure
# `make real` prints the build's last lines and fails. LLAMA_SERVER/LLAMA_MODEL in the
# environment win over the cache.
REAL_CACHE ?= $(HOME)/.cache/crossbar-real
GET_LLAMA ?= $(CURDIR)/../shared/tools/get-llama-server.sh
REAL_BIN := $(REAL_CACHE)/llama.cpp/build/bin/llama-server
REAL_GGUF := $(REAL_CACHE)/gemma-3-270m-q4_k_m.gguf

real:
	@if [ -x "$(REAL_BIN)" ] && [ -s "$(REAL_GGUF)" ]; then \
		echo "real llama-server and model: $(REAL_CACHE)"; exit 0; fi; \
	if [ ! -f "$(GET_LLAMA)" ]; then \
		echo "make real: no $(GET_LLAMA) to build llama-server with"; exit 1; fi; \
	mkdir -p "$(REAL_CACHE)"; log="$(REAL_CACHE)/build.log"; start=$$(date +%s); \
	echo "building llama-server and the model into $(REAL_CACHE) (about 9 min the first time; log $$log)"; \
	if ! CACHE="$(REAL_CACHE)" bash "$(GET_LLAMA)" >"$$log" 2>&1; then \
		echo "make real: the build failed; its last lines ($$log):"; tail -n 40 "$$log"; exit 1; fi; \
	echo "built in $$(( $$(date +%s) - start )) s"

# Under CI=true the real tests never skip: `make test` builds what the cache lacks first, and a
# missing binary fails them. Elsewhere they run when the cache has the binary, else they skip.
ifeq ($(CI),true)
TEST_NEEDS := real
LLAMA_SERVER ?= $(REAL_BIN)
LLAMA_MODEL ?= $(REAL_GGUF)
else
LLAMA_SERVER ?= $(wildcard $(REAL_BIN))
LLAMA_MODEL ?= $(wildcard $(REAL_GGUF))
endif
export LLAMA_SERVER LLAMA_MODEL

# The real coding agents for tests/agents/ (Claude Code, Codex CLI, OpenCode, aider), pinned, in
# AGENTS_CACHE: about 10 minutes the first time (npm's and PyPI's downloads), seconds after.
# Never fatal outside CI: without an agent its test skips with the reason.
AGENTS_CACHE ?= $(HOME)/.cache/crossbar-agents
export AGENTS_CACHE

agents:
	@PY=$(PY) bash tests/agents/install.sh

# The agents install while the real llama-server builds (both are mostly waiting), so a cold CI
# pays for the longer of the two, not their sum.
test: lint browser
	@PY=$(PY) bash tests/agents/install.sh & agents=$$!; status=0; \
	if [ -n "$(TEST_NEEDS)" ]; then $(MAKE) --no-print-directory $(TEST_NEEDS) || status=$$?; fi; \
	wait $$agents || status=$$?; [ $$status = 0 ] || exit $$status; \
	$(BIN)/python -m pytest -q -rs
	@$(MAKE) --no-print-directory test-pure

# A fast subset on the pure build: the same source with the compiled modules' .so files passed
# over (CROSSBAR_PURE=1, crossbar/build.py), so the fallback and reference stays tested.
PURE_TESTS := tests/proxy/test_channel.py tests/wire tests/leases tests/limiter tests/project
test-pure: $(BUILD_STAMP)
	@echo "pure build subset: $$(CROSSBAR_PURE=1 $(BIN)/python -c 'from crossbar.build import describe; print(describe())')"
	CROSSBAR_PURE=1 $(BIN)/python -m pytest -q $(PURE_TESTS)

# Two fake llama-servers and crossbar (examples/demo.toml), driven by two short conversations,
# left running; pids and logs in demo/.
demo: $(BUILD_STAMP)
	$(BIN)/python -m crossbar.demo run

demo-stop:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m crossbar.demo stop; \
	else $(PY) -m crossbar.demo stop; fi

# The demo on free ports with a temporary db; fails on any wrong answer; stops everything.
smoke: $(BUILD_STAMP)
	$(BIN)/python -m crossbar.demo smoke

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache
	find crossbar -name '*.so' -delete; rm -f *__mypyc*.so
