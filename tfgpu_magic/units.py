"""Formatting of sizes for people: binary units, as nvidia-smi and TensorFlow count."""

from __future__ import annotations

from typing import Optional

__all__ = ["MIB", "GIB", "format_bytes", "format_change"]

MIB = 1024**2
GIB = 1024**3


def format_bytes(value: Optional[int]) -> str:
    """``1536 MiB`` style below 10 GiB, ``12.5 GiB`` above; a missing reading is ``n/a``."""
    if value is None:
        return "n/a"
    if abs(value) < 10 * GIB:
        return f"{value / MIB:,.0f} MiB"
    return f"{value / GIB:,.1f} GiB"


def format_change(before: Optional[int], after: Optional[int]) -> str:
    if before is None or after is None:
        return "n/a"
    delta = after - before
    if delta == 0:
        return "unchanged"
    return ("+" if delta > 0 else "-") + format_bytes(abs(delta))
