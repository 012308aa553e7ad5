"""The live memory panel of ``%gpu monitor``: an anywidget fed by the kernel's shared sampler.

Each sample is sent to the browser once, in a custom message holding only new points
(``model.send``; their numbers in two binary buffers, see :func:`batch_wire`); the whole history is sent only when a view asks for it (a new view, or one
re-rendered).  A sample whose readings, messages and status equal the last one sent is not sent,
except as a heartbeat once every ``HEARTBEAT_S`` (the chart's time axis and its "last sample"
clock go as far as the newest point); the next sample that differs brings the last unchanged one
with it, so the chart stays flat up to the change instead of sloping across the samples left out.
Each message costs the kernel about a millisecond of CPU whatever it holds, so at most
``MAX_MESSAGES_PER_S`` go out a second: the sampler hands its readings on every 2 s
(``monitor.HAND_ON_S``), a message goes out at a hand-on when the gap since the last one allows,
and changes that come faster (short intervals, busy GPUs) go out together, in order.  At intervals of 1 / ``MAX_MESSAGES_PER_S`` and
longer every changed sample has its own message, as it comes.  Stop sends what waits; the
history holds it.  Sending happens on the sampler thread, which is why the chart keeps moving
while a cell holds the kernel.  Clicks on the panel's controls, in contrast, arrive on the
shell channel and take effect once the running cell ends; pause is handled in the browser
alone, so it answers at once.

A panel is two widgets in the kernel (its model and the ``Layout`` every DOM widget has), four
with a sidebar (the :class:`SideArea` that holds it and its ``Layout``), each with a comm.
``close()`` releases them all; ``%gpu monitor off`` closes every panel, so repeated open/off
cycles leave nothing behind.  The *Stop* button only stops a panel: its frozen chart stays on
screen until ``%gpu monitor off`` or ``close()``.

``--sidebar`` shows the panel in the right side area of JupyterLab or Notebook 7 through
:class:`SideArea`, a widget whose front end is part of this package's JupyterLab extension
(``js/lab/sidearea.ts``).
"""

from __future__ import annotations

import math
import operator
import pathlib
import sys
from array import array
from collections.abc import Callable, Iterable
from typing import Any

import anywidget
import ipywidgets
import traitlets

from .monitor import (
    _GAP,
    _READINGS,
    DEFAULT_INTERVAL_S,
    HAND_ON_S,
    MAX_INTERVAL_S,
    MAX_WINDOW_S,
    MIN_INTERVAL_S,
    Hub,
    Sample,
    Sampler,
    _Stored,
)

__all__ = ["MemoryPanel", "SideArea", "batch", "batch_wire"]

from .._version import __version__

_STATIC = pathlib.Path(__file__).parent.parent / "static"  # tfgpu_magic/static, where npm builds it

# The JupyterLab extension's npm package, which registers the SideArea widget's model and view
# (package.json "name"; js/lab/version.ts).  Its version is the Python package's.
NPM_PACKAGE = "tfgpu-magic"
NPM_RANGE = f"^{__version__}"

# Built by `npm run build` (esbuild, from js/), at install time by hatch-jupyter-builder.
_MISSING_BUNDLE = """
export default { render({ el }) {
  el.textContent = "tfgpu_magic: the panel's front end is not built. "
    + "Run `npm install && npm run build` in the source tree, or reinstall the package.";
} };
"""

# The series of every chart: wire name -> DeviceSample field (bytes; "util" is percent).  "tf"
# and "peak" are TensorFlow's allocator under their older names (kept for readers of the wire);
# the panel draws every framework's figures from "frameworks" (see batch).
SERIES = {
    "total": "total_bytes",
    "used": "used_bytes",
    "mine": "mine_bytes",
    "tf": "tf_in_use_bytes",
    "peak": "tf_peak_bytes",
    "limit": "limit_bytes",
    "util": "utilization_percent",
}

