"""``%gpu doctor``: one report on how this kernel shares its GPUs, each finding with its evidence and fix.

The doctor reads facts once (:func:`gather`) and hands them to a list of finding functions
(:data:`FINDINGS`), each ``(facts) -> Finding | None``.  A finding says what is wrong (its
title), the readings and variables that show it, with their values (``evidence``), and the fix:
the exact line to run, or the administrator's command.  A healthy kernel gets no finding and a
short summary of how it shares (:func:`summary`).

Facts come from the records, as every report's do: what the kernel inherited
(``Machine.inherited``), what the session accepted and applied (its limits per GPU), the claims,
NVML through the session's machine, and which frameworks take a pool of their own, from their
adapters.  Nothing here starts a framework or CUDA, and a reading that fails is a note, not a
finding.  Everything shown that others could choose (variables, paths, GPU names) is escaped by
:func:`tfgpu_magic.safe_text.safe`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..command.units import MIB, format_bytes
from ..gpus import claims, numbering, platform
from ..gpus.nvml import GpuLost, GpuProcess, NvmlUnavailable, ReadingFailed
from ..safe_text import bounded, safe

if TYPE_CHECKING:
    from .session import Session

__all__ = ["FINDINGS", "Facts", "Finding", "GpuFacts", "diagnose", "gather", "render_text", "report"]

CONTEXT_BYTES = 300 * MIB  # what a CUDA context and its libraries take beyond the allocator, roughly
# Used memory beyond the listed processes (and the context overhead) that says others share the GPU
# unseen: at least this much, and at least UNSEEN_SHARE of the GPU.
UNSEEN_BYTES = 1024 * MIB
UNSEEN_SHARE = 0.10
SHOWN = 120  # characters of a variable's value or a path shown as evidence

# NVML's compute modes (nvmlComputeMode_t): 1 (exclusive thread) is gone since CUDA 8.
COMPUTE_DEFAULT, COMPUTE_PROHIBITED, COMPUTE_EXCLUSIVE = 0, 2, 3
COMPUTE_MODE_NAMES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


@dataclass(frozen=True)
class Finding:
    """One thing about how this kernel shares its GPUs that needs a fix."""

    key: str  # stable name, for `%gpu doctor --json` and tests
    title: str
    evidence: tuple[str, ...]
    fix: str

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "evidence": list(self.evidence), "fix": self.fix}


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML lists it, with this kernel's figures on it (bytes; None: unknown)."""

    index: int
    uuid: str | None
    name: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    utilization: int | None
    mig: bool | None
    compute_mode: int | None
    processes: tuple[GpuProcess, ...] | None  # None: NVML could not list them
    kernel_bytes: int | None  # the driver's figure for this kernel's processes; None: none listed
    limit_bytes: int | None  # this kernel's limit on it, from the session's record


@dataclass(frozen=True)
class MpsReading:
    """An MPS control daemon's pipe, as lstat sees it (never opened, never followed)."""

    directory: str
    owner_uid: int
    variables: dict[str, str]  # the CUDA_MPS_* variables of the kernel's environment


SlurmReading = platform.SlurmGpus  # variable, value, node_indices


@dataclass(frozen=True)
class FrameworkFacts:
    key: str
    name: str
    stage: str
    takes_pool: bool  # imported by the notebook and able to use a GPU (its adapter says)


@dataclass(frozen=True)
class Facts:
    """What the findings read: gathered once, from the records and one round of NVML readings."""

    env: Mapping[str, str]  # the kernel's environment now (the variables the findings name)
    inherited: Mapping[str, str | None]  # as the kernel inherited the variables tfgpu_magic manages
    by_hand: Mapping[str, str | None]  # variables set in os.environ by hand since, with their values
    cuda_read: Mapping[str, str | None] | None  # CUDA's variables as CUDA read them; None: not started
    cuda_started_by: str | None
    nvml_error: str | None
    gpus: tuple[GpuFacts, ...]
    allocation: numbering.Allocation
    applied_visible: tuple[int, ...] | None  # the GPUs the session's accepted request shows
    requested_visible: str | None  # `%gpu use ...` as requested, None when not asked
    claimed: tuple[int, ...]  # GPUs this kernel claimed (`%gpu use auto`)
    claimed_by_others: Mapping[int, str]  # GPU -> who else holds a live claim on it
    mps: MpsReading | None
    slurm: SlurmReading | None
    frameworks: tuple[FrameworkFacts, ...]
    shares_requested: bool  # `%gpu limit 6G tensorflow, 2G jax`: each framework's pool is sized
    limit_label: str | None  # who holds the accepted limit: "soft (...)", "hard (MPS)", "hard (MIG)"
    platform_shares: Mapping[int, str]  # GPU -> its platform share, described (the session's record)
    notes: tuple[str, ...] = ()

    def gpu(self, index: int) -> GpuFacts | None:
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def seen(self) -> tuple[GpuFacts, ...]:
        """The GPUs this kernel may use (what the session accepted; every GPU when it names none):
        how a GPU it left out is shared is not this kernel's concern."""
        if self.applied_visible is None:
            return self.gpus
        return tuple(g for g in self.gpus if g.index in self.applied_visible)

    @property
    def uuids(self) -> list[str | None]:
        return [g.uuid for g in self.gpus]


