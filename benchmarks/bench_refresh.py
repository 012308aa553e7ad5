"""One refresh of the shared inventory with owners resolved through psutil, against real processes.

Run by hand: `PYTHONPATH=. .venv/bin/python benchmarks/bench_refresh.py [--peers-python PY]`.
Prints medians; no assertions.

The busy fake server (``simulated.busy_server``: 8 GPUs, 40 processes, one exited) lists real
pids here: this process, 38 sleeping Pythons this benchmark starts (and ends), and the pid of
one that has exited.  Its simulated ``owner_of`` is removed, so owners and commands come from
psutil as on a real machine.  A refresh is ``status.build_report`` (what ``%gpu status`` and the
endpoint build); its time is shown whole and less the fake NVML's own time (its calls, each
costing what one fake call costs), which leaves our code plus the operating system's answers.

Variants: no cache (psutil and pwd for every process, as before the cache), a fresh
``PsutilProcessTable`` per refresh (a cold cache), the process-wide shared table (warm), and
the simulated owner table (no operating system at all: the floor).

Peers, where installed: nvitop and gpustat doing their own equivalent against the same fake
server and the same pids, through a stand-in ``pynvml`` whose functions call the fake (what
the fake cannot answer, such as temperature or fans, raises NVML's Not Supported).  Installed
in this interpreter they run here; otherwise ``--peers-python`` names an interpreter that has
them (e.g. a separate virtual environment), run as a child process on the same pids.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TFGPU_MAGIC_CLAIM_DIR", tempfile.mkdtemp(prefix="tfgpu-bench-claims-"))

from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

from tfgpu_magic.gpus.simulated import SimulatedNvml, busy_server  # noqa: E402

SLEEPERS = 38  # with this process and one exited pid: the busy server's 40


def real_pid_server(pids: list[int], gone: int) -> SimulatedNvml:
    """The busy fake server listing real pids; no simulated owner table (psutil answers)."""
    server = busy_server(os.getpid())
    listed = [p for gpu in server.gpus for p in gpu.processes if p.pid != os.getpid()]
    assert len(listed) == len(pids) + 1, "the busy server's size changed: adjust SLEEPERS"
    for proc, pid in zip(listed, [*pids, gone]):
        proc.pid = pid
    server.owner_of = None  # type: ignore[assignment]  # process_table_for falls back to psutil
    return server


def fake_call_ms(server: SimulatedNvml) -> float:
    return median_ms(lambda: [server.nvmlDeviceGetMemoryInfo(0) for _ in range(1000)], 50) / 1000


# -- our code ----------------------------------------------------------------------------------
def ours(pids: list[int], gone: int, runs: int) -> None:
    from tfgpu_magic.gpus import owners
    from tfgpu_magic.gpus.nvml import Nvml
    from tfgpu_magic.kernel import status
    from tfgpu_magic.kernel.session import Session

    server = real_pid_server(pids, gone)
    session = Session(nvml=Nvml(lib=server), env={})
    status.build_report(session)
    before = server.calls
    status.build_report(session)
    calls = server.calls - before
    per_call = fake_call_ms(server)
    nvml_ms = calls * per_call
    shared = owners.shared_psutil_table()

    class Uncached:
        """psutil and pwd for every process: the look-up as it was before the cache."""

        table = owners.PsutilProcessTable()

        def lookup(self, pid: int) -> owners.ProcessDetails:
            self.table._names = owners._UserNames()  # a name cache of one look-up: pwd every time
            return self.table._read(pid)

        def current_user(self) -> Optional[str]:
            return owners._UserNames().name(os.getuid())

    simulated = busy_server(os.getpid())
    sim_session = Session(nvml=Nvml(lib=simulated), env={})
    variants: list[tuple[str, Callable[[], object]]] = [
        ("no cache (psutil + pwd per process, as before)", lambda: status.build_report(session, process_table=Uncached())),
        ("a fresh PsutilProcessTable per refresh (cold)", lambda: status.build_report(session, process_table=owners.PsutilProcessTable())),
        ("the shared table (warm): what %gpu and the endpoint use", lambda: status.build_report(session)),
        ("simulated owners, no psutil (the floor)", lambda: status.build_report(sim_session)),
    ]
    rows = [(label, median_ms(work, runs)) for label, work in variants]
    report = status.build_report(session)
    procs = [p for g in report["gpus"] for p in g["processes"] or []]
    named = sum(1 for p in procs if p["user"])
    print(f"Ours: build_report, 8 fake GPUs, {len(procs)} processes ({named} with owners from psutil, "
          f"{sum(1 for p in procs if not p['alive'])} exited); {calls} fake NVML calls a refresh, "
          f"about {nvml_ms:.3f} ms of them")
    print(f"  {'variant':<58} {'median':>9} {'less fake NVML':>15}")
    for label, ms in rows:
        print(f"  {label:<58} {ms:7.3f} ms {ms - nvml_ms:10.3f} ms")
    listed = [p.pid for g in server.gpus for p in g.processes]
    uncached = Uncached()
    lookups = [
        ("40 look-ups, no cache", lambda: [uncached.lookup(pid) for pid in listed]),
        ("40 look-ups, the shared table (warm)", lambda: [shared.lookup(pid) for pid in listed]),
    ]
    for label, work in lookups:
        print(f"  {label:<58} {median_ms(work, runs):7.3f} ms")
    print(f"  the shared table remembers {shared.cache_size()} processes")


# -- peers: nvitop and gpustat on the same fake server, through a stand-in pynvml ---------------
STANDIN_EXTRA: dict[str, Callable[..., Any]] = {
    "nvmlSystemGetDriverVersion": lambda: "999.99",
    "nvmlSystemGetCudaDriverVersion": lambda: 12080,
    "nvmlSystemGetCudaDriverVersion_v2": lambda: 12080,
    "nvmlSystemGetNVMLVersion": lambda: "12.999.99",
    "nvmlDeviceGetIndex": lambda handle: handle,
}


def install_pynvml_standin(server: SimulatedNvml) -> SimpleNamespace:
    """Point ``pynvml``'s functions at the fake server; returns counters of the calls made."""
    import pynvml

    from tfgpu_magic.gpus.simulated import NVMLError as FakeError

    counts = SimpleNamespace(answered=0, refused=0)

    def answered(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **_kwargs: Any) -> Any:
            counts.answered += 1
            try:
                result = fn(*args)
            except FakeError as err:
                raise pynvml.NVMLError(err.value) from None
            if isinstance(result, list):  # process listings: the fields a real struct has
                for p in result:
                    p.gpuInstanceId = p.computeInstanceId = 0xFFFFFFFF
            return result

        return call

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        counts.refused += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def no_pointer(_name: str) -> Any:  # no real library behind: the versioned APIs are absent
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    for name, attr in list(vars(pynvml).items()):
        if not name.startswith("nvml") or not callable(attr) or isinstance(attr, type):
            continue
        base = name.removesuffix("_v3").removesuffix("_v2")
        if name in STANDIN_EXTRA:
            setattr(pynvml, name, answered(STANDIN_EXTRA[name]))
        elif hasattr(server, base):
            setattr(pynvml, name, answered(getattr(server, base)))
        elif name == "nvmlInitWithFlags":
            setattr(pynvml, name, answered(lambda flags=0: server.nvmlInit()))
        elif name.startswith(("nvmlDevice", "nvmlSystem", "nvmlUnit")):
            setattr(pynvml, name, refused)
    pynvml._nvmlGetFunctionPointer = no_pointer
    return counts