_series_of = operator.attrgetter(*SERIES.values())  # a DeviceSample's readings, in SERIES order
_ABSENT = (None,) * len(SERIES)  # a device missing from a sample: a gap in every series

# Messages a second at most, whatever the interval: one a hand-on of the sampler.  A comm message
# costs the kernel about a millisecond of CPU (ipykernel serialises and signs it on the sampler
# thread, then its IOPub thread and zmq's send it; measured 2026-11-27) however many samples it
# holds, so at 0.1 s with busy GPUs (a change every tick) the samples of 2 s go out together: one
# message instead of twenty, every sample still in it, each with its own time (the chart draws
# them all).
MAX_MESSAGES_PER_S = 1 / HAND_ON_S

# An unchanged sample is still sent once the last message is this old (seconds of sample time):
# the browser draws the time axis, and says "last sample", up to the newest point it holds.
HEARTBEAT_S = HAND_ON_S

# A chart whose device left the samples.  GPUs leave when `%gpu use` hides them from this
# kernel (the sampler follows the session's visible GPUs); the chart stays, frozen, and says why.
HIDDEN_GPU = "hidden from this kernel's frameworks by %gpu use; no longer sampled"
GONE_DEVICE = "its framework no longer reports this device; no longer sampled"


def batch(
    samples: Iterable[Sample], kind: str = "samples", keys: Iterable[str] | None = None
) -> dict[str, Any]:
    """Samples as columns, the shape uPlot draws: times, then per device one array per series.

    A device absent from a sample gets null there, so every array matches ``t``.  ``keys``
    limits the devices sent (a new panel shows only the GPUs the kernel sees now).

    The frameworks' allocator figures come per device under ``frameworks`` (framework key ->
    series -> array, e.g. ``{"pytorch": {"allocated": [...], "reserved": [...]}}``), present only
    on a device that has some; ``figures`` describes each series (its legend label, whose number
    it is), ``figure_notes`` says which framework has none and why, and ``figures_read_at`` when
    they were read (on the user's thread: after each cell, at each ``%gpu``).
    """
    samples = list(samples)
    keys = _device_keys(samples) if keys is None else [k for k in _device_keys(samples) if k in set(keys)]
    rows: dict[str, list[tuple]] = {k: [] for k in keys}  # per device, its readings in each sample
    for sample in samples:
        present = {d.key: d for d in sample.devices}
        for key, row in rows.items():
            device = present.get(key)
            row.append(_ABSENT if device is None else _series_of(device))
    # per device: one list per series (the rows transposed), and "frameworks": its figures' columns
    columns: dict[str, dict[str, object]] = {
        key: dict(zip(SERIES, map(list, zip(*row, strict=False)), strict=False))
        if row
        else {s: [] for s in SERIES}
        for key, row in rows.items()
    }
    for key, figures in _figure_columns(samples, columns).items():
        columns[key]["frameworks"] = figures
    last = samples[-1] if samples else None
    errors = {d.key: d.error for d in last.devices if d.key in columns} if last else {}
    return {
        "kind": kind,
        "t": [s.time_s for s in samples],
        "d": columns,
        "errors": errors,  # the latest message per device; null clears it
        "status": last.status if last else None,
        "figures": _figure_series(samples),
        "figure_notes": list(last.figure_notes) if last else [],
        "figures_read_at": last.figures_read_at if last else None,
    }


