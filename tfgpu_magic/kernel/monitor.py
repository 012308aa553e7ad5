"""The sampler behind ``%gpu monitor``: one background thread per kernel, shared by all panels.

Sampling runs on its own thread, never on the kernel's event loop, so a panel keeps moving
while a long cell (``model.fit``) holds the kernel.  The sources are injected (an ``Nvml``, and
plain callables for the frameworks' allocator figures, the configured limits and the visible
GPUs), so tests, benchmarks and the GPU machine drive the same code without IPython or a
framework.  This module imports neither, nor the widget (:mod:`tfgpu_magic.kernel.widget`), which
imports it: :mod:`tfgpu_magic.kernel.panels` opens a panel by joining the two.

The thread reads NVML only.  The frameworks' allocator figures are read on the user's thread,
after each cell and at every ``%gpu`` (:mod:`tfgpu_magic.kernel.allocator_figures`); the thread
takes the latest published snapshot and never calls into a framework.

Readings are bytes.  A reading that failed is ``None`` (drawn as a gap), never 0.

A tick reads each GPU's memory (utilization too where the driver keeps no samples of it); its
process lists (for this kernel's share) only when its used memory moved since they were last
read, or they are ``LISTING_MAX_AGE_S`` old; and keeps what NVML answered, as it answered it.
The readings are packed into the history's samples later, together, while the code is warm: by
whoever reads the history first (:meth:`Sampler.latest`, :meth:`Sampler.snapshot`), or at the
hand-on.  Once every ``HAND_ON_S`` the samples taken since get their utilization from the
driver's sample buffer and are handed to the panels together, and the sources besides NVML
(allocator figures, limits, visible GPUs) are read again for the next ticks.

At most one sampler thread runs per kernel: a stop that finds the thread inside a slow
reading (a hung NVML call) says so, and a new panel takes that thread back rather than start
a second one beside it.
"""

from __future__ import annotations

import atexit
import bisect
import math
import operator
import os
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..gpus.nvml import GpuLost, Nvml, NvmlUnavailable
from .allocator_figures import NOTHING_READ, AllocatorFigures, FigureSeries

__all__ = [
    "DEFAULT_INTERVAL_S",
    "MAX_HISTORY",
    "MAX_INTERVAL_S",
    "MAX_WINDOW_S",
    "MIN_INTERVAL_S",
    "DeviceSample",
    "Hub",
    "Sample",
    "Sampler",
    "active_sampler",
    "hub",
    "sampler_running",
    "stop_panels",
]

DEFAULT_INTERVAL_S = 0.5  # a panel opened while none runs, without --interval
MIN_INTERVAL_S = 0.1  # NVML itself refreshes memory readings about this often
MAX_INTERVAL_S = 60.0  # `%gpu monitor --interval` allows 0.1 s to 60 s
MAX_WINDOW_S = 24 * 3600.0  # `%gpu monitor --window` allows up to 24 h
SLOW_SOURCES_S = 2.0  # limits, visible GPUs: configuration, re-read this often
# A GPU's process lists (NVML's costliest calls, two per GPU) are read again only when its used
# memory changed since the last listing, which this kernel allocating or freeing always does, or
# when that listing is this old: the GPU's used memory and the per-process figures are separate
# readings that need not move together, and another process may free just what this kernel took
# within one tick, leaving "used" as it was.  2 s, as for the configuration above: the figure for
# this kernel is then never staler than the limits shown beside it.
LISTING_MAX_AGE_S = 2.0
# The thread reads NVML on every tick and hands its samples on (their utilization filled, given
# to the panels) once this often: filling, comparing and sending then run once for twenty
# samples at 0.1 s, warm, instead of after each sleep, when the caches are cold and every first
# touch costs several times its warm cost.  A panel sends one message a hand-on at most
# (widget.MAX_MESSAGES_PER_S): a comm message costs the kernel about a millisecond of CPU over
# three threads whatever it holds, a tenth of the monitor's whole cost at 10 Hz when sent every
# second (measured 2026-11-27, docs/performance.md).  The chart moves every 2 s, each point at
# its own time; a panel that opens, or a sampler started again, shows its first reading at once.
HAND_ON_S = 2.0
# A GPU's utilization comes from the driver's own buffer of samples (Nvml.utilization_samples),
# read at each hand-on: one NVML call a hand-on instead of one a tick.  A tick's utilization is
# the newest sample taken at or before it, if no older than this (the driver samples every 1/6 s
# to 1 s); a GPU whose driver keeps no samples, or stamps them with a clock that is not this
# sampler's, is read each tick instead (nvmlDeviceGetUtilizationRates, the newest sample).
UTILIZATION_SAMPLE_MAX_AGE_S = 2.0
# Sleeps this short are time.sleep, which a stop or a new interval waits out (see Sampler._sleep_until).
SHORT_SLEEP_S = 0.25
STOP_WAIT_S = 5.0  # how long a stop waits for a reading in progress before saying it still runs
# Samples kept in the kernel whatever the window (10 min at 0.1 s, 50 min at the default 0.5 s),
# packed (see _Stored).  Measured 2026-11-22 on a 2-core Intel Xeon VM, CPython 3.11.7, Linux
# x86_64, with tracemalloc and with a sys.getsizeof walk (they agree): a full history of 8 GPUs
# whose every reading changes on every tick held 3.25 MiB, about 70 bytes per GPU per sample;
# with GPU utilization kept too (7 readings per GPU) 3.62 MiB, about 79 bytes (2026-11-22, the
# sys.getsizeof walk of tests/test_panel_history.py only, which holds the code to it).  With the
# frameworks' allocator figures read anew for every sample too (their read time is then one more
# float per sample; after each cell in a real kernel) 3.85 MiB (2026-11-26, the same walk, same
# VM).  Kept as DeviceSample objects it held 19 MiB.
MAX_HISTORY = 6000
THREAD_NAME = "tfgpu-monitor"

Figures = Callable[[], AllocatorFigures]  # the latest snapshot published on the user's thread
Limits = Callable[[], Mapping[int, int]]  # NVML index -> configured cap, bytes
Visible = Callable[[], list[int] | None]  # NVML indices this kernel sees; None = all


