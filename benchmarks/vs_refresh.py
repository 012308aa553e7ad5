"""A status refresh, warm and cold: tfgpu_magic against nvitop and gpustat, interleaved in one process.

Run by ``compare.py`` as a child process (``python benchmarks/vs_refresh.py GPUS PROCESSES ROUNDS``),
which prints one JSON line.  Every contender reads the same stand-in NVML (``standin.py``) listing
the same real processes: this one, sleepers of several users, and one exited pid.

What each does per refresh, as its users run it:

- tfgpu_magic: ``status.build_report`` (what ``%gpu status`` and ``tfgpu --json`` build): memory,
  utilization, every process with owner and command, this kernel's share, claims.  Warm: the
  process-wide owner cache, as a kernel has after its first ``%gpu``.
- nvitop: ``Device.all()`` once; per refresh each device's memory, utilization and processes with
  username, command and GPU memory, the previous refresh's process objects kept alive (nvitop's
  monitor keeps its snapshot, and its process cache holds objects only while someone does).
- gpustat: ``gpustat.new_query()`` (what ``gpustat`` and its ``--watch`` run), which also reads each
  process's CPU and host memory; its 0.1 s sleep per GPU (to measure CPU percent) is skipped, so
  its work is timed, not its waiting.  It keeps psutil objects per pid itself (warm).

Cold: the same readers after emptying what they remember about processes and users (our owner
table and user names; nvitop's process instances; gpustat's psutil objects): the first refresh of
a new kernel or tool, NVML already started.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["TFGPU_MAGIC_CLAIM_DIR"] = tempfile.mkdtemp(prefix="tfgpu-bench-claims-")

import peers
import standin
from timing import interleaved, median_ms, summary


def ours() -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(refresh, forget): ``%gpu status``'s report, and emptying the owner cache for a cold one."""
    from tfgpu_magic.gpus import owners
    from tfgpu_magic.gpus.nvml import Nvml
    from tfgpu_magic.kernel import status
    from tfgpu_magic.kernel.session import Session

    session = Session(nvml=Nvml(), env={})
    cold = SimpleNamespace(table=None)

    def refresh() -> Any:
        return status.build_report(session, process_table=cold.table)

    def forget() -> None:
        cold.table = owners.PsutilProcessTable(user_names=owners._UserNames())

    return refresh, forget


def nvitop(stand_in: bool = True) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(refresh, forget), as nvitop's users run it; ``stand_in`` False: on the real driver
    (``real_refresh.py``), nvitop's own ctypes calls left as they are."""
    if stand_in:
        standin.point_nvitop_at_pynvml()
    from nvitop import Device, GpuProcess, HostProcess

    devices = Device.all()
    kept: list[Any] = []  # the last snapshot, as nvitop's monitor holds it

    def refresh() -> Any:
        rows = []
        with GpuProcess.failsafe():  # an exited pid shows N/A, as in nvitop's own views
            for device in devices:
                memory, utilization = device.memory_info(), device.gpu_utilization()
                processes = device.processes()
                rows.append(
                    (
                        memory,
                        utilization,
                        [(p.pid, p.username(), p.command(), p.gpu_memory()) for p in processes.values()],
                    )
                )
                kept.append(processes)
        del kept[: -len(devices)]
        return rows

    def forget() -> None:
        kept.clear()
        GpuProcess.INSTANCES.clear()
        HostProcess.INSTANCES.clear()

    return refresh, forget


def gpustat() -> tuple[Callable[[], Any], Callable[[], Any]]:
    import gpustat as module
    import gpustat.core

    gpustat.core.time = SimpleNamespace(sleep=lambda _s: None, time=__import__("time").time)  # type: ignore[attr-defined]

    def forget() -> None:
        gpustat.core.GPUStatCollection.global_processes.clear()

    return module.new_query, forget


def shown(name: str, result: Any) -> int:
    """How many processes a contender's refresh reported."""
    if name == "tfgpu_magic":
        return sum(len(g["processes"] or []) for g in result["gpus"])
    if name == "nvitop":
        return sum(len(row[2]) for row in result)
    return sum(len(g.processes or []) for g in result.gpus)


def main() -> None:
    gpus, processes, rounds = (int(a) for a in sys.argv[1:4])
    peers.ensure_installed()
    with standin.Sleepers(processes - 2) as sleepers:
        server = standin.server_listing([os.getpid(), *sleepers.pids], gpus, gone=sleepers.gone)
        calls = standin.install(server)
        made = {"tfgpu_magic": ours(), "nvitop": nvitop(), "gpustat": gpustat()}
        refreshes = {name: pair[0] for name, pair in made.items()}
        forgets = {name: pair[1] for name, pair in made.items()}
        result: dict[str, Any] = {
            "gpus": gpus,
            "processes": processes,
            "owners": sleepers.owners,
            "contenders": {},
        }
        import pynvml

        nvml_call_ms = median_ms(lambda: [pynvml.nvmlDeviceGetMemoryInfo(0) for _ in range(1000)], 20) / 1000
        result["standin_call_ms"] = nvml_call_ms
        for name, refresh in refreshes.items():
            refresh()
            before = sum(calls.values())
            found = refresh()
            result["contenders"][name] = {
                "nvml_calls": sum(calls.values()) - before,
                "processes_shown": shown(name, found),
            }
        for case, prepare in (("warm", None), ("cold", forgets)):
            samples = interleaved(refreshes, rounds if case == "warm" else max(10, rounds // 3), prepare)
            for name, ms in samples.items():
                result["contenders"][name][case] = summary(ms)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
