"""The ``%gpu`` commands as values: what :mod:`tfgpu_magic.command.grammar` makes of a line.

Kept apart from the parser so that what only reads commands (the plan, the session, the
framework adapters, and so a status in a fresh process) does not load the command language.
"""

from __future__ import annotations

from typing import Literal

from ..records import Record

__all__ = [
    "Allocator",
    "Auto",
    "Command",
    "Doctor",
    "Everything",
    "Free",
    "Grow",
    "Limit",
    "Monitor",
    "Percent",
    "Precision",
    "Reset",
    "Save",
    "Size",
    "Split",
    "Status",
    "Trace",
    "Use",
]


# -- values -------------------------------------------------------------------------------------
class Percent(Record):
    """A share of each GPU's total memory, 0 < value <= 100."""

    value: float

    def __str__(self) -> str:
        return f"{self.value:g}%"


Size = int | Percent  # an int is MiB
Everything = Literal["all", "none"]  # `use all`, `use none`


class Auto(Record):
    """``use auto``: let the product choose GPUs (see :mod:`tfgpu_magic.inventory`)."""

    count: int = 1
    min_free_bytes: int | None = None
    wait_seconds: float | None = None
    min_capability: tuple[int, int] | None = None  # the least CUDA compute capability, (8, 0)


# -- commands -----------------------------------------------------------------------------------
class Use(Record):
    """``%gpu use``: the GPUs the kernel's frameworks are shown."""

    gpus: tuple[int, ...] | Everything | Auto  # NVML indices, "all", "none", or Auto


class Grow(Record):
    """``%gpu grow`` / ``grow off``: memory taken as needed, or reserved at the start."""

    on: bool


class Limit(Record):
    """``%gpu limit``: the kernel's cap on each visible GPU (``None``: ``limit off``)."""

    sizes: tuple[Size, ...] | None  # None: off; one size for every GPU, or one per GPU
    # Or the kernel's limit as named shares, one size each, on every visible GPU: ("tensorflow", 6144), ...
    shares: tuple[tuple[str, Size], ...] | None = None
    # `--hard`: the limit is to hold for the whole process (MPS or MIG), not only the frameworks' pools.
    hard: bool = False


class Split(Record):
    """``%gpu split``: logical GPUs on each visible GPU (neither field: ``split off``)."""

    count: int | None = None  # n equal logical GPUs on each visible GPU
    sizes: tuple[int, ...] | None = None  # explicit MiB of each logical GPU

    @property
    def off(self) -> bool:
        return self.count is None and self.sizes is None


class Allocator(Record):
    """``%gpu allocator``: the frameworks' GPU allocator."""

    name: str  # "async", "default" or "platform" (JAX's allocator that hands memory back)


class Precision(Record):
    """``%gpu precision``: Keras's dtype policy."""

    policy: str


class Free(Record):
    """``%gpu free``: the frameworks' caches emptied, with the driver's reading before and after."""


class Save(Record):
    """``%gpu save``: this notebook's GPU settings into its metadata (``tfgpu``)."""


class Status(Record):
    """``%gpu status``: what was asked, what is in force, and who holds what."""

    json: bool = False


class Reset(Record):
    """``%gpu reset``: forget the requested settings not yet in force."""


class Doctor(Record):
    """``%gpu doctor``: how this kernel shares its GPUs, each finding with its evidence and fix."""

    json: bool = False


class Monitor(Record):
    """``%gpu monitor``: the live memory chart, in the output or the sidebar."""

    sidebar: bool = False
    interval: float | None = None  # seconds between samples; None: the running sampler's (0.5 s if none)
    window: float = 300.0  # seconds of history shown
    off: bool = False  # `%gpu monitor off`: stop every panel of this kernel and its sampler


class Trace(Record):
    """``%gpu trace``: after each cell, each framework's allocator peak and retained change."""

    on: bool


Command = (
    Use
    | Grow
    | Limit
    | Split
    | Allocator
    | Precision
    | Free
    | Status
    | Reset
    | Monitor
    | Trace
    | Save
    | Doctor
)
