"""Who holds what on this machine's GPUs, per Jupyter kernel: the reply of ``GET tfgpu/api/status``.

:func:`inventory` takes an :class:`~tfgpu_magic.gpus.nvml.Nvml`, the server's kernels
(:class:`KernelDescription`) and a process table, and returns the JSON-ready dict of the
contract between the server extension and the JupyterLab extension (``version`` 1).  It is
pure Python: no Jupyter, no tornado, so it runs and is tested where there is no server (a GPU
machine, a script).  psutil is imported when the first reading is made, not at import.

Attribution is :func:`tfgpu_magic.gpus.holdings.attribute`'s, the one ``%gpu`` uses: each process
NVML lists gets its owner from the process table, and is then mine, another user's, or exited.
This module only regroups those entries: a process is a kernel's when it is the kernel's
process or one of its descendants, found by walking up from each process NVML lists
(:func:`read_ancestry`: a few ``/proc`` reads per GPU process, never a scan of the whole
process table, which on a shared server holds thousands).  What no kernel accounts for stays "my other processes", "other users" or
"unattributed", as in ``%gpu``.

A kernel whose memory cannot be found gets a ``note`` and ``null`` memory (never a made-up
0): a kernel without a local process (a remote or gateway kernel), or a server that sees none
of the pids NVML lists (another pid namespace, e.g. a container without the host's).  No
driver is ``driver.available = false`` with a one-line reason; a lost GPU is ``lost: true``
with ``null`` readings.  Every string, whoever chose it (command lines, user and file names,
NVML's notes), goes through :func:`tfgpu_magic.safe_text.safe`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, overload

from ..gpus import holdings, owners, platform
from ..gpus.nvml import GpuInfo, GpuLost, Nvml, NvmlUnavailable, ReadingFailed
from ..gpus.process_tree import children_of, descendants, read_ancestry, read_parent_map
from ..gpus.utilization import UtilizationReader, of_pids
from ..safe_text import safe_tree

__all__ = [
    "REFRESH_INTERVAL_S",
    "VERSION",
    "KernelDescription",
    "children_of",
    "descendants",
    "inventory",
    "iso_utc",
    "read_ancestry",
    "read_parent_map",
    "unavailable",
]

VERSION = 1  # of the reply's shape; keys are only ever added
REFRESH_INTERVAL_S = 2.0

# The server is no kernel: no pid NVML lists is "this kernel" to holdings.attribute (pids are > 0).
_NOBODY = -1

REMOTE_NOTE = "a remote kernel (no local process): its GPU memory cannot be seen from this server"
FOREIGN_PIDS_NOTE = (
    "NVML lists only processes this server cannot see (a container without the host's pid "
    "namespace?): this kernel's GPU memory cannot be told apart from the rest"
)


@dataclass(frozen=True)
class KernelDescription:
    """One running kernel, as the server describes it.  None: not known."""

    id: str
    name: str | None = None  # the kernel spec's name, e.g. "python3"
    path: str | None = None  # the session's path (the notebook), if any session uses the kernel
    session_name: str | None = None
    session_type: str | None = None  # "notebook", "console", ...
    execution_state: str | None = None  # "idle", "busy", "starting", "dead", ...
    last_activity: str | None = None  # ISO 8601 in UTC, see iso_utc
    pid: int | None = None  # the kernel's local process; None for a remote (gateway) kernel


@overload
def iso_utc(moment: datetime) -> str: ...
@overload
def iso_utc(moment: datetime | None) -> str | None: ...
def iso_utc(moment: datetime | None) -> str | None:
    """``2026-11-22T10:00:00.000000Z``: always microseconds, so every reply has one format."""
    if moment is None:
        return None
    if moment.tzinfo is None:  # jupyter_server's timestamps are aware; a naive one is taken as UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- the reply --------------------------------------------------------------------------------
def inventory(
    nvml: Nvml,
    kernels: Sequence[KernelDescription],
    table: owners.ProcessTable | None = None,
    parents: Mapping[int, int] | None = None,
    *,
    refresh_interval_s: float = REFRESH_INTERVAL_S,
    clock: Callable[[], float] = time.time,
    notes: Iterable[str] = (),
    shares: platform.ShareRecord | None = None,
    utilization: UtilizationReader | None = None,
) -> dict[str, Any]:
    """The contract's reply: GPUs, kernels (most GPU memory first), and everyone else's processes.

    ``utilization`` reads each kernel's GPU utilization on the GPUs where a kernel holds memory,
    since its own previous reading (default: a new reader, so whatever samples the driver keeps).

    ``table`` gives owners and commands (default: the device source's own table, else psutil);
    ``parents`` maps pid to parent pid (default: :func:`read_ancestry` of the pids NVML lists
    and the kernels' own); ``notes``
    start the reply's notes.  Never raises for what NVML or the operating system says:
    failures become notes.
    """
    table = table or owners.process_table_for(nvml, os.getpid())
    user = table.current_user()
    generated_at = clock()
    try:
        gpus = nvml.gpus()
    except NvmlUnavailable as err:
        return unavailable(
            kernels,
            str(err),
            user=user,
            refresh_interval_s=refresh_interval_s,
            generated_at=generated_at,
            notes=notes,
        )
    usages = [holdings.attribute(nvml, gpu, table, _NOBODY, user) for gpu in gpus]
    notes = list(notes)
    if parents is None:
        listed = (e.pid for u in usages for e in (u.processes or ()))
        parents = read_ancestry([*listed, *(k.pid for k in kernels if k.pid is not None)])
    owner_of = _kernel_of_each_pid(kernels, parents)
    foreign = _only_foreign_pids(usages)
    if foreign:
        notes.append(_foreign_note(usages))
    hidden = sorted({e.pid for u in usages for e in (u.processes or ()) if e.whose == holdings.HIDDEN})
    if hidden:
        notes.append(holdings.hidden_note(hidden))
    unlisted = [
        gpu.index
        for gpu, usage in zip(gpus, usages, strict=False)
        if usage.processes is None and not gpu.lost
    ]
    reply = _reply(user, generated_at, refresh_interval_s, available=True, reason=None, notes=notes)
    reply["pids_visible"] = not foreign and not hidden
    reply["gpus"] = [_gpu(gpu, usage, owner_of) for gpu, usage in zip(gpus, usages, strict=False)]
    # The platform's share of each GPU, from the server's inherited environment (its kernels inherit it).
    found = {} if shares is None else shares.shares([_facts(gpu) for gpu in gpus])
    for entry, gpu in zip(reply["gpus"], gpus, strict=False):
        entry["mig_instances"] = _mig_instances(nvml, gpu, owner_of) if gpu.mig_enabled else None
        entry["share"] = found[gpu.index].as_json() if gpu.index in found else None
    kernel_rows = [_kernel(k, usages, owner_of, parents, foreign, unlisted) for k in kernels]
    _add_utilization(kernel_rows, usages, owner_of, utilization or UtilizationReader(nvml))
    reply["kernels"] = _sorted(kernel_rows)
    reply.update(_everyone_else(usages, owner_of))
    return safe_tree(reply)


def unavailable(
    kernels: Sequence[KernelDescription],
    reason: str,
    *,
    user: str | None = None,
    refresh_interval_s: float = REFRESH_INTERVAL_S,
    generated_at: float | None = None,
    notes: Iterable[str] = (),
) -> dict[str, Any]:
    """The reply when no GPU can be read: ``driver.available = false``, the reason, the kernels without memory."""
    generated_at = time.time() if generated_at is None else generated_at
    reply = _reply(user, generated_at, refresh_interval_s, available=False, reason=reason, notes=list(notes))
    reply["kernels"] = _sorted(
        [_kernel_fields(k, child_pids=[], memory={}, total=None, note=None) for k in kernels]
    )
    return safe_tree(reply)


def _reply(
    user: str | None,
    generated_at: float,
    interval: float,
    *,
    available: bool,
    reason: str | None,
    notes: list[str],
) -> dict[str, Any]:
    return {
        "version": VERSION,
        "generated_at": _seconds(generated_at, "the server's clock", notes),
        "refresh_interval_s": _seconds(interval, "the refresh interval", notes),
        "driver": {"available": available, "reason": reason},
        "user": user,
        "gpus": [],
        "kernels": [],
        "my_other_processes": [],
        "other_users": [],
        "unattributed": [],
        "notes": notes,
        # False: NVML lists pids this server cannot see: only such pids (another pid namespace), so
        # nobody's share (kernels', other users') can be told, or some that /proc hides (hidepid),
        # so other users' share cannot; None: no driver reading at all.
        "pids_visible": None,
        "hidden_processes": [],  # listed pids /proc hides (hidepid): another user's or exited, unknown which
    }


def _seconds(value: float, what: str, notes: list[str]) -> float | None:
    """A time as the reply carries it.  A negative one is nobody's (a clock before 1970, a negative
    interval): null, and a note says what it was.  A non-finite one is left to the endpoint's
    strict JSON, which writes it as null with a note of its own."""
    if value < 0:
        notes.append(f"{what} gave {value!r} seconds, which is no time: written as null")
        return None
    return value


# -- which processes are a kernel's -----------------------------------------------------------
def _kernel_of_each_pid(kernels: Sequence[KernelDescription], parents: Mapping[int, int]) -> dict[int, str]:
    """``{pid: kernel id}`` for every kernel's own process and all its descendants."""
    children = children_of(parents)
    owner_of: dict[int, str] = {}
    for kernel in kernels:
        if kernel.pid is None:
            continue
        owner_of[kernel.pid] = kernel.id
        for pid in descendants(kernel.pid, children):
            owner_of.setdefault(pid, kernel.id)
    return owner_of


def _only_foreign_pids(usages: list[holdings.GpuUsage]) -> bool:
    """The pid-namespace heuristic: NVML lists processes, and not one of them is a process we can see."""
    listed = [e for u in usages for e in (u.processes or ())]
    return bool(listed) and not any(e.alive for e in listed)


def _foreign_note(usages: list[holdings.GpuUsage]) -> str:
    pids = sorted({e.pid for u in usages for e in (u.processes or ())})
    shown = ", ".join(map(str, pids[:8])) + (", ..." if len(pids) > 8 else "")
    return (
        f"NVML lists pid {shown}, none of them a process this server can see: the server probably runs "
        "in another pid namespace than the GPU's processes (a container without the host's), so no "
        "memory can be attributed to kernels"
    )


def _kernels_entry(entry: holdings.ProcessEntry, owner_of: Mapping[int, str]) -> str | None:
    """The kernel holding this process, if any; an exited process is nobody's (it is unattributed)."""
    return owner_of.get(entry.pid) if entry.alive else None


# -- GPUs -------------------------------------------------------------------------------------
def _facts(gpu: GpuInfo) -> platform.GpuFacts:
    return platform.GpuFacts(gpu.index, gpu.uuid, gpu.memory.total_bytes if gpu.memory else None)


def _gpu(gpu: GpuInfo, usage: holdings.GpuUsage, owner_of: Mapping[int, str]) -> dict[str, Any]:
    memory = gpu.memory
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "memory_used_bytes": memory.used_bytes if memory else None,
        "memory_total_bytes": memory.total_bytes if memory else None,
        "utilization_percent": gpu.utilization_percent,
        "lost": gpu.lost,
        "notes": _gpu_notes(gpu, usage),
        "split": _split(usage, owner_of, memory.free_bytes if memory else None),
    }


