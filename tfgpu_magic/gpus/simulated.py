"""A simulated shared multi-GPU server, behind the same functions as ``pynvml``.

Hand it to :class:`tfgpu_magic.gpus.nvml.Nvml` in place of ``pynvml``::

    server = shared_server()              # 4 GPUs, several users' processes
    nvml = Nvml(lib=server)

It implements the ``pynvml`` functions tfgpu_magic calls, with NVML's error codes, so the
real translation code (unsupported readings, lost GPUs) runs in tests, benchmarks and
tutorials on machines without a GPU.  Scenarios are changed by mutating the dataclasses.

Faults are injected the same way:

* ``SimulatedGpu.unsupported`` (a set of reading names): those readings raise
  ``NVMLError(NVML_ERROR_NOT_SUPPORTED)``;
* ``SimulatedGpu.lost = True``: every reading of that GPU raises ``NVML_ERROR_GPU_IS_LOST``;
* ``SimulatedGpu.faults`` (reading name -> exception): that reading raises the exception,
  any exception (``NVMLError(NVML_ERROR_NO_PERMISSION)``, ``RuntimeError("boom")``, ...), before
  the checks above; ``SimulatedNvml.faults_raised`` counts how often one was raised;
* ``SimulatedGpu.mig = True`` with ``mig_instances`` (:class:`SimulatedMigInstance`): a GPU in
  MIG mode.  Its instances answer NVML's MIG queries as the driver does
  (``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
  ``nvmlDeviceGetHandleByUUID``, ``nvmlDeviceGetGpuInstanceId`` / ``GetComputeInstanceId``,
  memory and processes on the instance's handle); the GPU's own readings cover the whole GPU,
  its process listing every instance's processes, and its utilization is not supported;
* ``SimulatedNvml.driver = False``: ``nvmlInit`` raises ``NVML_ERROR_DRIVER_NOT_LOADED``;
  ``SimulatedNvml.init_error`` (an exception, or None): ``nvmlInit`` raises it instead.

Reading names (see :data:`READINGS`): ``handle`` (``nvmlDeviceGetHandleByIndex``), ``name``,
``uuid``, ``pci``, ``memory``, ``utilization``, ``compute_capability``, ``mig``, and
``processes`` (both process listings) or ``compute_processes`` / ``graphics_processes`` (one),
and, on a GPU in MIG mode, ``mig_devices`` (:data:`MIG_READINGS`: the MIG device count, handles
and ids), and ``process_utilization`` (:data:`SAMPLE_READINGS`: ``nvmlDeviceGetProcessUtilization``,
samples of the processes whose ``SimulatedProcess.sm_percent`` is above 0, timestamped by
``SimulatedNvml.clock``).
"""

from __future__ import annotations

import os
import re
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from . import SIMULATED_SOURCE_ENV

RECHECK_NOT_A_KERNEL_S = 1.0  # a process found not to be a kernel is looked at again after this
# A process younger than this found not to be a kernel is looked at again at every scan: it may be
# a kernel between its fork and its exec (same start time, its parent's command line).
YOUNG_PROCESS_S = 5.0

__all__ = [
    "DEMO_KERNEL_PID",
    "MIG_READINGS",
    "READINGS",
    "SAMPLE_READINGS",
    "FileServerNvml",
    "HostKernelsNvml",
    "LiveKernelsNvml",
    "SimulatedGpu",
    "SimulatedMigHandle",
    "SimulatedMigInstance",
    "SimulatedNvml",
    "SimulatedProcess",
    "busy_server",
    "from_environment",
    "host_kernels_server",
    "is_ipython_kernel",
    "kernels_server",
    "mig_server",
    "shared_server",
]

MIB = 1024 * 1024

# NVML's own return codes (nvml.h), so code written against pynvml sees the same values.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

# The reading names that ``SimulatedGpu.faults`` and ``SimulatedGpu.unsupported`` understand.
READINGS = (
    "handle",
    "name",
    "uuid",
    "pci",
    "memory",
    "utilization",
    "compute_capability",
    "mig",
    "processes",
    "compute_processes",
    "graphics_processes",
)
# Readings of a GPU in MIG mode only (faults and ``unsupported`` take them too): the MIG device
# count, handles and instance ids.
MIG_READINGS = ("mig_devices",)
# The per-process utilization samples (faults and ``unsupported`` take it too); read only by the
# utilization figures (``Nvml.process_utilization``), not by a GPU's other readings.
SAMPLE_READINGS = ("process_utilization",)


class NVMLError(Exception):
    """Same shape as ``pynvml.NVMLError``: the NVML return code is in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
            NVML_ERROR_GPU_IS_LOST: "GPU is lost",
            NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
            NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
            NVML_ERROR_UNINITIALIZED: "Uninitialized",
            NVML_ERROR_GPU_NOT_FOUND: "GPU not found",
            NVML_ERROR_UNKNOWN: "Unknown Error",
        }.get(self.value, f"NVML error {self.value}")


@dataclass
class SimulatedProcess:
    """A process on a simulated GPU.  ``used_mib=None`` mimics NVML's 'not available'."""

    pid: int
    used_mib: int | None
    user: str = "someone"  # read by the simulated process table (see SimulatedNvml.owner_of)
    command: str = "python train.py"
    alive: bool = True  # False: NVML still lists it, but the process has exited
    kind: str = "compute"
    sm_percent: int = 0  # how busy it keeps the GPU's SMs: its process utilization samples (0: none)


@dataclass
class SimulatedMigInstance:
    """A MIG device (a compute instance in a GPU instance) on a simulated GPU in MIG mode."""

    gpu_instance_id: int
    compute_instance_id: int
    total_mib: int
    profile: str = ""  # e.g. "2g.10gb", shown in the instance's name
    base_used_mib: int = 0  # the instance's context overhead
    uuid: str = ""  # "MIG-...": given one when the server is made
    processes: list[SimulatedProcess] = field(default_factory=list)

    @property
    def used_mib(self) -> int:
        return min(self.base_used_mib + sum(p.used_mib or 0 for p in self.processes), self.total_mib)


@dataclass(frozen=True)
class SimulatedMigHandle:
    """A MIG device handle: its GPU and its place among the GPU's MIG devices (as NVML's index)."""

    parent: int
    slot: int


