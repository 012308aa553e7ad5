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
from dataclasses import dataclass
from typing import Any

from .nvml import GpuLost, Nvml, NvmlUnavailable, ProcessUtilization, ReadingFailed

__all__ = ["DEVICE", "PROCESS", "Utilization", "UtilizationReader", "of_pids"]

PROCESS = "process"  # the pids' own samples
DEVICE = "device"  # the whole GPU's utilization: the driver gives none per process here
PER_DEVICE_NOTE = "per device: the driver gives no per-process utilization on this GPU ({why})"


@dataclass(frozen=True)
class Utilization:
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

    def read(self, indices: Iterable[int]) -> dict[int, ProcessUtilization | str]:
        """Each GPU's samples since the last reading, or the note why they could not be read."""
        found: dict[int, ProcessUtilization | str] = {}
        for index in sorted(set(indices)):
            with self._lock:
                since = self._since.get(index, 0)
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