def standin_costs_ms(server: SimulatedNvml) -> tuple[float, float]:
    """What one answered and one refused stand-in call cost (the refusal raised and caught)."""
    import pynvml

    server.nvmlInit()  # gpustat shuts NVML down after each query
    answered = median_ms(lambda: [pynvml.nvmlDeviceGetMemoryInfo(0) for _ in range(1000)], 30) / 1000

    def refuse() -> None:
        for _ in range(1000):
            try:
                pynvml.nvmlDeviceGetTemperature(0, 0)
            except pynvml.NVMLError:
                pass

    return answered, median_ms(refuse, 30) / 1000


def peer(name: str, pids: list[int], gone: int, runs: int) -> dict[str, Any]:
    """Time one peer's refresh in this process; returns JSON-ready figures."""
    server = real_pid_server(pids, gone)
    counts = install_pynvml_standin(server)
    if name == "gpustat":
        import gpustat
        import gpustat.core

        # new_query() sleeps 0.1 s per GPU (a cpu_percent interval): left out, to time its work
        gpustat.core.time = SimpleNamespace(sleep=lambda _s: None)  # type: ignore[attr-defined]

        def work() -> object:
            return gpustat.new_query()

        what = "gpustat.new_query(): GPUs, processes with user, command, CPU and memory (its 0.1 s sleep per GPU skipped)"
        version = gpustat.__version__
    else:
        import nvitop
        from nvitop import Device, GpuProcess
        from nvitop.api import libnvml

        # nvitop redefines a few wrappers over ctypes function pointers: point those at the fake too
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetMemoryInfo"):
            setattr(libnvml, fn, getattr(sys.modules["pynvml"], fn))
        libnvml.nvmlDeviceGetMPSComputeRunningProcesses = lambda handle: []
        devices = Device.all()

        def work() -> object:
            rows = []
            with GpuProcess.failsafe():  # an exited pid gives N/A, as nvitop's own views do
                for device in devices:
                    device.memory_info(), device.gpu_utilization(), device.name(), device.uuid()
                    for proc in device.processes().values():
                        rows.append((proc.pid, proc.username(), proc.command(), proc.gpu_memory()))
            return rows

        what = "Device.all() once; per refresh memory, utilization, processes with username and command"
        version = nvitop.__version__
    work()
    answered, refused = counts.answered, counts.refused
    work()
    answered, refused = counts.answered - answered, counts.refused - refused
    ms = median_ms(work, runs)
    answer_ms, refuse_ms = standin_costs_ms(server)
    found = work()
    if name == "gpustat":
        shown = sum(len(g.processes or []) for g in found.gpus)  # type: ignore[attr-defined]
    else:
        shown = len(found)  # type: ignore[arg-type]
    return {
        "name": name, "version": version, "what": what, "median_ms": ms, "processes": shown,
        "standin_calls": [answered, refused], "standin_ms": answered * answer_ms + refused * refuse_ms,
    }


