"""``%%gpu budget 2G`` and ``%%gpu on 1``: run one cell under a memory budget or on one GPU.

Both may share a line (``%%gpu on 1 budget 2G``).  The cell body runs in the user's namespace as
``%%time`` runs it: IPython's input transformations apply, the value of a final expression is
the cell's result, and exceptions (an out-of-memory error included) reach IPython unchanged.

A budget is checked after the cell has run, against TensorFlow's allocator: the cell's peak is
the most it held above what was in use when the cell started, per device.  Over budget, the cell
fails with :class:`BudgetExceeded` (its variables are kept).
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from ..command import grammar
from ..command.units import format_size
from ..frameworks import tensorflow as tf_adapter
from ..frameworks.base import Stage
from . import trace
from .session import SessionError

__all__ = ["BudgetExceeded", "CELL_FORMS", "CellCommand", "check_budget", "execute", "parse_cell_line", "run_cell_magic"]

CELL_FORMS = grammar.CELL_FORMS  # declared, with their parsers, in grammar.TABLE
USAGE = grammar.cell_usage()


class BudgetExceeded(RuntimeError):
    """A cell's peak went over its ``%%gpu budget``; shown as one line, without a traceback."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"BudgetExceeded: {self}"]


@dataclass(frozen=True)
class CellCommand:
    budget_bytes: Optional[int] = None
    gpu: Optional[int] = None  # NVML index, as nvidia-smi and `%gpu use` number GPUs


# -- the line ------------------------------------------------------------------------------------
def parse_cell_line(line: str) -> CellCommand:
    """``budget 2G``, ``on 1``, or both, in any order; raises GrammarError naming the forms."""
    found = grammar.parse_cell(line)
    return CellCommand(found.get("budget"), found.get("on"))  # type: ignore[arg-type]


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
    tf = session.tf
    if tf.stage() is Stage.STARTED and not tf.memory_devices():
        raise SessionError(f"cannot check a budget: {trace.NO_STATS}")
    others_in_use = any(f.stage() is not Stage.NOT_IMPORTED for f in (session.torch,)) or (
        session.jax.stage() is Stage.STARTED
    )
    tf_measured = tf.stage() is not Stage.NOT_IMPORTED or not others_in_use
    if tf_measured and trace.enable_cpu_stats(session):
        print(f"tfgpu_magic: no GPU will be visible, so {tf_adapter.CPU_STATS_ENV}=true is now set "
              "for TensorFlow's CPU allocator to keep the statistics a budget needs")
    others = [f for f in session.frameworks() if f is not tf]
    imported_before = {f.key for f in others if f.stage() is not Stage.NOT_IMPORTED}
    windows = {f.key: f.open_peak_window() for f in others if f.key in imported_before}
    window = tf.open_peak_window()
    try:
        with scope:
            value = execute(shell, cell)
        readings = window.read()
        other_readings = {
            trace.framework_device_label(f.name, device, session): reading
            for f in others if f.stage() is Stage.STARTED
            for device, reading in (
                windows[f.key].peaks() if f.key in windows else trace.readings_since_start(f)
            ).items()
        }
    finally:
        window.close()
        for opened in windows.values():
            opened.close()
    if tf.stage() is Stage.STARTED and not readings and not other_readings:
        raise SessionError(f"the budget could not be checked: {trace.NO_STATS}")
    if not readings and not other_readings and others_in_use:
        print("tfgpu_magic: the budget could not be checked: no framework's allocator reported figures "
              "(PyTorch before it starts CUDA, or JAX without a GPU backend, keeps none)")
    labels = {device: trace.device_label(device, session) for device in readings}
    peaks = {labels[d]: (start, stats.peak_bytes) for d, (start, stats) in readings.items()}
    peaks.update({label: (r.start_bytes, r.peak_bytes) for label, r in other_readings.items() if r.exact})
    check_budget(budget, peaks)
    for label, reading in other_readings.items():
        if not reading.exact and reading.peak_bytes - reading.start_bytes > budget:
            print(f"tfgpu_magic: {label}: the budget could not be checked: JAX cannot reset its peak, and "
                  f"the highest it held since it started ({format_size(reading.peak_bytes)}) was before this cell")
    return value


