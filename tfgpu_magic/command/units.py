"""Formatting of sizes for people: binary units, as nvidia-smi and TensorFlow count."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["GIB", "MIB", "format_bytes", "format_change", "format_size", "sizes_for"]

MIB = 1024**2
GIB = 1024**3


def format_bytes(value: int | None) -> str:
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


def format_change(before: int | None, after: int | None, fmt: Callable[[int], str] = format_bytes) -> str:
    """``+64 MiB``, ``-1,024 MiB`` or ``unchanged``; ``n/a`` when a reading is missing."""
    if before is None or after is None:
        return "n/a"
    delta = after - before
    if delta == 0:
        return "unchanged"
    return ("+" if delta > 0 else "-") + fmt(abs(delta))


def sizes_for(total: int | None) -> Callable[[int | None], str]:
    """One unit for a group of figures side by side (a GPU's used, free, shares and processes),
    chosen from the group's largest, its total: GiB from 1 GiB up, else MiB.  ``2.3 GiB / 15.0 GiB``,
    never ``2,348 MiB / 15.0 GiB``; a small non-zero share keeps two significant digits."""
    if total is None or total < GIB:
        return lambda value: "n/a" if value is None else f"{value / MIB:,.0f} MiB"
    return _in_gib


def _in_gib(value: int | None) -> str:
    if value is None:
        return "n/a"
    gib = value / GIB
    return f"{gib:,.1f} GiB" if gib == 0 or abs(gib) >= 0.05 else f"{gib:.2g} GiB"
