"""Who holds what on each GPU, and picking free GPUs for ``%gpu use auto``.

NVML lists the processes on a GPU by pid; owners and commands come from the operating system
through a :class:`ProcessTable` (psutil on a real machine, the fake server's own table in
tests).  Memory is split into this kernel, my other processes (same user), other users, and
what no listed process accounts for.  Where NVML's pids do not match ours (a container without
the host's pid namespace), this kernel's share falls back to TensorFlow's allocator, and the
report says which number is shown.

Neither psutil nor NVML is touched at import.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from . import claims, grammar, tf_runtime
from .nvml import GpuInfo, GpuLost, Nvml, NvmlUnavailable
from .units import format_bytes

__all__ = [
    "ChoiceError",
    "GpuUsage",
    "OwnerLookupTable",
    "ProcessDetails",
    "ProcessEntry",
    "ProcessTable",
    "PsutilProcessTable",
    "attribute",
    "choose_gpus",
    "claim_key",
    "process_table_for",
    "release_claims",
]

POLL_S = 2.0  # how often --wait looks again
PROGRESS_EVERY_S = 60.0  # how often --wait says it is still waiting


class ChoiceError(RuntimeError):
    """No GPU could be chosen; the message (one line) says why and what to try."""


# -- the process table ------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessDetails:
    """What the operating system says about a pid.  None: not known or not allowed to see."""

    user: Optional[str]
    command: Optional[str]
    alive: bool
    note: Optional[str] = None


class ProcessTable(Protocol):
    def lookup(self, pid: int) -> ProcessDetails: ...

    def current_user(self) -> Optional[str]: ...


EXITED_NOTE = "exited, but NVML still lists it (or it lives in another pid namespace)"


class PsutilProcessTable:
    """Owners and commands from psutil.  Every failure becomes a missing field and a note."""

    def lookup(self, pid: int) -> ProcessDetails:
        try:
            import psutil  # not at import: `import tfgpu_magic` stays light
        except ImportError:  # a declared dependency, but a bare GPU box may lack it
            return _proc_lookup(pid)
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                user, user_note = _guarded_read(proc.username, psutil)
                command, command_note = _guarded_read(lambda: " ".join(proc.cmdline()) or proc.name(), psutil)
        except (psutil.NoSuchProcess, ProcessLookupError):  # ZombieProcess is a NoSuchProcess
            return ProcessDetails(None, None, False, EXITED_NOTE)
        if user_note == "exited" or command_note == "exited":
            return ProcessDetails(None, None, False, EXITED_NOTE)
        note = user_note or command_note
        return ProcessDetails(user, command, True, note)

    def current_user(self) -> Optional[str]:
        return _user_name(os.getuid())


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (containers): the number still says who
        return str(uid)


def _proc_lookup(pid: int) -> ProcessDetails:
    """Owner and command from /proc, for machines without psutil (Linux only)."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return ProcessDetails(None, None, False, EXITED_NOTE)
    except OSError:
        return ProcessDetails(None, None, True, "psutil is not installed and /proc cannot be read")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip() or None
    except OSError:
        command = None
    return ProcessDetails(_user_name(uid), command, True)


def _guarded_read(read: Callable[[], Any], psutil: Any) -> tuple[Optional[str], Optional[str]]:
    try:
        return str(read()), None
    except psutil.AccessDenied:
        return None, "owned by a user whose details this account may not read"
    except psutil.NoSuchProcess:
        return None, "exited"
    except KeyError:  # uid with no name: psutil cannot map it
        return None, "owner has no user name on this machine"


