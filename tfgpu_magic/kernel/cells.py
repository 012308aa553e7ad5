"""``%%gpu budget 2G`` and ``%%gpu on 1``: run one cell under a memory budget or on one GPU.

Both may share a line (``%%gpu on 1 budget 2G``).  The cell body runs in the user's namespace as
``%%time`` runs it: IPython's input transformations apply, the value of a final expression is
the cell's result, and exceptions (an out-of-memory error included) reach IPython unchanged.

A budget is checked after the cell has run, against each framework's allocator: the cell's peak
is the most it held above what was in use when the cell started, per device.  Over budget, the cell
fails with :class:`BudgetExceeded` (its variables are kept).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..command import grammar
from ..command.units import format_size
from ..frameworks.base import ReportView
from .session import SessionError

__all__ = [
    "CELL_FORMS",
    "BudgetExceeded",
    "CellCommand",
    "check_budget",
    "execute",
    "parse_cell_line",
    "run_cell_magic",
]

CELL_FORMS = grammar.CELL_FORMS  # declared, with their parsers, in grammar.TABLE
USAGE = grammar.cell_usage()


class BudgetExceeded(RuntimeError):
    """A cell's peak went over its ``%%gpu budget``; shown as one line, without a traceback."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"BudgetExceeded: {self}"]


@dataclass(frozen=True)
class CellCommand:
    budget_bytes: int | None = None
    gpu: int | None = None  # NVML index, as nvidia-smi and `%gpu use` number GPUs


# -- the line ------------------------------------------------------------------------------------
def parse_cell_line(line: str) -> CellCommand:
    """``budget 2G``, ``on 1``, or both, in any order; raises GrammarError naming the forms."""
    found = grammar.parse_cell(line)
    return CellCommand(found.get("budget"), found.get("on"))


# -- running --------------------------------------------------------------------------------------
def run_cell_magic(shell: Any, session: Any, line: str, cell: str) -> Any:
    """Parse, check, run the cell, check its budget; returns the value of its last expression."""
    __tracebackhide__ = True  # tracebacks of the user's code skip these frames
    command = parse_cell_line(line)
    scope = _gpu_scope(session, command.gpu) if command.gpu is not None else contextlib.nullcontext()
    if command.budget_bytes is None:
        with scope:
            return execute(shell, cell)
    return _run_with_budget(shell, session, command.budget_bytes, scope, cell)


def _run_with_budget(shell: Any, session: Any, budget: int, scope: Any, cell: str) -> Any:
    __tracebackhide__ = True
    frameworks = session.frameworks()
    view = _view(session)
    for framework in frameworks:
        problem = framework.measurement_problem(view)
        if problem:
            raise SessionError(f"cannot check a budget: {problem}")
    in_use = {f.key for f in frameworks if f.in_use()}
    if view.visible_gpus is not _UNKNOWN:
        for framework in frameworks:  # the CPU's allocator keeps statistics only if asked before its start
            said = framework.keep_statistics(view, alone=not in_use - {framework.key})
            if said:
                print(f"tfgpu_magic: {said}")
    windows = {f.key: f.open_peak_window() for f in frameworks}  # one not started yet counts from zero
    try:
        with scope:
            value = execute(shell, cell)
        view = _view(session)  # CUDA may have started in the cell: its numbering is known now
        readings = [
            (framework, framework.device_label(device, view), reading)
            for framework in frameworks
            for device, reading in windows[framework.key].peaks().items()
        ]
    finally:
        for window in windows.values():
            window.close()
    if not readings:
        problem = next((p for p in (f.measurement_problem(view) for f in frameworks) if p), None)
        if problem:
            raise SessionError(f"the budget could not be checked: {problem}")
        if in_use:
            print(
                "tfgpu_magic: the budget could not be checked: no framework's allocator reported figures "
                "(a framework keeps none before it starts on a GPU)"
            )
    check_budget(
        budget, {label: (r.start_bytes, r.peak_bytes, f.name) for f, label, r in readings if r.exact}
    )
    for framework, label, reading in readings:
        if not reading.exact and reading.peak_bytes - reading.start_bytes > budget:
            print(
                f"tfgpu_magic: {label}: the budget could not be checked: {framework.name} cannot reset its peak, "
                f"and the highest it held since it started ({format_size(reading.peak_bytes)}) was before this cell"
            )
    return value


_UNKNOWN: Any = object()  # the GPUs this kernel sees could not be read


