"""NVML readings: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

NVML starts lazily, once, under a lock, and is shut down at interpreter exit; it is never
started at import.  The library is injected (``Nvml(lib=...)``): by default the real
``pynvml`` module, in tests a fake with the same functions (``tfgpu_magic.simulated``).

Readings are typed, with units in the names.  A reading the GPU does not support is ``None``
(shown as missing), never 0.  Indices are NVML's, i.e. what ``nvidia-smi`` shows.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

__all__ = [
    "GpuInfo",
    "GpuLost",
    "GpuProcess",
    "MemoryInfo",
    "Nvml",
    "NvmlUnavailable",
]

T = TypeVar("T")

MIB = 1024 * 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used at all: no NVIDIA driver, or the library is missing."""


class GpuLost(RuntimeError):
    """A GPU stopped answering (fell off the bus, was reset, or vanished)."""


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory as the driver sees it, in bytes (all processes, all users)."""

    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU.  ``None`` means NVML could not give that reading."""

    index: int  # NVML index, as nvidia-smi shows it
    uuid: Optional[str]
    name: Optional[str]
    pci_bus_id: Optional[str]
    memory: Optional[MemoryInfo]  # bytes
    utilization_percent: Optional[int]
    compute_capability: Optional[tuple[int, int]]
    mig_enabled: Optional[bool]
    lost: bool = False  # True when the GPU stopped answering; other fields are then None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as NVML reports it (no owner lookup here)."""

    pid: int
    gpu_index: int
    used_memory_bytes: Optional[int]  # None when NVML cannot attribute memory (e.g. no permission)
    kind: str  # "compute" or "graphics"


