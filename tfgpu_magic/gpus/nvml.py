"""NVML readings: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

NVML starts lazily, under a lock, and is shut down at interpreter exit; it is never started at
import.  The library is injected (``Nvml(lib=...)``): by default the real ``pynvml`` module, in
tests a fake with the same functions (``tfgpu_magic.simulated``).

Readings are typed, with units in the names.  Indices are NVML's, i.e. what ``nvidia-smi``
shows.

The contract (what callers may rely on)
---------------------------------------
* A failure is confined to its reading, or at worst its GPU, and says why.  Nothing the
  library raises (``NVMLError`` of any code, or any other ``Exception``: a ``TypeError`` from a
  mismatched binding, a ``RuntimeError`` from a wrapper) leaves a public method as itself.
* **NvmlUnavailable**: NVML cannot start (no driver, no ``pynvml``, ``nvmlInit`` or the device
  count failed).  Every reading method (all but :meth:`Nvml.available`, :meth:`Nvml.shutdown`
  and :attr:`Nvml.lib`) may raise it.  A failed start is not final: it is tried again, at
  most once per ``retry_s`` (5 s, monotonic clock), so a driver that comes back is used
  without a restart, while a dead driver costs one ``nvmlInit`` per 5 s, not one per sample.
  :meth:`Nvml.available` follows the same rule and never raises.
* :meth:`Nvml.gpu` and :meth:`Nvml.gpus` raise nothing else.  A reading that fails is
  ``None`` (never 0) and :attr:`GpuInfo.notes` gains ``"<reading>: <reason>"``, e.g.
  ``"utilization: Insufficient Permissions"``, ``"name: RuntimeError: boom"``,
  ``"MIG mode: Not Supported"``.  If the device handle cannot be had, every reading of that
  GPU is ``None`` with the note ``"device handle: <reason>"``.  Only ``GPU is lost`` / ``GPU not
  found`` mark the GPU ``lost=True`` (all readings ``None``, the note names the reading that
  found it).  Other GPUs are unaffected.
* :meth:`Nvml.uuid`, :meth:`Nvml.name`, :meth:`Nvml.total_bytes` (static facts, read once and
  cached) return ``None`` when unreadable or lost, and raise nothing else; a failed reading
  is not cached, so a later call tries again.  :meth:`Nvml.gpu` reads those, the PCI bus id
  and the compute capability (static too) once per GPU the same way; memory in use and
  utilization are read on every call.  MIG mode is read once per device handle (see
  :meth:`Nvml._mig_mode`): the driver changes it only while the GPU is idle, by unbinding or
  resetting it, which the handle does not outlive here.
* :meth:`Nvml.memory` (the sampling path: one NVML call when the handle is known),
  :meth:`Nvml.processes` and :meth:`Nvml.memory_of_process` (one process's share) raise
  :class:`GpuLost` when the GPU stopped answering and :class:`ReadingFailed` for any other
  failure (``str()`` is the reason, ``.note`` is ``"<reading>: <reason>"``).  ``processes``
  raises rather than returning ``[]`` because an unknown listing must not look like an idle
  GPU; only the graphics listing may fail quietly (compute-only GPUs refuse it).
* :meth:`Nvml.memory_and_utilization_of` (the monitor's tick: every GPU's memory and
  utilization in one call) raises only :class:`NvmlUnavailable`; a GPU whose memory reading
  fails gets the :class:`GpuLost` or :class:`ReadingFailed` that :meth:`Nvml.memory` would raise
  in its place in the list.
* :meth:`Nvml.mig_devices` lists a GPU's MIG instances (``[]`` when it is not in MIG mode or
  has no MIG support) and raises like :meth:`Nvml.processes`; a reading of one instance that
  fails is ``None`` with a note, as in :meth:`Nvml.gpu`.  MIG handles are fetched on every
  call (a handle dies with its compute instance).  :meth:`Nvml.mig_processes` lists one
  instance's processes.
* An index outside ``range(device_count())`` is the caller's bug: ``IndexError``.
* ``KeyboardInterrupt`` (any ``BaseException`` that is not an ``Exception``) passes through.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Container, Iterable
from typing import Any, TypeVar

from ..records import Record
from ..safe_text import safe

__all__ = [
    "GpuInfo",
    "GpuLost",
    "GpuProcess",
    "MemoryInfo",
    "MigDevice",
    "MonitorReading",
    "Nvml",
    "NvmlUnavailable",
    "ProcessUtilization",
    "ReadingFailed",
]

T = TypeVar("T")

# One GPU's reading for the monitor (Nvml.memory_and_utilization_of): total and used bytes, and
# utilization in percent (None where NVML has no such reading).
MonitorReading = tuple[int, int, int | None]

RETRY_S = 5.0  # a failed start is tried again after this long (monotonic seconds)

MAX_DEVICES = 1024  # more than any machine has: as many as `%gpu use` can name (0..1023)

# How long the memory reading made for a GPU's total may stand in for the next reading of that GPU:
# within one refresh (the request resolved, then the GPUs read), never across a user's two.
FIRST_READING_S = 0.5

# Reading names, as notes and ReadingFailed.reading show them.
HANDLE = "device handle"
UUID = "uuid"
NAME = "name"
PCI = "PCI bus id"
MEMORY = "memory"
UTILIZATION = "utilization"
COMPUTE_CAPABILITY = "compute capability"
MIG = "MIG mode"
COMPUTE_MODE = "compute mode"
MIG_DEVICES = "MIG devices"
MIG_IDS = "MIG instance ids"
MAX_MIG_DEVICES = 64  # more than any GPU has (an A100 or H100: 7); bounds a driver's answer
PROCESSES = "processes"
PROCESS_UTILIZATION = "process utilization"
UTILIZATION_SAMPLES = "utilization samples"
MAX_SAMPLES = 4096  # utilization samples looked at per reading: bounds a driver's (or a fake's) answer
GRAPHICS_PROCESSES = "graphics processes"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used at all: no NVIDIA driver, or the library is missing."""