def _mig_instances(nvml: Nvml, gpu: GpuInfo, owner_of: Mapping[int, str]) -> list[dict[str, Any]]:
    """A MIG-enabled GPU's instances: each one's own memory, and which of this server's kernels run on it."""
    try:
        listings = holdings.mig_listings(nvml, gpu.index)
    except (GpuLost, ReadingFailed) as err:
        return [{"mig_index": None, "notes": [f"the MIG instances could not be listed ({err})"]}]
    rows = []
    for listing in listings:
        device, memory = listing.device, listing.device.memory
        pids = None if listing.processes is None else [p.pid for p in listing.processes]
        rows.append(
            {
                "mig_index": device.mig_index,
                "uuid": device.uuid,
                "gpu_instance_id": device.gpu_instance_id,
                "compute_instance_id": device.compute_instance_id,
                "memory_used_bytes": memory.used_bytes if memory else None,
                "memory_total_bytes": memory.total_bytes if memory else None,
                "process_count": None if pids is None else len(pids),
                "kernel_ids": None if pids is None else sorted({owner_of[p] for p in pids if p in owner_of}),
                "notes": list(listing.notes),
            }
        )
    return rows


def _split(usage: holdings.GpuUsage, owner_of: Mapping[int, str], free: int | None) -> dict[str, int | None]:
    """holdings' split with the kernels' processes taken out of "mine" (or "others") into their own share."""
    if usage.processes is None:  # lost, or NVML could not list them: nobody's share is known
        return {
            "kernels_bytes": None,
            "my_other_bytes": None,
            "others_bytes": None,
            "unattributed_bytes": usage.unattributed_bytes,
            "free_bytes": free,
        }
    hidden = any(e.whose == holdings.HIDDEN for e in usage.processes)
    kernels, mine, others = [], [], []
    for entry in usage.processes:
        if _kernels_entry(entry, owner_of) is not None:
            kernels.append(entry)
        elif entry.whose == holdings.MINE:
            mine.append(entry)
        elif entry.whose == holdings.OTHERS:
            others.append(entry)
    return {
        "kernels_bytes": _known_sum(e.used_memory_bytes for e in kernels),
        "my_other_bytes": _known_sum(e.used_memory_bytes for e in mine),
        # /proc hides some listed pids (hidepid): other users' share is unknown, as holdings says
        "others_bytes": None if hidden else _known_sum(e.used_memory_bytes for e in others),
        # Regrouping moves bytes between shares, never in or out: holdings' rest stays right.
        "unattributed_bytes": usage.unattributed_bytes,
        "free_bytes": free,
    }


