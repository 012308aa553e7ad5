"""Choosing GPUs for ``%gpu use auto`` and claiming them for this kernel.

Candidates are the GPUs the environment allocated to this kernel; lost GPUs, GPUs in MIG
mode, GPUs whose UUID cannot be read (their claim would have no stable key) and GPUs claimed
by another live kernel are skipped.  Choosing and claiming happen under the claim directory's
lock (:mod:`tfgpu_magic.gpus.claims`), so two kernels started together get different GPUs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..command import grammar
from ..command.units import format_bytes
from ..gpus import claims
from ..gpus.nvml import GpuInfo, Nvml, NvmlUnavailable

__all__ = [
    "ChoiceError",
    "Interrupted",
    "NeverMet",
    "choose_gpus",
    "claim_key",
    "min_text",
    "release",
    "who_holds",
]

POLL_S = 2.0  # how often --wait looks again
PROGRESS_EVERY_S = 60.0  # how often --wait says it is still waiting


class ChoiceError(RuntimeError):
    """No GPU could be chosen; the message (one line) says why and what to try."""


class NeverMet(ChoiceError):
    """No GPU could be chosen, and waiting would not help: this machine cannot meet the request."""


class Interrupted(ChoiceError):
    """The wait was interrupted (Ctrl-C): nothing was chosen or claimed."""


def claim_key(nvml: Nvml, index: int) -> str | None:
    """The claim file's key: the GPU's UUID, read once and cached by :class:`Nvml`.

    None when the UUID cannot be read: a key made of anything else (the bus id, the index)
    could differ between two kernels, which would then both get the GPU.
    """
    return nvml.uuid(index)


def release(session: Any, index: int) -> None:
    """Give back this kernel's claim on one GPU (nothing happens if it holds none)."""
    key = claim_key(session.nvml, index)
    if key is not None:
        claims.release(key)


@dataclass(frozen=True)
class _Look:
    """One look at the machine: who can be chosen, and why the others cannot."""

    ready: list[GpuInfo]  # best first
    skipped: dict[int, str]  # nvidia-smi index -> why not
    best_free: GpuInfo | None
    ours: frozenset[int] = frozenset()  # claimed for this kernel by its starter (see _for_us)


def choose_gpus(
    session: Any,
    auto: grammar.Auto,
    progress: Callable[[str], None],
    *,
    poll_s: float = POLL_S,
    progress_every_s: float = PROGRESS_EVERY_S,
    how_to_stop: str = "interrupt the cell to stop",
    how_to_wait: str | None = None,
    how_to_wait_longer: str = "`--wait 30m`",
) -> tuple[tuple[int, ...], str]:
    """Choose ``auto.count`` GPUs (nvidia-smi indices) and claim them for this process's lifetime.

    Most free memory first, ties to the lower utilization.  With ``auto.wait_seconds`` it looks
    again every ``poll_s`` until enough GPUs qualify, saying so through ``progress`` (with
    ``how_to_stop``: a kernel's user interrupts the cell, a terminal's presses Ctrl-C); Ctrl-C
    stops the wait (:class:`Interrupted`).  ``how_to_wait`` is the advice when nothing qualifies
    without a wait (default: the ``%gpu use auto ... --wait 10m`` to type), ``how_to_wait_longer`` the
    example of a longer wait when a wait ran out (``--wait 30m``: ``%gpu`` and ``tfgpu run`` alike).  Returns the indices and a one-line reason; raises :class:`ChoiceError`.
    Claims this kernel held before are left alone: the session releases what it no longer
    requests once it has accepted the choice (so a refused choice changes nothing).
    """
    nvml: Nvml = session.nvml
    allowed = _check_machine(session, auto)
    started = _started_with(session, auto)
    if started is not None:
        return started
    deadline = None if auto.wait_seconds is None else time.monotonic() + auto.wait_seconds
    last_said = None
    try:
        while True:
            chosen, look = _try_once(nvml, auto, allowed)
            if chosen is not None:
                return chosen
            now = time.monotonic()
            if deadline is None or now >= deadline:
                raise ChoiceError(_failure(auto, look, deadline is not None, how_to_wait, how_to_wait_longer))
            if last_said is None or now - last_said >= progress_every_s:
                progress(_waiting(auto, look, deadline - now, how_to_stop))
                last_said = now
            time.sleep(min(poll_s, max(0.0, deadline - now)))
    except KeyboardInterrupt:
        raise Interrupted("stopped waiting (interrupted); no GPU was chosen or claimed") from None


