"""How busy processes keep the GPUs since the last reading: NVML's process utilization samples.

The driver samples each process's share of a GPU's time a few times a second while it runs work
there, and keeps the recent samples; :meth:`Nvml.process_utilization` returns those newer than a
timestamp.  A :class:`UtilizationReader` (one per reader: the server's status source, a kernel)
remembers per GPU the newest sample it saw, so each reading covers the time since its previous
one, as far back as the driver still keeps samples.  A process without a sample ran nothing on
that GPU in the window: 0%.  Where the driver gives no per-process samples (a GPU in MIG mode, an
old driver) the figure is the GPU's own, everyone's together, and says so (``scope`` "device").
Every figure is the driver's.  One NVML call per GPU read; read only the GPUs someone asks about.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from ..command.units import format_bytes
from ..records import Record
from .nvml import GpuLost, Nvml, NvmlUnavailable, ProcessUtilization, ReadingFailed

__all__ = [
    "CULLER_ENV",
    "DEVICE",
    "PROCESS",
    "Utilization",
    "UtilizationReader",
    "idle_line",
    "of_pids",
    "span_text",
]

PROCESS = "process"  # the pids' own samples
DEVICE = "device"  # the whole GPU's utilization: the driver gives none per process here
# Set by the Jupyter server extension in the kernels it starts while its idle culler is on:
# "<idle seconds>,<least bytes>[,<free below bytes>]" (TfgpuMagic.cull_idle_gpu_kernels_after,
# cull_min_gpu_memory, cull_only_when_free_below), for the kernel's idle notice (kernel/idle_notice).
# The culler counts idle time from the kernel's last activity, no earlier than its last cell's end:
# the time the kernel says is the earliest it can act.
CULLER_ENV = "TFGPU_MAGIC_CULLER"
PER_DEVICE_NOTE = "per device: the driver gives no per-process utilization on this GPU ({why})"


class Utilization(Record):
    """Some processes' utilization of one GPU, percent (the driver's); None: unknown, ``note`` says why."""

    percent: int | None
    scope: str  # PROCESS or DEVICE
    note: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"percent": self.percent, "scope": self.scope, "note": self.note}


class UtilizationReader:
    """Reads GPUs' process utilization, each reading since this reader's previous one of that GPU."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._since: dict[int, int] = {}  # GPU index -> the newest sample seen (microseconds)
        self._lock = threading.Lock()  # held over no call that can call back: only the dict's update

    def read(
        self, indices: Iterable[int], since_us: int | None = None
    ) -> dict[int, ProcessUtilization | str]:
        """Each GPU's samples since the last reading (or since ``since_us``, microseconds of the
        clock NVML stamps samples with: Unix time), or the note why they could not be read."""
        found: dict[int, ProcessUtilization | str] = {}
        for index in sorted(set(indices)):
            with self._lock:
                since = self._since.get(index, 0) if since_us is None else since_us
            try:
                reading = self._nvml.process_utilization(index, since)
            except (GpuLost, ReadingFailed, NvmlUnavailable) as err:
                found[index] = getattr(err, "note", None) or str(err)
                continue
            with self._lock:
                self._since[index] = max(self._since.get(index, 0), reading.latest_us)
            found[index] = reading
        return found

    def since_us(self, index: int) -> int | None:
        """The newest sample this reader has seen on a GPU (None: none yet)."""
        with self._lock:
            return self._since.get(index)


def of_pids(reading: ProcessUtilization | str | None, pids: Iterable[int]) -> Utilization:
    """The busiest of ``pids`` on the GPU of ``reading`` (a note: unknown, with that note)."""
    if reading is None:
        return Utilization(None, PROCESS, "not read")
    if isinstance(reading, str):
        return Utilization(None, PROCESS, f"the utilization could not be read ({reading})")
    if reading.per_device:
        return Utilization(reading.device_percent, DEVICE, PER_DEVICE_NOTE.format(why=reading.note))
    return Utilization(reading.percent_of(pids), PROCESS)


def idle_line(held_bytes: int, idle_s: float) -> str:
    """The one line a kernel's notebook shows when it holds memory it does not use (the panel, the
    status bar): what it holds, for how long, what to do.  The server's readings followed it the
    whole time; under a cell the kernel says :func:`idle_since_cell_line`."""
    return (
        f"This kernel has held {format_bytes(held_bytes)} of GPU memory (the driver's figure) at 0% GPU "
        f"utilization for {span_text(idle_s)}: `%gpu free` gives it back to your colleagues"
    )


def idle_since_cell_line(held_bytes: int, since_s: float) -> str:
    """The line under a cell: the kernel read the driver's samples only now, and the driver keeps
    a bounded number of them, so it says what they show since the last cell ended, not that the
    whole pause was idle."""
    return (
        f"This kernel holds {format_bytes(held_bytes)} of GPU memory (the driver's figure) and the driver's "
        f"samples show no GPU work by it since its last cell ended, {span_text(since_s)} ago: "
        "`%gpu free` gives it back to your colleagues"
    )


def span_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 5 min``."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"
