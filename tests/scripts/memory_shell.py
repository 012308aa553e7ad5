"""A real IPython shell with tfgpu_magic loaded, for the per-cell memory scenarios.

Imported by the scenario scripts next to it (trace_scenario.py, cells_scenario.py, ...), each
run in a fresh process by the tests, since TensorFlow's start-up cannot be undone.
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout

from IPython.testing.globalipapp import start_ipython

import tfgpu_magic
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml

# A machine without GPUs, whatever this one has; `--four-gpus`: a driver listing four GPUs (which
# TensorFlow's CPU build then does not find, as on a GPU server with the wrong TensorFlow).
FOUR_GPUS = "--four-gpus" in sys.argv
tfgpu_magic.set_device_source(SimulatedNvml([SimulatedGpu() for _ in range(4)] if FOUR_GPUS else []))
ip = start_ipython()
ip.run_line_magic("load_ext", "tfgpu_magic")
results: dict = {}


def cell(code: str) -> dict:
    """Run a cell as the notebook would; what it printed, on which stream, and how it ended."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        outcome = ip.run_cell(code, store_history=True)
    error = outcome.error_in_exec or outcome.error_before_exec
    return {
        "out": out.getvalue(),
        "err": err.getvalue(),
        "ok": outcome.success,
        "error": None if error is None else f"{type(error).__name__}: {error}",
        "result": None if outcome.result is None else repr(outcome.result),
    }


def finish() -> None:
    print(json.dumps(results))