def _known_sum(values: Iterable[int | None]) -> int | None:
    """The sum of known figures: 0 for no process at all, None when every figure is unknown."""
    values = list(values)
    known = [v for v in values if v is not None]
    return None if values and not known else sum(known)


def _gpu_notes(gpu: GpuInfo, usage: holdings.GpuUsage) -> list[str]:
    """Why readings are missing, then who-holds-what notes; a note said by both is said once."""
    readings = [n for n in gpu.notes if not any(n in other for other in usage.notes)]
    return [*readings, *usage.notes]


# -- kernels ----------------------------------------------------------------------------------
def _kernel(
    kernel: KernelDescription,
    usages: list[holdings.GpuUsage],
    owner_of: Mapping[int, str],
    parents: Mapping[int, int],
    foreign: bool,
    unlisted: list[int],
) -> dict[str, Any]:
    if kernel.pid is None:
        return _kernel_fields(kernel, child_pids=[], memory={}, total=None, note=REMOTE_NOTE)
    if foreign:
        return _kernel_fields(kernel, child_pids=[], memory={}, total=None, note=FOREIGN_PIDS_NOTE)
    held = {
        u.index: [e for e in u.processes or () if _kernels_entry(e, owner_of) == kernel.id] for u in usages
    }
    memory = {
        str(index): _known_sum(e.used_memory_bytes for e in entries)
        for index, entries in held.items()
        if entries
    }
    child_pids = sorted({e.pid for entries in held.values() for e in entries if e.pid != kernel.pid})
    total = _known_sum(memory.values())
    return _kernel_fields(kernel, child_pids, memory, total, _kernel_note(kernel, parents, unlisted))