# -- platform readings (gpus/platform.py reads them for the shares too) ---------------------------
def read_mps(env: Mapping[str, str], me: int | None = None) -> MpsReading | None:
    """An MPS control daemon this kernel's CUDA would connect to (:func:`platform.mps_pipe`: lstat
    only, owned by root or ``me``), with the kernel's ``CUDA_MPS_*`` variables."""
    pipe = platform.mps_pipe(env, me)
    if pipe is None:
        return None
    variables = {name: value for name, value in env.items() if name.startswith("CUDA_MPS_")}
    return MpsReading(pipe.directory, pipe.owner_uid, variables)


def read_slurm(env: Mapping[str, str]) -> SlurmReading | None:
    """The job's GPUs as Slurm numbers them on the node (:func:`platform.slurm_gpus`)."""
    return platform.slurm_gpus(env)


# -- gathering -------------------------------------------------------------------------------------
def gather(
    session: Session,
    *,
    my_pid: int | None = None,
    parents: Callable[[Iterable[int]], Mapping[int, int]] | None = None,
    me: int | None = None,
) -> Facts:
    """The facts, read once.  ``my_pid``: the kernel's process (default: this one); ``parents``:
    ``{pid: ppid}`` for listed pids and their ancestors (default: the process table), so a
    child process of the kernel counts as the kernel's; ``me``: the uid whose MPS daemon counts."""
    machine = session.machine
    env = machine.env
    my_pid = os.getpid() if my_pid is None else my_pid
    notes: list[str] = []
    try:
        accepted = session.resolved()
        applied_visible = accepted.visible
    except Exception as err:  # a request that cannot hold: status says why
        applied_visible = None
        notes.append(f"the request cannot hold: {safe(str(err))}")
    limits = session.limit_bytes_by_gpu()
    nvml_error = None
    gpus: tuple[GpuFacts, ...] = ()
    try:
        gpus = _read_gpus(session, my_pid, parents, limits, notes)
    except NvmlUnavailable as err:  # no driver: every other fact still holds
        nvml_error = safe(str(err))
    capture = machine.cuda_record.capture
    return Facts(
        env=dict(env),
        inherited=dict(machine.inherited),
        by_hand={name: env.get(name) for name in ("CUDA_VISIBLE_DEVICES",) if machine.set_by_hand(name)},
        cuda_read=None if capture is None else machine.cuda_env(),
        cuda_started_by=machine.cuda_record.by,
        nvml_error=nvml_error,
        gpus=gpus,
        allocation=machine.allocation(),
        applied_visible=applied_visible,
        requested_visible=next((d for d in session.requested.describe() if d.startswith("use ")), None),
        claimed=tuple(session.claimed),
        claimed_by_others=_others_claims(session, gpus, notes),
        mps=read_mps(env, me),
        slurm=read_slurm(env),
        frameworks=tuple(
            FrameworkFacts(f.key, f.name, f.stage().describe(), _takes_pool(f)) for f in session.frameworks()
        ),
        shares_requested=session.requested.shares is not None,
        limit_label=session.limit_label(),
        platform_shares=_platform_shares(session, notes),
        notes=tuple(notes),
    )


def _platform_shares(session: Session, notes: list[str]) -> dict[int, str]:
    try:
        return {index: share.describe() for index, share in session.machine.platform_shares().items()}
    except Exception as err:  # a fault in one reading is a note
        notes.append(f"the platform's shares could not be read: {safe(str(err))}")
        return {}


def _takes_pool(framework: Any) -> bool:
    try:
        return bool(framework.takes_share())
    except Exception:  # no answer: not counted, as the session does
        return False


