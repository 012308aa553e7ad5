"""Every framework's allocator figures, read on the user's thread and published for the panel.

A framework is asked about its memory only from the thread that runs the user's cells: after
each cell (IPython's ``post_run_cell``) and at every ``%gpu``, :func:`publish` reads each
imported adapter's :meth:`~tfgpu_magic.frameworks.base.Framework.device_memory` (started ones
only), maps its devices to nvidia-smi indices, and swaps in one immutable
:class:`AllocatorFigures`, stamped with the time it was read.  The sampler thread of
``%gpu monitor`` only takes :meth:`Board.latest` (one attribute read): it never calls into a
framework, never imports anything, and holds no lock while a framework is asked.

The figures are the allocators' own count (what each framework's allocator holds), never the
driver's; while a long cell runs they are those read after the previous cell.  Reading never
raises into the user's cell: a framework whose reading fails is a note, as is one imported whose
build keeps no figures (its adapter says why), so the panel says a series is absent instead of
drawing zero.  This module names no framework: it loops over the adapters and uses their
``key``, ``name`` and ``charted_figures``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..frameworks.base import Stage
from ..records import Record

__all__ = [
    "NOTHING_READ",
    "AllocatorFigures",
    "Board",
    "DeviceFigures",
    "FigureSeries",
    "KernelContext",
    "board_of",
    "install",
    "publish",
    "read",
]


class FigureSeries(Record):
    """One series the panel draws: a figure of one framework's allocator."""

    framework: str  # the adapter's key ("pytorch")
    series: str  # the figure's key under it ("reserved")
    label: str  # what the legend says: "PyTorch allocator: reserved"
    wire_field: str | None = None  # an older DeviceSample field it also fills


class DeviceFigures(Record):
    """One framework device's figures, in bytes (None: this figure is not kept there)."""

    framework: str  # the adapter's key
    device: str  # the framework's own name for it ("cuda:0", "GPU:0", "CPU:0")
    label: str  # "PyTorch cuda:0": the title of its own chart where it maps to no GPU
    gpu: int | None  # nvidia-smi index; None where it is no GPU (CPU:0) or the mapping failed
    values: tuple[tuple[str, int | None], ...]  # (series, bytes), in the adapter's order


class AllocatorFigures(Record):
    """What every imported framework's allocator held at ``read_at`` (immutable: swapped whole)."""

    read_at: float | None  # Unix time of the reading; None: never read
    series: tuple[FigureSeries, ...] = ()  # the series present, framework by framework
    devices: tuple[DeviceFigures, ...] = ()
    notes: tuple[str, ...] = ()  # per framework: why it has no figures, or why its reading failed

    def wire_fields(self) -> dict[tuple[str, str], str]:
        """(framework key, series) -> the older DeviceSample field it fills."""
        return {(s.framework, s.series): s.wire_field for s in self.series if s.wire_field}


NOTHING_READ = AllocatorFigures(None)


class KernelContext(Record):
    """The session's answers the panel needs beside the figures, read on the user's thread too
    (they ask the adapters where they are): the caps, the GPUs shown, and which framework found no
    GPU although CUDA was shown some."""

    limits: tuple[tuple[int, int], ...] = ()  # (nvidia-smi index, cap in bytes)
    visible: tuple[int, ...] | None = None  # nvidia-smi indices this kernel sees; None: all
    found_no_gpu: str | None = None  # the name of the framework that found none
    notes: tuple[str, ...] = ()  # an answer that could not be read
    limit_label: str | None = None  # who holds the caps: "soft (...)", "hard (MPS)", "hard (MIG)"


UNKNOWN_CONTEXT = KernelContext()


def _name(framework: Any) -> str:
    try:
        return str(framework.name)
    except Exception:
        return type(framework).__name__


def read(
    frameworks: Iterable[Any], cuda_map: Callable[[], list[int]], clock: Callable[[], float] = time.time
) -> AllocatorFigures:
    """Every imported framework's figures now.  Call on the user's thread; never raises.

    ``cuda_map`` gives CUDA's numbering (entry k: CUDA device k's nvidia-smi index); it is asked
    once, and only when a framework has figures to map.
    """
    series: list[FigureSeries] = []
    devices: list[DeviceFigures] = []
    notes: list[str] = []
    numbering: list[list[int] | None] = []  # asked once, lazily

    def cuda() -> list[int]:
        if not numbering:
            numbering.append(list(cuda_map()))
        return numbering[0] or []

    try:
        frameworks = tuple(frameworks)
    except Exception as err:
        return AllocatorFigures(
            _now(clock), notes=(f"the frameworks could not be listed ({type(err).__name__}: {err})",)
        )
    for framework in frameworks:
        name = _name(framework)
        try:
            stage = framework.stage()
            if stage is Stage.NOT_IMPORTED:
                continue
            memory = framework.device_memory() if stage is Stage.STARTED else {}
            if not memory:
                why = framework.figures_absent()
                notes.append(f"{name}: no allocator figures {why or 'reported'}")
                continue
            key, charted = str(framework.key), tuple(framework.charted_figures)
        except Exception as err:  # one framework's fault is a note; the others are still read
            notes.append(f"{name}: allocator figures could not be read ({type(err).__name__}: {err})")
            continue
        try:
            gpus = framework.gpu_numbering(cuda())
        except Exception as err:
            gpus = {}
            notes.append(f"{name}: its devices could not be matched to GPUs ({type(err).__name__}: {err})")
        kept = [f for f in charted if any(getattr(m, f.field, None) is not None for m in memory.values())]
        series += [FigureSeries(key, f.series, f"{name} allocator: {f.label}", f.wire_field) for f in kept]
        for device, figures in memory.items():
            values = tuple((f.series, _bytes(getattr(figures, f.field, None))) for f in kept)
            devices.append(DeviceFigures(key, str(device), f"{name} {device}", gpus.get(device), values))
    return AllocatorFigures(_now(clock), tuple(series), tuple(devices), tuple(notes))