def _kernel_note(kernel: KernelDescription, parents: Mapping[int, int], unlisted: list[int]) -> str | None:
    """What makes this kernel's figures incomplete; None when nothing does."""
    notes = []
    if kernel.pid not in parents:  # died since the server last heard of it
        notes.append(f"its process {kernel.pid} is not running")
    if unlisted:  # a lost GPU is not among them: its memory is gone with it
        shown = ", ".join(map(str, unlisted))
        notes.append(
            f"GPU {shown}: NVML could not list the processes, so the kernel's memory there is unknown"
        )
    return "; ".join(notes) or None


def _kernel_fields(
    kernel: KernelDescription,
    child_pids: list[int],
    memory: dict[str, int | None],
    total: int | None,
    note: str | None,
) -> dict[str, Any]:
    return {
        "id": kernel.id,
        "name": kernel.name,
        "path": kernel.path,
        "session_name": kernel.session_name,
        "session_type": kernel.session_type,
        "execution_state": kernel.execution_state,
        "last_activity": kernel.last_activity,
        "pid": kernel.pid,
        "child_pids": child_pids,  # the kernel's descendants that hold GPU memory
        "gpu_memory_bytes": memory,  # per nvidia-smi index (string keys), only GPUs it holds
        "total_gpu_memory_bytes": total,
        "note": note,
        # per nvidia-smi index, the GPUs it holds memory on: {"percent", "scope", "note"} (the driver's)
        "gpu_utilization": {},
    }