class GpuLost(RuntimeError):
    """A GPU stopped answering (fell off the bus, was reset, or vanished).

    ``note`` is ``"<reading>: <reason>"`` for the reading that found it (None if not known).
    """

    def __init__(self, message: str, note: str | None = None) -> None:
        super().__init__(message)
        self.note = note


class ReadingFailed(RuntimeError):
    """One reading of one GPU failed, for any reason but a lost GPU.

    ``str(err)`` is the reason (``"Insufficient Permissions"``, ``"RuntimeError: boom"``), or
    the whole note when the reading asked for failed because the device handle did;
    ``reading`` names what failed, ``note`` is ``"<reading>: <reason>"``, ``index`` the GPU.
    """

    def __init__(self, index: int, reading: str, reason: str, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.index = index
        self.reading = reading
        self.reason = reason

    @property
    def note(self) -> str:
        return f"{self.reading}: {self.reason}"


class MemoryInfo(Record):
    """Device memory as the driver sees it, in bytes (all processes, all users).

    ``used_bytes`` is nvidia-smi's "used": where the driver offers NVML's version-2 reading,
    the memory it reserves for itself (about 500 MiB on an H100) is ``reserved_bytes`` and not
    part of ``used_bytes``, so an idle GPU reads 0 used, as nvidia-smi shows it.  With only the
    version-1 reading (older drivers) ``reserved_bytes`` is None and ``used_bytes`` includes it.
    """

    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None


class GpuInfo(Record):
    """One physical GPU.  ``None`` means NVML could not give that reading; ``notes`` say why."""

    index: int  # NVML index, as nvidia-smi shows it
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    memory: MemoryInfo | None  # bytes
    utilization_percent: int | None
    compute_capability: tuple[int, int] | None
    mig_enabled: bool | None
    lost: bool = False  # True when the GPU stopped answering; other fields are then None
    notes: tuple[str, ...] = ()  # "<reading>: <reason>" for each reading that failed


class MigDevice(Record):
    """One MIG instance (a compute instance in a GPU instance), as NVML lists it under its GPU."""

    index: int  # its GPU's nvidia-smi index
    mig_index: int  # its place among the GPU's MIG devices (nvidia-smi's and nvitop's `3:0`)
    uuid: str | None  # "MIG-..."
    name: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory: MemoryInfo | None  # the instance's own memory
    notes: tuple[str, ...] = ()


class GpuProcess(Record):
    """A process holding memory on a GPU, as NVML reports it (no owner lookup here)."""

    pid: int
    gpu_index: int
    used_memory_bytes: int | None  # None when NVML cannot attribute memory (e.g. no permission)
    kind: str  # "compute" or "graphics"


class ProcessUtilization(Record):
    """How busy processes kept one GPU since a time: NVML's process utilization samples (the driver's figures).

    ``percent_by_pid``: each sampled pid's highest SM utilization among its samples.  The driver
    samples a process only while it runs work on the GPU, so a process holding memory without
    a sample was idle there (0%) for as far back as the driver's samples reach.
    ``latest_us``: the newest sample's timestamp (microseconds), the next reading's ``since``;
    the ``since`` given when there was none.  ``per_device``: the driver gives no per-process
    samples on this GPU (a GPU in MIG mode, an old driver): ``device_percent`` is the whole
    GPU's utilization, everyone's together, and ``percent_by_pid`` is empty.  With MPS the
    driver credits its clients' work to the MPS server's process.
    """

    index: int
    percent_by_pid: dict[int, int]
    latest_us: int
    per_device: bool = False
    device_percent: int | None = None
    note: str | None = None  # why the reading is per device

    def percent_of(self, pids: Any) -> int | None:
        """The busiest of these pids (0 for pids without a sample); the GPU's figure when per device."""
        if self.per_device:
            return self.device_percent
        return max((self.percent_by_pid.get(pid, 0) for pid in pids), default=0)


class Nvml:
    """A thread-safe, lazily started view of NVML; see the module docstring for the contract.

    ``clock`` (monotonic seconds) and ``retry_s`` set when a failed start is tried again.
    """

    def __init__(
        self,
        lib: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = RETRY_S,
    ) -> None:
        self._lib = lib
        self._clock = clock
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._started = False
        self._failure: str | None = None  # why the last start failed
        self._retry_at = 0.0  # when a failed start may be tried again (clock time)
        self._exit_registered = False
        self._handles: dict[int, Any] = {}
        # index -> (the GPU's MIG mode, None: not supported; the note that says why), once per handle
        self._mig_modes: dict[int, tuple[bool | None, str | None]] = {}
        self._count = 0
        self.count_note: str | None = None  # why the device count was capped, if it was
        self._static: dict[int, dict[str, Any]] = {}  # index -> {"uuid"|"name"|"total"|"pci"|"cc": value}
        # index -> (clock time, the memory reading total_bytes made first), for gpu() to use once
        self._first_memory: dict[int, tuple[float, MemoryInfo]] = {}
        self._system: dict[str, str | None] = {}  # facts of the driver itself: {"cuda_driver": "12.8"}
        # The driver lacks version 2 of the memory reading (found once, by memory_and_utilization_of).
        self._memory_v1 = False

    # -- start and stop -------------------------------------------------------------------
    def _ensure_started(self) -> Any:
        if self._started:
            return self._lib
        with self._lock:
            if self._started:
                return self._lib
            if self._failure is not None and self._clock() < self._retry_at:
                raise NvmlUnavailable(self._failure)
            try:
                self._count = self._start()
            except NvmlUnavailable as err:
                self._failure = str(err)
                self._retry_at = self._clock() + self._retry_s
                raise
            self._failure = None
            self._started = True
            if not self._exit_registered:
                atexit.register(self.shutdown)
                self._exit_registered = True
            return self._lib

    def _start(self) -> int:
        """nvmlInit and the device count; any failure is :class:`NvmlUnavailable`."""
        if self._lib is None:
            try:
                import pynvml  # the one place pynvml is imported
            except ImportError as err:
                raise NvmlUnavailable("NVML is not installed (HINT: pip install nvidia-ml-py)") from err
            except Exception as err:
                raise NvmlUnavailable(
                    f"NVML could not be loaded ({_reason(err, False)}) (HINT: pip install -U nvidia-ml-py)"
                ) from err
            self._lib = pynvml
        lib = self._lib
        try:
            lib.nvmlInit()
        except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise NvmlUnavailable(
                f"no NVIDIA driver could be reached through NVML ({_reason(err, _is_nvml_error(lib, err))}); "
                "GPU readings are unavailable (HINT: check `nvidia-smi` on this machine)"
            ) from err
        try:
            return self._capped(lib.nvmlDeviceGetCount())
        except Exception as err:
            try:
                lib.nvmlShutdown()
            except Exception:  # already failing; the first error is the one to report
                pass
            raise NvmlUnavailable(
                f"NVML started but could not count the GPUs ({_reason(err, _is_nvml_error(lib, err))}); "
                "GPU readings are unavailable (HINT: check `nvidia-smi` on this machine)"
            ) from err

    def _capped(self, answer: Any) -> int:
        """The device count, within what a machine can have: a driver's absurd answer (10**30, -1)
        would otherwise make every loop over the GPUs run without bound."""
        count = int(answer)
        if 0 <= count <= MAX_DEVICES:
            self.count_note = None
            return count
        self.count_note = f"the driver reported {safe(str(answer)[:40])} GPUs; " + (
            f"only the first {MAX_DEVICES} are read" if count > 0 else "none are read"
        )
        return min(max(count, 0), MAX_DEVICES)

    def shutdown(self) -> None:
        """Stop NVML if this object started it.  Safe to call more than once."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            self._handles.clear()
            self._mig_modes.clear()
            self._static.clear()  # a later start may see other GPUs
            self._first_memory.clear()
            self._system.clear()
            self._memory_v1 = False
            try:
                self._lib.nvmlShutdown()
            except Exception:  # nothing useful to do at exit
                pass

    def available(self) -> bool:
        """True when NVML answers; never raises (a failed start is retried after a backoff)."""
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
        """Driver-level memory of one GPU, in bytes.  Cheap: the sampling path uses it.

        Raises :class:`GpuLost` or :class:`ReadingFailed` (and :class:`NvmlUnavailable`).
        """
        lib = self._ensure_started()
        handle = self._handle(index)
        return self._read(index, MEMORY, _memory_info, lib, handle)

    def utilization(self, index: int) -> int:
        """Percent of the last sample period the GPU was busy (the panel's utilization chart).

        Raises :class:`GpuLost` or :class:`ReadingFailed` (a GPU without the reading, say).
        """
        lib = self._ensure_started()
        handle = self._handle(index)
        return self._read(index, UTILIZATION, _utilization, lib, handle)

    def compute_mode(self, index: int) -> int | None:
        """The GPU's compute mode (``nvmlDeviceGetComputeMode``: 0 default, 2 prohibited, 3
        exclusive process); None where the driver cannot say.  Read when asked (``%gpu doctor``):
        an administrator may change it at any time.  Raises :class:`GpuLost` like every reading."""
        lib = self._ensure_started()
        handle = self._handle(index)
        try:
            return self._read(index, COMPUTE_MODE, _compute_mode, lib, handle)
        except ReadingFailed:
            return None

    def memory_and_utilization_of(
        self, indices: Iterable[int], utilization: Container[int] | None = None
    ) -> list[MonitorReading | Exception]:
        """Total and used bytes and utilization (None where NVML has no such reading, or where
        not asked: only GPUs in ``utilization`` when given) of each GPU in ``indices``, in order:
        a tick of ``%gpu monitor``, one or two NVML calls a GPU.

        A GPU whose memory reading fails gets, in its place, the :class:`GpuLost` or
        :class:`ReadingFailed` that :meth:`memory` would raise; the other GPUs are read all the
        same.  Nothing is built per GPU but its three numbers (no :class:`MemoryInfo`): the
        monitor makes this call ten times a second, after a sleep that left the caches cold, and
        its cost is what it touches.  May raise :class:`NvmlUnavailable`.
        """
        lib = self._lib if self._started else self._ensure_started()
        read_memory = lib.nvmlDeviceGetMemoryInfo
        version = None if self._memory_v1 else getattr(lib, "nvmlMemory_v2", None)
        handles = self._handles
        found: list[MonitorReading | Exception] = []
        for index in indices:
            handle = handles.get(index)
            try:
                if handle is None:
                    handle = self._handle(index)
                info = read_memory(handle) if version is None else read_memory(handle, version)
                total, used = info.total, info.used
                # _bytes's check, inline for the ints a binding gives: ten times a second per GPU.
                if not (
                    type(total) is int
                    and type(used) is int
                    and 0 <= total <= MAX_BYTES
                    and 0 <= used <= MAX_BYTES
                ):
                    total, used = _bytes(total), _bytes(used)
            except Exception as err:
                if handle is None:  # the handle could not be had: _handle said why
                    found.append(err)
                    continue
                try:  # what memory() does: an older driver's version 1, or the failure said as it says it
                    memory = self._read(index, MEMORY, _memory_info, lib, handle)
                except Exception as failed:
                    found.append(failed)
                    continue
                total, used = memory.total_bytes, memory.used_bytes
                if version is not None and _version_2_missing(lib, err):
                    self._memory_v1 = True  # the next ticks ask for version 1 straight away
            percent: int | None = None
            if utilization is None or index in utilization:
                try:
                    percent = _utilization(lib, handle)
                except Exception as err:  # many GPUs lack the reading: a gap, not a failure
                    self._failed(index, UTILIZATION, err)  # (a lost GPU's handle is dropped all the same)
            found.append((total, used, percent))
        return found

    def utilization_samples(self, index: int, since_us: int = 0) -> list[tuple[int, int]]:
        """The driver's own GPU-utilization samples of one GPU newer than ``since_us``, as (CPU
        time in microseconds, percent), oldest first: one ``nvmlDeviceGetSamples`` call.

        The driver keeps a buffer of them (one every 1/6 s to 1 s, by product), each what
        ``nvmlDeviceGetUtilizationRates`` answers while it is the newest; NVML's reference
        recommends reading the buffer over polling for frequent readings.  No sample since then
        (``NOT_FOUND``) is an empty list.  Raises :class:`GpuLost` or :class:`ReadingFailed`
        (``NOT_SUPPORTED``: a GPU in MIG mode; a binding without the function).
        """
        lib = self._ensure_started()
        handle = self._handle(index)
        try:
            found = lib.nvmlDeviceGetSamples(
                handle, getattr(lib, "NVML_GPU_UTILIZATION_SAMPLES", 1), int(since_us)
            )
        except Exception as err:
            if _is_nvml_error(lib, err) and _code(err) == getattr(lib, "NVML_ERROR_NOT_FOUND", 6):
                return []
            raise self._failed(index, UTILIZATION_SAMPLES, err) from err
        return self._read(index, UTILIZATION_SAMPLES, _utilization_samples, found, int(since_us))

    def process_utilization(self, index: int, since_us: int = 0) -> ProcessUtilization:
        """NVML's per-process utilization samples of one GPU newer than ``since_us`` (one call).

        No sample since then (NVML's ``NOT_FOUND``) is no process busy.  Where the driver has no
        per-process samples (``NOT_SUPPORTED``: a GPU in MIG mode; a binding without the function)
        the GPU's own utilization is read instead, marked ``per_device`` (a second call).  Raises
        :class:`GpuLost` or :class:`ReadingFailed` like :meth:`processes` (a MIG GPU has no
        utilization of its own either: the note says both).
        """
        lib = self._ensure_started()
        handle = self._handle(index)
        try:
            samples = lib.nvmlDeviceGetProcessUtilization(handle, int(since_us))
        except Exception as err:
            if _is_nvml_error(lib, err) and _code(err) == getattr(lib, "NVML_ERROR_NOT_FOUND", 6):
                return ProcessUtilization(index, {}, since_us)
            if not (_not_supported(lib, err) or isinstance(err, AttributeError)):
                raise self._failed(index, PROCESS_UTILIZATION, err) from err
            reason = _reason(err, _is_nvml_error(lib, err))
            why = f"{PROCESS_UTILIZATION}: {reason}"
            try:
                device = self._read(index, UTILIZATION, _utilization, lib, handle)
            except ReadingFailed as failed:
                also = f"{reason} (and the GPU's own utilization: {failed.reason})"
                raise ReadingFailed(index, PROCESS_UTILIZATION, also) from failed
            return ProcessUtilization(index, {}, since_us, per_device=True, device_percent=device, note=why)
        return self._read(index, PROCESS_UTILIZATION, _samples, index, samples, since_us)

    def cuda_driver_version(self) -> str | None:
        """The newest CUDA version the driver supports (``nvmlSystemGetCudaDriverVersion``), as
        ``"12.8"``; None when NVML is absent or cannot say.  Read once: a driver does not change
        under a running process."""
        if "cuda_driver" not in self._system:
            try:
                code = int(self._ensure_started().nvmlSystemGetCudaDriverVersion())
            except Exception:  # NvmlUnavailable, Not-Supported, an old binding: unknown, retried
                return None
            self._system["cuda_driver"] = f"{code // 1000}.{code % 1000 // 10}" if 0 < code < 10**6 else None
        return self._system["cuda_driver"]

    # UUID, name and total memory never change: read once per GPU, cached only when read.
    def uuid(self, index: int) -> str | None:
        """The GPU's UUID (cached); None if unreadable or lost (tried again next call)."""
        return self._fact(index, "uuid", UUID, _uuid)

    def name(self, index: int) -> str | None:
        """The GPU's product name (cached); None if unreadable or lost (tried again next call)."""
        return self._fact(index, "name", NAME, _name)

    def total_bytes(self, index: int) -> int | None:
        """The GPU's total memory in bytes (cached); None if unreadable or lost (tried again next call).

        Its first read is the whole memory reading, which the next :meth:`gpu` of that GPU uses
        if it comes within ``FIRST_READING_S``: a new reader's first refresh needs the total (to
        resolve the request) and then the reading, and reads memory once per GPU, not twice.
        """
        total: int | None = self._static.get(index, {}).get("total")
        if total is not None:
            return total
        lib = self._ensure_started()
        try:
            memory = self._read(index, MEMORY, _memory_info, lib, self._handle(index))
        except (GpuLost, ReadingFailed):
            return None
        self._remember(index, "total", memory.total_bytes)
        self._first_memory[index] = (self._clock(), memory)
        return memory.total_bytes

    def _taken_first_memory(self, index: int) -> MemoryInfo | None:
        """The reading :meth:`total_bytes` just made, once, while it is younger than ``FIRST_READING_S``."""
        taken = self._first_memory.pop(index, None)
        if taken is None or self._clock() - taken[0] > FIRST_READING_S:
            return None
        return taken[1]

    def _fact(self, index: int, key: str, reading: str, read: Callable[[Any, Any], T]) -> T | None:
        value: T | None = self._static.get(index, {}).get(key)  # what `read` found before, or None
        if value is not None:
            return value
        lib = self._ensure_started()
        try:
            value = self._read(index, reading, read, lib, self._handle(index))
        except (GpuLost, ReadingFailed):
            return None
        self._remember(index, key, value)
        return value

    def _remember(self, index: int, key: str, value: Any) -> None:
        if value is not None:
            self._static.setdefault(index, {})[key] = value

    def gpu(self, index: int) -> GpuInfo:
        """Everything we show about one GPU; never raises for a failing reading (see the contract)."""
        lib = self._ensure_started()
        try:
            handle = self._handle(index)
        except ReadingFailed as err:
            return GpuInfo(index, None, None, None, None, None, None, None, notes=(err.note,))
        except GpuLost as err:
            return _lost(index, err)
        notes: list[str] = []
        cached = self._static.get(index, {})

        def optional(reading: str, read: Callable[[Any, Any], T]) -> T | None:
            try:
                return self._read(index, reading, read, lib, handle)
            except ReadingFailed as err:
                notes.append(err.note)
                return None

        try:
            memory = self._taken_first_memory(index) or optional(MEMORY, _memory_info)
            uuid = cached.get("uuid") or optional(UUID, _uuid)
            name = cached.get("name") or optional(NAME, _name)
            pci = cached.get("pci") or optional(PCI, _pci_bus_id)
            capability = cached.get("cc") or optional(COMPUTE_CAPABILITY, _compute_capability)
            info = GpuInfo(
                index=index,
                uuid=uuid,
                name=name,
                pci_bus_id=pci,
                memory=memory,
                utilization_percent=optional(UTILIZATION, _utilization),
                compute_capability=capability,
                mig_enabled=self._mig_mode_noted(index, lib, handle, notes),
                notes=tuple(notes),
            )
        except GpuLost as err:
            return _lost(index, err)
        self._remember(index, "uuid", uuid)
        self._remember(index, "name", name)
        self._remember(index, "total", memory.total_bytes if memory else None)
        self._remember(index, "pci", pci)
        self._remember(index, "cc", capability)
        return info

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.device_count())]

    @property
    def lib(self) -> Any:
        """The injected pynvml-like library (None until the real one is first needed)."""
        return self._lib

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute and graphics processes on one GPU; a process listed in both counts once.

        If the compute listing itself fails (not supported, no permission, any error) this
        raises :class:`ReadingFailed` (or :class:`GpuLost`): an unknown listing must not look
        like an idle GPU.  A failing graphics listing is only skipped (compute-only GPUs often
        refuse it), unless it finds the GPU lost.
        """
        lib = self._ensure_started()
        return self._processes_of(index, lib, self._handle(index))

    def memory_of_process(self, index: int, pid: int) -> int | None:
        """The bytes process ``pid`` holds on GPU ``index``, as :meth:`processes` lists it: 0 when
        it is not listed, None when NVML lists it without a figure.  Raises as :meth:`processes`.

        The monitor asks this of a GPU whenever its used memory moved (every tick, on a GPU
        where this kernel allocates), so it builds no listing, and reads the graphics listing
        only when the compute one does not list ``pid`` (where both do, the compute entry is
        the answer, as in :meth:`processes`).  Plain loops: a generator over both listings
        cost this path 20-40 us more per eight GPUs, measured cold (2026-11-28)."""
        lib = self._ensure_started()
        handle = self._handle(index)
        for listed, used, _ in self._read(index, PROCESSES, _listing, lib, handle, "compute"):
            if listed == pid:
                return used
        for listed, used, _ in self._graphics_listing(index, lib, handle):
            if listed == pid:
                return used
        return 0

    def _processes_of(self, index: int, lib: Any, handle: Any) -> list[GpuProcess]:
        """The processes of a GPU's (or a MIG instance's) ``handle``, as :meth:`processes` says."""
        compute = self._read(index, PROCESSES, _listing, lib, handle, "compute")
        found: dict[int, GpuProcess] = {}
        for pid, used, kind in compute + self._graphics_listing(index, lib, handle):
            if pid not in found:  # listed in both: the compute listing's entry
                found[pid] = GpuProcess(pid, index, used, kind)
        return list(found.values())

    def _graphics_listing(self, index: int, lib: Any, handle: Any) -> list[tuple[int, int | None, str]]:
        """The graphics listing, or none where it fails (compute-only GPUs refuse it); a GPU it
        finds lost raises :class:`GpuLost`."""
        try:
            return self._read(index, GRAPHICS_PROCESSES, _listing, lib, handle, "graphics")
        except ReadingFailed:
            return []

    # -- MIG ------------------------------------------------------------------------------
    def mig_devices(self, index: int) -> list[MigDevice]:
        """The GPU's MIG instances, in NVML's order; ``[]`` when MIG is off or not supported.

        Raises :class:`GpuLost` or :class:`ReadingFailed` when the mode or the listing cannot be
        read (an unknown listing must not look like a GPU without instances).
        """
        lib = self._ensure_started()
        handle = self._handle(index)
        if not self._mig_mode(index, lib, handle)[0]:  # off, not supported, or no such function
            return []
        count = self._read(
            index, MIG_DEVICES, lambda lib, h: int(lib.nvmlDeviceGetMaxMigDeviceCount(h)), lib, handle
        )
        found = []
        for slot in range(max(0, min(count, MAX_MIG_DEVICES))):
            try:
                mig_handle = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except Exception as err:
                if _is_nvml_error(lib, err) and _code(err) == getattr(lib, "NVML_ERROR_NOT_FOUND", 6):
                    continue  # no instance at this index
                raise self._failed(index, MIG_DEVICES, err) from err
            found.append(self._mig_device(index, slot, lib, mig_handle))
        return found

    def _mig_device(self, index: int, slot: int, lib: Any, handle: Any) -> MigDevice:
        notes: list[str] = []

        def optional(reading: str, read: Callable[[Any, Any], T]) -> T | None:
            try:
                return read(lib, handle)
            except Exception as err:
                failure = self._failed(index, reading, err)
                if isinstance(failure, GpuLost):
                    raise failure from err
                notes.append(f"MIG {index}:{slot} {failure.note}")
                return None

        return MigDevice(
            index=index,
            mig_index=slot,
            uuid=optional(UUID, _uuid),
            name=optional(NAME, _name),
            gpu_instance_id=optional(MIG_IDS, lambda lib, h: int(lib.nvmlDeviceGetGpuInstanceId(h))),
            compute_instance_id=optional(MIG_IDS, lambda lib, h: int(lib.nvmlDeviceGetComputeInstanceId(h))),
            memory=optional(MEMORY, _memory_info),
            notes=tuple(dict.fromkeys(notes)),
        )

    def mig_processes(self, index: int, mig_index: int) -> list[GpuProcess]:
        """Processes NVML lists on one MIG instance (``gpu_index`` is its GPU's); raises like :meth:`processes`."""
        lib = self._ensure_started()
        handle = self._handle(index)
        mig_handle = self._read(
            index,
            MIG_DEVICES,
            lambda lib, h: lib.nvmlDeviceGetMigDeviceHandleByIndex(h, mig_index),
            lib,
            handle,
        )
        return self._processes_of(index, lib, mig_handle)

    def _mig_mode(self, index: int, lib: Any, handle: Any) -> tuple[bool | None, str | None]:
        """The GPU's current MIG mode, and None; or (None, the note that says why) when it has no
        MIG support (or the binding lacks the function).  Raises like :meth:`processes` for any
        other failure (not remembered: the next reading tries again).

        Read once per handle.  The current mode changes only when a pending one is activated:
        ``nvmlDeviceSetMigMode`` (or ``nvidia-smi -mig``) "may unbind or reset the device to
        activate the requested mode", fails with ``IN_USE`` unless the device is idle, and tells its
        caller to query the device's attributes again; a reset needs every client of the GPU gone.
        A handle that then answers ``GPU is lost`` is dropped with its mode, as is every handle
        when NVML is shut down or restarted: the next reading starts from the driver again."""
        if index in self._mig_modes and self._handles.get(index) is handle:
            return self._mig_modes[index]
        try:
            mode: tuple[bool | None, str | None] = (_mig_enabled(lib, handle), None)
        except Exception as err:
            if not (_not_supported(lib, err) or isinstance(err, (AttributeError, TypeError))):
                raise self._failed(index, MIG, err) from err
            mode = (None, f"{MIG}: {_reason(err, _is_nvml_error(lib, err))}")
        if self._handles.get(index) is handle:
            self._mig_modes[index] = mode
        return mode

    def _mig_mode_noted(self, index: int, lib: Any, handle: Any, notes: list[str]) -> bool | None:
        """:meth:`_mig_mode` for :meth:`gpu`: no support is its note (``MIG mode: Not Supported``) on
        every reading, as is any other failure."""
        try:
            mode, note = self._mig_mode(index, lib, handle)
        except ReadingFailed as err:
            notes.append(err.note)
            return None
        if note is not None:
            notes.append(note)
        return mode

    # -- helpers --------------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        """The device handle (cached once had); raises GpuLost or ReadingFailed."""
        handle = self._handles.get(index)
        if handle is None:
            if not 0 <= index < self._count:
                raise IndexError(f"no GPU {index}: this machine has {self._count}")
            handle = self._read(
                index, HANDLE, lambda lib, i: lib.nvmlDeviceGetHandleByIndex(i), self._lib, index
            )
            self._handles[index] = handle
        return handle

    def _read(self, index: int, reading: str, read: Callable[..., T], *args: Any) -> T:
        """``read(*args)``, with any failure turned into :class:`GpuLost` or :class:`ReadingFailed`."""
        try:
            return read(*args)
        except Exception as err:
            raise self._failed(index, reading, err) from err

    def _failed(self, index: int, reading: str, err: Exception) -> GpuLost | ReadingFailed:
        lib = self._lib
        nvml_error = _is_nvml_error(lib, err)
        reason = _reason(err, nvml_error)
        note = f"{reading}: {reason}"
        if nvml_error and _code(err) in _lost_codes(lib):
            self._handles.pop(index, None)
            self._mig_modes.pop(index, None)
            return GpuLost(f"GPU {index} stopped answering ({reason})", note)
        if nvml_error and _code(err) == getattr(lib, "NVML_ERROR_UNINITIALIZED", None):
            self._restart_later()  # someone shut NVML down under us: start again on the next call
        return ReadingFailed(index, reading, reason, note if reading == HANDLE else None)

    def _restart_later(self) -> None:
        with self._lock:
            self._started = False
            self._handles.clear()
            self._mig_modes.clear()


# -- one reading each: the whole conversion inside, so a malformed answer fails that reading ----
MAX_BYTES = 2**53 - 1  # the largest integer every JSON reader keeps exactly; no GPU comes near it


def _bytes(value: Any) -> int:
    """A byte count as NVML gives it; a negative or impossibly large one fails the reading (it is
    nobody's figure, and the reply's schema allows none)."""
    count = int(value)
    if not 0 <= count <= MAX_BYTES:
        raise ValueError(f"NVML gave {count} as a byte count")
    return count


def _memory_info(lib: Any, handle: Any) -> MemoryInfo:
    """nvidia-smi's figures: the version-2 reading where the driver has it, else version 1.

    Version 1 counts the driver's own reservation as used, so an idle H100 would show 480 MiB
    that no process holds (seen on a real H100, driver 580, 2026-11-22) while nvidia-smi says 0.
    """
    version_2 = getattr(lib, "nvmlMemory_v2", None)
    if version_2 is not None:
        try:
            info = lib.nvmlDeviceGetMemoryInfo(handle, version=version_2)
            return MemoryInfo(_bytes(info.total), _bytes(info.used), _bytes(info.free), _bytes(info.reserved))
        except Exception as err:
            if not _version_2_missing(lib, err):
                raise
    info = lib.nvmlDeviceGetMemoryInfo(handle)
    return MemoryInfo(_bytes(info.total), _bytes(info.used), _bytes(info.free))


def _version_2_missing(lib: Any, err: Exception) -> bool:
    """An older driver or binding without ``nvmlDeviceGetMemoryInfo_v2``: use version 1."""
    if isinstance(err, TypeError):  # a binding whose function takes no ``version``
        return True
    missing = (getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13), getattr(lib, "NVML_ERROR_NOT_SUPPORTED", 3))
    return _is_nvml_error(lib, err) and _code(err) in missing