def batch_packed(stored: list[_Stored], kind: str = "samples") -> dict[str, Any]:
    """:func:`batch` of samples as the history keeps them, without building a Sample each.

    Samples of one layout and one description of their figures (what a steady panel sends:
    the sampler shares both with the previous sample while unchanged) are cut into columns
    straight from their packed readings; any others go through :func:`batch`.
    """
    first = stored[0] if stored else None
    if first is None or any(s.layout is not first.layout or s.figures is not first.figures for s in stored):
        return batch([s.unpack() for s in stored], kind)
    keys = [key for key, _, _ in first.layout]
    if len(set(keys)) != len(keys):  # one key twice: batch() says which one counts
        return batch([s.unpack() for s in stored], kind)
    series, notes = first.figures
    wire = {(s.framework, s.series): _WIRE_NAME[s.wire_field] for s in series if s.wire_field in _WIRE_NAME}
    flat = array("q")
    for s in stored:
        flat.extend(s.readings)
    stride, n = len(first.readings), len(_READINGS)
    columns: dict[str, dict[str, object]] = {}
    at = 0
    for key, _, charted in first.layout:
        device: dict[str, object] = {
            name: _column(flat, at + j, stride) for j, name in enumerate(_PACKED_SERIES)
        }
        frameworks: dict[str, dict[str, list]] = {}
        for k, (framework, name) in enumerate(charted):
            column = _column(flat, at + n + k, stride)
            frameworks.setdefault(framework, {})[name] = column
            if (framework, name) in wire:
                device[wire[(framework, name)]] = column
        columns[key] = {s: device[s] if s in device else [None] * len(stored) for s in SERIES}
        if frameworks:
            columns[key]["frameworks"] = frameworks
        at += n + len(charted)
    last = stored[-1]
    errors = last.errors or (None,) * len(keys)
    seen: dict[tuple[str, str], str] = {}
    for s in series:
        seen.setdefault((s.framework, s.series), s.label)
    return {
        "kind": kind,
        "t": [s.time_s for s in stored],
        "d": columns,
        "errors": dict(zip(keys, errors, strict=True)),
        "status": last.status,
        "figures": [{"framework": f, "series": s, "label": label} for (f, s), label in seen.items()],
        "figure_notes": list(notes),
        "figures_read_at": last.figures_at,
    }


def batch_wire(stored: list[_Stored]) -> tuple[dict[str, Any], list[memoryview]]:
    """A message of new samples as sent: ``(content, buffers)``.

    Samples of one layout and one description of their figures (what a steady panel sends)
    travel with their numbers as two binary buffers: the times (float64, little-endian) and
    the packed readings as the history keeps them (int64, little-endian, -2**63 where a reading
    is missing; per sample, per device in the order of ``packed["devices"]``, the readings
    named by ``packed["readings"]`` and then one per figure the device charts).  The content
    holds the rest of :func:`batch`'s fields.  The front end (js/lab/wire.ts) cuts the columns;
    a figure an adapter also names by an older wire field (``tf``) is that column again
    (``packed["wire"]``), and a series with no column is all nulls.

    A message costs the kernel what its numbers cost to encode: as JSON, a batch of ten
    samples on eight GPUs took more than the rest of the message (measured 2026-11-27).
    Any other batch is :func:`batch_packed`'s JSON, with no buffers.
    """
    first = stored[0] if stored else None
    if first is None or any(s.layout is not first.layout or s.figures is not first.figures for s in stored):
        return batch_packed(stored), []
    keys = [key for key, _, _ in first.layout]
    if len(set(keys)) != len(keys):  # one key twice: batch() says which one counts
        return batch_packed(stored), []
    series, notes = first.figures
    readings = array("q")
    for s in stored:
        readings.extend(s.readings)
    times = array("d", [s.time_s for s in stored])
    if sys.byteorder != "little":
        readings.byteswap()
        times.byteswap()
    wire = {(s.framework, s.series): _WIRE_NAME[s.wire_field] for s in series if s.wire_field in _WIRE_NAME}
    seen: dict[tuple[str, str], str] = {}
    for s in series:
        seen.setdefault((s.framework, s.series), s.label)
    last = stored[-1]
    content = {
        "kind": "samples",
        "packed": {
            "devices": [[key, [list(c) for c in charted]] for key, _, charted in first.layout],
            "readings": _PACKED_SERIES,
            "wire": [[f, s, name] for (f, s), name in wire.items()],
        },
        "errors": dict(zip(keys, last.errors or (None,) * len(keys), strict=True)),
        "status": last.status,
        "figures": [{"framework": f, "series": s, "label": label} for (f, s), label in seen.items()],
        "figure_notes": list(notes),
        "figures_read_at": last.figures_at,
    }
    return content, [memoryview(times), memoryview(readings)]


