"""Opening a memory panel: what ``%gpu monitor`` and ``tfgpu_magic.monitor.open_panel`` run.

The sampling engine (:mod:`.monitor`) knows nothing of widgets; the widget (:mod:`.widget`) draws
what the engine samples.  This module joins them on the user's thread: it builds the kernel's
readers (the session's NVML and the allocator figures published after each cell), hands them to
the one sampler of the kernel, and shows the widget.  IPython, ipywidgets and anywidget are
imported only when a panel opens, so ``%load_ext`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..gpus.nvml import Nvml
from . import allocator_figures, monitor
from .monitor import DEFAULT_INTERVAL_S, Sampler, checked_interval, no_note, no_visible

# What `%gpu monitor` prints where no notebook front end can show a widget (a terminal IPython).
NO_FRONT_END = (
    "%gpu monitor needs a notebook front end (JupyterLab, Notebook 7 or VS Code) to show its "
    "charts; nothing was started. In a terminal, run `tfgpu` (the command) or `%gpu status`."
)


def open_panel(
    interval: float | None = None,
    window: float = 300.0,
    sidebar: bool = False,
    *,
    nvml: Nvml | None = None,
    display: bool = True,
    session: Any = None,
    **sources: Callable[[], Any],
) -> Any:
    """Show a live memory panel (what ``%gpu monitor`` runs) and return it.

    ``session`` is the kernel's :class:`~tfgpu_magic.kernel.session.Session` (the magic passes its
    own; by default the process's).  ``nvml`` replaces its NVML reader (a simulated one in
    tests and tutorials), and
    ``sources`` any of the other readers (``figures``, ``limits``, ``visible``, ``no_gpu_note``;
    see :class:`Sampler`).  The first panel's sources serve every panel while the sampler
    runs.  Without ``interval`` a panel joins the running sampler at its interval (0.5 s when
    none runs); an explicit one applies to every open panel.  Both say so in the panel.

    Where no notebook front end can show it (a terminal IPython), prints why and returns None,
    having started nothing.
    """
    unknown = set(sources) - {"figures", "limits", "visible", "no_gpu_note"}
    if unknown:
        raise TypeError(f"open_panel() got unknown sources: {', '.join(sorted(unknown))}")
    if interval is not None:
        checked_interval(interval)
    if display and not _has_front_end():
        print(NO_FRONT_END)
        return None
    from .widget import MemoryPanel  # IPython, ipywidgets and anywidget only when a panel opens

    def make() -> Sampler:  # called only when no sampler runs yet, on this (the user's) thread
        readers = {**_kernel_sources(session, nvml), **sources}
        readers["nvml"].available()  # imports pynvml here: the sampler thread must never import anything
        first = DEFAULT_INTERVAL_S if interval is None else interval
        return Sampler(interval=first, keep_s=window, **readers)

    panel = MemoryPanel(monitor.hub(), make, interval=interval, window=window)
    _follow_limit_label(panel, session)
    if display:
        _show(panel, sidebar)
    return panel


def _follow_limit_label(panel: Any, session: Any) -> None:
    """The panel says who holds its limit line, as the session's context last published it (after
    each cell, on the user's thread): every limit shown says soft or hard."""
    if session is None:
        from .session import get_session

        session = get_session()
    board = allocator_figures.board_of(session)
    panel.show_limit_label(board.context())
    board.on_context(panel.show_limit_label)


def _has_front_end() -> bool:
    """A kernel (ipykernel) that can carry a widget's comm to a notebook front end.

    A terminal IPython (``TerminalInteractiveShell``), a plain ``InteractiveShell`` or no IPython
    at all has none: a widget would print as ``<MemoryPanel object at ...>`` and its sampler
    would run for nobody.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


# The panel-wide note when a framework found no GPU (TensorFlow: a CPU-only build, CUDA's libraries
# missing): the GPUs were not hidden, so they stay charted.
FOUND_NO_GPU = "{name} found no GPU (`%gpu` says why); the charts show the driver's readings"


def _kernel_sources(session: Any, nvml: Nvml | None) -> dict[str, Any]:
    """The real sources: the session's machine, and the allocator figures it published.

    The sampler thread calls these.  The frameworks' figures are only the snapshot published on
    the user's thread (after each cell, at each ``%gpu``): the thread never calls into a
    framework, so sampling never imports or starts anything.  A given ``nvml`` (a simulated
    server) shows all its GPUs: the session's visible indices belong to the real one.
    """
    if session is None:
        from .session import get_session

        session = get_session()
    allocator_figures.publish(session)  # on the user's thread: the first samples have figures
    board = allocator_figures.board_of(session)

    def limits() -> dict[int, int]:
        return dict(board.context().limits)

    def visible() -> list[int] | None:
        shown = board.context().visible
        return None if shown is None else list(shown)

    def no_gpu_note() -> str | None:
        context = board.context()
        notes = [FOUND_NO_GPU.format(name=context.found_no_gpu)] if context.found_no_gpu else []
        return "; ".join(notes + list(context.notes)) or None

    return dict(
        nvml=session.nvml if nvml is None else nvml,
        figures=board.latest,
        limits=limits,
        visible=visible if nvml is None else no_visible,
        no_gpu_note=no_gpu_note if nvml is None else no_note,
    )


def _show(panel: Any, sidebar: bool) -> None:
    from IPython.display import display

    if not sidebar:
        display(panel)
        return
    from .widget import SideArea

    side = SideArea(child=panel, title="GPU memory")
    display(side)  # the cell shows one line; the panel goes to the side area
    panel.side_area = side  # kept, so closing the panel closes the side tab too