def _check_machine(session: Any, auto: grammar.Auto) -> tuple[int, ...]:
    """The GPUs this kernel may choose from: the environment's allocation, or every GPU."""
    try:
        count = session.nvml.device_count()
    except NvmlUnavailable as err:
        raise NeverMet(
            f"`%gpu use auto` needs GPU readings, and {err}; name the GPUs instead, e.g. `%gpu use 0`"
        ) from None
    if count == 0:
        raise NeverMet("`%gpu use auto` found no GPU on this machine (NVML lists none)")
    allocation = session.machine.allocation()
    if allocation.restricted and allocation.gpus is None:
        raise NeverMet(
            f"the environment allocated {allocation.describe()} ({allocation.note}); "
            "`%gpu use auto` cannot rank them: use `%gpu use all`"
        )
    if allocation.mig:
        raise NeverMet(
            f"the environment allocated {allocation.describe()}: MIG instances are not ranked; "
            "`%gpu use all` keeps the allocation"
        )
    allowed = tuple(range(count)) if allocation.gpus is None else allocation.gpus
    where = (
        f"the environment allocated {allocation.describe()}"
        if allocation.restricted
        else f"this machine has {count}"
    )
    if auto.count > len(allowed):
        raise NeverMet(
            f"`%gpu use auto:{auto.count}` needs {auto.count} GPUs but {where}; "
            f"use `%gpu use auto:{len(allowed)}` or fewer"
            if allowed
            else f"`%gpu use auto` has no GPU to choose: {where}"
        )
    _check_capable(session.nvml, auto, allowed)
    return allowed


def _check_capable(nvml: Nvml, auto: grammar.Auto, allowed: tuple[int, ...]) -> None:
    """Refuse at once what no GPU here could ever give (more memory than it has, a newer architecture)."""
    gpus = [nvml.gpu(i) for i in allowed]
    if auto.min_free_bytes is not None:
        totals = [(g.memory.total_bytes, g.index) for g in gpus if g.memory is not None]
        able = [index for total, index in totals if total >= auto.min_free_bytes]
        if totals and len(able) < auto.count:
            largest, where = max(totals)
            raise NeverMet(
                f"no GPU here has {format_bytes(auto.min_free_bytes)} in all (the largest is GPU {where}, "
                f"{format_bytes(largest)}), so no wait would help; ask for less (`--min-free`, `%gpu limit`)"
            )
    if auto.min_capability is not None:
        capable = [
            g
            for g in gpus
            if g.compute_capability is not None and g.compute_capability >= auto.min_capability
        ]
        known = [g.compute_capability for g in gpus if g.compute_capability is not None]
        if known and len(capable) < auto.count:
            best = max(known)
            raise NeverMet(
                "{} GPU{} of compute capability {}.{} or above needed; the newest here is {}.{}".format(
                    auto.count, "s" if auto.count != 1 else "", *auto.min_capability, *best
                )
            )


def _started_with(session: Any, auto: grammar.Auto) -> tuple[tuple[int, ...], str] | None:
    """Once a framework has started with its GPUs they are fixed: keep (and claim) them if the count fits."""
    view = session.view()
    for framework in session.frameworks():
        visible = framework.started_gpus(view)
        if visible is not None:
            break
    else:
        return None
    if len(visible) != auto.count:
        shown = "GPU " + ",".join(map(str, visible)) if visible else "no GPU"
        raise ChoiceError(
            f"{framework.name} has already started with {shown} visible and cannot change it in a running "
            f"kernel; put `%gpu use auto{_count_text(auto)}` at the top of the notebook, before "
            f"`import {framework.module}`, and restart the kernel"
        )
    nvml: Nvml = session.nvml
    with claims.choosing():
        for index in visible:
            key = claim_key(nvml, index)
            if key is not None:
                claims.claim(key)
    return (
        visible,
        f"{framework.name} has already started with GPU {_indices(visible)}; keeping it (claimed for this kernel)",
    )