def _read_gpus(
    session: Session,
    my_pid: int,
    parents: Callable[[Iterable[int]], Mapping[int, int]] | None,
    limits: Mapping[int, int],
    notes: list[str],
) -> tuple[GpuFacts, ...]:
    nvml = session.machine.nvml
    found = []
    listings: dict[int, tuple[GpuProcess, ...] | None] = {}
    for index in range(nvml.device_count()):
        try:
            listings[index] = tuple(nvml.processes(index))
        except (GpuLost, ReadingFailed) as err:
            listings[index] = None
            notes.append(f"GPU {index}: processes not listed ({safe(str(err))})")
    listed = {p.pid for procs in listings.values() for p in procs or ()}
    ancestry = _ancestry(parents, listed - {my_pid}, notes)
    mine = {pid for pid in listed if _descends(pid, my_pid, ancestry)}
    for index in range(nvml.device_count()):
        info = nvml.gpu(index)
        memory = info.memory
        processes = listings[index]
        kernel = [p.used_memory_bytes for p in processes or () if p.pid in mine]
        try:
            mode = None if info.lost else nvml.compute_mode(index)
        except GpuLost:
            mode = None
        found.append(
            GpuFacts(
                index=index,
                uuid=info.uuid,
                name=info.name,
                total_bytes=memory.total_bytes if memory else None,
                used_bytes=memory.used_bytes if memory else None,
                free_bytes=memory.free_bytes if memory else None,
                utilization=info.utilization_percent,
                mig=info.mig_enabled,
                compute_mode=mode,
                processes=processes,
                kernel_bytes=sum(b or 0 for b in kernel) if kernel else None,
                limit_bytes=limits.get(index),
            )
        )
    return tuple(found)


def _ancestry(
    parents: Callable[[Iterable[int]], Mapping[int, int]] | None, pids: set[int], notes: list[str]
) -> Mapping[int, int]:
    if not pids:
        return {}
    if parents is None:
        from ..gpus.process_tree import read_ancestry

        parents = read_ancestry
    try:
        return parents(pids)
    except Exception as err:  # a fault in one reading is a note
        notes.append(f"the process tree could not be read ({type(err).__name__})")
        return {}


def _descends(pid: int, ancestor: int, parents: Mapping[int, int]) -> bool:
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid not in parents:
            return False
        pid = parents[pid]
    return False


def _others_claims(session: Session, gpus: tuple[GpuFacts, ...], notes: list[str]) -> dict[int, str]:
    """GPU -> who else holds a live claim on it (claims are keyed by UUID, never by index)."""
    keys = {g.uuid: g.index for g in gpus if g.uuid}
    if not keys:
        return {}
    try:
        found = claims.holders(list(keys), notes=notes)
    except claims.ClaimError as err:
        notes.append(safe(str(err)))
        return {}
    return {keys[key]: h.describe() for key, h in found.items() if h is not None and not h.this_process}


# -- the findings ------------------------------------------------------------------------------------
def _shown(value: str | None) -> str:
    return "unset" if value is None else f"'{bounded(value, SHOWN)}'"


def _gpu_list(indices: Iterable[int]) -> str:
    return ",".join(map(str, indices))