def _add_utilization(
    rows: list[dict[str, Any]],
    usages: list[holdings.GpuUsage],
    owner_of: Mapping[int, str],
    reader: UtilizationReader,
) -> None:
    """Each kernel's utilization on each GPU it holds memory on: one NVML reading per such GPU."""
    pids: dict[str, dict[int, set[int]]] = {}  # kernel id -> GPU index -> its pids there
    for usage in usages:
        for entry in usage.processes or ():
            kernel_id = _kernels_entry(entry, owner_of)
            if kernel_id is not None:
                pids.setdefault(kernel_id, {}).setdefault(usage.index, set()).add(entry.pid)
    readings = reader.read({index for held in pids.values() for index in held})
    for row in rows:
        held = pids.get(row["id"], {})
        row["gpu_utilization"] = {
            str(index): of_pids(readings.get(index), sorted(on_gpu)).as_json()
            for index, on_gpu in sorted(held.items())
        }


def _sorted(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Most GPU memory first; then by path and id, so a reply's order never flickers."""
    return sorted(kernels, key=lambda k: (-(k["total_gpu_memory_bytes"] or 0), k["path"] or "", k["id"]))


# -- everyone else ----------------------------------------------------------------------------
def _everyone_else(
    usages: list[holdings.GpuUsage], owner_of: Mapping[int, str]
) -> dict[str, list[dict[str, Any]]]:
    """Processes no kernel accounts for: mine, other users', exited ones NVML still lists, and
    those /proc hides (hidepid)."""
    lists: dict[str, list[dict[str, Any]]] = {
        "my_other_processes": [],
        "other_users": [],
        "unattributed": [],
        "hidden_processes": [],
    }
    for usage in usages:
        for entry in usage.processes or ():
            if _kernels_entry(entry, owner_of) is not None:
                continue
            base = {"gpu": usage.index, "pid": entry.pid, "used_memory_bytes": entry.used_memory_bytes}
            if entry.whose == holdings.MINE:
                lists["my_other_processes"].append({**base, "command": entry.command})
            elif entry.whose == holdings.OTHERS:
                lists["other_users"].append({**base, "user": entry.user, "command": entry.command})
            elif entry.whose == holdings.HIDDEN:
                lists["hidden_processes"].append({**base, "note": entry.note or owners.HIDDEN_NOTE})
            else:
                lists["unattributed"].append({**base, "note": entry.note or owners.EXITED_NOTE})
    return lists
