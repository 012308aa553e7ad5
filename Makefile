# Two commands: `make setup` installs everything (Chromium for the browser tests included),
# `make test` runs the whole suite: unit tests, TensorFlow stage tests, browser tests, tutorials.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test bench

setup:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	  else echo "Chromium missing and not root: browser tests will be skipped (apt-get install chromium)"; fi; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu,test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null

test:
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m pytest --nbval example_notebooks tests

bench:
	$(BIN)/python benchmarks/bench_magic.py