@dataclass(frozen=True, slots=True)  # slots: thousands are kept in history
class DeviceSample:
    """One device at one instant.  Every reading in bytes; None = missing (a gap)."""

    key: str  # "gpu0" for NVML GPU 0; "tensorflow:CPU:0" for a framework's device NVML does not know
    label: str  # what the panel titles the chart with
    total_bytes: int | None = None
    used_bytes: int | None = None  # by every process on the GPU
    mine_bytes: int | None = None  # by this kernel's process
    # TensorFlow's allocator, inside what this kernel holds: a stable wire field, filled from the
    # figure whose adapter names it (ChartedFigure.wire_field); also under ``figures``.
    tf_in_use_bytes: int | None = None
    tf_peak_bytes: int | None = None
    limit_bytes: int | None = None  # the configured per-GPU cap
    error: str | None = None  # why readings are missing, shown in the panel
    # NVML's GPU utilization, percent; last so that positional construction above stays valid.
    utilization_percent: int | None = None
    # Every framework's allocator figures on this device: (framework key, series, bytes or None),
    # summed over the framework's devices on one GPU (TensorFlow's logical GPUs), as read last.
    figures: tuple[tuple[str, str, int | None], ...] = ()


@dataclass(frozen=True, slots=True)
class Sample:
    time_s: float  # Unix time, seconds
    devices: tuple[DeviceSample, ...]
    status: str | None = None  # a panel-wide message, e.g. "no NVIDIA GPU"
    # The frameworks' allocator figures, as last published on the user's thread: the series
    # present (the legend's names), when they were read, and why a framework has none.
    series: tuple[FigureSeries, ...] = ()
    figures_read_at: float | None = None
    figure_notes: tuple[str, ...] = ()


# The readings of a DeviceSample (all ints, packed into one int64 array per sample), before its
# figures.  The older fields that figures fill (tf_in_use_bytes) are not packed: unpacking fills
# them again from the figures, as the sampler did (FigureSeries.wire_field).
_READINGS = (
    "total_bytes",
    "used_bytes",
    "mine_bytes",
    "limit_bytes",
    "utilization_percent",
)
_GAP = -(2**63)  # a missing reading in the packed array (readings are bytes, never negative)
_readings_of = operator.attrgetter(*_READINGS)  # a DeviceSample's readings, as a tuple
_NO_READINGS = (_GAP,) * len(_READINGS)
_USED_AT = _READINGS.index("used_bytes")  # where a GPU's readings hold its used memory
_UTILIZATION_AT = _READINGS.index("utilization_percent")  # and its utilization
# A GPU's process listing: (clock time, its used bytes then, bytes this kernel holds or _GAP, note).
_Listing = tuple[float, int, int, str | None]
# A tick's plan (see Sampler._plan): the layout; per GPU (index, cap, figure values); the figure
# values of the framework devices on no charted GPU.
_Plan = tuple[tuple[tuple[str, str, tuple], ...], list[tuple[int, int, list]], list[list]]


class _TickPlan:
    """What the ticks between two hand-ons read, and what their samples hold besides readings
    (made by Sampler._make_plan from the sources as they were at the first of those ticks)."""

    __slots__ = (
        "elsewhere",
        "elsewhere_errors",
        "figures",
        "figures_at",
        "gpus",
        "indices",
        "layout",
        "rates",
        "sampled",
        "source_figures",
        "status",
    )

    def __init__(
        self,
        indices: tuple[int, ...],
        gpus: list[tuple[int, int, list]],
        elsewhere: list[Any],
        elsewhere_errors: list[None],
        layout: tuple,
        status: str | None,
        figures: tuple,
        figures_at: float | None,
    ) -> None:
        self.indices = indices  # the NVML indices read
        self.gpus = gpus  # per GPU read: (index, cap, figure values)
        self.elsewhere = elsewhere  # the packed values of the framework devices on no charted GPU
        self.elsewhere_errors = elsewhere_errors
        self.layout = layout
        self.status = status
        self.figures = figures  # (series, figure notes)
        self.figures_at = figures_at
        self.rates: frozenset[int] = frozenset()  # the GPUs whose utilization a tick reads itself
        # (index, offset of its readings in a tick's values) of the GPUs whose utilization the
        # hand-on fills from the driver's samples.
        self.sampled: list[tuple[int, int]] = []
        self.source_figures: Any = None  # the allocator figures' snapshot the plan was made from


def _layout_of(device: DeviceSample) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """A device's key, label and the (framework, series) of its figures: what rarely changes."""
    return device.key, device.label, tuple(f[:2] for f in device.figures)


def _figure_values(device: DeviceSample) -> list[int | None]:
    return [f[2] for f in device.figures]


def _int64(value: Any) -> int:
    """A reading as an int64 for the packed array; anything that is not one becomes a gap."""
    try:
        value = int(value)
    except (TypeError, ValueError, OverflowError):
        return _GAP
    return value if _GAP < value < 2**63 else _GAP