def peers(pids: list[int], gone: int, runs: int, python: Optional[str]) -> None:
    print("Peers, the same fake server and pids, through a stand-in pynvml:")
    for name in ("nvitop", "gpustat"):
        if importlib.util.find_spec(name) is not None and importlib.util.find_spec("pynvml") is not None:
            result = peer_in_child(sys.executable, name, pids, gone, runs)  # a child: the stand-in patches pynvml
        elif python:
            result = peer_in_child(python, name, pids, gone, runs)
        else:
            print(f"  {name}: not installed (pass --peers-python with an interpreter that has it)")
            continue
        if "error" in result:
            print(f"  {name}: failed: {result['error']}")
            continue
        answered, refused = result["standin_calls"]
        print(
            f"  {name} {result['version']}: {result['median_ms']:.3f} ms median, "
            f"{result['median_ms'] - result['standin_ms']:.3f} ms less the fake NVML "
            f"({answered} answered + {refused} refused calls, about {result['standin_ms']:.3f} ms); "
            f"{result['processes']} processes shown"
        )
        print(f"      {result['what']}")


def peer_in_child(python: str, name: str, pids: list[int], gone: int, runs: int) -> dict[str, Any]:
    command = [python, os.path.abspath(__file__), "--peer", name, "--pids", ",".join(map(str, pids)),
               "--gone", str(gone), "--runs", str(runs)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": ROOT})
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(lines[-1])


# -- the sleepers ------------------------------------------------------------------------------
def start_sleepers(count: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # tfgpu bench sleeper {n}"])
        for n in range(count)
    ]


def settle(procs: list[subprocess.Popen]) -> None:
    """Wait until every sleeper has exec'd and is older than the table's minimum age."""
    from tfgpu_magic.gpus import owners

    time.sleep(owners.MIN_AGE_S + 0.2)
    deadline = time.monotonic() + 30
    try:
        import psutil
    except ImportError:
        return
    for proc in procs:
        while time.monotonic() < deadline and not any("sleeper" in a for a in psutil.Process(proc.pid).cmdline()):
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--peers-python", help="an interpreter with nvitop and gpustat installed")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--pids", help=argparse.SUPPRESS)
    parser.add_argument("--gone", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:  # the child side of peer_in_child: one JSON line
        try:
            result = peer(args.peer, [int(p) for p in args.pids.split(",")], args.gone, args.runs)
        except Exception as err:  # reported by the parent as the peer's failure
            result = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(result))
        return
    print(f"Python {sys.version.split()[0]} on {os.uname().machine}, {os.cpu_count()} CPU(s)")
    procs = start_sleepers(SLEEPERS)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    try:
        settle(procs)
        pids = [p.pid for p in procs]
        ours(pids, exited.pid, args.runs)
        peers(pids, exited.pid, max(30, args.runs // 3), args.peers_python)
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