@dataclass
class SimulatedGpu:
    name: str = "NVIDIA A100-SXM4-40GB"
    total_mib: int = 40960
    base_used_mib: int = 300  # driver/context overhead not owned by a listed process
    reserved_mib: int = 0  # the driver's own reservation: "used" in NVML's version-1 reading only
    utilization: int = 0
    uuid: str = ""
    pci_bus_id: str = ""
    compute_capability: tuple[int, int] = (8, 0)
    mig: bool = False
    mig_instances: list[SimulatedMigInstance] = field(default_factory=list)  # read only when ``mig``
    max_mig_devices: int = 7  # what nvmlDeviceGetMaxMigDeviceCount says (an A100's 7); 0: no MIG support
    compute_mode: int = 0  # nvmlDeviceGetComputeMode: 0 default, 2 prohibited, 3 exclusive process
    processes: list[SimulatedProcess] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # e.g. {"utilization", "processes"}
    lost: bool = False
    # reading name (see READINGS) -> the exception that reading raises, e.g.
    # {"utilization": NVMLError(NVML_ERROR_NO_PERMISSION), "name": RuntimeError("boom")}
    faults: dict[str, BaseException] = field(default_factory=dict)

    @property
    def used_mib(self) -> int:
        used = self.base_used_mib + sum(p.used_mib or 0 for p in self.processes)
        if self.mig:  # the GPU's reading covers its instances
            used += sum(m.used_mib for m in self.mig_instances)
        return min(used, self.total_mib)


