"""The stand-in NVML every contender of ``compare.py`` reads, and the real processes it lists.

There is no GPU on the machines these benchmarks run on, so NVML is replaced the same way for
everyone: the real ``pynvml`` module (nvidia-ml-py) stays the one every contender imports, and its
functions are pointed at one :class:`tfgpu_magic.gpus.simulated.SimulatedNvml`.  tfgpu_magic
(``Nvml()`` with no injected library imports ``pynvml``), nvitop, gpustat and
jupyterlab-nvdashboard therefore make their own NVML calls, each costing one Python call into the
simulated server; what the simulated server cannot answer (temperature, fans, clocks...) raises
NVML's "Not Supported", as many real GPUs do.  Calls are counted per function.

The processes NVML lists are real: sleeping ``/bin/sleep`` processes started here, owned by several
real users when this runs as root (users ``tfgpu-bench-1`` .. ``-4`` are created for it), so every
contender asks the operating system for owners and commands as it does on a shared server.  The
simulated server has no owner table of its own (``owner_of`` is removed), so tfgpu_magic asks psutil.

Like the real library, ``nvmlInit``/``nvmlShutdown`` are counted: gpustat's shutdown after each
query does not stop NVML under the others.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tfgpu_magic.gpus.simulated import NVMLError as SimulatedError  # noqa: E402
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess  # noqa: E402

BENCH_USERS = ("tfgpu-bench-1", "tfgpu-bench-2", "tfgpu-bench-3", "tfgpu-bench-4")
SLEEP_S = 3600  # the sleepers' lifetime if this benchmark dies without ending them

# Answers the simulated server lacks, given as a real driver would.
_SYSTEM_ANSWERS: dict[str, Callable[..., Any]] = {
    "nvmlSystemGetDriverVersion": lambda: "580.95.05",
    "nvmlSystemGetNVMLVersion": lambda: "13.580.95.05",
    "nvmlDeviceGetIndex": lambda handle: handle,
}


class LiveServer(SimulatedNvml):
    """A server whose GPUs are busy: utilization moves with every sample the driver takes, and
    one process per GPU grows or shrinks every 2 s (a training job's allocator at work), so a
    reader that sends only what changed still has something to send, as on a GPU in use.

    The driver samples utilization once every 1/6 s to 1 s, by product (NVML's reference,
    ``nvmlUtilization_t``); ``nvmlDeviceGetUtilizationRates`` answers the newest sample and
    ``nvmlDeviceGetSamples`` the buffer of them.  The stand-in keeps the simulated server's
    period (``SimulatedNvml.sample_period_us``, 1/6 s), the fastest: the most samples for a
    reader of the buffer and the most changes for any reader.  (Until 2026-11-28 it sampled
    every 100 ms, faster than any GPU: docs/performance.md has both.)
    """

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        reading = super().nvmlDeviceGetUtilizationRates(handle)
        reading.gpu = self.utilization_at(handle, int(time.time() * 1_000_000))
        return reading

    def utilization_at(self, handle: Any, at_us: int) -> int:
        """What the GPU's utilization was at ``at_us``: the newest sample's, as the driver answers."""
        return (37 * (at_us // self.sample_period_us) + 11 * int(handle)) % 101

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        gpu = self.gpus[int(handle)]
        step = int(time.monotonic() / 2)
        for proc in gpu.processes[-1:]:  # the last process listed: another user's training job
            proc.used_mib = 2048 + 256 * ((step + int(handle)) % 4)
        return super().nvmlDeviceGetMemoryInfo(handle, version)


def server_listing(pids: list[int], gpus: int, live: bool = False, gone: int | None = None) -> SimulatedNvml:
    """``gpus`` GPUs listing ``pids`` round-robin (pid n on GPU n % gpus), each pid holding
    256 + 64·n MiB; ``gone``: the pid of an exited process NVML still lists (on GPU 0)."""
    kind = LiveServer if live else SimulatedNvml
    sizes = (81920, 40960, 24576)
    server = kind(
        [
            SimulatedGpu(
                name=f"NVIDIA Stand-in {sizes[i % 3] // 1024}GB",
                total_mib=sizes[i % 3],
                utilization=(17 * i) % 100,
            )
            for i in range(gpus)
        ]
    )
    for n, pid in enumerate(pids):
        server.gpus[n % gpus].processes.append(SimulatedProcess(pid, 256 + 64 * n))
    if gone is not None:
        server.gpus[0].processes.append(SimulatedProcess(gone, 512, alive=False))
    server.owner_of = None  # type: ignore[assignment]  # owners come from the operating system
    return server


def monitor_server(my_pid: int, others: list[int], gpus: int = 8) -> SimulatedNvml:
    """The monitor's server: ``gpus`` busy GPUs, on each this kernel and two other processes."""
    server = LiveServer([SimulatedGpu(name="NVIDIA H100 80GB HBM3", total_mib=81920) for _ in range(gpus)])
    for i, gpu in enumerate(server.gpus):
        gpu.processes += [
            SimulatedProcess(my_pid, 4096 + i),
            SimulatedProcess(others[(2 * i) % len(others)], 8192),
            SimulatedProcess(others[(2 * i + 1) % len(others)], 2048),
        ]
    server.owner_of = None  # type: ignore[assignment]
    return server


# -- pynvml pointed at the simulated server -------------------------------------------------------
def install(server: SimulatedNvml) -> Counter:
    """Point ``pynvml`` (and nvitop's own ctypes wrappers, when nvitop is imported later) at ``server``.

    Returns the counter of calls by function name (``"refused"`` counts the Not Supported answers).
    Call before any contender imports: jupyterlab-nvdashboard starts NVML at import.
    """
    import pynvml

    calls: Counter = Counter()
    references = {"count": 0}

    def answering(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            try:
                return fn(*args, **kwargs)
            except SimulatedError as err:
                raise pynvml.NVMLError(err.value) from None

        call.__name__ = name
        return call

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        calls["refused"] += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def init(*_flags: Any) -> None:
        references["count"] += 1
        server.nvmlInit()

    def shutdown() -> None:  # NVML counts its users: the last shutdown stops it
        references["count"] = max(0, references["count"] - 1)
        if references["count"] == 0:
            server.nvmlShutdown()

    def no_symbol(_name: str) -> Any:  # nothing behind ctypes: wrappers fall back to pynvml's functions
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    for name, attr in list(vars(pynvml).items()):
        if not name.startswith("nvml") or not callable(attr) or isinstance(attr, type):
            continue
        base = name.removesuffix("_v3").removesuffix("_v2")
        if name in _SYSTEM_ANSWERS:
            setattr(pynvml, name, answering(name, _SYSTEM_ANSWERS[name]))
        elif name in ("nvmlInit", "nvmlInitWithFlags"):
            setattr(pynvml, name, answering(name, init))
        elif name == "nvmlShutdown":
            setattr(pynvml, name, answering(name, shutdown))
        elif hasattr(server, base):
            setattr(pynvml, name, answering(base, getattr(server, base)))
        elif name.startswith(("nvmlDevice", "nvmlSystem", "nvmlUnit", "nvmlGpu", "nvmlVgpu")):
            setattr(pynvml, name, refused)
    pynvml._nvmlGetFunctionPointer = no_symbol
    pynvml.nvmlDeviceGetMPSComputeRunningProcesses = answering(
        "nvmlDeviceGetMPSComputeRunningProcesses", lambda h: []
    )
    return calls


def point_nvitop_at_pynvml() -> None:
    """nvitop redefines a few functions over ctypes pointers (for NVML's newer structs): with no
    library behind them, point those at pynvml's (stand-in) functions too."""
    import pynvml
    from nvitop.api import libnvml

    for name in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
        "nvmlDeviceGetMemoryInfo",
    ):
        setattr(libnvml, name, getattr(pynvml, name))


# -- real processes of several users --------------------------------------------------------------
def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def bench_users() -> list[str | None]:
    """The owners sleepers are started as: the benchmark users when root (created if missing), else only me (None)."""
    if os.geteuid() != 0:
        return [None]
    import pwd

    for user in BENCH_USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            useradd = _tool("useradd")
            if useradd is None:
                return [None]
            subprocess.run(
                [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True
            )
    return [None, *BENCH_USERS]


class Sleepers:
    """``count`` real sleeping processes, round-robin over ``bench_users()``; ended on exit."""

    def __init__(self, count: int) -> None:
        users = bench_users()
        self.owners = sorted({u or "me" for u in users})
        self.procs = [
            subprocess.Popen(
                ["/bin/sleep", str(SLEEP_S)], user=users[n % len(users)], stdin=subprocess.DEVNULL
            )
            for n in range(count)
        ]
        self.pids = [p.pid for p in self.procs]
        done = subprocess.Popen(["/bin/true"])
        done.wait()
        self.gone = done.pid  # exited: NVML may still list such a pid for a moment
        self._settle()

    def _settle(self) -> None:
        """Wait until each has exec'd ``sleep`` and is older than the owner cache's minimum age."""
        from tfgpu_magic.gpus import owners

        deadline = time.monotonic() + 60
        for pid in self.pids:
            while time.monotonic() < deadline:
                try:
                    with open(f"/proc/{pid}/comm", "rb") as f:
                        if f.read().strip() == b"sleep":
                            break
                except OSError:
                    break
                time.sleep(0.005)
        time.sleep(owners.MIN_AGE_S + 0.2)

    def __enter__(self) -> Sleepers:
        return self

    def __exit__(self, *_exc: Any) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


class KernelsFromFile(SimulatedNvml):
    """``gpus`` GPUs listing other users' ``others`` (one per GPU, round-robin) and the pids written
    to ``path`` (a JSON list; the benchmark writes the server's kernels there once they run):
    kernel n on GPU n % gpus holding (n + 1) GiB.  The file is read again only when its
    modification time changes, one ``stat`` per listing: no scan of /proc, which real NVML
    does not make either."""

    def __init__(self, path: str, others: list[int], gpus: int = 8) -> None:
        super().__init__([SimulatedGpu(name="NVIDIA Stand-in 80GB", total_mib=81920) for _ in range(gpus)])
        self.owner_of = None  # type: ignore[assignment]
        self._path, self._others, self._seen = path, others, None

    def _processes(self, handle: Any, kind: str) -> list[SimpleNamespace]:
        self._reload()
        return super()._processes(handle, kind)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        self._reload()  # used memory counts the listed processes
        return super().nvmlDeviceGetMemoryInfo(handle, version)

    def _reload(self) -> None:
        try:
            seen = os.stat(self._path).st_mtime_ns
        except OSError:
            seen = None
        if seen == self._seen:
            return
        self._seen = seen
        import json

        try:
            with open(self._path) as f:
                kernels = [int(pid) for pid in json.load(f)]
        except (OSError, ValueError):
            kernels = []
        for gpu in self.gpus:
            gpu.processes = []
        for n, pid in enumerate(self._others):
            self.gpus[n % len(self.gpus)].processes.append(SimulatedProcess(pid, 2048 + 512 * n))
        for n, pid in enumerate(kernels):
            self.gpus[n % len(self.gpus)].processes.append(SimulatedProcess(pid, 1024 * (n + 1)))
