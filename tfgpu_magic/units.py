"""Formatting of sizes for people: binary units, as nvidia-smi and TensorFlow count."""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["MIB", "GIB", "format_bytes", "format_change", "format_size"]

MIB = 1024**2
GIB = 1024**3


def format_bytes(value: Optional[int]) -> str:
    """``1536 MiB`` style below 10 GiB, ``12.5 GiB`` above; a missing reading is ``n/a``."""
    if value is None:
        return "n/a"
    if abs(value) < 10 * GIB:
        return f"{value / MIB:,.0f} MiB"
    return f"{value / GIB:,.1f} GiB"


def format_size(value: int) -> str:
    """Like :func:`format_bytes`, with small sizes that do not round to ``0 MiB`` (allocator readings)."""
    if value < 1024:
        return f"{value} B"
    if value < MIB:
        return f"{value / 1024:.0f} KiB"
    return format_bytes(value)


def format_change(
    before: Optional[int], after: Optional[int], fmt: Callable[[int], str] = format_bytes
) -> str:
    """``+64 MiB``, ``-1,024 MiB`` or ``unchanged``; ``n/a`` when a reading is missing."""
    if before is None or after is None:
        return "n/a"
    delta = after - before
    if delta == 0:
        return "unchanged"
    return ("+" if delta > 0 else "-") + fmt(abs(delta))