class SimulatedNvml:
    """The subset of ``pynvml`` that tfgpu_magic uses, backed by :class:`SimulatedGpu` objects."""

    NVMLError = NVMLError
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_GPU_NOT_FOUND = NVML_ERROR_GPU_NOT_FOUND
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_GPU_UTILIZATION_SAMPLES = 1
    nvmlMemory_v2 = 0x02000028  # pynvml's constant: asks for the version-2 memory reading
    memory_v2 = True  # False: a driver without nvmlDeviceGetMemoryInfo_v2
    cuda_driver_version = 12080  # nvmlSystemGetCudaDriverVersion: CUDA 12.8; None: not supported
    sample_period_us = 166_667  # the driver samples utilization (per process too) about six times a second

    def __init__(self, gpus: list[SimulatedGpu], driver: bool = True) -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_error: BaseException | None = None  # raised by nvmlInit when set
        self.initialized = False
        self.init_calls = 0
        self.calls = 0  # every NVML call, for benchmarks and 'how many reads' tests
        self.faults_raised = 0  # injected faults (SimulatedGpu.faults) raised so far
        self.clock = time.time  # the samples' timestamps (seconds; NVML's are microseconds of this clock)
        for i, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-{i:08x}-fake-0000-0000-{i:012x}"
            gpu.pci_bus_id = gpu.pci_bus_id or f"00000000:{0x17 + i * 0x10:02X}:00.0"
            for slot, instance in enumerate(gpu.mig_instances):
                instance.uuid = (
                    instance.uuid or f"MIG-{i:08x}-{slot:04x}-fake-0000-{instance.gpu_instance_id:012x}"
                )

    # -- lifecycle --------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error
        if not self.driver:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        if self.cuda_driver_version is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._fault(self.gpus[index], "handle")
        return index  # the handle is the index; readings look the GPU up again each call

    # -- readings ---------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Any) -> str:
        if isinstance(handle, SimulatedMigHandle):
            gpu, instance = self._mig(handle, "name")
            return f"{gpu.name} MIG {instance.profile}".rstrip()
        return self._gpu(handle, "name").name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, SimulatedMigHandle):
            return self._mig(handle, "uuid")[1].uuid
        return self._gpu(handle, "uuid").uuid

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(handle, "pci").pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        if version is not None and not self.memory_v2:
            self.calls += 1
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        gpu: Any = (
            self._mig(handle, "memory")[1]
            if isinstance(handle, SimulatedMigHandle)
            else self._gpu(handle, "memory")
        )
        reserved_mib = getattr(gpu, "reserved_mib", 0)
        used, reserved, total = gpu.used_mib * MIB, reserved_mib * MIB, gpu.total_mib * MIB
        if version is None:  # version 1 counts the driver's reservation as used
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        return SimpleNamespace(total=total, reserved=reserved, used=used, free=total - used - reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        if isinstance(handle, SimulatedMigHandle):
            self._mig(handle, "utilization")
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(handle, "utilization")
        if gpu.mig:  # NVML has no utilization for a GPU in MIG mode
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self._gpu(handle, "compute_capability").compute_capability

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        """[current, pending], as pynvml returns them."""
        if isinstance(handle, SimulatedMigHandle):
            self._check()
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a MIG device has no MIG mode of its own
        mig = int(self._gpu(handle, "mig").mig)
        return [mig, mig]

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._gpu(handle, "compute_mode").compute_mode

    # -- MIG devices (pynvml's names and semantics) ----------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._gpu(self._physical(handle), "mig_devices")
        if gpu.max_mig_devices == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> SimulatedMigHandle:
        """NVML: NOT_SUPPORTED without MIG support, INVALID_ARGUMENT for an index beyond the
        maximum (or a GPU not in MIG mode), NOT_FOUND where no MIG device is at that index."""
        gpu = self._gpu(self._physical(handle), "mig_devices")
        if gpu.max_mig_devices == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not gpu.mig or not 0 <= index < gpu.max_mig_devices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig_instances):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return SimulatedMigHandle(handle, index)

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> Any:
        """A GPU's handle for a ``GPU-`` UUID, a MIG device's for a ``MIG-`` one; NOT_FOUND otherwise."""
        self._check()
        wanted = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == wanted:
                return i
            for slot, instance in enumerate(gpu.mig_instances if gpu.mig else ()):
                if instance.uuid == wanted:
                    return SimulatedMigHandle(i, slot)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> bool:
        self._check()
        return isinstance(handle, SimulatedMigHandle)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> int:
        if not isinstance(handle, SimulatedMigHandle):
            self._check()
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._mig(handle, "handle")
        return handle.parent

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_only(handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig_only(handle).compute_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return self._processes(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return self._processes(handle, "graphics")

    def nvmlDeviceGetSamples(self, handle: Any, samplingType: int, timeStamp: int) -> tuple[int, list[Any]]:
        """GPU-utilization samples newer than ``timeStamp`` (microseconds), as pynvml returns them:
        (``NVML_VALUE_TYPE_UNSIGNED_INT``, ``c_nvmlSample_t``-like records, oldest first).

        As the driver does: one sample every ``sample_period_us``, at fixed times of the clock,
        the last ``UTILIZATION_SAMPLES_KEPT`` of them kept; each holds the utilization of its
        time (:meth:`utilization_at`).  None newer is ``NOT_FOUND``; other sampling types, a GPU
        in MIG mode and a MIG device are ``NOT_SUPPORTED``.
        """
        if isinstance(handle, SimulatedMigHandle):
            self._mig(handle, "utilization")
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(handle, "utilization")
        if gpu.mig or int(samplingType) != 1:  # NVML_GPU_UTILIZATION_SAMPLES only
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        period = self.sample_period_us
        newest = int(self.clock() * 1_000_000) // period * period
        times = [newest - n * period for n in range(self.UTILIZATION_SAMPLES_KEPT)]
        samples = [
            SimpleNamespace(timeStamp=at, sampleValue=SimpleNamespace(uiVal=self.utilization_at(handle, at)))
            for at in reversed(times)
            if at > int(timeStamp)
        ]
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return 1, samples

    UTILIZATION_SAMPLES_KEPT = 30  # the driver's buffer is bounded: 5 s at six samples a second

    def utilization_at(self, handle: Any, at_us: int) -> int:
        """The GPU's utilization at ``at_us``: here its utilization now (a test sets it)."""
        return int(self.gpus[handle].utilization)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[SimpleNamespace]:
        """pynvml's ``nvmlProcessUtilizationSample_t`` records newer than ``timeStamp`` (microseconds).

        As the driver does: a process is sampled only while it runs work (``sm_percent`` > 0), so
        an idle process has no sample at all; no sample since ``timeStamp`` is ``NOT_FOUND``; a GPU
        in MIG mode (or a MIG device) has no per-process utilization (``NOT_SUPPORTED``).  Each busy
        process gets one sample per ``sample_period_us`` since ``timeStamp``, the newest at the
        clock's now, at most 16 each (the driver's buffer is bounded too).
        """
        if isinstance(handle, SimulatedMigHandle):
            self._mig(handle, "process_utilization")
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpu = self._gpu(handle, "process_utilization")
        if gpu.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        now_us = int(self.clock() * 1_000_000)
        since = int(timeStamp)
        busy = [p for p in self._sampled(handle) if p.alive and p.sm_percent > 0]
        samples = []
        for proc in busy:
            for n in range(16):
                at = now_us - n * self.sample_period_us
                if at <= since:
                    break
                samples.append(
                    SimpleNamespace(
                        pid=proc.pid, timeStamp=at, smUtil=proc.sm_percent, memUtil=0, encUtil=0, decUtil=0
                    )
                )
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return samples

    def _sampled(self, handle: int) -> list[SimulatedProcess]:
        """The processes the driver samples on a GPU (a live server adds its kernels)."""
        return list(self.gpus[handle].processes)

    # -- the process table a real server has beside NVML (psutil's job there) ----------------
    def owner_of(self, pid: int) -> SimulatedProcess | None:
        """The simulated process with this pid, or None if it exited or never existed."""
        for proc in self.fixed_processes():
            if proc.pid == pid and proc.alive:
                return proc
        return None

    def fixed_processes(self) -> list[SimulatedProcess]:
        """Every simulated process, those on MIG instances included."""
        found = []
        for gpu in self.gpus:
            found += gpu.processes
            for instance in gpu.mig_instances:
                found += instance.processes
        return found

    # -- helpers ----------------------------------------------------------------------------
    def _check(self) -> None:
        self.calls += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _fault(self, gpu: SimulatedGpu, *readings: str) -> None:
        for reading in readings:
            fault = gpu.faults.get(reading)
            if fault is not None:
                self.faults_raised += 1
                raise fault

    def _gpu(self, handle: int, reading: str, *also: str) -> SimulatedGpu:
        """The GPU behind a handle, raising what is injected for ``reading`` (or ``also``)."""
        self._check()
        gpu = self.gpus[handle]
        self._fault(gpu, reading, *also)
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if reading in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _processes(self, handle: Any, kind: str) -> list[SimpleNamespace]:
        """On a MIG device, its processes; on a GPU in MIG mode, every instance's (with their
        ``gpuInstanceId``/``computeInstanceId``, as NVML's version-3 process records have)."""
        if isinstance(handle, SimulatedMigHandle):
            _gpu, instance = self._mig(handle, "processes", f"{kind}_processes")
            return [_record(p, instance) for p in instance.processes if p.kind == kind]
        gpu = self._gpu(handle, "processes", f"{kind}_processes")
        listed = [_record(p, None) for p in gpu.processes if p.kind == kind]
        for instance in gpu.mig_instances if gpu.mig else ():
            listed += [_record(p, instance) for p in instance.processes if p.kind == kind]
        return listed

    def _physical(self, handle: int | SimulatedMigHandle) -> int:
        if isinstance(handle, SimulatedMigHandle):
            self._check()
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # MIG queries take the GPU's handle
        return handle

    def _mig(
        self, handle: SimulatedMigHandle, reading: str, *also: str
    ) -> tuple[SimulatedGpu, SimulatedMigInstance]:
        """The GPU and instance behind a MIG handle; a handle whose instance is gone is invalid."""
        gpu = self._gpu(handle.parent, reading, *also)
        if not gpu.mig or handle.slot >= len(gpu.mig_instances):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu, gpu.mig_instances[handle.slot]

    def _mig_only(self, handle: Any) -> SimulatedMigInstance:
        if not isinstance(handle, SimulatedMigHandle):
            self._gpu(handle, "mig_devices")
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # not a MIG device
        return self._mig(handle, "mig_devices")[1]


def _record(p: SimulatedProcess, instance: SimulatedMigInstance | None) -> SimpleNamespace:
    """A process as pynvml gives it (``nvmlProcessInfo_v3``); NVML's 'no instance' is 0xFFFFFFFF."""
    none = 0xFFFFFFFF
    return SimpleNamespace(
        pid=p.pid,
        usedGpuMemory=None if p.used_mib is None else p.used_mib * MIB,
        gpuInstanceId=none if instance is None else instance.gpu_instance_id,
        computeInstanceId=none if instance is None else instance.compute_instance_id,
    )


def shared_server(my_pid: int | None = None, me: str = "me") -> SimulatedNvml:
    """A four-GPU server shared by a team, as seen from the process ``my_pid``.

    GPU 0 (40 GiB) is busy with alice's training; GPU 1 (80 GiB) holds this process and
    another of mine; GPU 2 (24 GiB) is idle; GPU 3 (16 GiB, an older card) supports no
    utilization reading and holds a process that has already exited.
    """
    my_pid = os.getpid() if my_pid is None else my_pid
    return SimulatedNvml(
        [
            SimulatedGpu(
                total_mib=40960,
                utilization=97,
                processes=[SimulatedProcess(41001, 30720, "alice", "python train_resnet.py", sm_percent=97)],
            ),
            SimulatedGpu(
                name="NVIDIA A100-SXM4-80GB",
                total_mib=81920,
                utilization=35,
                processes=[
                    SimulatedProcess(my_pid, 10240, me, "python -m ipykernel_launcher"),
                    SimulatedProcess(41002, 4096, me, "python -m ipykernel_launcher"),
                    SimulatedProcess(41003, 8192, "bob", "python finetune.py", sm_percent=35),
                ],
            ),
            SimulatedGpu(name="NVIDIA RTX A5000", total_mib=24576, utilization=0, compute_capability=(8, 6)),
            SimulatedGpu(
                name="Tesla T4",
                total_mib=15360,
                compute_capability=(7, 5),
                unsupported={"utilization"},
                processes=[SimulatedProcess(41004, 2048, "carol", "python old.py", alive=False)],
            ),
        ]
    )


def mig_server(my_pid: int | None = None, me: str = "me") -> SimulatedNvml:
    """``shared_server`` with GPU 3 an A100 in MIG mode, shared by three tenants' instances.

    GPU 3 (40 GiB) holds MIG instances 1/0 (2g.10gb, where bob runs), 2/0 (2g.10gb, alice's)
    and 5/0 (1g.5gb, idle).  A kernel a scheduler started with ``CUDA_VISIBLE_DEVICES`` set to
    instance 1/0's UUID (``server.gpus[3].mig_instances[0].uuid``) has that instance, not the GPU.
    """
    server = shared_server(my_pid, me)
    gpu = SimulatedGpu(
        name="NVIDIA A100-SXM4-40GB",
        total_mib=40960,
        base_used_mib=0,
        mig=True,
        uuid=server.gpus[3].uuid,
        pci_bus_id=server.gpus[3].pci_bus_id,
        mig_instances=[
            SimulatedMigInstance(
                1, 0, 9984, "2g.10gb", 13, processes=[SimulatedProcess(41005, 3072, "bob", "python sweep.py")]
            ),
            SimulatedMigInstance(
                2,
                0,
                9984,
                "2g.10gb",
                13,
                processes=[SimulatedProcess(41006, 6144, "alice", "python eval.py")],
            ),
            SimulatedMigInstance(5, 0, 4864, "1g.5gb", 13),
        ],
    )
    for slot, instance in enumerate(gpu.mig_instances):
        instance.uuid = f"MIG-{3:08x}-{slot:04x}-fake-0000-{instance.gpu_instance_id:012x}"
    server.gpus[3] = gpu
    return server


def busy_server(
    my_pid: int | None = None, gpus: int = 8, processes: int = 40, me: str = "me"
) -> SimulatedNvml:
    """A larger shared server (default 8 GPUs, 40 processes of five users, this process among them).

    Sizes alternate 80/40/24 GiB; one GPU lacks a utilization reading and one process has
    exited, so the slow paths (missing readings, notes) are part of every benchmark run.
    """
    my_pid = os.getpid() if my_pid is None else my_pid
    users = [me, "alice", "bob", "carol", "dave"]
    sizes = [81920, 40960, 24576]
    server = SimulatedNvml(
        [
            SimulatedGpu(
                name=f"NVIDIA Fake {sizes[i % 3] // 1024}GB",
                total_mib=sizes[i % 3],
                utilization=(i * 17) % 100,
                unsupported={"utilization"} if i == gpus - 1 else set(),
            )
            for i in range(gpus)
        ]
    )
    for n in range(processes):
        gpu = server.gpus[n % gpus]
        pid = my_pid if n == 0 else 50000 + n
        gpu.processes.append(
            SimulatedProcess(
                pid, 256 + 64 * n, users[n % len(users)], f"python job_{n}.py", alive=n != processes - 1
            )
        )
    return server


# -- a simulated server holding the real kernels of this process (a Jupyter server) ------------------
FAKE_PID_BASE = 1 << 22  # above Linux's largest pid_max (2**22): such a pid never names a real process
DEMO_KERNEL_PID = FAKE_PID_BASE + 100  # `tfgpu --demo`: the notebook kernel of "me" on shared_server's GPU 1
KERNEL_GIB_STEP = 1024  # MiB: kernel n holds (n + 1) GiB
KERNEL_CHILD_MIB = 256  # each process below a kernel


class LiveKernelsNvml(SimulatedNvml):
    """Simulated GPUs that also hold this process's live kernels, found when NVML is read.

    The rule, which tests, demos and the browser tests rely on: the direct children of the
    Jupyter server ``server_pid`` (default: this process) whose command line mentions ``kernel``
    (``ipykernel_launcher``, a ``kernel-<id>.json`` connection file) are kernels 0, 1, 2, ...;
    kernel ``n`` holds ``(n + 1)`` GiB on GPU ``n % kernel_gpus``, and every process below it (its
    children, theirs, ...) holds 256 MiB on the same GPU.  They are compute processes; the
    GPU's used memory includes them.

    A kernel's number is given once, when the Jupyter server starts it: the server extension
    asks ``kernel_environment()`` for the next kernel's variables, and the number travels in
    the kernel's environment (``TFGPU_MAGIC_SIMULATED_KERNEL``), where every reader (the server,
    the kernel itself, its siblings) reads it.  So a kernel keeps its GPU and its memory when
    others stop (a culled kernel gives its memory back; no survivor is renumbered).  A kernel
    without a number (one started by other means) takes the lowest number no live kernel holds,
    in pid order.

    The fixed processes in ``gpus`` keep their simulated owners (``owner_of`` answers for their
    pids, alive or not); every other pid, the kernels included, gets its real owner and command
    from psutil.  The process tree is scanned again when a process has started or ended since
    the last scan (the pids ``/proc`` lists changed: a reading never misses a kernel started
    after the last one, as a driver lists a process at once), and at least every ``scan_ttl_s``
    seconds; not on every reading: one reading of the server makes many NVML calls, and a scan
    of ``/proc`` costs milliseconds.
    """

    def __init__(
        self,
        gpus: list[SimulatedGpu],
        driver: bool = True,
        kernel_gpus: int = 2,
        scan_ttl_s: float = 0.5,
        server_pid: int | None = None,
    ) -> None:
        super().__init__(gpus, driver)
        self.server_pid = os.getpid() if server_pid is None else server_pid
        self.kernel_gpus = max(1, min(kernel_gpus, len(gpus)))
        self.scan_ttl_s = scan_ttl_s
        self._scan_lock = threading.Lock()
        self._scanned_at: float | None = None
        self._scanned_pids: frozenset[int] | None = None  # the pids /proc listed before that scan
        self._live: dict[int, list[SimulatedProcess]] = {}
        # pid -> (identity, what was read of it, when)
        self._remembered: dict[int, tuple[object, Any, float]] = {}
        self._next_number = 0  # the number ``kernel_environment()`` gives the next kernel
        self.source_name = "kernels_server"  # the factory a kernel calls to read the same server

    def kernel_environment(self) -> dict[str, str]:
        """The variables of the next kernel the Jupyter server starts: which simulated server to read
        (``from_environment()``) and the kernel's number (see the class's rule), given once."""
        number, self._next_number = self._next_number, self._next_number + 1
        return {SOURCE_ENV: self.source_name, KERNEL_NUMBER_ENV: str(number)}

    def live_processes(self) -> dict[int, list[SimulatedProcess]]:
        """``{gpu index: [the kernels' processes on it]}`` under the rule above (rescanned when stale)."""
        with self._scan_lock:
            now = time.monotonic()
            listed = _listed_pids()
            if (
                self._scanned_at is None
                or now - self._scanned_at >= self.scan_ttl_s
                or listed != self._scanned_pids  # a process started (or ended) since
                or self._one_exited()
            ):
                self._live = self._scan()
                self._scanned_at, self._scanned_pids = now, listed
            return self._live

    def _one_exited(self) -> bool:
        """Whether a process of the last scan has exited: its memory is free now, as the driver says
        as soon as a process ends (a kernel just culled must not hold memory for another scan_ttl_s)."""
        from .owners import NoIdentity, stat_identity

        return any(stat_identity(p.pid) is NoIdentity.GONE for procs in self._live.values() for p in procs)

    def _scan(self) -> dict[int, list[SimulatedProcess]]:
        from .process_tree import children_of, descendants, read_parent_map

        parents = read_parent_map()[0]
        children = children_of(parents)
        kernels = sorted(pid for pid in children.get(self.server_pid, []) if _is_kernel(pid))
        self._forget_exited(parents)
        given = {pid: self._remember(pid, _kernel_number) for pid in kernels}
        taken = {n for n in given.values() if n is not None}
        free = (n for n in range(len(kernels) + len(taken)) if n not in taken)
        numbers = {pid: n if n is not None else next(free) for pid, n in given.items()}
        live: dict[int, list[SimulatedProcess]] = {}
        for pid in kernels:
            n = numbers[pid]
            held = live.setdefault(n % self.kernel_gpus, [])
            # Owners and commands of these come from psutil (owner_of), not from these records.
            held.append(SimulatedProcess(pid, (n + 1) * KERNEL_GIB_STEP, user="", command=""))
            held.extend(
                SimulatedProcess(child, KERNEL_CHILD_MIB, user="", command="")
                for child in descendants(pid, children)
            )
        return live

    def _remember(self, pid: int, read: Any) -> Any:
        """``read(pid)``, read once per process (remembered while it lives, by its start time)."""
        from .owners import NoIdentity, stat_identity

        identity = stat_identity(pid)
        if identity is NoIdentity.GONE:
            return read(pid)
        known = self._remembered.get(pid)
        now = time.monotonic()
        if known is not None and identity is not NoIdentity.UNKNOWN and known[0] == identity:
            # A "not a kernel" answer is read again after a while: a process seen between its fork
            # and its exec (a kernel being started) keeps its start time but not its command line.
            if known[1] is not None or now - known[2] < RECHECK_NOT_A_KERNEL_S:
                return known[1]
        value = read(pid)
        if identity is not NoIdentity.UNKNOWN and (value is not None or not _young(identity)):
            self._remembered[pid] = (identity, value, now)
        return value

    def _forget_exited(self, parents: Any) -> None:
        self._remembered = {pid: v for pid, v in self._remembered.items() if pid in parents}

    # -- the readings that include the kernels ----------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        if version is not None:  # as a binding without version 2 answers: Nvml reads version 1
            raise TypeError("the live kernels are added to version 1's reading only")
        info = super().nvmlDeviceGetMemoryInfo(handle)  # faults and lost GPUs first
        extra = sum(p.used_mib or 0 for p in self.live_processes().get(handle, [])) * MIB
        used = min(info.used + extra, info.total)
        return SimpleNamespace(total=info.total, used=used, free=info.total - used)

    def _processes(self, handle: int, kind: str) -> list[SimpleNamespace]:
        listed = super()._processes(handle, kind)
        if kind == "compute":
            listed += [
                SimpleNamespace(pid=p.pid, usedGpuMemory=None if p.used_mib is None else p.used_mib * MIB)
                for p in self.live_processes().get(handle, [])
            ]
        return listed

    def _sampled(self, handle: int) -> list[SimulatedProcess]:
        return [*super()._sampled(handle), *self.live_processes().get(handle, [])]

    def owner_of(self, pid: int) -> Any | None:
        """A fixed process's simulated owner (None once it exited); any other pid's real one (psutil)."""
        for proc in self.fixed_processes():
            if proc.pid == pid:
                return proc if proc.alive else None
        from .owners import PsutilProcessTable

        details = PsutilProcessTable().lookup(pid)
        return SimpleNamespace(user=details.user, command=details.command) if details.alive else None


def _kernel_number(pid: int) -> int | None:
    """The number the Jupyter server gave the kernel (its environment), or None: not given, or not
    readable (another user's process: only its owner and root may read its environment)."""
    import psutil

    try:
        text = psutil.Process(pid).environ().get(KERNEL_NUMBER_ENV, "")
    except psutil.Error:
        return None
    return int(text) if text.isdigit() and len(text) < 7 else None  # hostile text is no number


def _listed_pids() -> frozenset[int] | None:
    """The pids ``/proc`` lists (one directory read, ~25 µs for a hundred processes), or None
    where it cannot be read (no ``/proc``): a scan is then only as fresh as ``scan_ttl_s``."""
    from .process_table import PROC

    try:
        return frozenset(PROC.pids())
    except OSError:
        return None


def _is_kernel(pid: int) -> bool:
    import psutil

    try:
        return "kernel" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:  # gone, or not ours to read: not a kernel we can show
        return False


def _running_a_kernel() -> bool:
    """Whether this process is an IPython kernel (its own command line could say anything:
    ``jupyter lab --TfgpuMagic.device_source=tfgpu_magic.simulated:kernels_server`` mentions one)."""
    kernelapp = sys.modules.get("ipykernel.kernelapp")  # never imported here: a kernel has it already
    return kernelapp is not None and kernelapp.IPKernelApp.initialized()


def kernels_server() -> LiveKernelsNvml:
    """``shared_server``'s four GPUs, with a Jupyter server's live kernels on GPUs 0 and 1 (see :class:`LiveKernelsNvml`).

    One simulated server for the Jupyter server and its kernels, so the GPU panel and a kernel's
    ``%gpu`` give the same figures: in the Jupyter server,
    ``jupyter lab --TfgpuMagic.device_source=tfgpu_magic.simulated:kernels_server``; each kernel
    that server starts reads it by itself (the server names it in the kernel's environment, see
    ``from_environment()``), as does ``tfgpu_magic.set_device_source(kernels_server())`` in one:
    the kernels of its parent, the Jupyter server (a process whose command line mentions ``kernel``
    is taken for a kernel).
    Fixed processes, with pids no real process can have: alice's training (30 GiB) on GPU 0; my
    other process (owned by this process's real user, 4 GiB) and bob's fine-tuning (8 GiB) on
    GPU 1; carol's exited process (2 GiB, still listed) on GPU 3, which has no utilization reading.
    """
    from .owners import PsutilProcessTable

    me = PsutilProcessTable().current_user() or "me"
    server_pid = os.getppid() if _running_a_kernel() else os.getpid()
    return LiveKernelsNvml(
        [
            SimulatedGpu(
                total_mib=40960,
                utilization=97,
                processes=[
                    SimulatedProcess(
                        FAKE_PID_BASE + 1, 30720, "alice", "python train_resnet.py", sm_percent=97
                    )
                ],
            ),
            SimulatedGpu(
                name="NVIDIA A100-SXM4-80GB",
                total_mib=81920,
                utilization=35,
                processes=[
                    SimulatedProcess(FAKE_PID_BASE + 2, 4096, me, "python train.py --resume"),
                    SimulatedProcess(FAKE_PID_BASE + 3, 8192, "bob", "python finetune.py", sm_percent=35),
                ],
            ),
            SimulatedGpu(name="NVIDIA RTX A5000", total_mib=24576, utilization=0, compute_capability=(8, 6)),
            SimulatedGpu(
                name="Tesla T4",
                total_mib=15360,
                compute_capability=(7, 5),
                unsupported={"utilization"},
                processes=[SimulatedProcess(FAKE_PID_BASE + 4, 2048, "carol", "python old.py", alive=False)],
            ),
        ],
        server_pid=server_pid,
    )


# -- a simulated server holding every IPython kernel of the machine, whoever runs it ----------------
MAX_HOST_KERNELS = 256  # kernels placed on the simulated GPUs at most (the lowest pids): a bounded reply
HOST_KERNEL_MIB = (1024, 2048, 3072, 4096)  # kernel pid p holds HOST_KERNEL_MIB[p % 4] MiB
_CONNECTION_FILE = re.compile(r"kernel-[^/\\]*\.json")
_LAUNCHERS = ("ipykernel_launcher", "ipykernel_launcher.py")


def is_ipython_kernel(argv: Sequence[str]) -> bool:
    """Whether a command line is an IPython kernel's: ``-m ipykernel_launcher`` (or ``-m ipykernel``, not ``install``),
    the launcher script, or a ``kernel-<id>.json`` connection file given with ``-f``.

    Stricter than the rule :class:`LiveKernelsNvml` applies to a server's children (a command line
    mentioning ``kernel``): among every process of a machine that would also take a Jupyter
    server started with ``--TfgpuMagic.device_source=...:host_kernels_server`` for a kernel.
    """
    for n, arg in enumerate(argv):
        if os.path.basename(arg) in _LAUNCHERS:
            return True
        if arg == "ipykernel" and n and argv[n - 1] == "-m" and argv[n + 1 : n + 2] != ["install"]:
            return True
        if arg.startswith(("-f=", "--f=")):
            value: str | None = arg.split("=", 1)[1]
        else:
            value = arg if n and argv[n - 1] in ("-f", "--f") else None
        if value is not None and _CONNECTION_FILE.fullmatch(os.path.basename(value)):
            return True
    return False


class HostKernelsNvml(LiveKernelsNvml):
    """Simulated GPUs holding every IPython kernel process of the machine, any user's.

    The rule gives the same figures whoever reads them (a Jupyter server of one user, another
    user's server, a kernel's ``%gpu``): every live process whose command line is a kernel's
    (:func:`is_ipython_kernel`) holds ``HOST_KERNEL_MIB[pid % 4]`` MiB (1 to 4 GiB) on GPU
    ``pid % kernel_gpus``, and every process below it (not itself a kernel) 256 MiB on the same
    GPU.  A figure depends on the pid alone, never on which other kernels run.  Owners and
    commands come from psutil (a kernel of another user is that user's process); on Linux any
    user may read another user's command line, unless ``/proc`` is mounted with ``hidepid``
    (then each reader sees only its own kernels, and the figures differ between readers).

    The scan is bounded: one read of the process table (:func:`read_parent_map`) per
    ``scan_ttl_s``, a command line read once per process (remembered while the process lives,
    by its start time), and at most ``MAX_HOST_KERNELS`` kernels, the lowest pids.
    """

    def __init__(
        self,
        gpus: list[SimulatedGpu],
        driver: bool = True,
        kernel_gpus: int = 2,
        scan_ttl_s: float = 0.5,
        users: Sequence[str] | None = None,
    ) -> None:
        super().__init__(gpus, driver, kernel_gpus=kernel_gpus, scan_ttl_s=scan_ttl_s)
        self.source_name = "host_kernels_server"
        # Only these users' kernels (None: every user's); a rule of the process's owner, which any
        # reader can see, so every reader still reads the same figures.
        self.users = None if users is None else frozenset(users)

    def kernel_environment(self) -> dict[str, str]:
        """The next kernel's variables: which simulated server to read, and the same users (a
        figure here depends on the pid alone, so no number)."""
        env = {SOURCE_ENV: self.source_name}
        if self.users is not None:
            env[USERS_ENV] = ",".join(sorted(self.users))
        return env

    def _scan(self) -> dict[int, list[SimulatedProcess]]:
        from .process_tree import children_of, descendants, read_parent_map

        parents = read_parent_map()[0]
        children = children_of(parents)
        self._forget_exited(parents)
        kernels = sorted(pid for pid in parents if self._remember(pid, self._counted))[:MAX_HOST_KERNELS]
        live: dict[int, list[SimulatedProcess]] = {}
        placed = set(kernels)
        for pid in kernels:
            held = live.setdefault(pid % self.kernel_gpus, [])
            held.append(
                SimulatedProcess(pid, HOST_KERNEL_MIB[pid % len(HOST_KERNEL_MIB)], user="", command="")
            )
            for child in descendants(pid, children):
                if child not in placed:  # a kernel below a kernel is listed once, as a kernel
                    placed.add(child)
                    held.append(SimulatedProcess(child, KERNEL_CHILD_MIB, user="", command=""))
        return live

    def _counted(self, pid: int) -> bool:
        """Whether the process is a kernel placed here: :func:`is_ipython_kernel` of its command
        line, and one of ``users``' when they are given."""
        return _host_kernel(pid) and (self.users is None or _user_of(pid) in self.users)


def _young(identity: object) -> bool:
    """Whether the process of ``identity`` (``owners.stat_identity``'s: start ticks since boot and
    name from ``/proc``, or a create time elsewhere) is younger than ``YOUNG_PROCESS_S``."""
    from .process_table import PROC

    if isinstance(identity, tuple):
        started_s: float = identity[0] / PROC.ticks_per_s()
        return PROC.since_boot_s() - started_s < YOUNG_PROCESS_S
    if isinstance(identity, float):
        return time.time() - identity < YOUNG_PROCESS_S
    return False


def _host_kernel(pid: int) -> bool:
    import psutil

    try:
        return is_ipython_kernel(psutil.Process(pid).cmdline())
    except psutil.Error:  # gone, or not readable (hidepid): not a kernel this reader can see
        return False


def _user_of(pid: int) -> str | None:
    import psutil

    try:
        return psutil.Process(pid).username()
    except (psutil.Error, KeyError):  # gone, or a uid without a name
        return None


def host_kernels_server() -> HostKernelsNvml:
    """``shared_server``'s four GPUs, holding every IPython kernel of this machine, any user's (see
    :class:`HostKernelsNvml`): no fixed process, so the figures are the same whoever reads them.

    For several users' Jupyter servers on one machine (JupyterHub): in each single-user server,
    ``--TfgpuMagic.device_source=tfgpu_magic.simulated:host_kernels_server``; each server's GPU
    panel lists its own kernels, and the other users' kernels as other users' processes; in a
    kernel, ``tfgpu_magic.set_device_source(host_kernels_server())`` gives the same figures.

    ``TFGPU_MAGIC_SIMULATED_USERS`` in the environment (user names, comma-separated) places only
    those users' kernels: a test on a shared machine counts its own users' kernels, whatever else
    runs there.
    """
    named = os.environ.get(USERS_ENV)
    return HostKernelsNvml(
        [
            SimulatedGpu(total_mib=40960, utilization=97),
            SimulatedGpu(name="NVIDIA A100-SXM4-80GB", total_mib=81920, utilization=35),
            SimulatedGpu(name="NVIDIA RTX A5000", total_mib=24576, utilization=0, compute_capability=(8, 6)),
            SimulatedGpu(
                name="Tesla T4", total_mib=15360, compute_capability=(7, 5), unsupported={"utilization"}
            ),
        ],
        users=None if named is None else [name.strip() for name in named.split(",") if name.strip()],
    )


# -- a simulated server described by a file, shared by every process that reads it -------------------
FILE_PREFIX = "file:"  # TFGPU_MAGIC_SIMULATED_SOURCE=file:/path/server.json
MAX_SPEC_BYTES = 1024 * 1024  # a spec is a few hundred bytes; a larger file is refused, not read
RELOAD_EVERY_S = 0.1  # how often a reading looks at the file's modification time
CHOSEN_ENV = "TFGPU_MAGIC_CHOSEN_GPUS"  # the GPUs a runner chose for a kernel (kernel/notebook_settings.py)


class FileServerNvml(LiveKernelsNvml):
    """A simulated server read from a JSON file, so that separate processes (``tfgpu run``, the kernel
    it starts, a test) read one server, and a change to the file is seen by all of them.

    The file (at most :data:`MAX_SPEC_BYTES`)::

        {"gpus": [{"name": "NVIDIA A100-SXM4-40GB", "total_mib": 40960, "utilization": 97,
                   "compute_capability": "8.0",
                   "processes": [{"pid": 4194305, "used_mib": 30720, "user": "alice",
                                  "command": "python train.py"}]}],
         "kernel_mib": 1024}

    Every key but ``gpus`` is optional (a GPU's defaults are :class:`SimulatedGpu`'s, a process's
    :class:`SimulatedProcess`'s); give listed processes pids above 2**22, which no real process
    has.  ``kernel_mib``: each IPython kernel started with this same source in its environment holds
    that much on each GPU a runner chose for it (``TFGPU_MAGIC_CHOSEN_GPUS``), or on GPU 0 when none
    was chosen, as a framework would; its child processes hold nothing.  Its owner and command are
    the real ones (psutil).

    The file is read again when its modification time, size or inode changes (looked at every
    :data:`RELOAD_EVERY_S` at most); replace it whole (write another file, then ``os.replace``) so
    no reader meets half of one.  A file that cannot be read at the start makes NVML unavailable,
    saying why; a later one that cannot be read is ignored (the last good one stays).  Keep the
    number of GPUs: NVML counts them once, at its start, as a driver does.
    """

    def __init__(self, path: str, scan_ttl_s: float = 0.5) -> None:
        self.path = path
        self.kernel_mib = 0
        self._seen: tuple[int, int, int] | None = None
        self._looked_at = 0.0
        gpus, why = self._read()
        super().__init__(gpus or [], kernel_gpus=max(1, len(gpus or [])), scan_ttl_s=scan_ttl_s)
        self.source_name = FILE_PREFIX + path
        if why is not None:
            self.init_error = RuntimeError(f"the simulated server's file {path} {why}")

    def _read(self) -> tuple[list[SimulatedGpu] | None, str | None]:
        """The file's GPUs (and ``kernel_mib``), or None and why not; records what was read."""
        import json

        from ..safe_text import safe

        try:  # never a FIFO's open, which would block every reading (O_NONBLOCK), nor a device
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            return None, f"cannot be read ({err.strerror or err})"
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None, "is not a regular file"
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = handle.read(MAX_SPEC_BYTES + 1)
        except OSError as err:
            return None, f"cannot be read ({err.strerror or err})"
        finally:
            os.close(fd)
        if len(data) > MAX_SPEC_BYTES:
            return None, f"is over {MAX_SPEC_BYTES} bytes"
        try:
            spec = json.loads(data)
            gpus = [_gpu_from_spec(index, gpu) for index, gpu in enumerate(spec["gpus"])]
            kernel_mib = int(spec.get("kernel_mib", 0))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as err:
            return None, f"is not a server's description ({type(err).__name__}: {safe(str(err))[:200]})"
        except RecursionError:
            return None, "is not a server's description (nested too deep)"
        self._seen = (info.st_mtime_ns, info.st_size, info.st_ino)
        self.kernel_mib = kernel_mib
        return gpus, None

    def _check(self) -> None:
        super()._check()
        now = time.monotonic()
        if now - self._looked_at < RELOAD_EVERY_S:
            return
        self._looked_at = now
        try:
            info = os.stat(self.path)
        except OSError:
            return
        if (info.st_mtime_ns, info.st_size, info.st_ino) != self._seen:
            gpus, _ = self._read()
            if gpus is not None:
                self.gpus = gpus

    def _scan(self) -> dict[int, list[SimulatedProcess]]:
        from .process_tree import read_parent_map

        if self.kernel_mib <= 0 or not self.gpus:
            return {}
        parents = read_parent_map()[0]
        self._forget_exited(parents)
        live: dict[int, list[SimulatedProcess]] = {}
        for pid in sorted(parents):
            gpus = self._remember(pid, self._kernel_gpus)
            for index in gpus or ():
                if 0 <= index < len(self.gpus):
                    live.setdefault(index, []).append(SimulatedProcess(pid, self.kernel_mib, "", ""))
        return live

    def _kernel_gpus(self, pid: int) -> tuple[int, ...] | None:
        """The GPUs a kernel of this server holds memory on, or None: not such a kernel (or not ours
        to read: only a process's owner and root read its environment)."""
        import psutil

        try:
            process = psutil.Process(pid)
            if not is_ipython_kernel(process.cmdline()):
                return None
            env = process.environ()
        except psutil.Error:
            return None
        if env.get(SOURCE_ENV) != self.source_name:
            return None
        chosen = env.get(CHOSEN_ENV, "")
        try:
            return tuple(int(part) for part in chosen.split(",") if part.strip()) or (0,)
        except ValueError:
            return (0,)


def _gpu_from_spec(index: int, spec: dict[str, Any]) -> SimulatedGpu:
    capability = str(spec.get("compute_capability", "8.0")).split(".")
    return SimulatedGpu(
        name=str(spec.get("name", SimulatedGpu.name)),
        total_mib=int(spec.get("total_mib", SimulatedGpu.total_mib)),
        base_used_mib=int(spec.get("base_used_mib", 0)),
        utilization=int(spec.get("utilization", 0)),
        uuid=f"GPU-{index:08x}-file-0000-0000-{index:012x}",
        compute_capability=(int(capability[0]), int(capability[1])),
        processes=[
            SimulatedProcess(
                int(p["pid"]),
                None if p.get("used_mib") is None else int(p["used_mib"]),
                str(p.get("user", "someone")),
                str(p.get("command", "python train.py")),
                alive=bool(p.get("alive", True)),
                sm_percent=int(p.get("sm_percent", 0)),
            )
            for p in spec.get("processes", [])
        ],
    )


# -- a kernel of a Jupyter server on a simulated server reads the same one ---------------------------
SOURCE_ENV = SIMULATED_SOURCE_ENV  # which simulated server a kernel reads (kernel_environment)
KERNEL_NUMBER_ENV = "TFGPU_MAGIC_SIMULATED_KERNEL"  # a kernel's number on kernels_server
USERS_ENV = "TFGPU_MAGIC_SIMULATED_USERS"  # host_kernels_server: only these users' kernels
_SOURCES = {"kernels_server": kernels_server, "host_kernels_server": host_kernels_server}


def from_environment(env: Any = None) -> LiveKernelsNvml | None:
    """The simulated server named in this process's environment (``TFGPU_MAGIC_SIMULATED_SOURCE``),
    or None: the real driver.  The Jupyter server extension names one of this module's servers in
    its kernels' environment; ``file:PATH`` names a :class:`FileServerNvml` (``tfgpu run`` and the
    kernel it starts read one server; the tests change it by rewriting the file).  Only this
    module's servers are named, so the variable never imports anything."""
    name = (os.environ if env is None else env).get(SOURCE_ENV)
    if name and name.startswith(FILE_PREFIX) and len(name) > len(FILE_PREFIX):
        return FileServerNvml(name[len(FILE_PREFIX) :])
    factory = _SOURCES.get(name) if name else None
    return factory() if factory is not None else None