def _named_entries(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _indices_named(value: str, facts: Facts) -> tuple[int, ...] | None:
    """nvidia-smi indices of the GPUs a ``*_VISIBLE_DEVICES`` value names (indices or UUIDs); None
    when an entry matches no GPU NVML lists here."""
    found = []
    uuids = facts.uuids
    for entry in _named_entries(value):
        if entry.isascii() and entry.isdigit():
            found.append(int(entry))
            continue
        matches = [
            i for i, uuid in enumerate(uuids) if uuid and entry.startswith("GPU-") and uuid.startswith(entry)
        ]
        if len(matches) != 1:
            return None
        found.append(matches[0])
    return tuple(found)


def more_gpus_than_allocated(facts: Facts) -> Finding | None:
    """(a) NVML lists more GPUs than the scheduler granted: ``NVIDIA_VISIBLE_DEVICES`` (the container
    runtime's allocation) or a Slurm job's GPU list names fewer than NVML shows."""
    if not facts.gpus:
        return None
    listed = len(facts.gpus)
    granted = _granted(facts)
    if granted is None:
        return None
    variable, value, count, indices = granted
    if count >= listed:
        return None
    if (
        indices is not None
        and facts.applied_visible is not None
        and set(facts.applied_visible) <= set(indices)
    ):
        return None  # `%gpu use` keeps the kernel inside the allocation already
    evidence = [
        f"{variable}={_shown(value)}: {count} GPU{'s' if count != 1 else ''} granted",
        f"NVML lists {listed} GPUs: "
        + ", ".join(f"GPU {g.index} {_shown(g.name)} {_shown(g.uuid)}" for g in facts.gpus),
    ]
    allocation = facts.allocation
    if allocation.restricted:
        evidence.append(f"CUDA_VISIBLE_DEVICES inherited: {_shown(allocation.raw)}")
    if indices is not None and all(0 <= i < listed for i in indices):
        line = f"`%gpu use {_gpu_list(indices)}`"
    else:
        line = "%gpu use with the granted GPUs' numbers as nvidia-smi shows them"
    return Finding(
        "more_gpus_than_allocated",
        f"This kernel can reach {listed} GPUs but the scheduler granted {count}",
        tuple(evidence),
        f"Stay within the allocation: {line}.  Administrator: run the container unprivileged, and "
        "set the NVIDIA Container Toolkit's `accept-nvidia-visible-devices-envvar-when-unprivileged = "
        "false` with `device-list-strategy = volume-mounts`, so only the granted GPUs reach the container.",
    )


def _granted(facts: Facts) -> tuple[str, str, int, tuple[int, ...] | None] | None:
    """(variable, value, how many GPUs it grants, their nvidia-smi indices if known)."""
    value = facts.env.get("NVIDIA_VISIBLE_DEVICES")
    if value and value.strip().lower() not in ("all", "void", "none", ""):
        entries = _named_entries(value)
        return "NVIDIA_VISIBLE_DEVICES", value, len(entries), _indices_named(value, facts)
    slurm = facts.slurm
    if slurm is not None and slurm.node_indices is not None:
        # Slurm's node indices are nvidia-smi's when the cgroup does not hide the other GPUs.
        return slurm.variable, slurm.value, len(slurm.node_indices), slurm.node_indices
    return None


def mig_mode(facts: Facts) -> Finding | None:
    """(b) A GPU this kernel can reach is in MIG mode: CUDA gets one instance of it, not the GPU."""
    on = [g for g in facts.seen if g.mig]
    if not on:
        return None
    allocation = facts.allocation
    evidence = [f"GPU {g.index} {_shown(g.name)}: MIG mode on (NVML)" for g in on]
    if allocation.mig:
        evidence += [f"CUDA_VISIBLE_DEVICES names {m.describe()} ({_shown(m.uuid)})" for m in allocation.mig]
        sizes = [m.total_bytes for m in allocation.mig if m.total_bytes]
        most = f" (at most {format_bytes(min(sizes))})" if sizes else ""
        return Finding(
            "mig_mode",
            "This kernel runs in a MIG instance: its memory is the instance's, not the GPU's",
            tuple(evidence),
            f"Size limits within the instance{most}, e.g. `%gpu limit 90%`; a whole GPU needs the "
            "administrator to allocate one (`sudo nvidia-smi -i N -mig 0` on an idle GPU).",
        )
    evidence.append(f"CUDA_VISIBLE_DEVICES inherited: {_shown(allocation.raw)} (names no MIG instance)")
    whole = [g.index for g in facts.gpus if g.mig is False]
    other = f", or use whole GPUs only: `%gpu use {_gpu_list(whole)}`" if whole else ""
    return Finding(
        "mig_mode",
        "A GPU in MIG mode is reachable but no MIG instance is allocated: CUDA uses one instance of it at most",
        tuple(evidence),
        "Start the kernel with CUDA_VISIBLE_DEVICES=MIG-<uuid> of a free instance (`nvidia-smi -L` lists "
        f"them){other}.  Administrator: allocate MIG instances through the "
        "scheduler (the device plugin's `mig-strategy`).",
    )


def compute_mode(facts: Facts) -> Finding | None:
    """(b) A GPU set to exclusive-process or prohibited compute mode."""
    odd = [g for g in facts.seen if g.compute_mode in (COMPUTE_EXCLUSIVE, COMPUTE_PROHIBITED)]
    if not odd:
        return None
    evidence = [
        f"GPU {g.index}: compute mode {COMPUTE_MODE_NAMES[g.compute_mode or 0]} (NVML)"
        + (f"; processes listed: {len(g.processes)}" if g.processes is not None else "")
        for g in odd
    ]
    prohibited = [g.index for g in odd if g.compute_mode == COMPUTE_PROHIBITED]
    usable = [g.index for g in facts.seen if g.compute_mode != COMPUTE_PROHIBITED]
    first = odd[0].index
    if prohibited:
        line = f"`%gpu use {_gpu_list(usable)}`" if usable else "no GPU here accepts CUDA work"
        user = f"Leave GPU {_gpu_list(prohibited)} out: {line}."
    else:
        user = "Only one process at a time may use these GPUs: stop the other kernel or job on them first."
    return Finding(
        "compute_mode",
        "A GPU is not in the Default compute mode: "
        + ("no process may use it" if prohibited else "one process at a time may use it"),
        tuple(evidence),
        f"{user}  Administrator: `sudo nvidia-smi -i {first} -c DEFAULT` lets processes share it.",
    )


def time_slicing(facts: Facts) -> Finding | None:
    """(b) A GPU's used memory well above the processes this container can see: others share it
    unseen (time-slicing, or another container on the same GPU)."""
    unseen = []
    for g in facts.seen:
        if g.used_bytes is None or g.total_bytes is None or g.processes is None or g.mig:
            continue
        listed = sum(p.used_memory_bytes or 0 for p in g.processes)
        extra = g.used_bytes - listed - CONTEXT_BYTES
        if extra >= max(UNSEEN_BYTES, UNSEEN_SHARE * g.total_bytes):
            unseen.append((g, listed, extra))
    if not unseen:
        return None
    evidence = [
        f"GPU {g.index}: {format_bytes(g.used_bytes)} used (driver), the {len(g.processes or ())} processes "
        f"listed hold {format_bytes(listed)}: {format_bytes(extra)} belongs to processes this kernel cannot see"
        + (f"; utilization {g.utilization}%" if g.utilization is not None else "")
        for g, listed, extra in unseen
    ]
    g = unseen[0][0]
    room = max(((g.free_bytes or 0) + (g.kernel_bytes or 0) - CONTEXT_BYTES) * 9 // 10 // MIB, 1)
    return Finding(
        "time_slicing",
        "A GPU is shared with work this kernel cannot see (time-slicing or another container)",
        tuple(evidence),
        f"Cap this kernel within what is free: `%gpu limit {room}` (MiB; run `%gpu use {g.index}` first if "
        "the kernel sees other GPUs).  Administrator: give the pod a GPU of its own or a MIG instance; "
        "time-sliced replicas do not divide memory.",
    )


def mps(facts: Facts) -> Finding | None:
    """(b) An MPS control daemon: this kernel's CUDA becomes an MPS client."""
    reading = facts.mps
    if reading is None:
        return None
    evidence = [
        f"{_shown(reading.directory + '/control')} is a FIFO owned by uid {reading.owner_uid} (lstat; not opened)",
    ]
    evidence += [f"{name}={_shown(value)}" for name, value in sorted(reading.variables.items())]
    limit = reading.variables.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    if limit:
        fix = (
            "None needed for memory: the MPS server enforces CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; keep "
            "this kernel's %gpu limit at or below it."
        )
    else:
        fix = (
            "A %gpu limit is cooperative under MPS: to make the server enforce it, start the kernel with "
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G (device 0, 8 GiB; one entry per GPU).  Administrator: "
            "`echo set_default_device_pinned_mem_limit 0 8G | nvidia-cuda-mps-control`."
        )
    return Finding("mps", "An MPS control daemon serves this kernel's GPUs", tuple(evidence), fix)


def cgroup_renumbering(facts: Facts) -> Finding | None:
    """(c) A cgroup (Slurm's, a container's) hides the other GPUs: NVML numbers the job's GPUs from 0,
    so the node's numbers that the scheduler wrote are not nvidia-smi's here."""
    node = _node_numbers(facts)
    if node is None or not facts.gpus:
        return None
    variable, value, indices = node
    here = tuple(g.index for g in facts.gpus)
    if len(indices) != len(here) or tuple(sorted(indices)) == here:
        return None
    pairs = ", ".join(
        f"node {n} = GPU {g.index} {_shown(g.uuid)}" for n, g in zip(indices, facts.gpus, strict=False)
    )
    evidence = [
        f"{variable}={_shown(value)}: the node's numbers",
        f"NVML inside the cgroup lists GPU {_gpu_list(here)}",
        f"by position: {pairs}",
    ]
    cuda = facts.inherited.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        named = _indices_named(cuda, facts)
        broken = named is None or any(i >= len(here) for i in named)
        evidence.append(
            f"CUDA_VISIBLE_DEVICES inherited: {_shown(cuda)}"
            + (" (names a GPU this cgroup does not have: CUDA finds none)" if broken else "")
        )
    return Finding(
        "cgroup_renumbering",
        "A cgroup renumbered the GPUs: the scheduler's numbers are the node's, nvidia-smi's here start at 0",
        tuple(evidence),
        f"Use the numbers seen here (`%gpu use {_gpu_list(here)}`), never the node's; claims are keyed by "
        "UUID, so they hold across jobs.  Administrator: Slurm's ConstrainDevices=yes sets "
        "CUDA_VISIBLE_DEVICES relative to the cgroup; a script that copies SLURM_JOB_GPUS into it is wrong.",
    )


def _node_numbers(facts: Facts) -> tuple[str, str, tuple[int, ...]] | None:
    slurm = facts.slurm
    if slurm is not None and slurm.node_indices is not None:
        return slurm.variable, slurm.value, slurm.node_indices
    value = facts.env.get("NVIDIA_VISIBLE_DEVICES")
    if value:
        entries = _named_entries(value)
        if entries and all(e.isascii() and e.isdigit() for e in entries):
            return "NVIDIA_VISIBLE_DEVICES", value, tuple(int(e) for e in entries)
    return None


def limit_exceeded(facts: Facts) -> Finding | None:
    """(d) A cooperative limit the CUDA context and libraries exceed: the driver's figure for this
    kernel's processes is above its limit, or the limit plus a context does not fit in what is free."""
    evidence = []
    worst: tuple[GpuFacts, int] | None = None
    for g in facts.gpus:
        if g.limit_bytes is None:
            continue
        held = g.kernel_bytes or 0
        if g.kernel_bytes is not None and held > g.limit_bytes:
            evidence.append(
                f"GPU {g.index}: this kernel's processes hold {format_bytes(held)} per the driver (NVML), "
                f"its limit is {format_bytes(g.limit_bytes)} (the session's record)"
            )
            worst = _lower(worst, g, g.limit_bytes - (held - g.limit_bytes))
        elif g.free_bytes is not None and g.limit_bytes + CONTEXT_BYTES - held > g.free_bytes:
            evidence.append(
                f"GPU {g.index}: limit {format_bytes(g.limit_bytes)} + about {format_bytes(CONTEXT_BYTES)} of "
                f"CUDA context, less {format_bytes(held)} held, is above the {format_bytes(g.free_bytes)} free"
            )
            worst = _lower(worst, g, g.free_bytes + held - CONTEXT_BYTES)
    if worst is None:
        return None
    return Finding(
        "limit_exceeded",
        "This kernel's limit does not hold on the driver's figures: the CUDA context and libraries "
        "(cuDNN, cuBLAS) sit outside the frameworks' allocators",
        tuple(evidence),
        _room_fix(worst[1]),
    )


def _room_fix(room: int) -> str:
    """Lower the limit to 90% of the room left, unless that is less than a CUDA context (a limit of
    a few MiB is no advice): then no lower limit makes room, and the fix says where to look."""
    if room * 9 // 10 < CONTEXT_BYTES:
        return (
            "No lower limit makes room here: more than the limit is held outside the allocators, or the GPU "
            "is nearly full. `%gpu status` names each process and what it holds; free what a library or "
            "child process holds, restart the kernel, or `%gpu use auto` for a GPU with room."
        )
    return (
        f"Lower the limit to leave room for them: `%gpu limit {room * 9 // 10 // MIB}` (MiB; a started "
        "framework keeps its limit until the kernel restarts)."
    )


def _lower(current: tuple[GpuFacts, int] | None, gpu: GpuFacts, room: int) -> tuple[GpuFacts, int]:
    return (gpu, room) if current is None or room < current[1] else current


def visible_devices_by_hand(facts: Facts) -> Finding | None:
    """(e) CUDA_VISIBLE_DEVICES set by hand against what `%gpu` applied or the claims: set in
    os.environ in the kernel, or inherited (not from a scheduler) naming GPUs another kernel claimed."""
    if "CUDA_VISIBLE_DEVICES" in facts.by_hand:
        return _set_in_kernel(facts, facts.by_hand["CUDA_VISIBLE_DEVICES"])
    value = facts.inherited.get("CUDA_VISIBLE_DEVICES")
    if value is None or _granted(facts) is not None:
        return None  # nothing inherited, or a scheduler's allocation: respected as it is
    taken = _claimed_elsewhere(value, facts)
    if not taken:
        return None
    evidence = [f"CUDA_VISIBLE_DEVICES inherited: {_shown(value)}, not a scheduler's allocation", *taken]
    return Finding(
        "visible_devices_by_hand",
        "CUDA_VISIBLE_DEVICES was set by hand before the kernel started, onto a GPU another kernel claimed",
        tuple(evidence),
        "Start the kernel without CUDA_VISIBLE_DEVICES (its kernel.json `env`, or the shell that started "
        "Jupyter), then `%gpu use auto`, which claims a free GPU.",
    )


def _set_in_kernel(facts: Facts, value: str | None) -> Finding | None:
    named = None if value is None else _indices_named(value, facts)
    taken = _claimed_elsewhere(value or "", facts)
    hidden = [i for i in facts.claimed if named is not None and i not in named]
    applied = facts.applied_visible
    differs = facts.requested_visible is not None and named is not None and applied is not None
    differs = differs and set(named or ()) != set(applied or ())
    if not (taken or hidden or differs):
        return None  # set by hand, but against nothing: the kernel follows it (see `%gpu`)
    evidence = [
        f"os.environ['CUDA_VISIBLE_DEVICES'] = {_shown(value)}, set by hand in this kernel",
        f"inherited: {_shown(facts.inherited.get('CUDA_VISIBLE_DEVICES'))}",
    ]
    if facts.requested_visible is not None:
        evidence.append(f"`%gpu {safe(facts.requested_visible)}` applied GPU {_gpu_list(applied or ())}")
    evidence += taken
    if hidden:
        evidence.append(f"this kernel claimed GPU {_gpu_list(hidden)}, which the value leaves out")
    if facts.cuda_read is not None:
        evidence.append(
            f"CUDA read CUDA_VISIBLE_DEVICES={_shown(facts.cuda_read.get('CUDA_VISIBLE_DEVICES'))} when "
            f"{safe(facts.cuda_started_by or 'a framework')} started it"
        )
        fix = "Restart the kernel, leave CUDA_VISIBLE_DEVICES alone, and choose GPUs with `%gpu use auto`."
    else:
        free = [i for i in applied or () if i not in facts.claimed_by_others]
        named_line = f"`%gpu use {_gpu_list(free)}` (what `%gpu` applied) or " if free else ""
        fix = (
            "Remove it: `os.environ.pop('CUDA_VISIBLE_DEVICES', None)`, then "
            f"{named_line}`%gpu use auto` (which claims a free GPU)."
        )
    return Finding(
        "visible_devices_by_hand",
        "CUDA_VISIBLE_DEVICES was set by hand, against what `%gpu` applied and the claims",
        tuple(evidence),
        fix,
    )


def _claimed_elsewhere(value: str, facts: Facts) -> list[str]:
    """Evidence lines for each GPU ``value`` names that another live kernel has claimed."""
    named = _indices_named(value, facts) or ()
    return [
        f"GPU {i} is claimed by {safe(facts.claimed_by_others[i])}"
        for i in named
        if i in facts.claimed_by_others
    ]


def several_pools(facts: Facts) -> Finding | None:
    """(f) Two or more frameworks in this kernel, each with an allocator pool of its own."""
    pools = [f for f in facts.frameworks if f.takes_pool]
    if len(pools) < 2 or facts.shares_requested:
        return None
    evidence = [f"{f.name}: {f.stage}, able to use a GPU (its adapter)" for f in pools]
    limits = {g.index: g.limit_bytes for g in facts.gpus if g.limit_bytes}
    if limits:
        evidence.append(
            "the kernel's limit, divided between them equally: "
            + ", ".join(f"GPU {i} {format_bytes(b)}" for i, b in sorted(limits.items()))
        )
        each = min(limits.values()) // len(pools) // MIB
    else:
        evidence.append("no limit: each may take most of a GPU for itself")
        totals = [g.free_bytes for g in facts.gpus if g.free_bytes]
        each = (min(totals) // 2 // len(pools) // MIB) if totals else 4096
    shares = ", ".join(f"{max(each, 1)}M {f.key}" for f in pools)
    return Finding(
        "several_pools",
        f"{len(pools)} frameworks in this kernel each keep a memory pool of their own",
        tuple(evidence),
        f"Size each pool: `%gpu limit {shares}` (one kernel, one limit), before they start.",
    )


FINDINGS: tuple[Callable[[Facts], Finding | None], ...] = (
    more_gpus_than_allocated,
    mig_mode,
    compute_mode,
    time_slicing,
    mps,
    cgroup_renumbering,
    limit_exceeded,
    visible_devices_by_hand,
    several_pools,
)


def diagnose(facts: Facts) -> tuple[list[Finding], list[str]]:
    """Every finding the facts show, and a note for each finding function that failed (a fault in
    one reading is a note, never an error in the user's kernel)."""
    found, notes = [], []
    for finding in FINDINGS:
        try:
            result = finding(facts)
        except Exception as err:
            notes.append(f"{finding.__name__} could not be checked ({type(err).__name__})")
            continue
        if result is not None:
            found.append(result)
    return found, notes


def summary(facts: Facts) -> list[str]:
    """How this kernel shares its GPUs, in a few lines (shown with or without findings)."""
    lines = []
    if facts.nvml_error:
        lines.append(f"NVML: {safe(facts.nvml_error)}")
    else:
        lines.append(
            f"GPUs NVML lists: {len(facts.gpus)}"
            + (f" ({_gpu_list(g.index for g in facts.gpus)})" if facts.gpus else "")
        )
    allocation = facts.allocation
    lines.append(
        "allocation: "
        + (
            allocation.describe()
            if allocation.restricted
            else "no CUDA_VISIBLE_DEVICES inherited (every GPU listed)"
        )
    )
    granted = _granted(facts)
    if granted is not None:
        variable, value, count, _ = granted
        lines.append(f"scheduler: {variable}={_shown(value)} ({count} GPU{'s' if count != 1 else ''})")
    lines.append(
        "this kernel: "
        + (
            "every GPU allowed"
            if facts.applied_visible is None
            else f"GPU {_gpu_list(facts.applied_visible)}"
            if facts.applied_visible
            else "no GPU (CUDA sees none)"
        )
        + (f"; claimed GPU {_gpu_list(facts.claimed)}" if facts.claimed else "")
    )
    limits = [f"GPU {g.index} {format_bytes(g.limit_bytes)}" for g in facts.gpus if g.limit_bytes]
    if limits:
        lines.append(f"limit: {', '.join(limits)}, {facts.limit_label or 'soft'}")
    else:
        lines.append("limit: none")
    seen = {g.index for g in facts.seen}
    for index, share in sorted(facts.platform_shares.items()):
        if index in seen:
            lines.append(f"platform share of GPU {index}: {safe(share)}")
    modes = sorted(
        {COMPUTE_MODE_NAMES.get(g.compute_mode or 0, "?") for g in facts.gpus if g.compute_mode is not None}
    )
    sharing = ["compute mode " + "/".join(modes)] if modes else []
    sharing.append("MPS" if facts.mps else "no MPS daemon")
    sharing.append(
        "MIG on GPU " + _gpu_list(g.index for g in facts.gpus if g.mig)
        if any(g.mig for g in facts.gpus)
        else "no MIG"
    )
    lines.append("sharing: " + ", ".join(sharing))
    pools = [f.name for f in facts.frameworks if f.takes_pool]
    lines.append("frameworks with a GPU pool: " + (", ".join(pools) if pools else "none yet"))
    return lines


def report(session: Session, **kwargs: Any) -> dict[str, Any]:
    """``%gpu doctor --json``: the findings, the summary and the notes."""
    facts = gather(session, **kwargs)
    findings, failed = diagnose(facts)
    return {
        "findings": [f.as_json() for f in findings],
        "summary": summary(facts),
        "notes": [*facts.notes, *failed],
    }


def render_text(data: dict[str, Any]) -> str:
    findings = data["findings"]
    lines = [f"{len(findings)} finding{'s' if len(findings) != 1 else ''}" if findings else "No findings."]
    for n, finding in enumerate(findings, 1):
        lines.append(f"{n}. {finding['title']}")
        lines += [f"   evidence: {line}" for line in finding["evidence"]]
        lines.append(f"   fix: {finding['fix']}")
    lines.append("How this kernel shares:")
    lines += [f"  {line}" for line in data["summary"]]
    lines += [f"note: {note}" for note in data["notes"]]
    return "\n".join(lines)