class _Stored:
    """A sample as the history keeps it: ~70 bytes per device instead of ~400.

    The readings of all devices sit in one ``array('q')``; the device keys and labels, the
    error messages, the status and the allocator figures' description are shared with the
    previous sample when unchanged (they rarely change), so a sample costs one small object,
    one float and one array.
    """

    __slots__ = ("errors", "figures", "figures_at", "layout", "readings", "status", "time_s")

    def __init__(
        self,
        time_s: float,
        layout: tuple,
        readings: array,
        errors: tuple | None,
        status: str | None,
        figures: tuple = ((), ()),
        figures_at: float | None = None,
    ):
        self.time_s = time_s
        self.layout = layout  # ((key, label, ((framework, series), ...)), ...)
        self.readings = readings  # per device len(_READINGS), then one per figure; _GAP where missing
        self.errors = errors  # one per device, or None when there is none
        self.status = status
        self.figures = figures  # (series, figure_notes): the description of the figures
        self.figures_at = figures_at  # when they were read

    @classmethod
    def pack(cls, sample: Sample, previous: _Stored | None) -> _Stored:
        devices = sample.devices
        values = [v for d in devices for v in (*_readings_of(d), *_figure_values(d))]
        return cls.of(
            sample.time_s,
            tuple(map(_layout_of, devices)),
            [_GAP if v is None else v for v in values],
            [d.error for d in devices],
            sample.status,
            (sample.series, sample.figure_notes),
            sample.figures_read_at,
            previous,
        )

    @classmethod
    def of(
        cls,
        time_s: float,
        layout: tuple,
        values: list[Any],
        errors: list[str | None],
        status: str | None,
        figures: tuple,
        figures_at: float | None,
        previous: _Stored | None,
    ) -> _Stored:
        """A sample from its parts (``values``: _GAP where missing), sharing what did not change
        with ``previous`` (equal strings and tuples, one copy: a panel then compares by identity)."""
        found: tuple[str | None, ...] | None = tuple(errors) if any(errors) else None
        if previous is not None:
            layout = previous.layout if layout is previous.layout or layout == previous.layout else layout
            found = previous.errors if found == previous.errors else found
            status = previous.status if status == previous.status else status
            figures = previous.figures if figures == previous.figures else figures
            figures_at = previous.figures_at if figures_at == previous.figures_at else figures_at
        try:
            readings = array("q", values)
        except (TypeError, OverflowError):  # not an int, or out of range: shown as a gap
            readings = array("q", [_int64(v) for v in values])
        return cls(float(time_s), layout, readings, found, status, figures, figures_at)

    def unpack(self) -> Sample:
        n = len(_READINGS)
        errors = self.errors or (None,) * len(self.layout)
        values = [None if v == _GAP else v for v in self.readings]
        series, notes = self.figures
        wire = {(s.framework, s.series): s.wire_field for s in series if s.wire_field}
        devices = []
        at = 0
        for i, (key, label, charted) in enumerate(self.layout):
            readings, values_charted = values[at : at + n], values[at + n : at + n + len(charted)]
            at += n + len(charted)
            figures = tuple(
                (framework, name, v) for (framework, name), v in zip(charted, values_charted, strict=False)
            )
            devices.append(
                DeviceSample(
                    key,
                    label,
                    error=errors[i],
                    figures=figures,
                    **dict(zip(_READINGS, readings, strict=False)),
                    **_wire_fields(figures, wire),
                )
            )
        return Sample(self.time_s, tuple(devices), self.status, series, self.figures_at, notes)

    @property
    def devices(self) -> tuple[DeviceSample, ...]:  # reads like a Sample (history[-1].devices)
        return self.unpack().devices


def _no_stats() -> dict:
    return {}


def no_visible() -> None:
    return None


def no_note() -> None:
    return None


def _nothing_read() -> AllocatorFigures:
    return NOTHING_READ