class OwnerLookupTable:
    """A process table from a lookup function returning objects with ``user`` and ``command``.

    ``SimulatedNvml.owner_of`` is such a function: a device source may bring its own process
    table, so a simulated server answers with simulated owners.
    """

    def __init__(self, owner_of: Callable[[int], Any], me: Optional[str] = None, my_pid: Optional[int] = None):
        self._owner_of = owner_of
        self._me = me
        self._my_pid = os.getpid() if my_pid is None else my_pid

    def lookup(self, pid: int) -> ProcessDetails:
        found = self._owner_of(pid)
        if found is None:
            return ProcessDetails(None, None, False, EXITED_NOTE)
        return ProcessDetails(getattr(found, "user", None), getattr(found, "command", None), True)

    def current_user(self) -> Optional[str]:
        if self._me is not None:
            return self._me
        found = self._owner_of(self._my_pid)
        return getattr(found, "user", None)


def process_table_for(nvml: Nvml, my_pid: Optional[int] = None) -> ProcessTable:
    """The device source's own table when it has one (the fake's ``owner_of``), else psutil."""
    lib = nvml.lib  # the injected device source; None until real NVML starts
    owner_of = getattr(lib, "owner_of", None)
    if callable(owner_of):
        return OwnerLookupTable(owner_of, my_pid=my_pid)
    return PsutilProcessTable()


# -- attribution ------------------------------------------------------------------------------
THIS_KERNEL, MINE, OTHERS, UNKNOWN = "this kernel", "mine", "others", "unknown"


@dataclass(frozen=True)
class ProcessEntry:
    pid: int
    used_memory_bytes: Optional[int]  # None: NVML could not say
    kind: str  # "compute" or "graphics"
    user: Optional[str]
    command: Optional[str]
    alive: bool
    whose: str  # THIS_KERNEL, MINE (my other processes), OTHERS, UNKNOWN (exited)
    note: Optional[str] = None


@dataclass(frozen=True)
class GpuUsage:
    """One GPU's memory split by holder, in bytes.  None: not known (never a made-up 0)."""

    index: int
    processes: Optional[tuple[ProcessEntry, ...]]  # None: NVML could not list them
    this_kernel_bytes: Optional[int]
    this_kernel_source: Optional[str]  # "nvml" (found by pid) or "tensorflow" (allocator in use)
    my_other_bytes: Optional[int]
    others_bytes: Optional[int]
    unattributed_bytes: Optional[int]  # used, but by no listed live process (contexts, exited)
    notes: tuple[str, ...] = ()


def attribute(
    nvml: Nvml,
    gpu: GpuInfo,
    table: ProcessTable,
    my_pid: int,
    me: Optional[str],
    tf_in_use_bytes: Optional[int] = None,
) -> GpuUsage:
    """Split one GPU's memory into this kernel, my other processes, others and the rest."""
    if gpu.lost:
        return GpuUsage(gpu.index, None, None, None, None, None, None, ("the GPU stopped answering",))
    try:
        listed = nvml.processes(gpu.index)
    except GpuLost:
        return GpuUsage(gpu.index, None, None, None, None, None, None, ("the GPU stopped answering",))
    except Exception as err:  # NVMLError: no permission, not supported
        return _unlisted(gpu, tf_in_use_bytes, f"NVML could not list the processes ({err})")
    entries = tuple(_entry(p.pid, p.used_memory_bytes, p.kind, table, my_pid, me) for p in listed)
    return _split(gpu, entries, tf_in_use_bytes, my_pid)


def _entry(pid: int, used: Optional[int], kind: str, table: ProcessTable, my_pid: int, me: Optional[str]) -> ProcessEntry:
    details = table.lookup(pid)
    if pid == my_pid:
        whose = THIS_KERNEL
    elif not details.alive:
        whose = UNKNOWN
    elif me is not None and details.user == me:
        whose = MINE
    else:
        whose = OTHERS  # including owners we may not see: not ours as far as we can tell
    return ProcessEntry(pid, used, kind, details.user, details.command, details.alive, whose, details.note)