def _try_once(
    nvml: Nvml, auto: grammar.Auto, allowed: tuple[int, ...]
) -> tuple[tuple[tuple[int, ...], str] | None, _Look]:
    """Under the directory lock: look, and claim the best GPUs if enough qualify."""
    try:
        with claims.choosing():
            look = _look(nvml, auto, allowed)
            if len(look.ready) < auto.count:
                return None, look
            held_before = claims.held()
            taken: list[GpuInfo] = []
            for gpu in look.ready:
                if len(taken) >= auto.count:
                    break
                if gpu.index in look.ours:  # its starter's claim holds it for this kernel already
                    taken.append(gpu)
                # _why_not: a ready GPU's uuid is known
                elif gpu.uuid is not None and claims.claim(gpu.uuid):
                    taken.append(gpu)
            if len(taken) < auto.count:  # a process outside the protocol holds the lock file
                for gpu in taken:
                    if gpu.uuid is not None and gpu.uuid not in held_before:
                        claims.release(gpu.uuid)
                return None, look
            return (tuple(sorted(g.index for g in taken)), _reason(auto, taken, look)), look
    except claims.ClaimError as err:
        raise ChoiceError(str(err)) from None


def _look(nvml: Nvml, auto: grammar.Auto, allowed: tuple[int, ...]) -> _Look:
    gpus = [nvml.gpu(i) for i in allowed]
    holders = {g.index: claims.holder(g.uuid) for g in gpus if not g.lost and g.uuid}
    ours = frozenset(
        index
        for index, holder in holders.items()
        if holder is not None and _for_us(holder) and not holder.this_process
    )
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
    # GPUs claimed for this kernel come first: the run's GPU stays the run's.
    ranked = sorted(fits, key=lambda g: (g.index not in ours, _rank(g)))
    return _Look(ranked, skipped, max(usable, key=_free, default=None), ours)


def _for_us(holder: claims.Holder) -> bool:
    """A claim this kernel may use as its own: its own, or one its starter holds for it.

    ``tfgpu run`` and papermill's ``tfgpu`` engine choose and claim GPUs, then start the kernel as
    their child; the notebook's own ``%gpu use auto`` cell must find that claim usable, not another
    kernel's.  The claim's owner (the file's uid, which nobody can forge) must be this user, and its
    process this kernel's parent: a process that is neither cannot lend its claim."""
    if holder.this_process:
        return True
    return holder.uid == os.getuid() and holder.pid is not None and holder.pid == os.getppid()


def _why_not(gpu: GpuInfo, holder: claims.Holder | None, auto: grammar.Auto) -> str | None:
    if gpu.lost:
        return "lost"
    if gpu.memory is None:
        return "no memory reading"
    if gpu.mig_enabled:
        return "in MIG mode (name a MIG instance yourself)"
    if gpu.uuid is None:
        return "without a readable UUID (its claim would have no stable name)"
    if holder is not None and not _for_us(holder):
        return f"claimed by {holder.describe()}"
    if auto.min_capability is not None:
        capability = gpu.compute_capability
        if capability is None:
            return "without a readable compute capability"
        if capability < auto.min_capability:
            return f"of compute capability {capability[0]}.{capability[1]}"
    if auto.min_free_bytes is not None and gpu.memory.free_bytes < auto.min_free_bytes:
        return f"{format_bytes(gpu.memory.free_bytes)} free"
    return None


