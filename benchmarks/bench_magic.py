"""How long `%gpu use/grow/limit` take before TensorFlow is imported.

Run by hand: `.venv/bin/python benchmarks/bench_magic.py`.  Prints medians; no assertions.
What `%load_ext tfgpu_magic` costs in a fresh kernel, against its peers, is `compare.py`'s.
"""

from __future__ import annotations

import statistics
import sys
import time


def magic_times(calls: int = 300) -> dict[str, float]:
    from IPython.core.interactiveshell import InteractiveShell

    import tfgpu_magic
    from tfgpu_magic.gpus.simulated import shared_server

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "tfgpu_magic")
    tfgpu_magic.set_device_source(shared_server())  # four GPUs, as on a shared server
    medians = {}
    for line in ("use 1", "grow", "limit 4096", "limit 50%"):
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            ip.run_line_magic("gpu", line)
            samples.append((time.perf_counter() - start) * 1000)
        medians[line] = statistics.median(samples)
    assert "tensorflow" not in sys.modules
    return medians


if __name__ == "__main__":
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        medians = magic_times()
    for line, ms in medians.items():
        print(f"%gpu {line:<12} median {ms:.3f} ms (TensorFlow not imported, fake 4-GPU NVML)")
