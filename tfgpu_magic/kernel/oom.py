"""An explanation under a framework's out-of-memory error: which device, how full, who else, what next.

:func:`explain` makes the text; :mod:`.oom_handler` shows it under the error's traceback in
IPython, importing this module only when the first out-of-memory error arrives.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ..command.units import format_size
from ..frameworks.base import OomFacts
from ..safe_text import safe

__all__ = ["Facts", "explain", "gather", "is_out_of_memory", "next_steps", "render"]


def is_out_of_memory(framework: Any, error: BaseException) -> bool:
    """Whether ``error`` (of the framework's out-of-memory type) is about memory: its adapter says."""
    return framework.is_out_of_memory(error)


# -- facts ----------------------------------------------------------------------------------------
@dataclass
class Facts:
    """The framework's reading of its error (its adapter's) and the driver's view of the GPU."""

    framework: str  # its name: "TensorFlow", ...
    own: OomFacts
    label: str  # "GPU 1 (TF GPU:0, NVIDIA A100-SXM4-80GB)" or "CPU:0"
    gpu_used_bytes: int | None = None  # all processes, per the driver
    gpu_total_bytes: int | None = None
    others: list[str] = field(default_factory=list)  # one line per other process
    others_note: str | None = None
    better_gpu: tuple[int, int] | None = None  # (NVML index, free bytes) of a freer GPU

    @property
    def gpu(self) -> int | None:  # NVML index
        return self.own.gpu


def gather(session: Any, error: BaseException) -> Facts:
    """Everything the explanation says, read now (the allocator right after the failure): the
    framework whose error it is reads it (its type first; else the first that takes any error)."""
    frameworks = session.frameworks()
    typed = [
        f for f in frameworks if f.oom_error_type() is not None and isinstance(error, f.oom_error_type())
    ]
    view = session.view()
    for framework in [*typed, *(f for f in frameworks if f not in typed)]:
        own = framework.oom_facts(
            error, dataclasses.replace(view, applied=session.applied.get(framework.key))
        )
        if own is not None:
            break
    else:
        raise LookupError(f"no framework reads {type(error).__name__} as its out-of-memory error")
    facts = Facts(framework.name, own, own.label)
    if own.gpu is not None:
        _driver_facts(session, facts, own.gpu, own.named)
    return facts


def _driver_facts(session: Any, facts: Facts, index: int, named: str) -> None:
    """The driver's view of GPU ``index``: its name, how full, who else, a freer GPU."""
    nvml = session.nvml
    info = nvml.gpu(index) if nvml.available() else None
    memory = info.memory if info is not None else None
    name = f", {info.name}" if info is not None and info.name else ""
    facts.label = f"GPU {index} ({named}{name})"
    if memory is not None:
        facts.gpu_used_bytes, facts.gpu_total_bytes = memory.used_bytes, memory.total_bytes
    if nvml.available():
        facts.others, facts.others_note = _other_processes(session, info)
        facts.better_gpu = _freer_gpu(nvml, index, memory)


def _other_processes(session: Any, info: Any) -> tuple[list[str], str | None]:
    """Other processes on the GPU with owners, largest first (the inventory's attribution)."""
    from ..gpus import holdings, owners  # psutil, only when there is something to explain

    table = owners.process_table_for(session.nvml)
    usage = holdings.attribute(session.nvml, info, table, os.getpid(), table.current_user())
    if usage.processes is None:
        return [], "; ".join(usage.notes) or "NVML could not list the processes"
    others = sorted(
        (e for e in usage.processes if e.whose != holdings.THIS_KERNEL),
        key=lambda e: -(e.used_memory_bytes or 0),
    )
    return [_process_line(e) for e in others], None


def _process_line(entry: Any) -> str:
    used = "memory n/a" if entry.used_memory_bytes is None else format_size(entry.used_memory_bytes)
    if not entry.alive:
        return f"pid {entry.pid}: {used} (exited, but the driver still lists it)"
    user = safe(entry.user) if entry.user else "unknown user"  # other users' text: never raw escapes
    command = f", {safe(entry.command)}" if entry.command else ""
    return f"pid {entry.pid}: {used} ({user}{command})"


def _freer_gpu(nvml: Any, index: int, memory: Any) -> tuple[int, int] | None:
    here = memory.free_bytes if memory is not None else 0
    best: tuple[int, int] | None = None
    for gpu in nvml.gpus():
        if gpu.index == index or gpu.memory is None or gpu.lost:
            continue
        free = gpu.memory.free_bytes
        if free > here and (best is None or free > best[1]):
            best = (gpu.index, free)
    return best


# -- the text -------------------------------------------------------------------------------------
def explain(session: Any, error: BaseException) -> str:
    """The explanation printed under an out-of-memory traceback (the one path to it)."""
    return render(gather(session, error))


def render(facts: Facts) -> str:
    lines = [f"tfgpu_magic: {facts.framework} ran out of memory on {facts.label}."]
    lines.extend(f"  {line}" for line in facts.own.lines)
    if facts.gpu_used_bytes is not None and facts.gpu_total_bytes is not None:
        lines.append(
            f"  GPU {facts.gpu}: {format_size(facts.gpu_used_bytes)} of {format_size(facts.gpu_total_bytes)} "
            "in use by all processes (nvidia-smi's view)"
        )
    lines.extend(_others_lines(facts))
    lines.append("  Next steps:")
    lines.extend(f"    - {step}" for step in next_steps(facts))
    return "\n".join(lines)


def _others_lines(facts: Facts) -> list[str]:
    if not facts.own.on_gpu or facts.gpu is None:
        return []
    if facts.others_note:
        return [f"  Other processes on GPU {facts.gpu}: unknown ({facts.others_note})"]
    if not facts.others:
        return [f"  Other processes on GPU {facts.gpu}: none"]
    return [f"  Other processes on GPU {facts.gpu}:"] + [f"    {line}" for line in facts.others]


def next_steps(facts: Facts) -> list[str]:
    """The framework's own remedies, then another GPU, a higher limit, or its remedy off the GPU."""
    steps = list(facts.own.steps)
    if facts.own.on_gpu and facts.better_gpu is not None:
        index, free = facts.better_gpu
        steps.append(
            f"another GPU: `%gpu use {index}` ({format_size(free)} free) or a higher `%gpu limit`, "
            "at the top of the notebook, then restart the kernel"
        )
    elif facts.own.on_gpu or facts.own.cpu_step is None:
        steps.append("a higher `%gpu limit`, at the top of the notebook, then restart the kernel")
    else:
        steps.append(facts.own.cpu_step)
    return steps
