"""One kernel, one limit: how the kernel's cap on a GPU is divided between its frameworks.

A limit is the kernel's, whatever runs in it: two frameworks on one GPU never get a full cap each.
The user may name the shares (`%gpu limit 6G tensorflow, 2G jax`); otherwise the cap is divided
equally between the frameworks that take a part of it (imported by the notebook, able to use a
GPU), after what a started framework already holds, which can no longer change.  A framework
named in no share, or arriving when nothing is left, gets the least a framework can be given
(1 MiB), and the reply says so: the kernel's limit is used up.

Pure arithmetic on what the session hands over; the frameworks themselves are not called here.
"""

from __future__ import annotations

from ..command.plan import GpuPlan
from ..command.units import MIB, format_bytes
from ..records import Record

__all__ = ["LEAST_MIB", "Sharer", "part_mib", "sharing_note"]

LEAST_MIB = 1  # what a framework with no part left is capped at: it can allocate nothing


class Sharer(Record):
    """A framework taking a part of the kernel's limit."""

    key: str
    name: str
    fixed_mib: dict[int, int] | None = None  # the parts it started with (None: can still change)


def part_mib(key: str, gpu: GpuPlan, sharers: list[Sharer]) -> int:
    """The part of ``gpu``'s cap for the framework ``key`` (one of ``sharers``)."""
    assert gpu.cap_mib is not None
    me = next(s for s in sharers if s.key == key)
    if me.fixed_mib is not None and gpu.index in me.fixed_mib:
        return me.fixed_mib[gpu.index]
    named = dict(gpu.shares_mib)
    if key in named:
        return named[key]
    held = sum(named.values()) + sum(
        s.fixed_mib.get(gpu.index, 0)
        for s in sharers
        if s.fixed_mib is not None and s.key not in named and s.key != key
    )
    open_count = sum(1 for s in sharers if s.key not in named and (s.fixed_mib is None or s.key == key))
    return max(LEAST_MIB, (gpu.cap_mib - held) // max(open_count, 1))


def sharing_note(gpus: list[GpuPlan], sharers: list[Sharer]) -> str | None:
    """How the kernel's limit is divided, for the reply and `%gpu` (None: one framework holds it)."""
    if len(sharers) < 2 and not any(g.shares_mib for g in gpus):
        return None
    parts = []
    for gpu in gpus:
        if gpu.cap_mib is None:
            continue
        each = ", ".join(f"{s.name} {format_bytes(part_mib(s.key, gpu, sharers) * MIB)}" for s in sharers)
        parts.append(f"GPU {gpu.index}'s {format_bytes(gpu.cap_mib * MIB)}: {each or 'no framework yet'}")
    if not parts:
        return None
    return "one kernel, one limit: " + "; ".join(parts)