_WIRE_NAME = {field: name for name, field in SERIES.items()}  # "tf_in_use_bytes" -> "tf"
_PACKED_SERIES = [_WIRE_NAME[field] for field in _READINGS]  # the packed readings' wire names


def _column(flat: array, offset: int, stride: int) -> list[int | None]:
    """Every ``stride``-th packed reading from ``offset``, gaps as None."""
    column = flat[offset::stride]
    values = column.tolist()
    return [None if v == _GAP else v for v in values] if _GAP in column else values


def _figure_columns(samples: list[Sample], keys: Iterable[str]) -> dict[str, dict[str, dict[str, list]]]:
    """Per device with figures: framework -> series -> one value per sample (null where absent)."""
    wanted = set(keys)
    found: dict[str, dict[tuple[str, str], list]] = {}
    for i, sample in enumerate(samples):
        for device in sample.devices:
            if not device.figures or device.key not in wanted:
                continue
            columns = found.setdefault(device.key, {})
            for framework, series, value in device.figures:
                column = columns.get((framework, series))
                if column is None:
                    column = columns[(framework, series)] = [None] * len(samples)
                column[i] = value
    nested: dict[str, dict[str, dict[str, list]]] = {}
    for key, columns in found.items():
        for (framework, series), column in columns.items():
            nested.setdefault(key, {}).setdefault(framework, {})[series] = column
    return nested


def _figure_series(samples: list[Sample]) -> list[dict[str, str]]:
    """Every framework series present in these samples, in order: its keys and its legend label."""
    seen: dict[tuple[str, str], str] = {}
    for sample in samples:
        for s in sample.series:
            seen.setdefault((s.framework, s.series), s.label)
    return [{"framework": f, "series": s, "label": label} for (f, s), label in seen.items()]


def _device_keys(samples: Iterable[Sample]) -> list[str]:
    seen: dict[str, None] = {}
    for sample in samples:
        for device in sample.devices:
            seen.setdefault(device.key)
    return list(seen)


def _describe(known: dict[str, str], present: set[str]) -> list[dict[str, Any]]:
    """The charts of a panel: every device it has shown, with a note on those no longer sampled."""
    return [
        {"key": key, "label": label, "gpu": key.startswith("gpu"), "gone": _gone_note(key, present)}
        for key, label in known.items()
    ]


def _gone_note(key: str, present: set[str]) -> str | None:
    if key in present:
        return None
    return HIDDEN_GPU if key.startswith("gpu") else GONE_DEVICE


def _interval_note(previous: float | None, interval: float, explicit: bool) -> str:
    """What the new panel's state line says about the one interval every panel shares."""
    if previous is None:
        return ""
    if not explicit:
        return f"joined the running sampler at its {interval:g} s (--interval changes it for every panel)"
    if previous != interval:
        return f"sampling every {interval:g} s now, for every open panel (was {previous:g} s)"
    return ""


