"""What `%gpu trace` costs a cell: the pre_run_cell + post_run_cell hooks, with TensorFlow started.

Run by hand (no timing assertions in the tests):

    cd /work/main && PYTHONPATH=. .venv/bin/python benchmarks/bench_trace.py

TensorFlow's CPU allocator keeps statistics here (TF_CPU_ALLOCATOR_USE_BFC=true is set below,
before TensorFlow starts), so the hooks do the full work: reset and read the allocator, format
and print one line.  Printing goes to an in-memory buffer, as a notebook's output would.  Also
times a whole `run_cell("pass")` with tracing off and on, for scale.
"""

from __future__ import annotations

import io
import os
import platform
import statistics
import time

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from IPython.core.interactiveshell import InteractiveShell

import tfgpu_magic
from tfgpu_magic.gpus.simulated import SimulatedNvml
from tfgpu_magic.kernel import trace
from tfgpu_magic.kernel.session import get_session

ROUNDS = 5000


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[int(len(ordered) * 0.95)]
    return f"median {p50 * 1e3:.3f} ms, p95 {p95 * 1e3:.3f} ms, max {ordered[-1] * 1e3:.3f} ms"


def hooks(tracer: trace.Tracer) -> list[float]:
    samples = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        tracer.pre_run_cell(None)
        tracer.post_run_cell(None)
        samples.append(time.perf_counter() - t0)
    return samples


def cells(shell, rounds: int = 500) -> list[float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        shell.run_cell("pass", store_history=False)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    tfgpu_magic.set_device_source(SimulatedNvml([]))
    held = tf.ones([1024, 1024])  # start TensorFlow, with something in the allocator
    shell = InteractiveShell.instance()  # a plain shell: IPython's test shell would need pytest
    shell.run_line_magic("load_ext", "tfgpu_magic")  # the session the tracer reads, as in a notebook
    tracer = trace.Tracer(shell, get_session(), out=io.StringIO())
    tracer.pre_run_cell(None)
    tracer.post_run_cell(None)
    assert tracer.out.getvalue().startswith("[gpu trace] CPU:0: peak 4 MiB"), tracer.out.getvalue()
    hooks(tracer)  # warm-up
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}, {ROUNDS} rounds")
    print(f"pre+post hooks, TensorFlow started, CPU stats on: {percentiles(hooks(tracer))}")
    print(f"run_cell('pass'), tracing off:                    {percentiles(cells(shell))}")
    on = trace.Tracer(shell, get_session(), out=io.StringIO())
    on.start()
    print(f"run_cell('pass'), tracing on:                     {percentiles(cells(shell))}")
    on.stop()
    del held


if __name__ == "__main__":
    main()