class Nvml:
    """A thread-safe, lazily started view of NVML.

    Every public method raises :class:`NvmlUnavailable` (with a hint) when there is no driver,
    and :class:`GpuLost` when the GPU asked about stopped answering.
    """

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self._started = False
        self._failure: Optional[NvmlUnavailable] = None
        self._handles: dict[int, Any] = {}
        self._count = 0
        self._static: dict[int, tuple[Optional[str], Optional[str], Optional[int]]] = {}  # uuid, name, total

    # -- start and stop -------------------------------------------------------------------
    def _ensure_started(self) -> Any:
        if self._started:
            return self._lib
        with self._lock:
            if self._started:
                return self._lib
            if self._failure is not None:
                raise self._failure
            try:
                if self._lib is None:
                    import pynvml  # the one place pynvml is imported

                    self._lib = pynvml
                self._lib.nvmlInit()
                self._count = int(self._lib.nvmlDeviceGetCount())
            except ImportError as err:
                self._failure = NvmlUnavailable(
                    "NVML is not installed (HINT: pip install nvidia-ml-py)"
                )
                raise self._failure from err
            except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self._failure = NvmlUnavailable(
                    f"no NVIDIA driver could be reached through NVML ({err}); "
                    "GPU readings are unavailable (HINT: check `nvidia-smi` on this machine)"
                )
                raise self._failure from err
            self._started = True
            atexit.register(self.shutdown)
            return self._lib

    def shutdown(self) -> None:
        """Stop NVML if this object started it.  Safe to call more than once."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            self._handles.clear()
            try:
                self._lib.nvmlShutdown()
            except Exception:  # nothing useful to do at exit
                pass

    def available(self) -> bool:
        """True when NVML answers; never raises."""
        try:
            self._ensure_started()
        except NvmlUnavailable:
            return False
        return True

    # -- readings -------------------------------------------------------------------------
    def device_count(self) -> int:
        self._ensure_started()
        return self._count

    def memory(self, index: int) -> MemoryInfo:
        """Driver-level memory of one GPU, in bytes.  Cheap: the sampling path uses it."""
        lib = self._ensure_started()
        handle = self._handle(index)
        info = self._call(index, lib.nvmlDeviceGetMemoryInfo, handle)
        return MemoryInfo(int(info.total), int(info.used), int(info.free))

    # UUID, name and total memory never change: read once per GPU (unless it was lost).
    def uuid(self, index: int) -> Optional[str]:
        """The GPU's UUID (cached); None if unreadable or lost."""
        return self._static_facts(index)[0]

    def name(self, index: int) -> Optional[str]:
        """The GPU's product name (cached); None if unreadable or lost."""
        return self._static_facts(index)[1]

    def total_bytes(self, index: int) -> Optional[int]:
        """The GPU's total memory in bytes (cached); None if unreadable or lost."""
        return self._static_facts(index)[2]

    def _static_facts(self, index: int) -> tuple[Optional[str], Optional[str], Optional[int]]:
        facts = self._static.get(index)
        if facts is None:
            gpu = self.gpu(index)
            facts = (gpu.uuid, gpu.name, gpu.memory.total_bytes if gpu.memory else None)
            if not gpu.lost:
                self._static[index] = facts
        return facts

    def gpu(self, index: int) -> GpuInfo:
        """Everything we show about one GPU; a lost GPU comes back with ``lost=True``."""
        lib = self._ensure_started()
        try:
            handle = self._handle(index)
            memory = self._optional(index, lambda: self.memory(index))
            return GpuInfo(
                index=index,
                uuid=self._optional(index, lambda: _text(lib.nvmlDeviceGetUUID(handle))),
                name=self._optional(index, lambda: _text(lib.nvmlDeviceGetName(handle))),
                pci_bus_id=self._optional(index, lambda: _pci_bus_id(lib, handle)),
                memory=memory,
                utilization_percent=self._optional(
                    index, lambda: int(lib.nvmlDeviceGetUtilizationRates(handle).gpu)
                ),
                compute_capability=self._optional(
                    index, lambda: tuple(lib.nvmlDeviceGetCudaComputeCapability(handle))
                ),
                mig_enabled=self._optional(
                    index, lambda: bool(lib.nvmlDeviceGetMigMode(handle)[0])
                ),
            )
        except GpuLost:
            return GpuInfo(index, None, None, None, None, None, None, None, lost=True)

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.device_count())]

    @property
    def lib(self) -> Any:
        """The injected pynvml-like library (None until the real one is first needed)."""
        return self._lib

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute and graphics processes on one GPU; a process listed in both counts once.

        If the compute listing itself fails (not supported, no permission) this raises the
        NVML error: an unknown listing must not look like an idle GPU.  A failing graphics
        listing is only skipped (compute-only GPUs often refuse it).
        """
        lib = self._ensure_started()
        handle = self._handle(index)
        found: dict[int, GpuProcess] = {}
        listings = (
            ("compute", self._call(index, lib.nvmlDeviceGetComputeRunningProcesses, handle)),
            ("graphics", self._optional(index, lambda: lib.nvmlDeviceGetGraphicsRunningProcesses(handle))),
        )
        for kind, listing in listings:
            for proc in listing or []:
                used = getattr(proc, "usedGpuMemory", None)
                pid = int(proc.pid)
                if pid not in found:
                    found[pid] = GpuProcess(pid, index, None if used is None else int(used), kind)
        return list(found.values())

    # -- helpers --------------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            if not 0 <= index < self._count:
                raise IndexError(f"no GPU {index}: this machine has {self._count}")
            handle = self._call(index, self._lib.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def _call(self, index: int, func: Callable[..., T], *args: Any) -> T:
        """Call NVML, turning 'GPU is lost' into :class:`GpuLost`."""
        try:
            return func(*args)
        except self._lib.NVMLError as err:
            if _code(err) in _lost_codes(self._lib):
                self._handles.pop(index, None)
                raise GpuLost(f"GPU {index} stopped answering ({err})") from err
            raise

    def _optional(self, index: int, read: Callable[[], T]) -> Optional[T]:
        """A reading, or None when the GPU does not support it.  A lost GPU still raises."""
        try:
            return read()
        except GpuLost:
            raise
        except self._lib.NVMLError as err:
            if _code(err) in _lost_codes(self._lib):
                self._handles.pop(index, None)
                raise GpuLost(f"GPU {index} stopped answering ({err})") from err
            return None


def _code(err: Exception) -> Optional[int]:
    return getattr(err, "value", None)


def _lost_codes(lib: Any) -> tuple[int, ...]:
    return tuple(
        code
        for code in (
            getattr(lib, "NVML_ERROR_GPU_IS_LOST", None),
            getattr(lib, "NVML_ERROR_GPU_NOT_FOUND", None),
        )
        if code is not None
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pci_bus_id(lib: Any, handle: Any) -> str:
    return _text(lib.nvmlDeviceGetPciInfo(handle).busId)