class MemoryPanel(anywidget.AnyWidget):
    """Per-device memory charts that follow the kernel's sampler until stopped or closed."""

    _esm = _STATIC / "widget.js" if (_STATIC / "widget.js").is_file() else _MISSING_BUNDLE
    _css = _STATIC / "widget.css" if (_STATIC / "widget.css").is_file() else ""

    interval = traitlets.Float(DEFAULT_INTERVAL_S, min=MIN_INTERVAL_S, max=MAX_INTERVAL_S).tag(
        sync=True
    )  # seconds per sample
    window = traitlets.Float(300.0, min=5.0, max=MAX_WINDOW_S).tag(sync=True)  # seconds shown
    min_interval = traitlets.Float(MIN_INTERVAL_S, read_only=True).tag(sync=True)
    devices: traitlets.List[dict[str, Any]] = traitlets.List().tag(
        sync=True
    )  # [{key, label, gpu}], in chart order
    running = traitlets.Bool(False).tag(sync=True)  # False once stopped: no more points come
    note = traitlets.Unicode("").tag(sync=True)  # shown in the state line: the shared interval
    # Who holds the limit line ("soft (TensorFlow's allocator)", "hard (MPS)"), set on the user's
    # thread when the session's context is published (after each cell); "" without a limit.
    limit_label = traitlets.Unicode("").tag(sync=True)

    def show_limit_label(self, context: Any) -> None:
        """Follow the session's context (allocator_figures.KernelContext): who holds the limit."""
        label = context.limit_label or ""
        if self.limit_label != label:
            self.limit_label = label

    # Until __init__ has joined the hub (a refused window, say), stop() and close() have nothing to do.
    side_area: SideArea | None = None  # set when shown in the side area (``--sidebar``)
    _hub: Hub | None = None
    _sampler: Sampler | None = None

    def __init__(
        self,
        hub: Hub,
        make: Callable[[], Sampler],
        interval: float | None = None,
        window: float = 300.0,
        **kwargs: Any,
    ) -> None:
        """``interval`` None: join the running sampler at its interval (the default with none running)."""
        super().__init__(
            interval=DEFAULT_INTERVAL_S if interval is None else interval, window=window, **kwargs
        )
        self._hub = hub
        self._described: list[dict[str, Any]] = []
        self._known: dict[str, str] = {}  # key -> label of every device this panel charts, in order
        self._layout: tuple[tuple[str, str], ...] = ()  # (key, label) of the devices last described
        # Samples as the sampler packs them (monitor._Stored): compared and sent without unpacking.
        self._sent: _Stored | None = None  # the last sample sent to the browser, or pending
        self._unsent: _Stored | None = None  # the newest sample not sent: equal to _sent but for its time
        self._pending: list[_Stored] = []  # samples for the next message (_sent is the last), oldest first
        self._seen_layout: tuple | None = None  # the packed layout last described
        self._message_s = float("-inf")  # sample time of the last message sent
        self._set_message_gap()
        self.observe(self._set_message_gap, "interval")  # before anything sets it
        previous = _running_interval(hub)
        sampler = hub.join(self, make, window)
        self._sampler: Sampler | None = sampler
        self._join_interval(interval, previous)
        recent = sampler.latest()
        if recent is not None:
            self._describe_devices(tuple((d.key, d.label) for d in recent.devices))
        sampler.subscribe(self._on_samples, packed=True)
        self.running = True
        self.on_msg(self._on_message)
        if self.comm is not None:  # the front end closed the model: release it here too
            self.comm.on_close(lambda _msg: self.close())
        self.observe(self._on_interval, "interval")
        self.observe(self._on_window, "window")

    # -- kernel -> browser (on the sampler thread) -------------------------------------------
    def _on_samples(self, samples: list[_Stored]) -> None:
        """The samples the sampler handed on (one a second at short intervals): each new one is
        kept for the next message, which goes out when the gap since the last one allows."""
        for sample in samples:
            self._keep(sample)
        # Checked on every hand-on, unchanged samples too, so a waiting batch never waits for a change.
        last = samples[-1].time_s if samples else None
        if last is None or not self._pending:
            return
        since = last - self._message_s  # negative: the clock went back; send
        if not 0.0 <= since < self._gap_s:
            pending, self._pending = self._pending, []
            self._message_s = last
            self.send(*batch_wire(pending))

    def _keep(self, sample: _Stored) -> None:
        """``sample`` joins the next message if it differs from the last one sent (or is due as a heartbeat)."""
        sent, unsent = self._sent, self._unsent
        # What the history shares with the previous sample while unchanged is compared by identity
        # first; the readings of all devices are one array, compared in C.
        same = (
            sent is not None
            and sample.readings == sent.readings
            and (sample.layout is sent.layout or sample.layout == sent.layout)
            and (sample.errors is sent.errors or sample.errors == sent.errors)
            and (sample.status is sent.status or sample.status == sent.status)
            and (sample.figures is sent.figures or sample.figures == sent.figures)
        )
        if same and sent is not None and 0.0 <= sample.time_s - sent.time_s < HEARTBEAT_S:
            self._unsent = sample  # nothing new to show; a change or a heartbeat may carry it later
            return
        if sample.layout is not self._seen_layout:
            self._seen_layout = sample.layout
            self._describe_devices(tuple((key, label) for key, label, _ in sample.layout))
        # Before a change, the last unchanged sample: the chart holds the old value up to just
        # before it.  A heartbeat needs none: the line is flat from the last point to it.
        self._pending += [sample] if same or unsent is None else [unsent, sample]
        self._sent, self._unsent = sample, None

    def _set_message_gap(self, _change: Any = None) -> None:
        """The least sample time between two messages: 1 / MAX_MESSAGES_PER_S, less a tenth of an interval.

        The sampler keeps to a deadline, but a sample's time may come a little early, and at
        intervals of 1 / MAX_MESSAGES_PER_S and longer every changed sample must still go out at once.
        Kept as a plain float, set when the interval changes: the sampler's thread reads it every
        tick, and a trait's read runs traitlets' code.
        """
        self._gap_s = 1.0 / MAX_MESSAGES_PER_S - self.interval / 10

    def _describe_devices(self, layout: tuple[tuple[str, str], ...]) -> None:
        """``layout``: the (key, label) of every device in the newest sample."""
        if layout == self._layout:
            return  # the devices and their labels as last described: nothing to do
        self._layout = layout
        for key, label in layout:
            self._known[key] = label  # a lost GPU's name may come later
        described = _describe(self._known, {key for key, _ in layout})
        if described != self._described:  # rare: a GPU hidden by `%gpu use`, a TensorFlow device appeared
            self._described = described
            self.devices = described

    def _send_history(self) -> None:
        # Only the devices this panel charts: a GPU hidden before it opened gets no chart.
        if self._sampler is not None:
            # The history holds them (and the next change needs no point before it).
            self._pending, self._unsent = [], None
            # Only what the panels were handed: the samples still waiting come with the next hand-on.
            self.send(batch(self._sampler.snapshot(handed_on=True), kind="history", keys=self._known))

    # -- browser -> kernel ------------------------------------------------------------------
    def set_state(self, sync_data: dict[str, Any]) -> None:
        """The front end's update: a setting outside its bounds (NaN passes a Float's own bounds)
        is not taken, and the front end is sent the value that stands instead of a traceback."""
        refused = [
            name
            for name in ("interval", "window")
            if name in sync_data and not self._acceptable(name, sync_data[name])
        ]
        super().set_state({name: value for name, value in sync_data.items() if name not in refused})
        if refused:
            self.send_state(refused)

    def _acceptable(self, name: str, value: Any) -> bool:
        trait = self.traits()[name]
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and trait.min <= value <= trait.max
        )

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        kind = content.get("kind") if isinstance(content, dict) else None
        if kind == "history":
            self._send_history()
        elif kind == "stop":
            self.stop()

    def _on_interval(self, change: dict) -> None:
        # Set by another panel: the sampler already runs at it.  Otherwise this panel's control.
        if self._sampler is not None and self._sampler.interval != change["new"]:
            self.note = ""
            self._share_interval(change["new"])

    def _join_interval(self, interval: float | None, previous: float | None) -> None:
        """Without an interval, take the one in force; with one, it serves every panel (and say so)."""
        explicit = interval is not None
        chosen = interval if interval is not None else DEFAULT_INTERVAL_S if previous is None else previous
        self.interval = chosen
        if explicit or previous is None:  # no panel runs: a sampler taken back may hold an old interval
            self._share_interval(chosen)
        self.note = _interval_note(previous, chosen, explicit)

    def _share_interval(self, seconds: float) -> None:
        """One sampler serves every panel, so every panel's control shows its interval."""
        if self._sampler is None or self._hub is None:  # stopped: it follows no sampler
            return
        self._sampler.interval = seconds
        for panel in self._hub.members():
            if panel is not self and getattr(panel, "interval", seconds) != seconds:
                panel.note = f"sampling every {seconds:g} s, as another panel asked (one sampler serves all)"
                panel.interval = seconds  # its observer finds the sampler already set

    def _on_window(self, change: dict) -> None:
        if self._hub is not None:
            self._hub.set_window(self, change["new"])

    # -- lifecycle --------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop following the sampler; the chart stays on screen, frozen.

        The last panel to stop ends the sampler's thread.  The panel stays open (in the kernel
        and on the page) until ``close()`` or ``%gpu monitor off``.
        """
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        sampler.unsubscribe(self._on_samples)
        pending, self._pending, unsent, self._unsent = self._pending, [], self._unsent, None
        if unsent is not None:  # the frozen chart ends at the last sample taken for it
            pending.append(unsent)
        if pending:
            self.send(*batch_wire(pending))
        if self._hub is not None:
            self._hub.leave(self, shown=True)
        self.running = False

    def close(self) -> None:
        """Stop, then release the panel's widgets and comms (its sidebar's too); the chart leaves the page."""
        self.stop()
        if self._hub is not None:
            self._hub.forget(self)
        side, self.side_area = self.side_area, None
        if side is not None:
            _close_with_layout(side)
        layout = self._trait_values.get("layout")  # without creating one
        super().close()
        if isinstance(layout, ipywidgets.Widget):
            layout.close()


def _running_interval(hub: Hub) -> float | None:
    """The interval open panels sample at; None when no panel follows a sampler."""
    sampler = hub.sampler
    return sampler.interval if sampler is not None and hub.members() else None


class SideArea(ipywidgets.DOMWidget):
    """Shows ``child`` in the right side area of JupyterLab or Notebook 7, not in the cell.

    The cell's output keeps one line saying so.  Its front end (model and view) comes with
    this package's JupyterLab extension; a front end without it (VS Code, say) cannot show
    it, and says so through the plain-text form below.  Closing it closes the side tab.
    """

    _model_name = traitlets.Unicode("SideAreaModel").tag(sync=True)
    _model_module = traitlets.Unicode(NPM_PACKAGE).tag(sync=True)
    _model_module_version = traitlets.Unicode(NPM_RANGE).tag(sync=True)
    _view_name = traitlets.Unicode("SideAreaView").tag(sync=True)
    _view_module = traitlets.Unicode(NPM_PACKAGE).tag(sync=True)
    _view_module_version = traitlets.Unicode(NPM_RANGE).tag(sync=True)

    child = traitlets.Instance(ipywidgets.Widget, allow_none=True).tag(
        sync=True, **ipywidgets.widget_serialization
    )
    title = traitlets.Unicode("GPU memory").tag(sync=True)  # the side tab's label

    def _repr_mimebundle_(self, **kwargs: Any) -> dict | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:  # what a front end without widgets shows instead
            bundle["text/plain"] = (
                f"{self.title}: shown in the side area of JupyterLab or Notebook 7 (tfgpu_magic's "
                "JupyterLab extension); elsewhere run `%gpu monitor` without --sidebar"
            )
        return bundle


def _close_with_layout(widget: Any) -> None:
    layout = getattr(widget, "_trait_values", {}).get("layout")
    widget.close()
    if isinstance(layout, ipywidgets.Widget):
        layout.close()
