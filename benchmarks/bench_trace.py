"""What `%gpu trace` costs a cell, against tracing off: an empty cell and a small framework op.

    .venv/bin/python benchmarks/bench_trace.py [ROUNDS [FRAMEWORK ...]]

One fresh process per framework (``tensorflow``, ``torch``; both by default), each a plain
IPython shell with ``%load_ext tfgpu_magic`` and the framework started, its cells run by
``shell.run_cell`` as a kernel runs them.  Tracing is switched with the real ``%gpu trace`` and
``%gpu trace off`` between blocks of cells (untimed); the blocks alternate off / on, the order
rotating every round, so a slow spell of the machine falls on both.  Two cells: ``pass``, and a
64×64 float32 matmul of tensors made beforehand (each framework on one compute thread).  Printed lines (the trace's, in a notebook the
cell's output) go to an in-memory buffer, for both modes alike.

TensorFlow's CPU allocator keeps statistics here (``TF_CPU_ALLOCATOR_USE_BFC=true``, set below
before TensorFlow starts), so with no GPU its hooks do the full work: reset and read the
allocator, format and print one line; the process checks a trace line was printed.  PyTorch's
adapter traces CUDA's caching allocator only: on a CPU build the hooks find no device to read
and print nothing, which is what tracing costs a CPU-only PyTorch user.

Run with a framework named, the process measures that one and prints one JSON line (what
``compare.py``'s ``trace`` section reads); with none named, it runs each in a child process and
prints a table.  No assertion on times.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from timing import summary  # noqa: E402

FRAMEWORKS = ("tensorflow", "torch")
BLOCK = 20  # cells per block between switches
# One compute thread each: on a 2-core VM shared with other work, waking a thread pool takes
# milliseconds at random, which would drown the hooks' microseconds; the hooks do the same either way.
SETUP = {
    "tensorflow": "import tensorflow as tf\n"
    "tf.config.threading.set_intra_op_parallelism_threads(1)\n"
    "tf.config.threading.set_inter_op_parallelism_threads(1)\n"
    "_a = tf.ones([64, 64]); _b = tf.ones([64, 64]); _held = tf.ones([1024, 1024])",
    "torch": "import torch\ntorch.set_num_threads(1)\n_a = torch.ones(64, 64); _b = torch.ones(64, 64)",
}
CELLS = {
    "empty": "pass",
    "matmul": {"tensorflow": "_c = tf.matmul(_a, _b)", "torch": "_c = _a @ _b"},
}


def measure(framework: str, rounds: int) -> dict[str, Any]:
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from IPython.core.interactiveshell import InteractiveShell

    import tfgpu_magic
    from tfgpu_magic.gpus.simulated import SimulatedNvml

    shell = InteractiveShell.instance()  # a plain shell: IPython's test shell would need pytest
    shell.run_line_magic("load_ext", "tfgpu_magic")
    tfgpu_magic.set_device_source(SimulatedNvml([]))
    _run(shell, SETUP[framework])
    cells = {kind: code if isinstance(code, str) else code[framework] for kind, code in CELLS.items()}
    first_line = _trace_once(shell, cells["matmul"])
    if framework == "tensorflow" and not first_line.startswith("[gpu trace] CPU:0: peak"):
        raise RuntimeError(f"TensorFlow's CPU allocator was not traced: {first_line!r}")
    samples: dict[str, dict[str, list[float]]] = {kind: {"off": [], "on": []} for kind in cells}
    for round_ in range(rounds):
        for kind, code in cells.items():
            for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                _switch(shell, mode == "on")
                samples[kind][mode].extend(_cells(shell, code, BLOCK))
    _switch(shell, False)
    result: dict[str, Any] = {"framework": framework, "first_trace_line": first_line, "cells": {}}
    for kind, by_mode in samples.items():
        off, on = summary(by_mode["off"]), summary(by_mode["on"])
        result["cells"][kind] = {
            "code": cells[kind],
            "off_us": off,
            "on_us": on,
            "overhead_us": on[0] - off[0],
            "overhead_percent": (on[0] - off[0]) / off[0] * 100,
            "runs": len(by_mode["on"]),
        }
    return result


def _run(shell: Any, code: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        result = shell.run_cell(code, store_history=False)
    result.raise_error()


def _switch(shell: Any, on: bool) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("gpu", "trace" if on else "trace off")


def _trace_once(shell: Any, code: str) -> str:
    """The line tracing prints after one cell (a check that the hooks did their work)."""
    _switch(shell, True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        shell.run_cell(code, store_history=False)
    _switch(shell, False)
    return printed.getvalue().strip()


def _cells(shell: Any, code: str, count: int) -> list[float]:
    """Microseconds of ``count`` runs of ``code`` as a cell, what they print kept in memory."""
    times = []
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(count):
            start = time.perf_counter()
            shell.run_cell(code, store_history=False)
            times.append((time.perf_counter() - start) * 1e6)
    return times


def in_child(framework: str, rounds: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), str(rounds), framework],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])},
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bench_trace.py {framework} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    named = sys.argv[2:]
    if len(named) == 1:
        print(json.dumps(measure(named[0], rounds)))
        return
    for framework in named or FRAMEWORKS:
        result = in_child(framework, rounds)
        print(f"{framework} (first trace line: {result['first_trace_line']!r})")
        for kind, data in result["cells"].items():
            off, on = data["off_us"], data["on_us"]
            print(
                f"  {kind:<7} off {off[0]:8.1f} us (p95 {off[1]:8.1f})  on {on[0]:8.1f} us (p95 {on[1]:8.1f})"
                f"  overhead {data['overhead_us']:+7.1f} us ({data['overhead_percent']:+.0f} %), {data['runs']} cells each"
            )


if __name__ == "__main__":
    main()