def _uuid(lib: Any, handle: Any) -> str:
    return _text(lib.nvmlDeviceGetUUID(handle))


def _name(lib: Any, handle: Any) -> str:
    return _text(lib.nvmlDeviceGetName(handle))


def _pci_bus_id(lib: Any, handle: Any) -> str:
    return _text(lib.nvmlDeviceGetPciInfo(handle).busId)


def _utilization(lib: Any, handle: Any) -> int:
    percent = int(lib.nvmlDeviceGetUtilizationRates(handle).gpu)
    if not 0 <= percent <= 100:
        raise ValueError(f"NVML gave a utilization of {percent}%")
    return percent


def _samples(index: int, samples: Any, since_us: int) -> ProcessUtilization:
    """The samples as :class:`ProcessUtilization`; one that is no percentage fails the reading."""
    percent: dict[int, int] = {}
    latest = since_us
    for n, sample in enumerate(samples or []):
        if n >= MAX_SAMPLES:
            break
        pid, at, sm = int(sample.pid), int(sample.timeStamp), int(sample.smUtil)
        if not 0 <= sm <= 100:
            raise ValueError(f"NVML gave a process utilization of {sm}%")
        percent[pid] = max(percent.get(pid, 0), sm)
        latest = max(latest, at)
    return ProcessUtilization(index, percent, latest)