def _split(gpu: GpuInfo, entries: tuple[ProcessEntry, ...], tf_in_use: Optional[int], my_pid: int) -> GpuUsage:
    notes: list[str] = []
    buckets = {w: _bucket([e for e in entries if e.whose == w]) for w in (THIS_KERNEL, MINE, OTHERS)}
    mine, source = buckets[THIS_KERNEL], "nvml"
    if not any(e.whose == THIS_KERNEL for e in entries) and tf_in_use is not None:
        mine, source = tf_in_use, "tensorflow"
        notes.append(
            f"NVML does not list this kernel's pid {my_pid} here (a container without the host's "
            "pid namespace?): showing TensorFlow's allocator in use, which leaves out CUDA's own overhead"
        )
    unknown = [e.pid for e in entries if e.used_memory_bytes is None]
    if unknown:
        notes.append(
            f"NVML gives no memory figure for pid {', '.join(map(str, unknown))}; "
            "sums count only the known figures"
        )
    exited = [e.pid for e in entries if not e.alive and e.whose != THIS_KERNEL]
    if exited:
        notes.append(f"pid {', '.join(map(str, exited))}: {EXITED_NOTE}; counted as unattributed")
    return GpuUsage(
        gpu.index,
        entries,
        mine,
        source if mine is not None else None,
        buckets[MINE],
        buckets[OTHERS],
        _rest(gpu, [mine, buckets[MINE], buckets[OTHERS]]),
        tuple(notes),
    )


def _unlisted(gpu: GpuInfo, tf_in_use: Optional[int], why: str) -> GpuUsage:
    source = "tensorflow" if tf_in_use is not None else None
    return GpuUsage(gpu.index, None, tf_in_use, source, None, None, None, (why,))


def _bucket(entries: list[ProcessEntry]) -> Optional[int]:
    """Known bytes of a group; 0 only when the group is truly empty, None when all are unknown."""
    known = [e.used_memory_bytes for e in entries if e.used_memory_bytes is not None]
    if entries and not known:
        return None
    return sum(known)


def _rest(gpu: GpuInfo, parts: list[Optional[int]]) -> Optional[int]:
    if gpu.memory is None:
        return None
    return max(0, gpu.memory.used_bytes - sum(p or 0 for p in parts))


# -- choosing GPUs ----------------------------------------------------------------------------
def claim_key(gpu: GpuInfo) -> str:
    """The claim file's key: the UUID, stable across reboots and numbering changes."""
    return gpu.uuid or gpu.pci_bus_id or f"gpu-index-{gpu.index}"


def release_claims(session: Any, gpus: tuple[int, ...]) -> None:
    """Give back this kernel's claims on these GPUs (chosen, then refused by the session)."""
    for index in gpus:
        claims.release(claim_key(session.nvml.gpu(index)))


@dataclass(frozen=True)
class _Look:
    """One look at the machine: who can be chosen, and why the others cannot."""

    ready: list[GpuInfo]  # best first
    skipped: dict[int, str]  # NVML index -> why not
    best_free: Optional[GpuInfo]


