"""The sampler behind ``%gpu monitor``: one background thread per kernel, shared by all panels.

Sampling runs on its own thread, never on the kernel's event loop, so a panel keeps moving
while a long cell (``model.fit``) holds the kernel.  The sources are injected (an ``Nvml``, and
plain callables for TensorFlow's allocator statistics, the configured limits and the visible
GPUs), so tests, benchmarks and the GPU machine drive the same code without IPython or
TensorFlow.  This module imports neither; the widget lives in :mod:`tfgpu_magic.widget`.

Readings are bytes.  A reading that failed is ``None`` (drawn as a gap), never 0.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .holdings import tf_by_gpu
from .nvml import GpuLost, Nvml, NvmlUnavailable
from .tf_runtime import Stage

__all__ = [
    "DeviceSample",
    "Hub",
    "Sample",
    "Sampler",
    "MIN_INTERVAL_S",
    "active_sampler",
    "open_panel",
    "sampler_running",
    "stop_panels",
]

MIN_INTERVAL_S = 0.1  # NVML itself refreshes memory readings about this often
SLOW_SOURCES_S = 2.0  # limits, visible GPUs, TF numbering: configuration, re-read this often
MAX_HISTORY = 6000  # samples kept in Python whatever the window: bounds memory (8 GPUs: ~5 MB)
THREAD_NAME = "tfgpu-monitor"

TfStats = Callable[[], Mapping[str, Any]]  # "GPU:0" -> object with current_bytes, peak_bytes
TfMap = Callable[[], Mapping[str, int]]  # "GPU:0" -> NVML index
Limits = Callable[[], Mapping[int, int]]  # NVML index -> configured cap, bytes
Visible = Callable[[], Optional[list[int]]]  # NVML indices this kernel sees; None = all


@dataclass(frozen=True, slots=True)  # slots: thousands are kept in history
class DeviceSample:
    """One device at one instant.  Every reading in bytes; None = missing (a gap)."""

    key: str  # "gpu0" for NVML GPU 0; "tf:CPU:0" for a TensorFlow device NVML does not know
    label: str  # what the panel titles the chart with
    total_bytes: Optional[int] = None
    used_bytes: Optional[int] = None  # by every process on the GPU
    mine_bytes: Optional[int] = None  # by this kernel's process
    tf_in_use_bytes: Optional[int] = None  # TensorFlow's allocator, inside what this kernel holds
    tf_peak_bytes: Optional[int] = None
    limit_bytes: Optional[int] = None  # the configured per-GPU cap
    error: Optional[str] = None  # why readings are missing, shown in the panel


@dataclass(frozen=True, slots=True)
class Sample:
    time_s: float  # Unix time, seconds
    devices: tuple[DeviceSample, ...]
    status: Optional[str] = None  # a panel-wide message, e.g. "no NVIDIA GPU"


def _no_stats() -> dict:
    return {}


def _no_visible() -> None:
    return None


class Sampler:
    """Reads every device once per ``interval`` seconds on a daemon thread.

    ``tick()`` takes one sample synchronously (what the thread calls; tests call it too).
    Listeners are called on the sampler thread with each new :class:`Sample`.
    """

    def __init__(
        self,
        nvml: Nvml,
        my_pid: Optional[int] = None,
        *,
        tf_stats: TfStats = _no_stats,
        tf_map: TfMap = _no_stats,
        limits: Limits = _no_stats,
        visible: Visible = _no_visible,
        interval: float = 0.5,
        keep_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.my_pid = os.getpid() if my_pid is None else my_pid
        self._tf_stats, self._tf_map = tf_stats, tf_map
        self._limits, self._visible = limits, visible
        self._clock = clock
        self._interval = _checked_interval(interval)
        self._keep_s = float(keep_s)
        self._lock = threading.Lock()  # guards history and listeners
        self.history: deque[Sample] = deque(maxlen=self._history_len())
        self._listeners: list[Callable[[Sample], None]] = []
        # Configuration sources may read every GPU in full; they change rarely, so they are
        # re-read every SLOW_SOURCES_S rather than on every tick: (monotonic time, values).
        self._slow: Optional[tuple[float, tuple[Any, ...]]] = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- settings -------------------------------------------------------------------------
    @property
    def interval(self) -> float:
        return self._interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        self._interval = _checked_interval(seconds)
        self._resize_history()
        self._wake.set()  # a long sleep should not delay a shorter new interval

    def keep(self, seconds: float) -> None:
        """Keep at least ``seconds`` of history (the widest window of the open panels)."""
        self._keep_s = max(float(seconds), 1.0)
        self._resize_history()

    def _history_len(self) -> int:
        return min(MAX_HISTORY, math.ceil(self._keep_s / self._interval) + 2)

    def _resize_history(self) -> None:
        with self._lock:
            if self.history.maxlen != self._history_len():
                self.history = deque(self.history, maxlen=self._history_len())

    # -- listeners and history --------------------------------------------------------------
    def subscribe(self, listener: Callable[[Sample], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[Sample], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.history)

    # -- the thread -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it, so no sampler outlives its last panel."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stopping.is_set():
            self.tick()
            # Sleep to a deadline rather than for `interval`, so ticks do not drift by the
            # time a reading takes; after a stall (suspended VM) restart from now.
            deadline = max(deadline + self._interval, time.monotonic())
            self._wake.wait(max(deadline - time.monotonic(), 0.0))
            if self._wake.is_set():
                self._wake.clear()
                deadline = time.monotonic()

    def tick(self) -> Sample:
        sample = self.read()
        with self._lock:
            self.history.append(sample)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(sample)
            except Exception:  # a broken panel must not stop the others' sampling
                pass
        return sample

    # -- one reading ------------------------------------------------------------------------
    def read(self) -> Sample:
        now = self._clock()
        status = None
        tf_stats, tf_note = _guarded(self._tf_stats, "TensorFlow's allocator statistics", {})
        tf_map, map_note, limits, limit_note, visible = self._configuration()
        by_index = tf_by_gpu(tf_stats, tf_map)  # summed over logical GPUs, as `%gpu` shows it
        try:
            count = self.nvml.device_count()
            indices = [i for i in range(count) if visible is None or i in visible]
        except NvmlUnavailable as err:
            indices = []
            status = f"No NVIDIA GPU to chart: {err}"
        devices = [self._read_gpu(i, by_index.get(i), limits.get(i)) for i in indices]
        mapped = {name for name, index in tf_map.items() if index in indices}
        devices += [_tf_only(name, stats) for name, stats in tf_stats.items() if name not in mapped]
        notes = [n for n in (status, tf_note, map_note, limit_note) if n]
        return Sample(now, tuple(devices), "; ".join(notes) or None)

    def _configuration(self) -> tuple[Any, ...]:
        now = time.monotonic()
        if self._slow is None or now - self._slow[0] >= SLOW_SOURCES_S:
            tf_map, map_note = _guarded(self._tf_map, "TensorFlow's GPU numbering", {})
            limits, limit_note = _guarded(self._limits, "the configured limits", {})
            visible, _ = _guarded(self._visible, "the visible GPUs", None)  # unknown: show all
            self._slow = (now, (tf_map, map_note, limits, limit_note, visible))
        return self._slow[1]

    def _read_gpu(self, index: int, tf: Optional[tuple[int, int]], limit: Optional[int]) -> DeviceSample:
        base = dict(
            key=f"gpu{index}",
            label=self._label(index),
            limit_bytes=limit,
            tf_in_use_bytes=tf[0] if tf else None,
            tf_peak_bytes=tf[1] if tf else None,
        )
        try:
            memory = self.nvml.memory(index)
        except GpuLost as err:
            return DeviceSample(**base, error=f"{err}; the chart resumes if it answers again")
        except Exception as err:  # NVMLError: not supported, no permission, ...
            return DeviceSample(**base, error=f"GPU {index}: memory reading failed ({err})")
        mine, note = self._mine(index)
        return DeviceSample(
            **base,
            total_bytes=memory.total_bytes,
            used_bytes=memory.used_bytes,
            mine_bytes=mine,
            error=note,
        )

    def _mine(self, index: int) -> tuple[Optional[int], Optional[str]]:
        """Bytes this kernel's process holds on the GPU; None when NVML cannot say."""
        try:
            processes = self.nvml.processes(index)
        except Exception as err:
            return None, f"GPU {index}: process list failed ({err})"
        held = [p.used_memory_bytes for p in processes if p.pid == self.my_pid]
        if any(b is None for b in held):
            return None, f"GPU {index}: NVML cannot say how much this kernel holds"
        return sum(held), None  # not listed: this kernel holds nothing there, a true 0

    def _label(self, index: int) -> str:
        try:
            name = self.nvml.name(index)  # read once by Nvml; a lost GPU is asked again next tick
        except Exception:
            name = None
        return f"GPU {index} · {name}" if name else f"GPU {index}"


