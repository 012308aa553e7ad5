"""The requested configuration as data, and the decisions on combinations TensorFlow mishandles.

A :class:`Plan` is what the user asked for, independent of TensorFlow's stage.  ``None`` in a
field means "not asked; TensorFlow's default".  Turning a plan into TensorFlow settings is
:mod:`tfgpu_magic.tf_runtime`'s job; this module only decides what the settings *are*:

* growth and a limit together: TensorFlow silently drops growth on a GPU with a logical
  device configuration, so growth is carried by ``TF_FORCE_GPU_ALLOW_GROWTH=true``, which its
  allocator honours for virtual devices too.  The user gets both: grow up to the cap.
* growth is always the same on every visible GPU (TensorFlow fails at the first op otherwise).
* ``split N`` divides the limit (or, without one, the GPU's memory less a reserve for the
  CUDA context) into N equal logical GPUs; ``split 4G,4G`` names the sizes and excludes a limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

from . import grammar
from .grammar import Percent, Size

__all__ = ["CONTEXT_RESERVE_MIB", "Plan", "PlanError", "logical_sizes_mib", "limit_mib"]

# Memory a CUDA context and TensorFlow's libraries take outside any TensorFlow limit
# (landscape.md: a 512 MB limit showed 1869 MiB in nvidia-smi).  Left free when `split N`
# must divide a whole GPU.
CONTEXT_RESERVE_MIB = 1536


class PlanError(ValueError):
    """A command that contradicts the rest of the plan; the message says how to resolve it."""


Visible = Union[tuple[int, ...], str, None]  # NVML indices, "all", "none", or None (not asked)


@dataclass(frozen=True)
class Plan:
    visible: Visible = None
    growth: Optional[bool] = None
    limits: Optional[tuple[Size, ...]] = None
    split: Optional[grammar.Split] = None
    allocator: Optional[str] = None  # "async" or "default"
    precision: Optional[str] = None

    def with_command(self, command: object) -> "Plan":
        """The plan after one configuration command; raises :class:`PlanError` on a conflict."""
        if isinstance(command, grammar.Use):
            if isinstance(command.gpus, grammar.Auto):
                raise TypeError("resolve `use auto` to GPU numbers before planning")
            return replace(self, visible=command.gpus)
        if isinstance(command, grammar.Grow):
            return replace(self, growth=command.on)
        if isinstance(command, grammar.Limit):
            if command.sizes is not None and self.split and self.split.sizes:
                raise PlanError(
                    "`%gpu split` already names the size of each logical GPU, so a limit would "
                    "contradict it; run `%gpu split off` first, or `%gpu split N` to divide the limit"
                )
            return replace(self, limits=command.sizes)
        if isinstance(command, grammar.Split):
            if command.sizes and self.limits:
                raise PlanError(
                    f"`%gpu split {_sizes_text(command.sizes)}` names sizes, but a limit of "
                    f"{_sizes_text(self.limits)} is set; run `%gpu limit off` first, or use "
                    "`%gpu split N` to divide the limit into N logical GPUs"
                )
            return replace(self, split=None if command.off else command)
        if isinstance(command, grammar.Allocator):
            return replace(self, allocator=command.name)
        if isinstance(command, grammar.Precision):
            return replace(self, precision=command.policy)
        raise TypeError(f"not a configuration command: {command!r}")

    def describe(self) -> list[str]:
        """One line per requested setting, in the words of the commands that set it."""
        lines = []
        if self.visible is not None:
            shown = self.visible if isinstance(self.visible, str) else ",".join(map(str, self.visible))
            lines.append(f"use {shown}")
        if self.growth is not None:
            lines.append("grow" if self.growth else "grow off")
        if self.limits is not None:
            lines.append(f"limit {_sizes_text(self.limits)}")
        if self.split is not None:
            shown = str(self.split.count) if self.split.count else _sizes_text(self.split.sizes or ())
            lines.append(f"split {shown}")
        if self.allocator is not None:
            lines.append(f"allocator {self.allocator}")
        if self.precision is not None:
            lines.append(f"precision {self.precision}")
        return lines

    @property
    def needs_logical_devices(self) -> bool:
        return self.limits is not None or self.split is not None


def _sizes_text(sizes: tuple[Size, ...]) -> str:
    return ",".join(str(s) if isinstance(s, Percent) else f"{s}MiB" for s in sizes)


def limit_mib(plan: Plan, position: int, total_mib: Optional[int]) -> Optional[int]:
    """The cap of the ``position``-th visible GPU, in MiB, or None when no limit is asked.

    One size applies to every GPU; a list gives one size per visible GPU, in order.
    A percentage needs the GPU's total memory (from NVML).
    """
    if plan.limits is None:
        return None
    sizes = plan.limits
    if len(sizes) != 1 and position >= len(sizes):
        raise PlanError(
            f"`%gpu limit` gives {len(sizes)} sizes but GPU #{position + 1} is visible too; "
            "give one size for all GPUs or one per visible GPU"
        )
    size = sizes[0] if len(sizes) == 1 else sizes[position]
    if isinstance(size, Percent):
        if total_mib is None:
            raise PlanError(
                f"a limit of {size} needs each GPU's total memory, which NVML cannot read here; "
                "give the limit in MiB or GiB instead (e.g. `%gpu limit 4G`)"
            )
        return max(1, int(total_mib * size.value / 100))
    return int(size)


def logical_sizes_mib(plan: Plan, position: int, total_mib: Optional[int]) -> Optional[list[int]]:
    """The logical GPUs to create on the ``position``-th visible GPU (MiB each), or None."""
    cap = limit_mib(plan, position, total_mib)
    split = plan.split
    if split is None:
        return None if cap is None else [cap]
    if split.sizes:
        return list(split.sizes)
    assert split.count is not None
    if cap is None:
        if total_mib is None:
            raise PlanError(
                f"`%gpu split {split.count}` needs the GPU's memory, which NVML cannot read here; "
                "name the sizes instead (e.g. `%gpu split 4G,4G`)"
            )
        cap = max(split.count, total_mib - CONTEXT_RESERVE_MIB)
    return [cap // split.count] * split.count
