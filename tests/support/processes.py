"""Fresh Pythons and fresh kernels: where TensorFlow starts, never in the test process.

A fresh process never inherits what TensorFlow, CUDA, XLA, JAX or PyTorch read at start-up from
the developer's shell or from an earlier test; a test that depends on one passes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .paths import ROOT, SCRIPTS

# What TensorFlow, CUDA, XLA, JAX and PyTorch read when they start.
START_UP_PREFIXES = ("TF_", "CUDA_", "XLA_", "JAX_", "PYTORCH_")

# The test being set up or run (conftest's pytest_runtest_setup records it): fresh processes check
# its markers.
running: list[pytest.Item | None] = [None]


def fresh_env(env: dict | None = None) -> dict:
    """The environment of a fresh Python: this checkout first, no inherited start-up settings."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith(START_UP_PREFIXES)}
    return {**clean, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}


def run_python(args: list[str], env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh process (see :func:`fresh_env`); the test must be marked `slow`.

    Fresh processes are where TensorFlow starts, so `make test-fast` (``-m "not slow ..."``) must
    never meet one: a test that starts one without the marker fails, saying so.
    """
    _must_be_slow(args)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=fresh_env(env), timeout=timeout, cwd=ROOT
    )


def start_python(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """Start ``python ARGS`` in a fresh process and return at once (stdout and stderr piped, text);
    as :func:`run_python`, only from a test marked `slow`.  The caller waits for it (or kills it)."""
    _must_be_slow(args)
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fresh_env(env),
        cwd=ROOT,
    )


def _must_be_slow(args: list[str]) -> None:
    item = running[0]
    if item is not None and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{item.nodeid} starts a fresh Python ({' '.join(args)[:60]}) but is not marked "
            "`slow`: mark it, so that `make test-fast` never starts one",
            pytrace=False,
        )


def run_scenario(name: str, *args: str, env: dict | None = None, timeout: int = 240) -> dict:
    """Run tests/scripts/<name>.py in a fresh Python and return the JSON it prints last."""
    proc = run_python([str(SCRIPTS / f"{name}.py"), *args], env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"scenario {name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


def run_in_fresh_kernel(cells: list[str], cwd: Path) -> list[list[dict]]:
    """Run ``cells`` as one notebook in a fresh python3 kernel (nbclient); each cell's outputs.
    Use with the ``kernel_env`` fixture, and mark the test `slow`."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(
        nb, timeout=300, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(cwd)}}
    ).execute()
    return [cell["outputs"] for cell in nb.cells]