def _checked_interval(seconds: float) -> float:
    seconds = float(seconds)
    if not seconds >= MIN_INTERVAL_S:  # also rejects NaN
        raise ValueError(f"interval must be at least {MIN_INTERVAL_S} s, got {seconds!r}")
    return seconds


def _guarded(read: Callable[[], Any], what: str, empty: Any) -> tuple[Any, Optional[str]]:
    """A source's reading, or ``empty`` and a note: one failing source stops nothing."""
    try:
        return read(), None
    except Exception as err:
        return empty, f"{what} could not be read ({type(err).__name__}: {err})"


def _attr(obj: Any, name: str) -> Optional[int]:
    value = getattr(obj, name, None)
    return None if value is None else int(value)


def _tf_only(name: str, stats: Any) -> DeviceSample:
    """A TensorFlow device NVML does not show (CPU:0, or any device without a driver)."""
    return DeviceSample(
        key=f"tf:{name}",
        label=f"TensorFlow {name}",
        tf_in_use_bytes=_attr(stats, "current_bytes"),
        tf_peak_bytes=_attr(stats, "peak_bytes"),
    )


class Hub:
    """The one sampler of this kernel, shared by every open panel.

    The first panel starts it; it stops when the last panel leaves (or at exit).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sampler: Optional[Sampler] = None
        self._members: dict[int, float] = {}  # id(panel) -> that panel's window, seconds
        self._panels: dict[int, Any] = {}  # id(panel) -> panel, for `%gpu monitor off`

    @property
    def sampler(self) -> Optional[Sampler]:
        return self._sampler

    def join(self, member: object, make: Callable[[], Sampler], window_s: float) -> Sampler:
        with self._lock:
            if self._sampler is None:
                self._sampler = make()
            self._members[id(member)] = window_s
            self._panels[id(member)] = member
            self._sampler.keep(max(self._members.values()))
            self._sampler.start()
            return self._sampler

    def set_window(self, member: object, window_s: float) -> None:
        with self._lock:
            if id(member) in self._members and self._sampler is not None:
                self._members[id(member)] = window_s
                self._sampler.keep(max(self._members.values()))

    def leave(self, member: object) -> None:
        with self._lock:
            self._members.pop(id(member), None)
            self._panels.pop(id(member), None)
            if self._members or self._sampler is None:
                return
            sampler, self._sampler = self._sampler, None
        sampler.stop()  # outside the lock: the thread may be calling a panel that leaves

    def members(self) -> list[Any]:
        with self._lock:
            return list(self._panels.values())

    def stop_all(self) -> None:
        with self._lock:
            self._members.clear()
            self._panels.clear()
            sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()


_hub = Hub()
atexit.register(_hub.stop_all)


def active_sampler() -> Optional[Sampler]:
    """This kernel's sampler, or None when no panel is open."""
    return _hub.sampler