def choose_gpus(
    session: Any,
    auto: grammar.Auto,
    progress: Callable[[str], None],
    *,
    poll_s: float = POLL_S,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> tuple[tuple[int, ...], str]:
    """Choose ``auto.count`` GPUs (NVML indices) and claim them for this process's lifetime.

    Most free memory first, ties to the lower utilization; GPUs claimed by other live
    kernels, lost GPUs and GPUs in MIG mode are skipped.  With ``auto.wait_seconds`` it looks
    again every ``poll_s`` until enough GPUs qualify, saying so through ``progress``; Ctrl-C
    stops the wait.  Returns the indices and a one-line reason; raises :class:`ChoiceError`.
    """
    nvml: Nvml = session.nvml
    _check_machine(nvml, auto)
    started = _started_with(session, auto)
    if started is not None:
        return started
    deadline = None if auto.wait_seconds is None else time.monotonic() + auto.wait_seconds
    last_said = None
    try:
        while True:
            chosen, look = _try_once(nvml, auto)
            if chosen is not None:
                return chosen
            now = time.monotonic()
            if deadline is None or now >= deadline:
                raise ChoiceError(_failure(auto, look, waited=deadline is not None))
            if last_said is None or now - last_said >= progress_every_s:
                progress(_waiting(auto, look, deadline - now))
                last_said = now
            time.sleep(min(poll_s, max(0.0, deadline - now)))
    except KeyboardInterrupt:
        raise ChoiceError("stopped waiting (interrupted); no GPU was chosen or claimed") from None


def _check_machine(nvml: Nvml, auto: grammar.Auto) -> None:
    try:
        count = nvml.device_count()
    except NvmlUnavailable as err:
        raise ChoiceError(f"`%gpu use auto` needs GPU readings, and {err}; name the GPUs instead, e.g. `%gpu use 0`") from None
    if count == 0:
        raise ChoiceError("`%gpu use auto` found no GPU on this machine (NVML lists none)")
    if auto.count > count:
        raise ChoiceError(
            f"`%gpu use auto:{auto.count}` needs {auto.count} GPUs but this machine has {count}; "
            f"use `%gpu use auto:{count}` or fewer"
        )


def _started_with(session: Any, auto: grammar.Auto) -> Optional[tuple[tuple[int, ...], str]]:
    """Once TensorFlow has started its GPUs are fixed: keep (and claim) them if the count fits."""
    if tf_runtime.stage() is not tf_runtime.Stage.STARTED:
        return None
    visible = tf_runtime.in_force(session.cuda_map()).visible_nvml
    if len(visible) != auto.count:
        shown = "GPU " + ",".join(map(str, visible)) if visible else "no GPU"
        raise ChoiceError(
            f"TensorFlow has already started with {shown} visible and cannot change it in a running "
            f"kernel; put `%gpu use auto{_count_text(auto)}` at the top of the notebook, before "
            "`import tensorflow`, and restart the kernel"
        )
    nvml: Nvml = session.nvml
    with claims.choosing():
        for index in visible:
            claims.claim(claim_key(nvml.gpu(index)))
    return visible, f"TensorFlow has already started with GPU {_indices(visible)}; keeping it (claimed for this kernel)"


def _try_once(nvml: Nvml, auto: grammar.Auto) -> tuple[Optional[tuple[tuple[int, ...], str]], _Look]:
    """Under the directory lock: look, and claim the best GPUs if enough qualify."""
    try:
        with claims.choosing():
            look = _look(nvml, auto)
            if len(look.ready) < auto.count:
                return None, look
            taken = [g for g in look.ready if claims.claim(claim_key(g))][: auto.count]
            if len(taken) < auto.count:  # a process outside the protocol holds the lock file
                for gpu in taken:
                    claims.release(claim_key(gpu))
                return None, look
            for key in claims.held() - {claim_key(g) for g in taken}:
                claims.release(key)  # an earlier `%gpu use auto` in this kernel
            return (tuple(sorted(g.index for g in taken)), _reason(auto, taken, look)), look
    except claims.ClaimError as err:
        raise ChoiceError(str(err)) from None


def _look(nvml: Nvml, auto: grammar.Auto) -> _Look:
    gpus = nvml.gpus()
    holders = {g.index: claims.holder(claim_key(g)) for g in gpus if not g.lost}
    skipped: dict[int, str] = {}
    fits: list[GpuInfo] = []
    for gpu in gpus:
        why = _why_not(gpu, holders.get(gpu.index), auto)
        if why:
            skipped[gpu.index] = why
        else:
            fits.append(gpu)
    # The best the user could get by waiting or asking for less: free memory on usable GPUs.
    usable = [g for g in gpus if g in fits or skipped.get(g.index, "").endswith(" free")]
    return _Look(sorted(fits, key=_rank), skipped, max(usable, key=_free, default=None))


def _why_not(gpu: GpuInfo, holder: Optional[claims.Holder], auto: grammar.Auto) -> Optional[str]:
    if gpu.lost:
        return "lost"
    if gpu.memory is None:
        return "no memory reading"
    if gpu.mig_enabled:
        return "in MIG mode (name a MIG instance yourself)"
    if holder is not None and not holder.this_process:
        return f"claimed by {holder.describe()}"
    if auto.min_free_bytes is not None and gpu.memory.free_bytes < auto.min_free_bytes:
        return f"{format_bytes(gpu.memory.free_bytes)} free"
    return None


def _free(gpu: GpuInfo) -> int:
    return gpu.memory.free_bytes if gpu.memory else -1


def _rank(gpu: GpuInfo) -> tuple[int, int, int]:
    """Most free memory first; then lower utilization (a missing reading ranks last); then index."""
    util = gpu.utilization_percent
    return (-_free(gpu), util if util is not None else 101, gpu.index)


def _describe(gpu: GpuInfo) -> str:
    util = "n/a" if gpu.utilization_percent is None else f"{gpu.utilization_percent}%"
    total = gpu.memory.total_bytes if gpu.memory else None
    return f"GPU {gpu.index}: {format_bytes(_free(gpu))} free of {format_bytes(total)}, utilization {util}"


def _reason(auto: grammar.Auto, taken: list[GpuInfo], look: _Look) -> str:
    what = "the GPU" if auto.count == 1 else f"the {auto.count} GPUs"
    floor = f" with at least {format_bytes(auto.min_free_bytes)} free" if auto.min_free_bytes else ""
    skipped = "; ".join(f"GPU {i} {why}" for i, why in sorted(look.skipped.items()) if why.startswith("claimed"))
    tail = f" (skipped: {skipped})" if skipped else ""
    return (
        f"Chose GPU {_indices(sorted(g.index for g in taken))}: {what} with the most free memory{floor} "
        f"not claimed by another kernel ({'; '.join(_describe(g) for g in taken)}){tail}; "
        "claimed for this kernel's lifetime"
    )


def _failure(auto: grammar.Auto, look: _Look, waited: bool) -> str:
    context = _context(look)
    if waited:
        return (
            f"{_shortfall(auto, look)} after waiting {_duration(auto.wait_seconds or 0)}{context}; "
            f"wait longer (e.g. `--wait 30m`){' or ask for less free memory' if auto.min_free_bytes else ''}"
        )
    return (
        f"{_shortfall(auto, look)} now{context}; "
        f"try `%gpu use auto{_count_text(auto)}{_min_text(auto)} --wait 10m`"
    )


def _shortfall(auto: grammar.Auto, look: _Look) -> str:
    if auto.min_free_bytes is not None:
        floor = format_bytes(auto.min_free_bytes)
        if auto.count == 1:
            return f"no unclaimed GPU has {floor} free"
        return f"fewer than {auto.count} unclaimed GPUs have {floor} free"
    if auto.count == 1:
        return "no GPU is free of other kernels' claims"
    return f"only {len(look.ready)} of the {auto.count} GPUs asked for are unclaimed"


def _context(look: _Look) -> str:
    parts = []
    if look.best_free is not None:
        parts.append(f"the most free is {format_bytes(_free(look.best_free))}, on GPU {look.best_free.index}")
    claimed = sum(1 for why in look.skipped.values() if why.startswith("claimed"))
    if claimed:
        parts.append(f"{claimed} GPU{'s' if claimed != 1 else ''} claimed by other kernels")
    return f" ({'; '.join(parts)})" if parts else ""


def _waiting(auto: grammar.Auto, look: _Look, left_s: float) -> str:
    return (
        f"Waiting: {_shortfall(auto, look)}{_context(look)}; {_duration(left_s)} left "
        "(interrupt the cell to stop)"
    )


def _count_text(auto: grammar.Auto) -> str:
    return f":{auto.count}" if auto.count != 1 else ""


def _min_text(auto: grammar.Auto) -> str:
    if auto.min_free_bytes is None:
        return ""
    mib = auto.min_free_bytes // (1024 * 1024)
    return f" --min-free {mib // 1024}G" if mib % 1024 == 0 else f" --min-free {mib}M"


def _indices(indices: Any) -> str:
    return ",".join(map(str, indices))


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m" if not secs else f"{minutes}m{secs:02d}s"
