PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint format venv clean demo demo-stop smoke

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

test: lint
	$(BIN)/python -m pytest -q

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