def who_holds(nvml: Nvml, indices: Any, most_users: int = 3) -> str:
    """Who holds each GPU, in one line: "GPU 0: alice 30 GiB (claimed by pid 41 (alice)); GPU 2: nobody".

    Memory per user from the driver's process list; other users' names as the process table
    gives them (made harmless for a terminal); a GPU that cannot be listed says so."""
    from ..gpus.owners import process_table_for
    from ..safe_text import safe

    table = process_table_for(nvml)
    parts = []
    for index in indices:
        try:
            listed = nvml.processes(index)
        except Exception:  # a lost GPU or a refused listing: said, never a made-up "nobody"
            parts.append(f"GPU {index}: not listed")
            continue
        by_user: dict[str, int] = {}
        for process in listed:
            details = table.lookup(process.pid)
            user = details.user if details.alive else None
            user = user or f"{'' if details.alive else 'exited '}pid {process.pid}"
            by_user[user] = by_user.get(user, 0) + (process.used_memory_bytes or 0)
        ranked = sorted(by_user.items(), key=lambda item: -item[1])
        held = ", ".join(f"{safe(user)} {format_bytes(size)}" for user, size in ranked[:most_users])
        if len(ranked) > most_users:
            held += f" and {len(ranked) - most_users} more"
        uuid = nvml.uuid(index)
        holder = claims.holder(uuid) if uuid else None
        claim = f" (claimed by {holder.describe()})" if holder is not None and not holder.this_process else ""
        parts.append(f"GPU {index}: {held or 'nobody'}{claim}")
    return "; ".join(parts)


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
    skipped = "; ".join(
        f"GPU {i} {why}" for i, why in sorted(look.skipped.items()) if why.startswith("claimed")
    )
    tail = f" (skipped: {skipped})" if skipped else ""
    lent = [g.index for g in taken if g.index in look.ours]
    held = (
        "claimed for this kernel's lifetime"
        if not lent
        else f"GPU {_indices(lent)} claimed for it by the process that started this kernel, "
        "for as long as that process runs"
    )
    return (
        f"Chose GPU {_indices(sorted(g.index for g in taken))}: {what} with the most free memory{floor} "
        f"not claimed by another kernel ({'; '.join(_describe(g) for g in taken)}){tail}; {held}"
    )


def _failure(
    auto: grammar.Auto, look: _Look, waited: bool, how_to_wait: str | None, how_to_wait_longer: str
) -> str:
    context = _context(look)
    if waited:
        return (
            f"{_shortfall(auto, look)} after waiting {_duration(auto.wait_seconds or 0)}{context}; "
            f"wait longer (e.g. {how_to_wait_longer}){' or ask for less free memory' if auto.min_free_bytes else ''}"
        )
    advice = how_to_wait or f"try `%gpu use auto{_count_text(auto)}{min_text(auto)} --wait 10m`"
    return f"{_shortfall(auto, look)} now{context}; {advice}"


def _shortfall(auto: grammar.Auto, look: _Look) -> str:
    capable = (
        " of compute capability {}.{} or above".format(*auto.min_capability) if auto.min_capability else ""
    )
    if auto.min_free_bytes is not None:
        floor = format_bytes(auto.min_free_bytes)
        if auto.count == 1:
            return f"no unclaimed GPU{capable} has {floor} free"
        return f"fewer than {auto.count} unclaimed GPUs{capable} have {floor} free"
    if capable:
        return f"fewer than {auto.count} unclaimed GPU{'s' if auto.count != 1 else ''}{capable}"
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


def _waiting(auto: grammar.Auto, look: _Look, left_s: float, how_to_stop: str) -> str:
    return f"Waiting: {_shortfall(auto, look)}{_context(look)}; {_duration(left_s)} left ({how_to_stop})"


def _count_text(auto: grammar.Auto) -> str:
    return f":{auto.count}" if auto.count != 1 else ""


def min_text(auto: grammar.Auto) -> str:
    text = ""
    if auto.min_free_bytes is not None:
        mib = auto.min_free_bytes // (1024 * 1024)
        text = f" --min-free {mib // 1024}G" if mib % 1024 == 0 else f" --min-free {mib}M"
    if auto.min_capability is not None:
        text += " --min-cc {}.{}".format(*auto.min_capability)
    return text


def _indices(indices: Any) -> str:
    return ",".join(map(str, indices))


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m" if not secs else f"{minutes}m{secs:02d}s"