def stop_panels() -> str:
    """``%gpu monitor off``: stop every panel of this kernel; the sampler's thread ends with them."""
    panels = _hub.members()
    for panel in panels:
        stop = getattr(panel, "stop", None)
        if stop is not None:
            stop()  # a panel leaves the hub; its chart stays on screen, frozen
    _hub.stop_all()  # members that are not panels (tests) go too
    if not panels:
        return "No memory panel is running in this kernel."
    count = "1 memory panel" if len(panels) == 1 else f"{len(panels)} memory panels"
    return f"Stopped {count}; the sampling thread has ended. `%gpu monitor` starts a new one."


def sampler_running() -> bool:
    """True while this kernel's sampler thread is alive (any thread of that name counts)."""
    return any(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())


def open_panel(
    interval: float = 0.5,
    window: float = 300.0,
    sidebar: bool = False,
    *,
    nvml: Optional[Nvml] = None,
    display: bool = True,
    session: Any = None,
    **sources: Callable[[], Any],
) -> Any:
    """Show a live memory panel (what ``%gpu monitor`` runs) and return it.

    ``session`` is the kernel's :class:`~tfgpu_magic.session.Session` (the magic passes its
    own; by default the process's).  ``nvml`` replaces its NVML reader (a simulated one in
    tests and tutorials), and
    ``sources`` any of the other readers (``tf_stats``, ``tf_map``, ``limits``, ``visible``;
    see :class:`Sampler`).  The first panel's sources serve every panel while the sampler
    runs; the newest panel's interval applies to all of them.
    """
    unknown = set(sources) - {"tf_stats", "tf_map", "limits", "visible"}
    if unknown:
        raise TypeError(f"open_panel() got unknown sources: {', '.join(sorted(unknown))}")
    from .widget import MemoryPanel  # IPython, ipywidgets and anywidget only when a panel opens

    _checked_interval(interval)

    def make() -> Sampler:  # called only when no sampler runs yet
        return Sampler(interval=interval, keep_s=window, **{**_kernel_sources(session, nvml), **sources})

    panel = MemoryPanel(_hub, make, interval=interval, window=window)
    if display:
        _show(panel, sidebar)
    return panel


def _kernel_sources(session: Any, nvml: Optional[Nvml]) -> dict[str, Any]:
    """The real sources: the session's machine and TensorFlow's allocator (never starting it).

    The sampler thread calls these: they read only what TensorFlow's adapter has published
    from the importing thread, so sampling never imports anything (see tf_runtime).  A given
    ``nvml`` (a simulated server) shows all its GPUs: the session's visible indices belong to
    the real one.
    """
    if session is None:
        from .session import get_session

        session = get_session()
    tf = session.tf

    def tf_map() -> Mapping[str, int]:
        if tf.stage() < Stage.ENUMERATED:
            return {}  # before enumeration the numbering would read every GPU for nothing
        return session.gpu_by_tf_name()

    return dict(
        nvml=session.nvml if nvml is None else nvml,
        tf_stats=tf.allocator_stats,
        tf_map=tf_map,
        limits=session.limit_bytes_by_gpu,
        visible=session.visible_gpus if nvml is None else _no_visible,
    )


def _show(panel: Any, sidebar: bool) -> None:
    from IPython.display import display

    if not sidebar:
        display(panel)
        return
    from sidecar import Sidecar

    side = Sidecar(title="GPU memory")
    with side:
        display(panel)
    panel.sidecar = side  # keep it, so closing the panel can close the tab too

