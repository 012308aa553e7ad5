"""Who holds what on each GPU: one computation for ``%gpu``, the panel, ``%gpu free`` and the OOM help.

Memory is split into this kernel, my other processes (same user), other users, and what no
listed process accounts for.  Where NVML's pids do not match ours (a container without the
host's pid namespace), this kernel's share falls back to a framework's allocator (the caller
says which, :class:`AllocatorShare`), and the result says which number is shown.  A framework's
allocator figures per GPU are summed over its devices there (:func:`allocator_by_gpu`: several
logical GPUs on one physical), so every reader shows the same number.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from ..records import Record
from .nvml import GpuInfo, GpuLost, GpuProcess, MigDevice, Nvml, ReadingFailed
from .owners import EXITED_NOTE, HIDDEN_NOTE, ProcessDetails, ProcessTable, lookup_listing

__all__ = [
    "HIDDEN",
    "MINE",
    "OTHERS",
    "THIS_KERNEL",
    "UNKNOWN",
    "AllocatorShare",
    "GpuUsage",
    "MigListing",
    "ProcessEntry",
    "allocator_by_gpu",
    "attribute",
    "entries",
    "gpu_listing_key",
    "mig_listing_key",
    "mig_listings",
]


THIS_KERNEL, MINE, OTHERS, UNKNOWN = "this kernel", "mine", "others", "unknown"
HIDDEN = "hidden"  # /proc hides it (hidepid): another user's, or exited; nobody can tell


class ProcessEntry(Record):
    """A process on a GPU with its owner and command, as a status lists it."""

    pid: int
    used_memory_bytes: int | None  # None: NVML could not say
    kind: str  # "compute" or "graphics"
    user: str | None
    command: str | None
    alive: bool
    whose: str  # THIS_KERNEL, MINE (my other processes), OTHERS, UNKNOWN (exited), HIDDEN
    note: str | None = None


class GpuUsage(Record):
    """One GPU's memory split by holder, in bytes.  None: not known (never a made-up 0)."""

    index: int
    processes: tuple[ProcessEntry, ...] | None  # None: NVML could not list them
    this_kernel_bytes: int | None
    this_kernel_source: (
        str | None
    )  # "nvml" (found by pid), or the key of the framework whose allocator is shown
    my_other_bytes: int | None
    others_bytes: int | None
    unattributed_bytes: int | None  # used, but by no listed live process (contexts, exited)
    notes: tuple[str, ...] = ()


class AllocatorShare(Record):
    """What one framework's allocator holds on a GPU: this kernel's share where NVML lists no pid of ours."""

    in_use_bytes: int
    source: str  # the framework's key ("this_kernel_source" in the report)
    name: str  # the framework as shown in the note


def attribute(
    nvml: Nvml,
    gpu: GpuInfo,
    table: ProcessTable,
    my_pid: int,
    me: str | None,
    allocator: AllocatorShare | None = None,
) -> GpuUsage:
    """Split one GPU's memory into this kernel, my other processes, others and the rest.

    ``allocator``: what a framework's allocator holds on this GPU, shown as this kernel's share
    where NVML lists no pid of ours (a container with its own pid namespace)."""
    if gpu.lost:
        return GpuUsage(gpu.index, None, None, None, None, None, None, ("the GPU stopped answering",))
    try:
        listed = nvml.processes(gpu.index)
    except GpuLost:
        return GpuUsage(gpu.index, None, None, None, None, None, None, ("the GPU stopped answering",))
    except Exception as err:  # NVMLError: no permission, not supported
        return _unlisted(gpu, allocator, f"NVML could not list the processes ({err})")
    return _split(gpu, entries(listed, table, my_pid, me, gpu_listing_key(gpu)), allocator, my_pid)


def entries(
    processes: Any, table: ProcessTable, my_pid: int, me: str | None, key: Hashable | None = None
) -> tuple[ProcessEntry, ...]:
    """Whose each listed process is (``nvml.GpuProcess`` objects): :func:`attribute`'s for a whole
    GPU, and the same for listings that are not a whole GPU's (a MIG instance's).

    ``key`` names the listing (:func:`gpu_listing_key`, :func:`mig_listing_key`), so the process
    table can answer an unchanged listing from memory; None looks each pid up.
    """
    processes = list(processes)
    pids = [p.pid for p in processes]
    found = [table.lookup(pid) for pid in pids] if key is None else lookup_listing(table, key, pids)
    return tuple(
        _entry(p.pid, p.used_memory_bytes, p.kind, d, my_pid, me)
        for p, d in zip(processes, found, strict=False)
    )


def gpu_listing_key(gpu: GpuInfo) -> Hashable:
    """What names one GPU's process listing to the process table (with its UUID: one table serves every source)."""
    return ("gpu", gpu.index, gpu.uuid)


def mig_listing_key(device: MigDevice) -> Hashable:
    """What names one MIG instance's process listing to the process table."""
    return ("mig", device.index, device.mig_index, device.uuid)


def _entry(
    pid: int, used: int | None, kind: str, details: ProcessDetails, my_pid: int, me: str | None
) -> ProcessEntry:
    if pid == my_pid:
        whose = THIS_KERNEL
    elif getattr(details, "hidden", False):
        whose = HIDDEN
    elif not details.alive:
        whose = UNKNOWN
    elif me is not None and details.user == me:
        whose = MINE
    else:
        whose = OTHERS  # including owners we may not see: not ours as far as we can tell
    return ProcessEntry(pid, used, kind, details.user, details.command, details.alive, whose, details.note)