def _bytes(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _now(clock: Callable[[], float]) -> float:
    try:
        return float(clock())
    except Exception:
        return time.time()


class Board:
    """Where the latest figures of one kernel wait for the sampler.

    :meth:`publish` reads (user's thread) and replaces the snapshot with one assignment;
    :meth:`latest` returns it (any thread).  No lock: a reference swap is atomic, and the snapshot
    is immutable, so a reader gets the old one or the new one, whole.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._latest = NOTHING_READ
        self._context = UNKNOWN_CONTEXT
        self._clock = clock
        self._context_listeners: list[weakref.WeakMethod[Callable[[KernelContext], None]]] = []

    def latest(self) -> AllocatorFigures:
        return self._latest

    def context(self) -> KernelContext:
        return self._context

    def publish_context(self, context: KernelContext) -> None:
        """Replace the context, then tell each live listener (on the publishing thread: the user's)."""
        self._context = context
        alive = [ref for ref in self._context_listeners if ref() is not None]
        self._context_listeners = alive
        for ref in alive:
            listener = ref()
            if listener is not None:
                try:
                    listener(context)
                except Exception:  # a closed panel's comm, say: the others still hear
                    pass

    def on_context(self, listener: Callable[[KernelContext], None]) -> None:
        """Call the bound method ``listener`` with each context published, while its object lives."""
        self._context_listeners.append(weakref.WeakMethod(listener))

    def publish(
        self, frameworks: Callable[[], Iterable[Any]], cuda_map: Callable[[], list[int]]
    ) -> AllocatorFigures:
        """Read every framework now and make it the latest; never raises (a fault is a note)."""
        try:
            figures = read(frameworks(), cuda_map, self._clock)
        except Exception as err:  # read() guards each framework; this is the last resort
            figures = AllocatorFigures(
                _now(self._clock),
                notes=(f"allocator figures could not be read ({type(err).__name__}: {err})",),
            )
        self._latest = figures
        return figures


def board_of(session: Any) -> Board:
    """The session's board (one per session: a test's session has its own); an object that is not a
    session gets a board of its own, kept on it."""
    board = getattr(session, "figures", None)
    if not isinstance(board, Board):
        board = Board()
        session.figures = board
    return board


def publish(session: Any) -> AllocatorFigures:
    """Read the session's frameworks (user's thread) and publish them for the panel; never raises."""
    try:
        board = board_of(session)
    except Exception:  # a session that cannot be a weak key: nothing to publish to
        return NOTHING_READ
    board.publish_context(read_context(session))
    return board.publish(session.frameworks, lambda: session.machine.cuda_map())


def read_context(session: Any) -> KernelContext:
    """The session's caps, visible GPUs and found-no-GPU answer now (user's thread); never raises."""
    notes: list[str] = []

    def ask(what: str, question: Callable[[], Any], otherwise: Any) -> Any:
        try:
            return question()
        except Exception as err:
            notes.append(f"{what} could not be read ({type(err).__name__}: {err})")
            return otherwise

    limits = ask(
        "the configured limits", lambda: tuple(sorted(dict(session.limit_bytes_by_gpu()).items())), ()
    )
    # What `%gpu use` and CUDA_VISIBLE_DEVICES hid, not what a framework found (see exposed_gpus).
    visible = ask("the visible GPUs", session.exposed_gpus, None)
    found = ask("the frameworks' GPUs", session.found_no_gpu, None)
    label = ask("who holds the limit", getattr(session, "limit_label", lambda: None), None)
    return KernelContext(
        limits, None if visible is None else tuple(visible), found, tuple(notes), label if limits else None
    )


_hooks: weakref.WeakKeyDictionary[Any, Callable[..., None]] = weakref.WeakKeyDictionary()


def install(shell: Any, session: Any) -> None:
    """Publish after every cell of ``shell`` (IPython's ``post_run_cell``); a second call replaces the first."""

    def after_cell(result: Any = None) -> None:
        publish(session)

    old = _hooks.get(shell)
    if old is not None:
        try:
            shell.events.unregister("post_run_cell", old)
        except ValueError:
            pass
    shell.events.register("post_run_cell", after_cell)
    _hooks[shell] = after_cell
