"""How long `%gpu use/grow/limit` take before TensorFlow is imported, and `%load_ext` itself.

Run by hand: `.venv/bin/python benchmarks/bench_magic.py`.  Prints medians; no assertions.
The import/load figure is measured in fresh interpreters (a module imports only once).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

LOAD = (
    "import time; t0 = time.perf_counter()\n"
    "import tfgpu_magic\n"
    "from IPython.core.interactiveshell import InteractiveShell\n"
    "ip = InteractiveShell.instance()\n"
    "t1 = time.perf_counter(); ip.run_line_magic('load_ext', 'tfgpu_magic'); t2 = time.perf_counter()\n"
    "print((t2 - t1) * 1000, (t1 - t0) * 1000)\n"
)


def load_times(runs: int = 7) -> tuple[float, float]:
    """Median ms of `%load_ext tfgpu_magic` (with `import tfgpu_magic`), and of `import tfgpu_magic` alone."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    loads, imports = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, check=True)
        load_ms, import_and_shell_ms = map(float, out.stdout.split())
        loads.append(load_ms)
    for _ in range(runs):
        code = "import time; t=time.perf_counter(); import tfgpu_magic; print((time.perf_counter()-t)*1000)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        imports.append(float(out.stdout))
    return statistics.median(imports), statistics.median(loads)


KERNEL_LOAD = "import time as _t; _t0 = _t.perf_counter()\n%load_ext tfgpu_magic\nprint((_t.perf_counter() - _t0) * 1000)"


def kernel_load_times(runs: int = 5) -> float:
    """Median ms of `import tfgpu_magic` + `%load_ext` in a real Jupyter kernel, each run a fresh one.

    A kernel has already imported asyncio, ssl and importlib.metadata, which a bare
    InteractiveShell has not and which wrapt (the import hooks) pulls in.
    """
    from jupyter_client.manager import start_new_kernel

    times = []
    for _ in range(runs):
        manager, client = start_new_kernel(kernel_name="python3")
        try:
            out: list[str] = []

            def keep(msg: dict) -> None:
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])

            client.execute_interactive(KERNEL_LOAD, output_hook=keep, timeout=60)
            times.append(float("".join(out)))
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    return statistics.median(times)


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

    import_ms, load_ms = load_times()
    print(f"import tfgpu_magic: median {import_ms:.1f} ms")
    print(f"%load_ext tfgpu_magic (after import): median {load_ms:.1f} ms; together {import_ms + load_ms:.1f} ms")
    print(f"import + %load_ext in a fresh Jupyter kernel: median {kernel_load_times():.1f} ms")
    with contextlib.redirect_stdout(io.StringIO()):
        medians = magic_times()
    for line, ms in medians.items():
        print(f"%gpu {line:<12} median {ms:.3f} ms (TensorFlow not imported, fake 4-GPU NVML)")
