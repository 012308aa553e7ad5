"""``%load_ext tfgpu_magic`` in a fresh Jupyter kernel, against ``import nvitop`` and ``import gpustat``.

Run by ``compare.py`` as a child process (``python benchmarks/vs_startup.py ROUNDS``), which prints
one JSON line.  Each round starts one fresh kernel per contender (the order rotating), runs three
empty cells (the kernel's own first-cell costs), then one cell that times the contender's line
with ``time.perf_counter`` inside the kernel, and shuts the kernel down.  The first ``%gpu`` after
``%load_ext`` (a cell of its own, untimed) is timed the same way: the session is built there.  The kernel is this
checkout's ``python3`` kernel, with the peers on its ``PYTHONPATH``.  What a user waits for is
that line: the imports it makes that the kernel had not made already (ipykernel has imported
IPython, traitlets, asyncio and zmq before the first cell).

Every contender imports from compiled bytecode, as an installed package does (pip compiles at
install): this checkout and the peers' folder are compiled first, since a checkout run with
``PYTHONDONTWRITEBYTECODE`` set would otherwise compile its modules again in every kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers
from timing import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LINES = {
    "tfgpu_magic": "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')",
    "tfgpu_magic (import only)": "import tfgpu_magic",
    "tfgpu_magic: the first %gpu (grow)": "get_ipython().run_line_magic('gpu', 'grow')",
    "nvitop": "import nvitop",
    "gpustat": "import gpustat",
}

# Run in a cell of its own before the timed one (untimed).
SETUP = {"tfgpu_magic: the first %gpu (grow)": "get_ipython().run_line_magic('load_ext', 'tfgpu_magic')"}

TIMED = """\
import time as _bench_time
_bench_start = _bench_time.perf_counter()
{line}
_bench_ms = (_bench_time.perf_counter() - _bench_start) * 1000
"""


def time_in_fresh_kernel(line: str, setup: str = "pass") -> float:
    from jupyter_client.manager import KernelManager

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, peers.PEERS_DIR])}
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env=env, stderr=subprocess.DEVNULL)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        for _ in range(3):
            client.execute_interactive("pass", timeout=60, output_hook=lambda _msg: None)
        client.execute_interactive(setup, timeout=60, output_hook=lambda _msg: None)
        reply = client.execute_interactive(
            TIMED.format(line=line),
            user_expressions={"ms": "_bench_ms"},
            timeout=60,
            output_hook=lambda _msg: None,
        )
        content: dict[str, Any] = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(
                f"{line!r} failed in the kernel: {content.get('ename')}: {content.get('evalue')}"
            )
        return float(content["user_expressions"]["ms"]["data"]["text/plain"])
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def compile_all() -> None:
    import compileall

    for folder in (os.path.join(ROOT, "tfgpu_magic"), peers.PEERS_DIR):
        compileall.compile_dir(folder, quiet=1)


def main() -> None:
    rounds = int(sys.argv[1])
    peers.ensure_installed()
    compile_all()
    names = list(LINES)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(time_in_fresh_kernel(LINES[name], SETUP.get(name, "pass")))
    print(
        json.dumps(
            {"contenders": {name: {"fresh": summary(ms), "samples": ms} for name, ms in samples.items()}}
        )
    )


if __name__ == "__main__":
    main()
