"""The first status of a fresh process: ``tfgpu --json`` against nvitop's import and first snapshot.

Run by ``compare.py`` as a child process (``python benchmarks/vs_fresh.py GPUS PROCESSES ROUNDS``),
which prints one JSON line.  Each round starts one new Python process per contender (the order
rotating); every process points ``pynvml`` at the same stand-in NVML (``standin.py``) listing the
same real processes, then times, from its first import of the contender to the last reading:

- ``tfgpu --json``: ``tfgpu_magic.__main__.main(["--json"])``, the whole command: its imports, the
  session, NVML's start, the report with owners and commands, and the JSON printed (to /dev/null).
- ``%gpu status``'s report: ``status.build_report(Session())`` and its imports, nothing printed.
- nvitop: ``import nvitop``, ``Device.all()``, and each device's memory, utilization and processes
  with username, command and GPU memory (what its one-shot views show), nothing printed.

Before the clock starts, each process has imported ``pynvml`` (patched to answer from the stand-in)
and the standard-library modules the stand-in needs; this package's modules the stand-in imported
are dropped from ``sys.modules`` first, so tfgpu_magic imports all of its own again.  ``pynvml``'s
import is therefore outside both figures.  The parent also times each process from its start to
its exit (the interpreter's own start and the stand-in included, alike for all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ROOT = os.path.dirname(HERE)

CONTENDERS = ("tfgpu --json", "status.build_report", "nvitop")


# -- the child: one fresh process, one contender ----------------------------------------------------
def _tfgpu_json() -> Any:
    from tfgpu_magic.__main__ import main

    saved = sys.stdout
    with open(os.devnull, "w") as sys.stdout:
        try:
            main(["--json"])
        finally:
            sys.stdout = saved
    return None


def _build_report() -> Any:
    from tfgpu_magic.kernel import status
    from tfgpu_magic.kernel.session import Session

    return status.build_report(Session(), viewer="this process")


def _nvitop() -> Any:
    import standin

    standin.point_nvitop_at_pynvml()  # imports nvitop.api.libnvml: nvitop's import, in the clock
    from nvitop import Device, GpuProcess

    rows = []
    with GpuProcess.failsafe():
        for device in Device.all():
            processes = device.processes()
            rows.append(
                (
                    device.memory_info(),
                    device.gpu_utilization(),
                    [(p.pid, p.username(), p.command(), p.gpu_memory()) for p in processes.values()],
                )
            )
    return rows


def child(name: str, gpus: int, gone: int, pids: list[int]) -> None:
    import peers
    import standin

    peers.ensure_installed()
    server = standin.server_listing([os.getpid(), *pids], gpus, gone=gone)
    calls = standin.install(server)
    for module in [m for m in sys.modules if m == "tfgpu_magic" or m.startswith("tfgpu_magic.")]:
        del sys.modules[module]  # the stand-in's copy of the simulated server stays with `server`
    before = set(sys.modules)
    work = {"tfgpu --json": _tfgpu_json, "status.build_report": _build_report, "nvitop": _nvitop}[name]
    start = time.perf_counter()
    work()
    ms = (time.perf_counter() - start) * 1000
    imported = sorted(set(sys.modules) - before)
    print(
        json.dumps(
            {
                "ms": ms,
                "nvml_calls": sum(n for call, n in calls.items() if call != "nvmlInit"),
                "modules": len(imported),
                "psutil": "psutil" in imported,
            }
        )
    )


# -- the parent: fresh processes, interleaved -------------------------------------------------------
def one_process(name: str, gpus: int, gone: int, pids: list[int]) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", name, str(gpus), str(gone), *map(str, pids)],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        name, gpus, gone, *pids = sys.argv[2:]
        child(name, int(gpus), int(gone), [int(p) for p in pids])
        return
    import compileall

    import peers
    import standin
    from timing import summary

    gpus, processes, rounds = (int(a) for a in sys.argv[1:4])
    peers.ensure_installed()
    for folder in (os.path.join(ROOT, "tfgpu_magic"), peers.PEERS_DIR):
        compileall.compile_dir(folder, quiet=1)  # imported from bytecode, as an installed package is
    os.environ["TFGPU_MAGIC_CLAIM_DIR"] = tempfile.mkdtemp(prefix="tfgpu-bench-claims-")
    found: dict[str, dict[str, Any]] = {name: {"ms": [], "wall": []} for name in CONTENDERS}
    with standin.Sleepers(processes - 1) as sleepers:
        for round_ in range(rounds):
            shift = round_ % len(CONTENDERS)
            for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                child_said, wall = one_process(name, gpus, sleepers.gone, sleepers.pids)
                found[name]["ms"].append(child_said["ms"])
                found[name]["wall"].append(wall)
                found[name].update({k: child_said[k] for k in ("nvml_calls", "modules", "psutil")})
    result = {
        "gpus": gpus,
        "processes": processes,
        "owners": sleepers.owners,
        "contenders": {
            name: {**data, "fresh": summary(data.pop("ms")), "process": summary(data.pop("wall"))}
            for name, data in found.items()
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