def _view(session: Any) -> ReportView:
    """The kernel's facts for the adapters (they never see the session), with whether this
    kernel's GPUs could be read at all."""
    try:
        visible = session.visible_gpus()
        seen = None if visible is None else tuple(visible)
    except Exception:  # no reading: assume GPUs rather than change the CPU allocator uninvited
        seen = _UNKNOWN
    return dataclasses.replace(session.view(), visible_gpus=seen)


def check_budget(budget: int, peaks: dict[str, tuple[int, int, str]]) -> None:
    """Raise BudgetExceeded when a device's rise (peak minus start, bytes) is over ``budget``;
    ``peaks``: label -> (bytes at the start, bytes at the peak, the framework whose allocator it is)."""
    for label, (start, peak, whose) in peaks.items():
        rise = peak - start
        if rise > budget:
            shown_rise, shown_budget = _distinct_sizes(rise, budget)
            raise BudgetExceeded(
                f"{label}: the cell's peak was {shown_rise}, over its budget of {shown_budget} "
                f"({whose}'s allocator held {format_size(start)} when the cell started "
                f"and {format_size(peak)} at the peak)"
            )


def _distinct_sizes(a: int, b: int) -> tuple[str, str]:
    """Two sizes as text; in bytes when rounding would show them equal ("64 MiB over 64 MiB")."""
    shown = format_size(a), format_size(b)
    if shown[0] != shown[1]:
        return shown
    return f"{a:,} bytes", f"{b:,} bytes"


@contextlib.contextmanager
def _gpu_scope(session: Any, gpu: int) -> Iterator[None]:
    """Each framework's device scope for the GPU nvidia-smi numbers ``gpu`` (``tf.device``,
    ``torch.cuda.device``, ``jax.default_device``: its adapter's); SessionError when a framework
    that sees GPUs lacks it, or when none sees a GPU."""
    __tracebackhide__ = True
    frameworks = session.frameworks()
    view = _view(session)
    found = [(f, *f.gpu_scope(gpu, view)) for f in frameworks]
    found = [(f, seen, scope) for f, seen, scope in found if seen is not None]
    if not found:  # nothing imported, or only a JAX whose backends have not started
        raise SessionError(_nothing_to_run_on(frameworks))
    scopes, blind = [], []  # blind: the error for each framework that sees no GPU
    for framework, seen, scope in found:
        if not seen:
            blind.append(_not_visible(gpu, [], framework.name))
        elif scope is None:
            raise SessionError(_not_visible(gpu, sorted(seen), framework.name))
        else:
            scopes.append(scope)
    if not scopes:
        raise SessionError(blind[0])
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(scope)
        yield


def _nothing_to_run_on(frameworks: Any) -> str:
    """No framework can run the cell yet: the first framework's scope, then the others'."""
    (first, *rest) = frameworks
    scope, use = first.scope_hint()
    others = [f.scope_hint() for f in rest]
    more = (
        f" (or {', or '.join(u for _s, u in others)}, for {', '.join(s for s, _u in others)})"
        if others
        else ""
    )
    return (
        f"`%%gpu on` runs the cell under {first.name}'s {scope}, and {first.name} is not imported: "
        f"run {use} in an earlier cell{more}"
    )


def _not_visible(gpu: int, visible: list[int], framework: str) -> str:
    if not visible:  # no GPU number would do: the usage line would offer `%%gpu on 1` in vain
        return (
            f"GPU {gpu} is not visible to {framework}: it sees no GPU, so `%%gpu on` has nothing to run the "
            "cell on here; `%%gpu budget 2G` still measures the cell"
        )
    shown = ", ".join(map(str, visible))
    return (
        f"GPU {gpu} is not visible to {framework} (visible: GPU {shown}, as nvidia-smi numbers them); {USAGE}"
    )


def execute(shell: Any, cell: str) -> Any:
    """Run ``cell`` in the user's namespace; the value of a final expression is returned."""
    __tracebackhide__ = True
    source = shell.transform_cell(cell)
    name = shell.compile.cache(source, shell.execution_count, raw_code=cell)  # tracebacks show its lines
    tree = shell.transform_ast(shell.compile.ast_parse(source, filename=name))
    last: ast.Expression | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(shell.compile(tree, name, "exec"), shell.user_global_ns, shell.user_ns)
    if last is None:
        return None
    value = eval(shell.compile(last, name, "eval"), shell.user_global_ns, shell.user_ns)
    return None if _ends_with_semicolon(shell, source) else value  # `x;` shows nothing


def _ends_with_semicolon(shell: Any, source: str) -> bool:
    quiet = getattr(type(shell.displayhook), "semicolon_at_end_of_expression", None)
    return bool(quiet(source)) if quiet is not None else source.rstrip().endswith(";")
