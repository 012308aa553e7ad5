"""Memory nobody uses, told to its owner: one line under the next cell a kernel runs after a long pause.

IPython's ``pre_run_cell`` / ``post_run_cell`` hooks, on the user's thread (no thread of ours):
``post_run_cell`` notes when a cell ended; ``pre_run_cell`` of the next one, when at least
``GpuMagics.idle_notice_after`` seconds have passed since, asks the driver which of this kernel's
processes (itself and those it started) hold memory, and, where they hold at least
``GpuMagics.idle_notice_min_memory`` in all, for their utilization samples since that cell ended
(:meth:`~tfgpu_magic.gpus.nvml.Nvml.process_utilization`).  When no sample shows any of them at
work, the cell's ``post_run_cell`` prints one line: what the kernel holds (the driver's figure),
for how long, and what to do (``%gpu free``, and when the server's idle culler shuts it down if
one is configured: the Jupyter server names its culler in the kernel's environment).

The driver keeps a bounded number of samples: what it no longer keeps, it cannot show.  A pause
means no cell ran; a thread or a process of the kernel that used the GPU meanwhile left samples,
unless they are older than the driver keeps.  A GPU without per-process samples (MIG) counts as
idle only when the whole GPU was at 0%.  A reading that fails says nothing (never a guess).  The
cost between two cells close together is one clock reading.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..gpus.utilization import CULLER_ENV  # the server names its culler in the kernels it starts

__all__ = ["CULLER_ENV", "IdleNotice", "Thresholds", "install"]


@dataclass(frozen=True)
class Thresholds:
    after_s: float
    min_bytes: int


class IdleNotice:
    """The hooks of one shell (see the module's doc)."""

    def __init__(
        self,
        session: Any,
        thresholds: Callable[[], Thresholds],
        clock: Callable[[], float] = time.time,
        my_pid: int | None = None,
        env: Any = None,
    ) -> None:
        self._session = session  # its nvml is read at each check: a device source set later is used
        self._thresholds = thresholds
        self._clock = clock
        self._my_pid = os.getpid() if my_pid is None else my_pid
        self._env = os.environ if env is None else env
        self._ended_at: float | None = None  # when the last cell ended (the clock's seconds)
        self._line: str | None = None  # to print under the cell now running

    def pre_run_cell(self, info: Any = None) -> None:
        self._line = None
        ended = self._ended_at
        if ended is None:
            return
        limits = self._thresholds()
        paused = self._clock() - ended
        if paused < limits.after_s:
            return
        try:
            self._line = self._notice(ended, paused, limits)
        except Exception:  # a reading that fails says nothing: never a guess, never the user's error
            self._line = None

    def post_run_cell(self, result: Any = None) -> None:
        self._ended_at = self._clock()
        line, self._line = self._line, None
        if line:
            print(line)

    def _notice(self, ended: float, paused: float, limits: Thresholds) -> str | None:
        from ..gpus.process_tree import read_ancestry
        from ..gpus.utilization import UtilizationReader, idle_since_cell_line, of_pids

        nvml = self._session.nvml
        listed = [p for i in range(nvml.device_count()) for p in nvml.processes(i)]
        parents = read_ancestry(p.pid for p in listed)
        mine = [p for p in listed if self._is_mine(p.pid, parents)]
        held = sum(p.used_memory_bytes or 0 for p in mine)
        if not mine or held < max(limits.min_bytes, 1):
            return None
        gpus = sorted({p.gpu_index for p in mine})
        # samples since the last cell ended, not what came before it
        readings = UtilizationReader(nvml).read(gpus, since_us=int(ended * 1_000_000))
        for index in gpus:
            figure = of_pids(readings.get(index), [p.pid for p in mine if p.gpu_index == index])
            if figure.percent != 0:  # at work, or unknown (None): nothing to say
                return None
        return f"tfgpu_magic: {idle_since_cell_line(held, paused)}{self._culler_deadline(ended, held)}"

    def _is_mine(self, pid: int, parents: dict[int, int]) -> bool:
        """This kernel's process, or one below it (what it started)."""
        seen = 0
        while pid and seen < 64:  # a map read while pids are reused may hold a cycle
            if pid == self._my_pid:
                return True
            pid = parents.get(pid, 0)
            seen += 1
        return False

    def _culler_deadline(self, ended: float, held: int) -> str:
        """``; the idle culler shuts it down at 10:42 UTC if it stays idle``, or "" (no culler, or under its minimum)."""
        parts = str(self._env.get(CULLER_ENV, ""))[:100].split(",")
        try:
            after_s, least = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            return ""
        if not after_s > 0 or held < least:
            return ""
        try:
            at = datetime.fromtimestamp(ended + after_s, tz=timezone.utc).strftime("%H:%M")
        except (OverflowError, OSError, ValueError):
            return ""
        if len(parts) > 2:  # it culls only while a GPU of the kernel runs short of free memory
            return f"; the idle culler may shut it down from {at} UTC if it stays idle and the GPU runs short"
        return f"; the idle culler can shut it down from {at} UTC if it stays idle"


_hooks: dict[int, IdleNotice] = {}


def install(shell: Any, session: Any, thresholds: Callable[[], Thresholds]) -> IdleNotice:
    """Register the hooks on ``shell``; a second call replaces the first."""
    old = _hooks.pop(id(shell), None)
    if old is not None:
        for event, hook in (("pre_run_cell", old.pre_run_cell), ("post_run_cell", old.post_run_cell)):
            try:
                shell.events.unregister(event, hook)
            except ValueError:
                pass
    notice = IdleNotice(session, thresholds)
    shell.events.register("pre_run_cell", notice.pre_run_cell)
    shell.events.register("post_run_cell", notice.post_run_cell)
    _hooks[id(shell)] = notice
    return notice