class Sampler:
    """Reads every device once per ``interval`` seconds on a daemon thread.

    ``tick()`` takes one sample synchronously and hands it on (tests call it).  The thread
    reads on every tick and hands its readings on every ``HAND_ON_S`` (the first after a start
    at once, and what waits when it stops).  Listeners are called on the sampler thread with each new
    :class:`Sample`; packed listeners with the list of samples handed on, as the history
    keeps them.
    """

    def __init__(
        self,
        nvml: Nvml,
        my_pid: int | None = None,
        *,
        figures: Figures = _nothing_read,
        limits: Limits = _no_stats,
        visible: Visible = no_visible,
        no_gpu_note: Callable[[], str | None] = no_note,  # a panel-wide note while GPUs are charted
        interval: float = 0.5,
        keep_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.my_pid = os.getpid() if my_pid is None else my_pid
        self._figures = figures  # never a framework: the latest snapshot published on the user's thread
        self._limits, self._visible = limits, visible
        self._no_gpu_note = no_gpu_note
        self._clock = clock
        self._interval = checked_interval(interval)
        self._per_hand_on = _readings_per_hand_on(self._interval)
        self._keep_s = _checked_keep(keep_s)
        self._lock = threading.Lock()  # guards the history, packing into it, and the listeners
        self._history: deque[_Stored] = deque(maxlen=self._history_len())  # packed: see latest(), snapshot()
        # The ticks' readings not yet packed into the history, oldest first, as (clock time, plan,
        # NVML's answers, the process listings then): appended by the thread without the lock
        # (a deque's append is atomic), packed under the lock by whoever reads first (_pack).
        self._taken: deque[tuple[float, _TickPlan, list[Any], Mapping[int, _Listing]]] = deque()
        self._layout: tuple[tuple[str, str, tuple], ...] = ()  # the devices of the last good sample
        # (listener, packed): a packed listener is handed the _Stored sample, the others a Sample.
        self._listeners: list[tuple[Callable[[Any], None], bool]] = []
        # Configuration sources may read every GPU in full; they change rarely, so they are
        # re-read every SLOW_SOURCES_S rather than on every tick: (monotonic time, values).
        self._slow: tuple[float, tuple[Any, ...]] | None = None
        # Per GPU: its key and label, once NVML has named it (a name never changes).
        self._names: dict[int, tuple[str, str]] = {}
        # Per GPU: the last process listing (see _list).  Replaced, never changed in place: a
        # tick keeps the mapping it read by, for the packing (see _measure).
        self._listings: Mapping[int, _Listing] = {}
        # Samples packed since the last hand-on, with the plan each was read by (None: it failed).
        self._waiting: list[tuple[_Stored, _TickPlan | None]] = []
        self._previous: _Stored | None = None  # the newest sample packed: the next one shares with it
        self._plan_now: _TickPlan | None = None  # what the ticks read until the next hand-on
        self._hand_on_next = False  # set by start(): the next reading is handed on at once
        # Per GPU: True while its utilization comes from the driver's samples, False when a tick
        # reads it (see UTILIZATION_SAMPLE_MAX_AGE_S); absent until a plan has found out.
        self._from_samples: dict[int, bool] = {}
        self._last_sample: dict[int, tuple[int, int]] = {}  # per GPU: the newest (time in us, percent)
        # The last plan of a tick (see _plan), with the sources it was made from.
        self._planned: tuple[AllocatorFigures, Mapping[int, int], tuple[int, ...], _Plan] | None = None
        # The GPUs charted, with the device count and visible GPUs they were worked out from.
        self._charted: tuple[int, list[int] | None, tuple[int, ...]] | None = None
        # Held while nobody asks the thread to wake; released to wake it.  A lock's timed acquire
        # is the cheapest sleep that can be cut short (an Event's wait makes a lock per call);
        # short sleeps are time.sleep, cheaper still (see _sleep_until).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._stopping = threading.Event()
        self._state = threading.Lock()  # guards starting the thread and its decision to end
        self._looping = False  # the thread has not yet decided to end
        self._thread: threading.Thread | None = None

    # -- settings -------------------------------------------------------------------------
    @property
    def interval(self) -> float:
        return self._interval

    @interval.setter
    def interval(self, seconds: float) -> None:
        self._interval = checked_interval(seconds)
        self._per_hand_on = _readings_per_hand_on(self._interval)
        self._resize_history()
        self._wake_up()  # a long sleep should not delay a shorter new interval

    def keep(self, seconds: float) -> None:
        """Keep at least ``seconds`` of history (the widest window of the open panels)."""
        self._keep_s = _checked_keep(seconds)
        self._resize_history()

    def _history_len(self) -> int:
        return min(MAX_HISTORY, math.ceil(self._keep_s / self._interval) + 2)

    def _resize_history(self) -> None:
        with self._lock:
            if self._history.maxlen != self._history_len():
                self._history = deque(self._history, maxlen=self._history_len())

    # -- listeners and history --------------------------------------------------------------
    def subscribe(self, listener: Callable[[Any], None], *, packed: bool = False) -> None:
        """``listener`` is called on the sampler thread with each new :class:`Sample`; with
        ``packed``, once a hand-on with the list of its samples as the history keeps them (no
        Sample is then built for them)."""
        with self._lock:
            self._listeners.append((listener, packed))

    def unsubscribe(self, listener: Callable[[Any], None]) -> None:
        with self._lock:
            self._listeners = [(f, packed) for f, packed in self._listeners if f != listener]

    @property
    def history(self) -> deque[_Stored]:
        """Every sample kept, oldest first (the readings taken and not yet packed are packed
        first).  The deque itself: it grows when a reader packs or at the hand-on, not at each tick."""
        with self._lock:
            self._pack()
            return self._history

    def snapshot(self, handed_on: bool = False) -> list[Sample]:
        """Every sample kept, oldest first; with ``handed_on``, those already handed to the
        listeners (the newest, up to ``HAND_ON_S`` of them, wait for the hand-on that fills
        their utilization from the driver's samples: a gap there until then)."""
        with self._lock:
            self._pack()
            stored = list(self._history)
            if handed_on and self._waiting:  # the newest wait; a short history may hold only those
                stored = stored[: max(0, len(stored) - len(self._waiting))]
        return [s.unpack() for s in stored]

    def latest(self) -> Sample | None:
        """The newest sample kept, or None before the first."""
        with self._lock:
            self._pack()
            stored = self._history[-1] if self._history else None
        return None if stored is None else stored.unpack()

    # -- the thread -----------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """The thread exists: sampling, or finishing its last reading after a stop."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def running(self) -> bool:
        """The thread samples and goes on doing so (it was not told to stop)."""
        return self.alive and not self._stopping.is_set()

    def start(self) -> None:
        """Start sampling.  A thread told to stop but still inside its last reading carries on
        instead: this sampler never has two threads."""
        with self._state:
            self._stopping.clear()
            self._hand_on_next = True  # a panel that starts (or joins) it has its first reading at once
            if self._looping:
                return  # running, or finishing a reading: it goes on
            old = self._thread
            if old is not None and old is not threading.current_thread():
                old.join()  # it has left its loop; only returning is left to it
            self._looping = True
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Tell the thread to stop and wait up to ``timeout`` seconds (default ``STOP_WAIT_S``).

        True when the thread has ended.  False when it is still inside a reading (a GPU driver
        call that has not returned): it ends as soon as that returns, and :meth:`start` meanwhile
        takes it back rather than start a second thread.
        """
        self._stopping.set()
        self._wake_up()
        return self.wait(timeout)

    def _wake_up(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:  # already released: the thread wakes once, as with an Event
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (default ``STOP_WAIT_S``) for a stopped thread to end.

        True when it has ended; False when it is still in a reading, or was started again.
        """
        thread = self._thread
        if thread is None:
            return True
        if thread is threading.current_thread():
            return False  # a listener stopping its own sampler: the loop ends after this tick
        deadline = time.monotonic() + (STOP_WAIT_S if timeout is None else timeout)
        while thread.is_alive() and self._stopping.is_set():  # start() again: stop waiting
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            thread.join(min(remaining, 0.05))  # returns as soon as the thread ends
        return not thread.is_alive()

    def _run(self) -> None:
        deadline = time.monotonic()
        ticks = 0  # since the last hand-on: counted here, as readers pack ticks on their own threads
        while True:
            if self._stopping.is_set():
                self._hand_on()  # what was read reaches the history and the panels
                # The decision to end, and start() taking the thread back, exclude each other.
                with self._state:
                    if self._stopping.is_set():
                        self._looping = False
                        return
            self._read()  # never raises
            ticks += 1
            if self._hand_on_next or ticks >= self._per_hand_on:
                self._hand_on_next, ticks = False, 0
                self._hand_on()
                self._plan_now = self._plan_or_none()  # warm, for the next ticks
            # Sleep to a deadline rather than for `interval`, so ticks do not drift by the
            # time a reading takes; after a stall (suspended VM) restart from now.
            deadline = max(deadline + self._interval, time.monotonic())
            if self._sleep_until(deadline):
                deadline = time.monotonic()  # woken (held again: the next wake releases it)

    def _plan_or_none(self) -> _TickPlan | None:
        """A plan, or None when making one fails: the next tick makes it, and its sample says why."""
        try:
            return self._make_plan()
        except Exception:
            return None

    def _sleep_until(self, deadline: float) -> bool:
        """Sleep to ``deadline`` (monotonic); True when woken (a stop, a new interval).

        A sleep of up to ``SHORT_SLEEP_S`` is ``time.sleep``, and a wake asked for meanwhile is
        taken when it ends: a wake-up from ``time.sleep`` cost the thread about half the CPU of
        one from a lock's timed acquire (in a kernel, 50-70 us against 115-125 us, 2026-11-27),
        and at 10 samples a second that is a tenth of a tick.  A stop or a new interval then
        waits for the end of that short sleep.  Longer sleeps wait on the lock, which a wake
        cuts short.
        """
        left = deadline - time.monotonic()
        if left <= SHORT_SLEEP_S:
            if left > 0:
                time.sleep(left)
            return self._wake.acquire(blocking=False)
        return self._wake.acquire(timeout=left)

    def tick(self) -> Sample:
        """Take one sample, keep it and hand it to the listeners.

        Never raises: a reading that fails in a way :meth:`read` does not expect becomes a
        sample of gaps with a note, and the next tick tries again.
        """
        self._plan_now = None  # the sources read afresh, as the thread does after a hand-on
        self._read()
        return self._hand_on()[-1].unpack()

    def _read(self) -> None:
        """One tick of the thread: NVML's readings of every charted GPU, kept as NVML gave them
        for :meth:`_pack` (a reader of the history packs them first, so it never lags).  Never
        raises: a failure is kept as a sample.

        The plan is made again when the allocator figures' snapshot changed (a cell ended), so a
        framework's device is charted from the next tick, not the next hand-on.  Nothing else:
        a tick comes after a sleep that left the caches cold, and it costs what it touches."""
        try:
            plan = self._plan_now
            if plan is None or self._figures_moved(plan):
                plan = self._plan_now = self._make_plan()
            now = self._clock()
            readings, listings = self._measure(plan, now)
        except Exception as err:
            failed = self._failed(err)  # outside the lock: it reads the clock
            with self._lock:
                self._pack()  # the readings before it, in order
                self._keep(_Stored.pack(failed, self._previous), None)
            return
        self._taken.append((now, plan, readings, listings))

    def _pack(self) -> None:
        """The readings taken and not yet packed, packed into the history in order (the caller
        holds ``_lock``).  Each sample shares with the one before it what did not change."""
        taken = self._taken
        while taken:
            now, plan, readings, listings = taken.popleft()
            try:
                stored = self._stored(now, plan, readings, listings, self._previous)
            except Exception as err:  # a reading nothing expected: a sample of its tick that says so
                self._keep(_Stored.pack(self._failed(err, now), self._previous), None)
                continue
            self._keep(stored, plan)

    def _keep(self, stored: _Stored, plan: _TickPlan | None) -> None:
        """``stored`` into the history, and waiting for the hand-on (the caller holds ``_lock``)."""
        self._previous = stored
        self._history.append(stored)
        if plan is not None:
            self._layout = stored.layout
        self._waiting.append((stored, plan))

    def _figures_moved(self, plan: _TickPlan) -> bool:
        """A new snapshot of the allocator figures was published since ``plan`` was made.  A
        source that fails says so in the plan's note until the next hand-on makes it again."""
        try:
            return self._figures() is not plan.source_figures
        except Exception:
            return False

    def _hand_on(self) -> list[_Stored]:
        """The samples taken since the last hand-on, their utilization filled from the driver's
        samples, handed to the listeners (a packed listener takes them all in one call); the
        sources are read again for the next ticks.  Returns the samples handed on."""
        self._plan_now = None
        with self._lock:
            self._pack()
            filling = list(self._waiting)
        self._fill_utilization(filling)
        with self._lock:  # filled first: a reader of the handed-on samples never sees one unfilled
            # Only those filled: a tick() on another thread may have packed more meanwhile.
            waiting = self._waiting[: len(filling)]
            del self._waiting[: len(filling)]
            listeners = list(self._listeners)
        handed = [stored for stored, _ in waiting]
        samples: list[Sample] | None = None
        for listener, packed in listeners:
            try:
                if packed:
                    listener(handed)
                else:
                    samples = [s.unpack() for s in handed] if samples is None else samples
                    for sample in samples:
                        listener(sample)
            except Exception:  # a broken panel must not stop the others' sampling
                pass
        return handed

    def _failed(self, err: Exception, now: float | None = None) -> Sample:
        """A sample of gaps that says why, at ``now`` (its tick's time), else the clock's."""
        note = f"sampling failed ({type(err).__name__}: {err}); trying again next tick"
        try:
            now = float(self._clock() if now is None else now)
        except Exception:
            now = time.time()
        devices = tuple(DeviceSample(key=key, label=label, error=note) for key, label, _ in self._layout)
        return Sample(now, devices, note)

    # -- one reading ------------------------------------------------------------------------
    def read(self) -> Sample:
        """One reading of every device, its sources read afresh; kept nowhere (a GPU it lists is
        kept as that GPU's listing, as a tick's is).  Utilization is read as it stands (no
        hand-on follows to fill it from the driver's samples)."""
        plan = self._make_plan()
        plan.rates, plan.sampled = frozenset(plan.indices), []
        now = self._clock()
        return self._stored(now, plan, *self._measure(plan, now), None).unpack()

    def _make_plan(self) -> _TickPlan:
        """What the ticks until the next hand-on read, from the sources as they are now: the
        allocator figures' snapshot, the limits and visible GPUs (re-read every
        ``SLOW_SOURCES_S``), the GPUs NVML counts."""
        status = None
        figures, figures_note = self._allocator_figures()
        limits, limit_note, visible, found_note = self._configuration()
        try:
            indices = self._indices(self.nvml.device_count(), visible)
        except NvmlUnavailable as err:
            indices = ()
            status = f"No NVIDIA GPU to chart: {err}"
        layout, gpus, elsewhere = self._plan(figures, indices, limits)
        notes = [n for n in (status, figures_note, limit_note, found_note if indices else None) if n]
        plan = _TickPlan(
            indices,
            gpus,
            [v for figure_values in elsewhere for v in (*_NO_READINGS, *figure_values)],
            [None] * len(elsewhere),
            layout,
            "; ".join(notes) or None,
            (figures.series, figures.notes),
            figures.read_at,
        )
        offset = 0
        for index, _, figure_values in gpus:
            if self._from_samples.get(index):  # unknown until a hand-on has found out: read each tick
                plan.sampled.append((index, offset))
            offset += len(_READINGS) + len(figure_values)
        plan.rates = frozenset(indices) - {index for index, _ in plan.sampled}
        plan.source_figures = figures
        return plan

    def _samples_usable(self, index: int, now_us: float) -> bool:
        """Whether the GPU's driver keeps utilization samples stamped with this sampler's clock
        (``now_us``: the time of a tick just taken); one call, the first time a GPU is charted."""
        try:
            samples = self.nvml.utilization_samples(index)
        except Exception:  # not supported, lost, no permission: read each tick, as before
            return False
        if not samples or not self._fresh(samples[-1][0], now_us):
            return False
        self._last_sample[index] = samples[-1]
        return True

    @staticmethod
    def _fresh(at_us: float, now_us: float) -> bool:
        """A sample of ``at_us`` is no older than UTILIZATION_SAMPLE_MAX_AGE_S at ``now_us`` and
        not from its future (a driver clock that is not this sampler's fails both ways)."""
        return now_us - UTILIZATION_SAMPLE_MAX_AGE_S * 1e6 <= at_us <= now_us + 1e6

    def _fill_utilization(self, waiting: list[tuple[_Stored, _TickPlan | None]]) -> None:
        """Each waiting sample's utilization of the GPUs read from samples, written into it (the
        history's sample: until then a reader sees a gap there): the newest driver sample at or
        before the tick, fetched now for all of them (one call a GPU).  A GPU whose samples
        fail, stop or come from another clock is read each tick from the next plan on; a GPU
        charted for the first time is read each tick until this finds out which it is."""
        taken = [(stored, plan) for stored, plan in waiting if plan is not None]
        if taken:  # GPUs charted for the first time: the next plan reads them as found here
            latest_taken, plan = taken[-1]
            for index in plan.indices:
                if index not in self._from_samples:
                    self._from_samples[index] = self._samples_usable(index, latest_taken.time_s * 1e6)
        ticks = [(stored, plan) for stored, plan in taken if plan.sampled]
        if not ticks:
            return
        series: dict[int, tuple[list[int], list[int]]] = {}
        for index in {index for r in ticks for index, _ in r[1].sampled}:
            last = self._last_sample.get(index)
            try:
                new = self.nvml.utilization_samples(index, last[0] if last else 0)
            except GpuLost:  # its memory reading says so; the chart resumes when it answers
                continue
            except Exception:
                self._from_samples[index] = False
                continue
            seen = ([last] if last else []) + new
            if not seen or not self._fresh(seen[-1][0], ticks[-1][0].time_s * 1e6):
                self._from_samples[index] = False  # stopped sampling, or another clock
                continue
            self._last_sample[index] = seen[-1]
            series[index] = ([at for at, _ in seen], [percent for _, percent in seen])
        for stored, plan in ticks:
            now_us, values = stored.time_s * 1e6, stored.readings  # filled in place: the history's
            for index, offset in plan.sampled:
                found = series.get(index)
                if found is None or values[offset + _USED_AT] == _GAP:  # no samples; no memory reading
                    continue
                times, percents = found
                newest = bisect.bisect_right(times, now_us) - 1
                if newest >= 0 and now_us - times[newest] <= UTILIZATION_SAMPLE_MAX_AGE_S * 1e6:
                    values[offset + _UTILIZATION_AT] = percents[newest]

    def _measure(self, plan: _TickPlan, now: float) -> tuple[list[Any], Mapping[int, _Listing]]:
        """NVML's answers for one tick, per GPU read (a reading, or the error in its place), and
        the process listings they are read by: a GPU's processes are listed first where its used
        memory moved.  The listings returned are this tick's own, whatever another thread's
        reading (:meth:`read`) does meanwhile: each good reading has one.

        Per GPU a tick makes one NVML call, its memory (utilization too where the driver keeps
        no samples of it: one :meth:`Nvml.memory_and_utilization_of` for all GPUs), and lists
        the GPU's processes only when its used memory moved (see :meth:`_list`).
        """
        try:
            readings = self.nvml.memory_and_utilization_of(plan.indices, plan.rates) if plan.indices else []
        except Exception as err:  # NVML stopped under us: every GPU's reading failed
            readings = [err] * len(plan.indices)
        listings = self._listings
        changed: dict[int, _Listing] | None = None  # a copy, made at the first change
        for index, reading in zip(plan.indices, readings, strict=True):
            listed = listings.get(index)
            if type(reading) is tuple:
                # The last listing's answer stands while the GPU's used memory has not moved and
                # it is younger than LISTING_MAX_AGE_S (or from a clock that went back: listed anew).
                if (
                    listed is None
                    or listed[1] != reading[1]
                    or not 0.0 <= now - listed[0] < LISTING_MAX_AGE_S
                ):
                    changed = dict(listings) if changed is None else changed
                    changed[index] = self._list(index, reading[1], now)
            elif listed is not None:  # a GPU that answers again is listed afresh
                changed = dict(listings) if changed is None else changed
                del changed[index]
        if changed is not None:
            self._listings = listings = changed
        return readings, listings

    @staticmethod
    def _stored(
        now: float,
        plan: _TickPlan,
        readings: list[Any],
        listings: Mapping[int, _Listing],
        previous: _Stored | None,
    ) -> _Stored:
        """One tick's sample as the history keeps it (``_GAP`` where a reading is missing, a note
        per device): NVML's answers, with this kernel's share from the listing of that tick,
        sharing with ``previous`` what did not change."""
        values: list[Any] = []
        errors: list[str | None] = []
        for (index, cap, figure_values), reading in zip(plan.gpus, readings, strict=True):
            if type(reading) is tuple:
                total, used, busy = reading
                listed = listings[index]  # the tick's own: each good reading has one (_measure)
                values += (total, used, listed[2], cap, _GAP if busy is None else busy)
                errors.append(listed[3])
            else:
                errors.append(_failure_note(index, reading))
                values += (_GAP, _GAP, _GAP, cap, _GAP)
            values += figure_values
        values += plan.elsewhere
        errors += plan.elsewhere_errors
        return _Stored.of(
            now, plan.layout, values, errors, plan.status, plan.figures, plan.figures_at, previous
        )

    def _indices(self, count: int, visible: list[int] | None) -> tuple[int, ...]:
        """The NVML indices charted: every GPU this kernel sees (all when ``visible`` is None).
        Worked out again only when the count or the visible GPUs (re-read every
        ``SLOW_SOURCES_S``) change."""
        known = self._charted
        if known is not None and known[0] == count and known[1] is visible:
            return known[2]
        indices = tuple(i for i in range(count) if visible is None or i in visible)
        self._charted = (count, visible, indices)
        return indices

    def _allocator_figures(self) -> tuple[AllocatorFigures, str | None]:
        figures, note = _guarded(self._figures, "the allocator figures", NOTHING_READ)
        if not isinstance(figures, AllocatorFigures):
            return NOTHING_READ, f"the allocator figures source gave a {type(figures).__name__}"
        return figures, note

    def _plan(self, figures: AllocatorFigures, indices: tuple[int, ...], limits: Mapping[int, int]) -> _Plan:
        """What a tick reads and how it is laid out: the layout, per GPU its index, cap and figure
        values, and the figure values of the framework devices on no charted GPU.

        Worked out again only when its sources change: a new snapshot of the figures (after a
        cell), the GPUs charted or the limits (re-read every ``SLOW_SOURCES_S``), or a GPU
        NVML has not named yet (asked again every tick).
        """
        plan = self._planned
        if plan is not None and plan[0] is figures and plan[1] is limits and plan[2] == indices:
            return plan[3]
        on_gpu, others = _by_gpu(figures, set(indices))
        layout: list[tuple[str, str, tuple]] = []
        gpus = []
        for index in indices:
            key, label = self._names.get(index) or self._name(index)
            found = on_gpu.get(index, ())
            layout.append((key, label, tuple((f, s) for f, s, _ in found)))
            limit = limits.get(index)
            gpus.append((index, _GAP if limit is None else limit, _gaps(v for _, _, v in found)))
        elsewhere = []
        for device in others:
            charted = tuple((device.framework, series) for series, _ in device.values)
            layout.append((f"{device.framework}:{device.device}", device.label, charted))
            elsewhere.append(_gaps(v for _, v in device.values))
        made = (tuple(layout), gpus, elsewhere)
        named = all(i in self._names for i in indices)
        self._planned = (figures, limits, indices, made) if named else None
        return made

    def _configuration(self) -> tuple[Any, ...]:
        now = time.monotonic()
        if self._slow is None or now - self._slow[0] >= SLOW_SOURCES_S:
            limits, limit_note = _guarded(self._limits, "the configured limits", {})
            visible, _ = _guarded(self._visible, "the visible GPUs", None)  # unknown: show all
            found_note, _ = _guarded(self._no_gpu_note, "the frameworks' GPUs", None)
            if self._slow is not None:  # unchanged: the same objects, so the plans made from them stand
                kept = self._slow[1]
                limits = kept[0] if limits == kept[0] else limits
                visible = kept[2] if visible == kept[2] else visible
            self._slow = (now, (limits, limit_note, visible, found_note or None))
        return self._slow[1]

    def _list(self, index: int, used: int, now: float) -> _Listing:
        """The GPU's processes listed: (time, used bytes then, bytes this kernel's process holds
        or ``_GAP`` when NVML cannot say, note).  A listing that failed has no time, so the
        next tick lists again."""
        try:
            held = self.nvml.memory_of_process(index, self.my_pid)
        except Exception as err:
            return (-math.inf, used, _GAP, f"GPU {index}: process list failed ({err})")
        if held is None:
            return (now, used, _GAP, f"GPU {index}: NVML cannot say how much this kernel holds")
        return (now, used, held, None)  # 0 when not listed: this kernel holds nothing there, a true 0

    def _name(self, index: int) -> tuple[str, str]:
        """The GPU's key and label; kept once NVML names it (a lost GPU is asked again next tick)."""
        try:
            name = self.nvml.name(index)  # read once by Nvml
        except Exception:
            name = None
        if not name:
            return f"gpu{index}", f"GPU {index}"
        self._names[index] = (f"gpu{index}", f"GPU {index} · {name}")
        return self._names[index]


def _readings_per_hand_on(interval: float) -> int:
    """Ticks between two hand-ons: as many as fill ``HAND_ON_S`` (one a tick from that interval on)."""
    return max(1, math.ceil(HAND_ON_S / interval - 1e-9))


def checked_interval(seconds: float) -> float:
    seconds = float(seconds)
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:  # also refuses NaN and infinities
        raise ValueError(
            f"interval must be from {MIN_INTERVAL_S:g} s to {MAX_INTERVAL_S:g} s, got {seconds!r}"
        )
    return seconds


def _checked_keep(seconds: float) -> float:
    """A window of history, held to 1 s .. MAX_WINDOW_S (NaN counts as the least)."""
    seconds = float(seconds)
    return min(seconds, MAX_WINDOW_S) if seconds >= 1.0 else 1.0


def _failure_note(index: int, err: Exception) -> str:
    """What a GPU's chart says when its memory reading failed."""
    if isinstance(err, GpuLost):
        return f"{err}; the chart resumes if it answers again"
    return f"GPU {index}: memory reading failed ({err})"  # NVMLError: not supported, no permission, ...


def _guarded(read: Callable[[], Any], what: str, empty: Any) -> tuple[Any, str | None]:
    """A source's reading, or ``empty`` and a note: one failing source stops nothing."""
    try:
        return read(), None
    except Exception as err:
        return empty, f"{what} could not be read ({type(err).__name__}: {err})"


def _by_gpu(figures: AllocatorFigures, charted: set[int]) -> tuple[dict[int, tuple], list[Any]]:
    """The figures per charted GPU, as DeviceSample.figures (summed over a framework's devices
    on one GPU: TensorFlow's logical GPUs), and the framework devices on no charted GPU."""
    sums: dict[int, dict[tuple[str, str], int | None]] = {}
    elsewhere = []
    for device in figures.devices:
        if device.gpu not in charted:
            elsewhere.append(device)
            continue
        gpu = sums.setdefault(device.gpu, {})
        for series, value in device.values:
            key = (device.framework, series)
            had = gpu.get(key, 0)
            gpu[key] = None if value is None or (key in gpu and had is None) else (had or 0) + value
    return {i: tuple((f, s, v) for (f, s), v in gpu.items()) for i, gpu in sums.items()}, elsewhere


def _wire_fields(figures: tuple, wire: Mapping[tuple[str, str], str]) -> dict[str, int | None]:
    """The older DeviceSample fields (``tf_in_use_bytes``) that figures fill, by the adapters' word."""
    return {wire[(f, s)]: v for f, s, v in figures if (f, s) in wire}


def _gaps(values: Any) -> list[Any]:
    return [_GAP if v is None else v for v in values]


class Hub:
    """The one sampler of this kernel, shared by every open panel.

    The first panel starts it; it stops when the last panel leaves (or at exit).  A sampler
    whose thread was still inside a reading when it was stopped is kept as *finishing*: the
    next panel takes it back instead of starting a second thread beside it.

    The lock guards only the bookkeeping, and nothing under it can run another object's code:
    a new sampler is made before the lock is taken, and panels leave the hub's dictionaries
    only into locals that outlive the lock.  A garbage collection can finalise an old panel at
    any allocation, and its ``close`` calls :meth:`leave` and :meth:`forget`; those return at
    once, without the lock, for a panel the hub no longer holds (a finalised one never is), so
    a finaliser can never wait for a lock its own thread holds.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sampler: Sampler | None = None
        self._finishing: Sampler | None = None  # stopped; its thread may still be in a reading
        self._members: dict[int, float] = {}  # id(panel) -> that panel's window, seconds
        self._panels: dict[int, Any] = {}  # id(panel) -> panel, for `%gpu monitor off`
        self._shown: dict[
            int, Any
        ] = {}  # stopped panels still on screen (their Stop button): `off` closes them

    @property
    def sampler(self) -> Sampler | None:
        return self._sampler

    def join(self, member: object, make: Callable[[], Sampler], window_s: float) -> Sampler:
        spare: Sampler | None = None  # made outside the lock: making allocates, and may collect
        while True:
            if spare is None and self._needs_a_sampler():
                spare = make()
            with self._lock:
                if self._sampler is None:
                    finishing, self._finishing = self._finishing, None
                    # One sampler thread at most: one still finishing a reading serves again (with
                    # the sources it was made with) rather than run beside a new one.
                    if finishing is not None and finishing.alive:
                        self._sampler = finishing
                    elif spare is not None:
                        self._sampler, spare = spare, None
                    else:
                        continue  # the sampler left while we looked: make one, outside the lock
                was_shown = self._shown.pop(id(member), None)  # dropped after the lock, if at all
                self._members[id(member)] = window_s
                self._panels[id(member)] = member
                self._sampler.keep(max(self._members.values()))
                self._sampler.start()
                joined = self._sampler
            del was_shown, spare  # an unused spare was never started: no thread to stop
            return joined

    def _needs_a_sampler(self) -> bool:
        with self._lock:
            finishing = self._finishing
            return self._sampler is None and (finishing is None or not finishing.alive)

    def set_window(self, member: object, window_s: float) -> None:
        with self._lock:
            if id(member) in self._members and self._sampler is not None:
                self._members[id(member)] = window_s
                self._sampler.keep(max(self._members.values()))

    def leave(self, member: object, *, shown: bool = False, timeout: float | None = None) -> bool:
        """``member`` stops following the sampler; the last one to leave stops it.

        ``shown``: the member stays on screen, stopped, until :meth:`forget` (``%gpu monitor off``
        closes such panels).  Returns True when no sampler thread is left, False while one runs
        or is still finishing a reading (see :meth:`Sampler.stop`).
        """
        if id(member) not in self._panels:  # not ours (a finalised panel never is): no lock
            return self._sampler is None and self._finishing is None
        with self._lock:
            self._members.pop(id(member), None)
            panel = self._panels.pop(id(member), None)  # dropped after the lock
            if shown and panel is not None:
                self._shown[id(member)] = panel
            if self._members or self._sampler is None:
                return self._sampler is None and self._finishing is None
            self._finishing, self._sampler = self._sampler, None
            self._finishing.stop(timeout=0)  # told under the lock, so a join cannot take it back first
        del panel
        return self._wait_finishing(
            timeout
        )  # outside the lock: the thread may be calling a panel that leaves

    def forget(self, member: object) -> None:
        """``member`` is gone for good (closed): nothing refers to it any more."""
        if id(member) not in self._shown:  # not ours (a finalised panel never is): no lock
            return
        with self._lock:
            panel = self._shown.pop(id(member), None)  # dropped after the lock
        del panel

    def members(self) -> list[Any]:
        """The panels following the sampler."""
        with self._lock:
            return list(self._panels.values())

    def shown(self) -> list[Any]:
        """The panels stopped by their own button and still on screen."""
        with self._lock:
            return list(self._shown.values())

    def stop_all(self, timeout: float | None = None) -> bool:
        """Every member leaves and the sampler stops; True when its thread has ended."""
        with self._lock:
            self._members.clear()  # ids and floats: nothing to finalise
            panels, self._panels = self._panels, {}  # dropped after the lock
            if self._sampler is not None:
                self._finishing, self._sampler = self._sampler, None
            if self._finishing is not None:
                self._finishing.stop(timeout=0)
        del panels
        return self._wait_finishing(timeout)

    def _wait_finishing(self, timeout: float | None) -> bool:
        with self._lock:
            finishing = self._finishing
        if finishing is None:
            return True
        ended = finishing.wait(timeout)  # returns early if a join took it back meanwhile
        with self._lock:
            if ended and self._finishing is finishing:
                self._finishing = None
            return self._finishing is None and self._sampler is None


_hub = Hub()
atexit.register(_hub.stop_all)


def hub() -> Hub:
    """The kernel's one hub: every panel of the kernel shares its sampler."""
    return _hub


def active_sampler() -> Sampler | None:
    """This kernel's sampler, or None when no panel is open."""
    return _hub.sampler


def stop_panels(timeout: float | None = None) -> str:
    """``%gpu monitor off``: stop and close every panel of this kernel, and the sampler's thread.

    Waits up to ``timeout`` seconds (default ``STOP_WAIT_S``) for a reading in progress, and
    says so if the thread outlives the wait.  The panels are closed (their models, layouts and
    sidebars), so open/off cycles leave nothing behind in the kernel; their charts leave the page.
    """
    running = _hub.members()
    shown = _hub.shown()
    ended = _hub.stop_all(
        timeout
    )  # one wait, however many panels; members that are not panels (tests) go too
    for panel in running + shown:
        close = getattr(panel, "close", None) or getattr(panel, "stop", None)
        if close is not None:
            close()
    finishing = "the sampling thread is still finishing a reading (a GPU driver call that has not returned)"
    if not running:
        answer = "No memory panel is running in this kernel"
        if shown:
            answer += f"; closed {_panels(len(shown), 'stopped panel')}"
        if not ended:
            answer += f"; {finishing} and ends when it returns"
        return answer + "."
    count = _panels(len(running), "memory panel")
    if ended:
        return f"Stopped {count}; the sampling thread has ended. `%gpu monitor` starts a new one."
    return (
        f"Stopped {count}; {finishing} and ends when it returns. "
        "`%gpu monitor` meanwhile takes that thread back rather than start a second one."
    )


def _panels(n: int, what: str) -> str:
    return f"1 {what}" if n == 1 else f"{n} {what}s"


def sampler_running() -> bool:
    """True while this kernel's sampler thread is alive (any thread of that name counts)."""
    return any(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())
