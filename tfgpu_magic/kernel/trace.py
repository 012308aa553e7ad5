"""``%gpu trace``: after each cell, each started framework's allocator peak and retained change per device.

The readings are the frameworks' own allocator figures (TensorFlow's ``get_memory_info``,
PyTorch's caching allocator, JAX's ``memory_stats``), so they are exact for this kernel and blind
to other processes.  Tracing never starts a framework and stays silent until one has started.
Each adapter says what its trace needs and how its devices are named (the ``trace_*`` methods of
:class:`~tfgpu_magic.frameworks.base.Framework`): where no GPU is visible TensorFlow's CPU
allocator is traced, which keeps statistics only when ``TF_CPU_ALLOCATOR_USE_BFC=true`` was set
before TensorFlow's first op; ``%gpu trace`` has TensorFlow's adapter set it when it is early
enough and no GPU will be visible.  This module names no framework: it loops over the adapters.

The hooks take IPython's event signatures (``pre_run_cell(info)``, ``post_run_cell(result)``)
and never break a cell: a failure is reported once on stderr and tracing goes on.

One line set per notebook cell: ``%%capture`` (and any code calling ``shell.run_cell``) runs its
body as a cell of its own, whose events fire inside the capture.  A line printed there would land
in the captured text (``json.loads(captured.stdout)`` then fails), so cells nested in a cell are
not reported: the outer cell's line, printed after the capture has ended, includes them.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from ..command.units import format_change, format_size
from ..frameworks.base import PeakReading, PeakWindow, Stage

__all__ = [
    "Tracer",
    "enable_cpu_stats",
    "format_line",
    "format_reading",
    "set_tracing",
]

PREFIX = "[gpu trace]"
_tracers: weakref.WeakKeyDictionary[Any, Tracer] = weakref.WeakKeyDictionary()


def set_tracing(shell: Any, session: Any, on: bool) -> str:
    """``%gpu trace`` / ``%gpu trace off``: install or remove the hooks; returns the answer."""
    tracer = _tracers.get(shell)
    if not on:
        if tracer is None or not tracer.active:
            return "tracing is already off"
        tracer.stop()
        return "tracing off"
    if tracer is None:
        tracer = _tracers[shell] = Tracer(shell, session)
    tracer.session = session  # the shell's magic may have been given a new session
    was_active = tracer.active
    tracer.start()
    return ("tracing is already on" if was_active else "tracing on") + ": " + _what_is_traced(session)


def _what_is_traced(session: Any) -> str:
    """What the trace will show, and what the user must do if it cannot show anything.

    The first framework with words of its own (TensorFlow) speaks, if it is imported, or is among
    those named (imported, else installed), or none is; the others named follow it.  Otherwise the
    frameworks named are listed.
    """
    frameworks = tuple(session.frameworks())
    imported = [f for f in frameworks if f.stage() is not Stage.NOT_IMPORTED]
    named = imported or [f for f in frameworks if f.installed()]
    for framework in frameworks:
        if named and framework not in named:
            continue
        reply = framework.trace_reply(
            session.env, session.visible_gpus, lambda d, f=framework: _label(f, d, session)
        )
        if reply is None:
            continue
        if framework.stage() is Stage.NOT_IMPORTED:
            others = [f.name for f in named if f is not framework]
        else:  # the others the user works with: imported (where that says so), or started
            others = [f.name for f in frameworks if f is not framework and _in_use(f)]
        if others:
            reply += f"; also the allocator of {' and '.join(others)} on each GPU, once started"
        return reply
    names = " and ".join(f.name for f in named)
    return f"after each cell, the allocator peak and retained change of {names} on each GPU, once started"


def _in_use(framework: Any) -> bool:
    stage = framework.stage()
    return stage is Stage.STARTED or (stage is not Stage.NOT_IMPORTED and not framework.import_says_little)


def enable_cpu_stats(session: Any) -> bool | None:
    """Before start-up with no GPU to be visible: have each framework's allocator keep figures.

    True when an adapter set its variable now (TensorFlow's ``TF_CPU_ALLOCATOR_USE_BFC=true``),
    False when it was set already, None when nothing applies (GPUs will be traced, or too late).
    """
    for framework in session.frameworks():
        answer = framework.trace_ready(session.env, session.visible_gpus)
        if answer is not None:
            return answer
    return None


def _label(framework: Any, device: str, session: Any) -> str:
    """The framework's name for ``device``, with nvidia-smi's number first where it maps to one."""
    try:
        gpu = framework.gpu_numbering(session.machine.cuda_map()).get(device)
    except Exception:  # no mapping: the framework's own name alone
        gpu = None
    return framework.trace_label(device, gpu)


class Tracer:
    """The pair of IPython hooks for one shell."""

    def __init__(self, shell: Any, session: Any, out: Any = None) -> None:
        self.shell = shell
        self.session = session
        self.out = out  # None: sys.stdout at the time of printing (IPython swaps it)
        self.active = False
        # One window per framework (its key); None for one not imported when the cell began:
        # if it starts during the cell, everything it holds was taken in the cell.
        self._windows: dict[str, PeakWindow | None] = {}
        self._started_at: float | None = None
        self._warned: set[str] = set()
        self._cells: list[Any] = []  # the ExecutionInfo of each cell running, outermost first

    def start(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self.active = True

    def stop(self) -> None:
        for framework in self.session.frameworks():
            try:
                framework.trace_stopped()  # untraced, each allocator stays its framework's choice
            except Exception as err:
                self._failed(err, f"{framework.name}'s")
        self.shell.events.unregister("pre_run_cell", self.pre_run_cell)
        self.shell.events.unregister("post_run_cell", self.post_run_cell)
        self.active = False
        self._cells.clear()
        self._close()

    def pre_run_cell(self, info: Any = None) -> None:
        self._cells.append(info)
        if len(self._cells) > 1:  # a cell run inside a cell (%%capture's body): the outer one reports
            return
        self._close()
        self._started_at = time.perf_counter()
        for framework in self.session.frameworks():
            imported = framework.stage() is not Stage.NOT_IMPORTED
            try:
                self._windows[framework.key] = framework.open_peak_window() if imported else None
            except Exception as err:  # never break the user's cell; this framework goes untraced
                self._windows.pop(framework.key, None)
                self._failed(err, f"{framework.name}'s")

    def post_run_cell(self, result: Any = None) -> None:
        if not self._ended(result) or self._cells:  # not one we saw begin, or still inside one
            return
        if self._started_at is None:
            return
        try:
            seconds = time.perf_counter() - self._started_at
            lines = self.lines(seconds)
            if lines:
                print("\n".join(lines), file=self.out or sys.stdout)
        except Exception as err:
            self._failed(err)
        finally:
            self._close()

    def _ended(self, result: Any) -> bool:
        """Forget the cell that ``result`` ends; False for a cell whose start was not seen.

        IPython announces a blank cell only at its end, and the cell that turned tracing on
        began before the hooks were there.  ``result.info`` is the object ``pre_run_cell`` got.
        """
        info = getattr(result, "info", None)
        if info is None:  # no ExecutionInfo to match (a caller of our own): the innermost ends
            if not self._cells:
                return False
            self._cells.pop()
            return True
        for depth in range(len(self._cells) - 1, -1, -1):
            if self._cells[depth] is info:
                del self._cells[depth:]  # and any inner cell whose end never came
                return True
        return False

    def lines(self, seconds: float) -> list[str]:
        """The report for the cell that just ran (empty until a framework has started)."""
        if not self._windows:
            return []
        lines: list[str] = []
        for framework in self.session.frameworks():
            if framework.stage() is not Stage.STARTED:
                continue
            if framework.key not in self._windows:  # its window could not be opened (said once)
                continue
            window = self._windows.get(framework.key)
            try:
                readings = window.peaks() if window is not None else readings_since_start(framework)
            except Exception as err:  # one framework's fault is a note; the others are still reported
                self._failed(err, f"{framework.name}'s")
                continue
            if framework.no_gpu_diagnosed:
                lines += self._no_gpu_line(framework, tracing_cpu=bool(readings))
            if not readings:
                absent = framework.trace_absent()
                lines += self._once(f"no-stats:{framework.key}", f"{PREFIX} {absent}") if absent else []
                continue
            lines += [
                format_reading(_label(framework, device, self.session), reading, seconds, framework.name)
                for device, reading in readings.items()
            ]
        return lines

    def _no_gpu_line(self, framework: Any, tracing_cpu: bool) -> list[str]:
        """Once: why the framework found no GPU although the driver lists some for this kernel."""
        if "no-gpu" in self._warned:
            return []
        diagnosis = framework.no_gpu_diagnosis(self.session.view(framework))
        if diagnosis is None:
            return []
        also = f"; tracing {framework.name}'s CPU allocator" if tracing_cpu else ""
        return self._once("no-gpu", f"{PREFIX} {diagnosis.line()}{also}")

    def _once(self, key: str, line: str) -> list[str]:
        if key in self._warned:
            return []
        self._warned.add(key)
        return [line]

    def _close(self) -> None:
        for window in self._windows.values():
            if window is not None:
                window.close()
        self._windows, self._started_at = {}, None

    def _failed(self, err: Exception, whose: str = "a framework's") -> None:
        if "failed" not in self._warned:
            self._warned.add("failed")
            print(
                f"tfgpu_magic: `%gpu trace` could not read {whose} allocator ({err!r}); "
                "the cell itself is unaffected",
                file=sys.stderr,
            )


def format_line(label: str, start: int, stats: Any, seconds: float) -> str:
    """``[gpu trace] CPU:0: peak 68 MiB (+64 MiB in this cell), retained +64 MiB, 0.31 s``."""
    return format_reading(label, PeakReading(start, stats.current_bytes, stats.peak_bytes), seconds)


def format_reading(label: str, reading: PeakReading, seconds: float, whose: str = "the framework") -> str:
    """One device's line; a peak that cannot be reset (JAX's) is shown as the bound it is, with
    ``whose`` it is."""
    retained = format_change(reading.start_bytes, reading.now_bytes, format_size)
    if reading.exact:
        rise = reading.peak_bytes - reading.start_bytes
        peak = f"peak {format_size(reading.peak_bytes)} (+{format_size(rise)} in this cell)"
    else:
        peak = f"peak at most {format_size(reading.peak_bytes)} ({whose} cannot reset its peak: the highest since it started)"
    return f"{PREFIX} {label}: {peak}, retained {retained}, {seconds:.2f} s"


def readings_since_start(framework: Any) -> dict[str, PeakReading]:
    """A framework that started during the cell: all it holds, and its peak, came in the cell."""
    return {d: PeakReading(0, m.in_use_bytes, m.peak_bytes) for d, m in framework.device_memory().items()}