def _split(
    gpu: GpuInfo, entries: tuple[ProcessEntry, ...], allocator: AllocatorShare | None, my_pid: int
) -> GpuUsage:
    notes: list[str] = []
    groups: dict[str, list[ProcessEntry]] = {THIS_KERNEL: [], MINE: [], OTHERS: [], HIDDEN: []}
    unknown, exited = [], []
    for e in entries:  # one pass (every refresh, every GPU): whose each is, what is not known of it
        group = groups.get(e.whose)
        if group is not None:
            group.append(e)
        if e.used_memory_bytes is None:
            unknown.append(e.pid)
        if not e.alive and e.whose != THIS_KERNEL:
            exited.append(e.pid)
    buckets = {w: _bucket(groups[w]) for w in (THIS_KERNEL, MINE, OTHERS)}
    mine, source = buckets[THIS_KERNEL], "nvml"
    if not groups[THIS_KERNEL] and allocator is not None:
        mine, source = allocator.in_use_bytes, allocator.source
        notes.append(
            f"NVML does not list this kernel's pid {my_pid} here (a container without the host's "
            f"pid namespace?): showing {allocator.name}'s allocator in use, which leaves out CUDA's own overhead"
        )
    if unknown:
        notes.append(
            f"NVML gives no memory figure for pid {', '.join(map(str, unknown))}; "
            "sums count only the known figures"
        )
    if exited:
        notes.append(f"pid {', '.join(map(str, exited))}: {EXITED_NOTE}; counted as unattributed")
    others, rest = buckets[OTHERS], _rest(gpu, [mine, buckets[MINE], buckets[OTHERS]])
    hidden = [e.pid for e in groups[HIDDEN]]
    if hidden:  # another user's or exited: other users' share and the rest cannot be told apart
        others = rest = None
        notes.append(hidden_note(hidden))
    return GpuUsage(
        gpu.index,
        entries,
        mine,
        source if mine is not None else None,
        buckets[MINE],
        others,
        rest,
        tuple(notes),
    )


def hidden_note(pids: list[int]) -> str:
    """The note for listed pids that /proc hides: what they hold is nobody's known share."""
    shown = ", ".join(map(str, pids[:8])) + (", ..." if len(pids) > 8 else "")
    return f"pid {shown}: {HIDDEN_NOTE}; other users' memory and the unattributed rest are unknown"


def _unlisted(gpu: GpuInfo, allocator: AllocatorShare | None, why: str) -> GpuUsage:
    if allocator is None:
        return GpuUsage(gpu.index, None, None, None, None, None, None, (why,))
    return GpuUsage(gpu.index, None, allocator.in_use_bytes, allocator.source, None, None, None, (why,))


def _bucket(entries: list[ProcessEntry]) -> int | None:
    """Known bytes of a group; 0 only when the group is truly empty, None when all are unknown."""
    known = [e.used_memory_bytes for e in entries if e.used_memory_bytes is not None]
    if entries and not known:
        return None
    return sum(known)


def _rest(gpu: GpuInfo, parts: list[int | None]) -> int | None:
    if gpu.memory is None:
        return None
    return max(0, gpu.memory.used_bytes - sum(p or 0 for p in parts))


def allocator_by_gpu(stats: Mapping[str, Any], names: Mapping[str, int]) -> dict[int, tuple[int, int]]:
    """A framework's allocator ``(in use, peak)`` bytes per nvidia-smi GPU, summed over its devices there.

    ``stats`` maps the framework's devices (``GPU:0``) to objects with ``current_bytes`` and
    ``peak_bytes``; ``names`` maps them to nvidia-smi indices.  The peak is the sum of the
    devices' peaks (an upper bound: they need not peak at the same moment).
    """
    result: dict[int, tuple[int, int]] = {}
    for name, reading in stats.items():
        index = names.get(name)
        if index is None:
            continue
        current, peak = result.get(index, (0, 0))
        result[index] = (current + int(reading.current_bytes), peak + int(reading.peak_bytes))
    return result


tf_by_gpu = allocator_by_gpu  # the old name, kept while kernel/monitor.py imports it (issue 27)


class MigListing(Record):
    """One MIG instance of a GPU and the processes NVML lists on it (None: the listing failed, see notes)."""

    device: MigDevice
    processes: list[GpuProcess] | None
    notes: tuple[str, ...]


def mig_listings(nvml: Nvml, index: int) -> list[MigListing]:
    """A MIG-enabled GPU's instances with their processes, for ``%gpu`` and the GPU panel alike.

    Raises :class:`GpuLost` or :class:`ReadingFailed` when the instances cannot be listed.
    """
    listings = []
    for device in nvml.mig_devices(index):
        notes = list(device.notes)
        try:
            processes: list[GpuProcess] | None = nvml.mig_processes(index, device.mig_index)
        except (GpuLost, ReadingFailed) as err:
            processes = None
            notes.append(f"NVML could not list the processes ({err})")
        listings.append(MigListing(device, processes, tuple(notes)))
    return listings
