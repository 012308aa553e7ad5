# Two commands: `make setup` installs everything (Chromium for the browser tests included),
# `make test` runs the whole suite: unit tests, TensorFlow stage tests, browser tests, tutorials.
# `make test-fast` is the quick loop: no fresh Python (so no TensorFlow start), no browser, no GPU.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test test-fast lint lint-python lint-js docs bench

# System packages: Chromium for the browser tests, Node and npm to build the front ends (the panel's
# bundle and the JupyterLab extension; `pip install -e` runs `npm run build`, and copies the built
# extension into the venv, so JupyterLab and Notebook 7 load it with no `jupyter lab build`).
# .ci/apt-install waits (10 minutes at most) for another apt or dpkg to release its lock.
APT_NEEDS := $(if $(shell command -v chromium),,chromium) $(if $(shell command -v npm),,nodejs npm)
# Prometheus for tests/test_prometheus.py, which starts the binary itself (its own config, data folder
# and loopback port): Debian's package without its recommends (node exporter, smartmontools, ipmitool
# and their services); the package's own service is not used (in a container without systemd it
# does not even start).
APT_BARE := $(if $(shell command -v prometheus),,prometheus)

setup:
	@if [ -n "$(strip $(APT_NEEDS))" ]; then \
	  if [ "$$(id -u)" = 0 ]; then .ci/apt-install $(APT_NEEDS); \
	  else echo "Not root, so not installing: $(APT_NEEDS) (sudo apt-get install -y $(APT_NEEDS));" \
	    "without Chromium the browser tests skip, without npm the front ends cannot be built"; fi; \
	fi
	@if [ -n "$(strip $(APT_BARE))" ]; then \
	  if [ "$$(id -u)" = 0 ]; then .ci/apt-install --no-install-recommends $(APT_BARE); \
	  else echo "Not root, so not installing: $(APT_BARE)" \
	    "(sudo apt-get install -y --no-install-recommends $(APT_BARE)); without it tests/test_prometheus.py skips"; fi; \
	fi
	@# An existing .venv is reused (a second `make setup` only brings it up to date).
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# PyTorch and JAX for their tests, pinned first: this machine's pip finds the 2.13.0 CPU build of
	@# torch (190 MB) on its own disk, where a newer or unpinned torch would be a CUDA build of several
	@# GB; `jax` alone is JAX's CPU build (jaxlib 0.10.2, about 90 MB).
	$(BIN)/pip install -q "torch==2.13.0" "jax==0.10.2" "jaxlib==0.10.2"
	@# The npm packages into ./node_modules, configurable-http-proxy among them (JupyterHub's proxy, for
	@# tests/test_jupyterhub.py): pip's build of the front ends runs npm only when they are not built yet.
	@if command -v npm >/dev/null; then npm install --no-audit --no-fund --loglevel=error; fi
	$(BIN)/pip install -q -e ".[cpu,test,docs]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null

# Static checks first: a finding fails the run before any test starts.
lint: lint-python lint-js

lint-python:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The front ends (js/): tsc over every TypeScript file, then ESLint with typescript-eslint's
# type-checked rules (eslint.config.mjs); both from node_modules (npm devDependencies, make setup).
lint-js:
	node_modules/.bin/tsc -p tsconfig.check.json
	node_modules/.bin/eslint js

# The documentation (docs/, MyST Markdown) into build/docs: a warning (a broken link or reference, a
# docstring autodoc cannot read) fails it. The magics' reference is generated from the grammar here.
docs:
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs build/docs

test: lint docs
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m pytest --nbval example_notebooks tests

test-fast:
	$(BIN)/python -m pytest -m "not slow and not browser and not gpu" tests

# The comparison with nvitop, gpustat, jupyterlab-nvdashboard and jupyter-resource-usage (about
# 10 minutes; the peers are installed into build/bench-deps on first use): the figures of docs/performance.md.
bench:
	$(BIN)/python benchmarks/compare.py