def check_budget(budget: int, peaks: dict[str, tuple[int, int]]) -> None:
    """Raise BudgetExceeded when a device's rise (peak minus start, bytes) is over ``budget``."""
    for label, (start, peak) in peaks.items():
        rise = peak - start
        if rise > budget:
            shown_rise, shown_budget = _distinct_sizes(rise, budget)
            raise BudgetExceeded(
                f"{label}: the cell's peak was {shown_rise}, over its budget of {shown_budget} "
                f"({_whose(label)} allocator held {format_size(start)} when the cell started "
                f"and {format_size(peak)} at the peak)"
            )


def _whose(label: str) -> str:
    for name in ("PyTorch", "JAX"):
        if f"({name} " in label or label.startswith(f"{name} "):
            return f"{name}'s"
    return "TensorFlow's"


def _distinct_sizes(a: int, b: int) -> tuple[str, str]:
    """Two sizes as text; in bytes when rounding would show them equal ("64 MiB over 64 MiB")."""
    shown = format_size(a), format_size(b)
    if shown[0] != shown[1]:
        return shown
    return f"{a:,} bytes", f"{b:,} bytes"


@contextlib.contextmanager
def _gpu_scope(session: Any, gpu: int) -> Iterator[None]:
    """Each imported framework's device scope for the GPU nvidia-smi numbers ``gpu``
    (``tf.device``, ``torch.cuda.device``, ``jax.default_device``); SessionError when a framework
    that sees GPUs lacks it, or when none sees a GPU."""
    __tracebackhide__ = True
    found = _visible_by_framework(session)
    if not found:  # nothing imported, or only a JAX whose backends have not started
        raise SessionError(
            "`%%gpu on` runs the cell under TensorFlow's tf.device, and TensorFlow is not imported: "
            "run `import tensorflow as tf` in an earlier cell (or `import torch`, or a first JAX "
            "operation, for torch.cuda.device, jax.default_device)"
        )
    scopes, blind = [], []  # blind: (framework, the error) for each framework that sees no GPU
    for framework, seen in found:
        if not seen:
            blind.append(_not_visible(gpu, [], framework.name))
        elif gpu not in seen:
            raise SessionError(_not_visible(gpu, sorted(seen), framework.name))
        else:
            scopes.append(_scope(session, framework, gpu))
    if not scopes:
        raise SessionError(blind[0])
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(scope)
        yield


def _visible_by_framework(session: Any) -> list[tuple[Any, list[int]]]:
    """Each imported framework and the GPUs it sees (nvidia-smi numbers; JAX once started)."""
    found = []
    tf, torch, jax = session.tf, session.torch, session.jax
    if tf.stage() is not Stage.NOT_IMPORTED:
        tf.enumerate_devices()
        found.append((tf, sorted(set(session.gpu_by_tf_name().values()))))
    cuda_map = session.machine.cuda_map()
    if torch.stage() is not Stage.NOT_IMPORTED:
        found.append((torch, cuda_map[: torch.found_gpus()]))
    if jax.stage() is Stage.STARTED:
        found.append((jax, [cuda_map[k] for k in jax.gpu_ids() if k < len(cuda_map)]))
    return found


def _scope(session: Any, framework: Any, gpu: int) -> Any:
    if framework is session.tf:
        name = next(n for n, index in session.gpu_by_tf_name().items() if index == gpu)
        return framework.device_scope(name)
    return framework.device_scope(session.machine.cuda_map().index(gpu))


def _not_visible(gpu: int, visible: list[int], framework: str = "TensorFlow") -> str:
    if not visible:
        return f"GPU {gpu} is not visible to {framework}: it sees no GPU; {USAGE}"
    shown = ", ".join(map(str, visible))
    return f"GPU {gpu} is not visible to {framework} (visible: GPU {shown}, as nvidia-smi numbers them); {USAGE}"


def execute(shell: Any, cell: str) -> Any:
    """Run ``cell`` in the user's namespace; the value of a final expression is returned."""
    __tracebackhide__ = True
    source = shell.transform_cell(cell)
    name = shell.compile.cache(source, shell.execution_count, raw_code=cell)  # tracebacks show its lines
    tree = shell.transform_ast(shell.compile.ast_parse(source, filename=name))
    last: Optional[ast.Expression] = None
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