# nvmlValue_t's member for each nvmlValueType_t: what a sample's value is read as.
_SAMPLE_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _utilization_samples(found: Any, since_us: int) -> list[tuple[int, int]]:
    """``nvmlDeviceGetSamples``' answer, (value type, samples), as sorted (time, percent) pairs
    newer than ``since_us``; a value that is no percentage fails the reading."""
    value_type, samples = found
    field = _SAMPLE_VALUE_FIELDS[int(value_type)]
    kept = []
    for n, sample in enumerate(samples or []):
        if n >= MAX_SAMPLES:
            break
        at, value = int(sample.timeStamp), getattr(sample.sampleValue, field)
        percent = round(value)
        if not 0 <= percent <= 100:
            raise ValueError(f"NVML gave a utilization sample of {value}%")
        if at > since_us:
            kept.append((at, percent))
    kept.sort()
    return kept


def _compute_capability(lib: Any, handle: Any) -> tuple[int, int]:
    major, minor = lib.nvmlDeviceGetCudaComputeCapability(handle)
    return (int(major), int(minor))


def _compute_mode(lib: Any, handle: Any) -> int:
    mode = int(lib.nvmlDeviceGetComputeMode(handle))
    if not 0 <= mode <= 3:
        raise ValueError(f"NVML gave compute mode {mode}")
    return mode


def _mig_enabled(lib: Any, handle: Any) -> bool:
    return bool(lib.nvmlDeviceGetMigMode(handle)[0])


def _listing(lib: Any, handle: Any, kind: str) -> list[tuple[int, int | None, str]]:
    """One NVML process listing as (pid, bytes or None, kind), in NVML's order."""
    call = (
        lib.nvmlDeviceGetComputeRunningProcesses
        if kind == "compute"
        else lib.nvmlDeviceGetGraphicsRunningProcesses
    )
    result = []
    for proc in call(handle) or []:
        used = getattr(proc, "usedGpuMemory", None)
        if used is not None and not 0 <= int(used) <= MAX_BYTES:
            used = None  # not a byte count: this process's memory is unknown, the others still listed
        result.append((int(proc.pid), None if used is None else int(used), kind))
    return result


def _not_supported(lib: Any, err: BaseException) -> bool:
    return _is_nvml_error(lib, err) and _code(err) in (
        getattr(lib, "NVML_ERROR_NOT_SUPPORTED", 3),
        getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
    )


def _lost(index: int, err: GpuLost) -> GpuInfo:
    notes = (err.note,) if err.note else ()
    return GpuInfo(index, None, None, None, None, None, None, None, lost=True, notes=notes)


def _is_nvml_error(lib: Any, err: BaseException) -> bool:
    nvml_error = getattr(lib, "NVMLError", None)
    return isinstance(nvml_error, type) and isinstance(err, nvml_error)


def _reason(err: BaseException, nvml_error: bool) -> str:
    """A short reason: NVML's own text for NVML errors, ``Type: text`` for anything else."""
    try:
        text = str(err).strip()
    except Exception:  # an exception whose text itself fails
        text = ""
    if nvml_error:
        return text or f"NVML error {_code(err)}"
    name = type(err).__name__
    return f"{name}: {text}" if text else name


def _code(err: BaseException) -> int | None:
    code = getattr(err, "value", None)  # pynvml's NVMLError.value
    return code if isinstance(code, int) else None


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
