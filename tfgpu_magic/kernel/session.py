"""The kernel's GPU session: what was asked, resolved once, and handed to every framework.

A :class:`Session` holds the request (a :class:`~tfgpu_magic.command.plan.Plan`), its record
(the resolution accepted, and what each framework was given) and the
:class:`~tfgpu_magic.kernel.machine.Machine`.  Each command is resolved once against the machine
(:func:`~tfgpu_magic.command.plan.resolve`); then every framework's adapter says what it means for
its framework now (:meth:`~tfgpu_magic.frameworks.base.Framework.consider`), puts what it reads at
start-up in the environment, and is given what it can take now.  Settings a framework reads at
import wait in a post-import hook, so ``import`` and the first op may share a cell; what a started
framework can no longer change is refused with the exact remedy, by its adapter.

The session names no framework: it loops over the adapters.  Its lock guards the record only and
is never held while a framework is called: compute, call, then commit.  Works without IPython;
messages are plain strings.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

from ..command import commands
from ..command.plan import Plan, PlanError, Resolution, resolve
from ..command.units import format_bytes, format_change
from ..frameworks import adapters
from ..frameworks.base import Change, Framework, Refusal, ReportView, Stage
from ..frameworks.import_hooks import run_after_import
from ..gpus import numbering, platform
from ..gpus.nvml import Nvml
from ..records import Record
from . import allocator_figures, deferred, shares
from .machine import Machine

MIB = 1024**2

__all__ = ["Session", "SessionError", "get_session", "set_device_source"]


class SessionError(ValueError):
    """A command that cannot be carried out; the message (one line) says what to do."""


class DefaultsRecord(Record):
    """An administrator's defaults as this kernel met them, recorded when they were applied: every
    configured line, and each one that was not applied with why (read by ``%gpu``)."""

    configured: tuple[str, ...] = ()
    not_applied: tuple[tuple[str, str], ...] = ()  # (line, why)

    def as_json(self) -> dict[str, Any]:
        return {
            "configured": list(self.configured),
            "not_applied": [{"line": line, "reason": why} for line, why in self.not_applied],
        }


class Session:
    def __init__(
        self,
        nvml: Nvml | None = None,
        env: MutableMapping[str, str] | None = None,
        machine: Machine | None = None,
        frameworks: Sequence[Framework] | None = None,
    ) -> None:
        self.machine = machine if machine is not None else Machine(nvml, env)
        self._frameworks = tuple(frameworks) if frameworks is not None else adapters()
        self.machine.attach(self._frameworks)  # one environment, one record of CUDA's start
        for framework in self._frameworks:
            if hasattr(framework, "warn"):
                framework.warn = self._hook_failed  # said at a moment of its own (JAX's start)
            if hasattr(framework, "starting"):  # a framework that reads its settings as it starts (JAX)
                framework.starting = functools.partial(self._starting, framework)
        self.defaults = Plan()  # an administrator's defaults (traitlets); `reset` returns here
        self.defaults_record = DefaultsRecord()  # which of them were applied, and why not the others
        self._requested = Plan()
        # The request as resolved when it was accepted (sizes in MiB per GPU): made once, read
        # by every report afterwards, so a driver that stops answering later changes nothing.
        self._accepted: Resolution | None = None
        # True while that resolution predates CUDA's listing of the GPUs: it is met with what CUDA
        # found once it has listed them (see _meet_enumeration).
        self._accepted_blind = False
        # Each framework's resolution (by its key), recorded the moment it was given to it: the
        # limits the panel draws and the out-of-memory text quotes are the ones it received.
        self.applied: dict[str, Resolution] = {}
        self._parts: set[str] = set()  # the keys of ``applied`` that are parts of the kernel's limit
        # What makes the accepted limit hard ("MPS", "MIG"), recorded when `limit ... --hard` was
        # accepted; None: the limit (if any) is soft, held by the frameworks' allocators only.
        self.hard_by: str | None = None
        # The per-GPU limit (nvidia-smi index -> MiB) put in MPS's variable for CUDA to read at its
        # start: once CUDA started, the MPS server holds the process to it, whatever is asked since.
        self._mps_caps: dict[int, int] = {}
        self.claimed: tuple[int, ...] = ()  # GPUs this kernel claimed through `%gpu use auto`
        # The accepted `use auto` (its --min-free and --min-cc are what `%gpu save` keeps); None
        # when the GPUs in force were named, or none was asked.
        self.auto_request: commands.Auto | None = None
        # The notebook's saved settings as they were met at the kernel's start (notebook_settings.py).
        self.notebook_record: Any = None
        self.loaded_into: Any = None  # the IPython shell the extension was loaded into (magics.load)
        self.hook_errors: list[str] = []
        self.notes: list[str] = []  # said once, shown by `%gpu` afterwards
        # The frameworks' allocator figures, read on the user's thread and published for the panel.
        self.figures = allocator_figures.Board()
        # Guards the record above; never held while a framework is called (see the module's doc).
        self._lock = threading.RLock()

    # The machine's parts, by their old names (scripts and tests use them).
    @property
    def nvml(self) -> Nvml:
        return self.machine.nvml

    @nvml.setter
    def nvml(self, nvml: Nvml) -> None:
        self.machine.nvml = nvml

    @property
    def env(self) -> MutableMapping[str, str]:
        return self.machine.env

    def frameworks(self) -> tuple[Framework, ...]:
        """Every framework's adapter, in the order of every report."""
        return self._frameworks

    def adapter(self, key: str) -> Framework:
        """The adapter whose key is ``key`` ("tensorflow", "pytorch", "jax"); KeyError otherwise."""
        for framework in self._frameworks:
            if framework.key == key:
                return framework
        raise KeyError(key)

    def imported_frameworks(self) -> tuple[Framework, ...]:
        return tuple(f for f in self._frameworks if f.stage() is not Stage.NOT_IMPORTED)

    def prepare(self, say: Callable[[str], None] = print) -> None:
        """At extension load: watch for each framework's import, and number CUDA's GPUs as nvidia-smi does."""
        self.install_import_hooks()
        if self.machine.inherited["CUDA_VISIBLE_DEVICES"] is not None:
            odd = self.machine.allocation().note  # an invalid entry: which, and what CUDA does with it
            if odd:
                say(f"tfgpu_magic: {odd}")
        if self.machine.cuda_record.capture is not None:
            return  # CUDA has numbered its GPUs already
        inherited = self.machine.inherited["CUDA_DEVICE_ORDER"]
        self.machine.set_env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if inherited is not None and not numbering.order_is_nvml({"CUDA_DEVICE_ORDER": inherited}):
            note = (
                f"CUDA_DEVICE_ORDER was {inherited!r}; tfgpu_magic set it to PCI_BUS_ID so that CUDA "
                "numbers the GPUs as nvidia-smi does (before CUDA started, so nothing else changes)"
            )
            self.notes.append(note)
            say(f"tfgpu_magic: {note}")

    # -- the request and its record ------------------------------------------------------------
    @property
    def requested(self) -> Plan:
        return self._requested

    @requested.setter
    def requested(self, plan: Plan) -> None:
        """A request set directly (a script, a test) is resolved when first read (see resolved)."""
        with self._lock:
            self._requested = plan
            self._accepted = None

    def resolved(self) -> Resolution:
        """The request as resolved when it was accepted; raises SessionError if it cannot hold.

        A request never resolved (the empty one a kernel starts with) is resolved on first
        read, once the machine can answer, and kept.  Safe on any thread: it reads the record
        and, the first time, the driver; it never calls a framework.
        """
        accepted, plan = self._accepted, self._requested  # read without waiting: a command may hold the lock
        if accepted is not None:
            return accepted
        blind = not self.machine.listed()
        resolution = self.resolution(plan)
        # Kept only if the request is still the one resolved, and only if no command holds the
        # record now (the sampler thread may get here while one accepts a request: never wait).
        if self._lock.acquire(blocking=False):
            try:
                if self._accepted is None and self._requested is plan:
                    self._accepted, self._accepted_blind = resolution, blind
            finally:
                self._lock.release()
        return resolution

    def meet_enumeration(self) -> None:
        """Before a report, on the user's thread: the request meets the GPUs CUDA listed since it
        was accepted (its notes then belong in this report)."""
        if self._accepted_blind and self.machine.listed():
            self._meet_enumeration()

    def _meet_enumeration(self, lister: Framework | None = None) -> None:
        """CUDA has listed a framework's GPUs since the request was accepted: a request that names
        no GPU (`use all`, `use none`, or no `use`) meets what CUDA found then.

        CUDA read ``CUDA_VISIBLE_DEVICES`` as it stood at that moment, so a value set by hand after
        the command is what the framework has.  The hand-made value is kept, as everywhere (see
        ``Machine.unmanaged_value``): the record follows what CUDA found, and a request it
        overrode is said.  ``lister``: the framework that has just listed them, from its import
        hook, which may still narrow what it shows (before its start).  Named GPUs need nothing
        here: the framework shows exactly them, or its hook says it could not.
        """
        with self._lock:
            accepted = self._accepted
            if accepted is None or not self._accepted_blind:
                return
            self._accepted_blind = False
        plan = accepted.plan
        if isinstance(plan.visible, tuple):
            return
        found = self.machine.cuda_found()
        if not found:
            return  # no GPU found: the framework's hook and status say so
        record = self.machine.cuda_record
        what = "; ".join(plan.describe())
        value = self.machine.cuda_env().get("CUDA_VISIBLE_DEVICES")
        by_hand = (
            f"CUDA_VISIBLE_DEVICES={value} was set by hand after `%gpu use {plan.visible}`, and CUDA "
            f"read it {record.when or 'when it started'}"
        )
        shown = "GPU " + ", ".join(map(str, found))
        can_apply = lister is not None and lister.stage() is not Stage.STARTED
        # Said at once from the import hook; found later (by `%gpu`), recorded for its report.
        failed = self._hook_failed if lister is not None else self.hook_errors.append
        if plan.visible == "none":
            if lister is not None and can_apply:
                self._give(lister, accepted)  # it hides what CUDA showed: the request holds
                return
            failed(
                f"could not apply {what}: {by_hand}, so {record.by or 'the framework'} has {shown}; restart the "
                "kernel and leave CUDA_VISIBLE_DEVICES to `%gpu use`"
            )
            return
        try:
            now = self._narrowed(accepted, found)
        except SessionError as err:
            failed(f"could not apply {what}: {err}")
            return
        if lister is not None and can_apply and now.visible is not None and now.visible != found:
            self._give(lister, now)  # CUDA showed GPUs outside the allocation: the framework hides them
        if now == accepted:
            return
        with self._lock:
            if self._accepted is not accepted:
                return  # a command accepted a request of its own meanwhile
            self._accepted = now
            for key, given in list(self.applied.items()):
                if given is accepted:
                    self.applied[key] = now
        hidden = [g.index for g in accepted.gpus if now.gpu(g.index) is None]
        if plan.visible == "all" and hidden and now.visible is not None:
            kept = "GPU " + ", ".join(map(str, now.visible)) if now.visible else "no GPU"
            self.notes.append(
                f"{by_hand}: `use all` is {kept}, the GPUs CUDA showed; GPU {', '.join(map(str, hidden))} "
                "stay hidden until the kernel restarts (to use them, restart and leave CUDA_VISIBLE_DEVICES "
                "to `%gpu use`)"
            )

    def _narrowed(self, accepted: Resolution, found: tuple[int, ...]) -> Resolution:
        """``accepted`` (`use all` or no `use`) with the GPUs CUDA found: each kept GPU keeps the
        sizes resolved when the request was accepted (no new driver reading); resolved again only
        where that cannot be (a GPU it did not resolve, or one size per GPU by position)."""
        plan = accepted.plan
        if plan.visible is None or accepted.visible is None:
            visible = found
        else:
            visible = tuple(i for i in accepted.visible if i in found)
        kept = tuple(g for g in accepted.gpus if g.index in visible)
        by_position = plan.limits is not None and len(plan.limits) > 1
        if len(kept) != len(visible) or (by_position and visible != accepted.visible):
            return self.resolution(plan)
        return Resolution(plan, visible, kept)

    def _give(self, framework: Framework, resolution: Resolution) -> None:
        """Hand ``resolution`` to one framework (no lock held), and record it if it took it, with
        whether it is a part of the kernel's limit (read by the sampler thread, which never asks)."""
        if framework.give(resolution, self.machine):
            part = framework.takes_share()
            with self._lock:
                self.applied[framework.key] = resolution
                if part:
                    self._parts.add(framework.key)
                else:
                    self._parts.discard(framework.key)

    # -- the resolution -------------------------------------------------------------------------
    def resolution(self, plan: Plan | None = None, *, started: bool = False) -> Resolution:
        """The request (or ``plan``) on this machine; raises SessionError if it cannot hold.

        ``started``: the GPUs a framework listed are fixed (it has started), so the question is
        only whether the plan equals them (a GPU CUDA never listed is then "different", with the
        restart remedy from that framework).
        """
        facts = self.machine.facts()
        if started:
            facts = replace(facts, cuda_found=None)
        try:
            return resolve(self.requested if plan is None else plan, facts)
        except PlanError as err:
            raise SessionError(str(err)) from None

    def visible_gpus(self) -> list[int] | None:
        """nvidia-smi indices this kernel sees (what the listing framework shows once CUDA listed
        them); None: unknown."""
        if self.machine.listed():
            cuda_map = self.machine.cuda_map()
            for framework in self._frameworks:
                if framework.enumerated():
                    return sorted(set(framework.device_gpus(cuda_map).values()))
        try:
            visible = self.resolved().visible
        except SessionError:
            return None
        return None if visible is None else list(visible)

    def exposed_gpus(self) -> list[int] | None:
        """nvidia-smi indices CUDA shows (or will show) this kernel: what ``%gpu use`` or
        ``CUDA_VISIBLE_DEVICES`` hid is left out, as CUDA read them.  Unlike :meth:`visible_gpus`,
        a framework that then found no GPU (a CPU-only build, missing CUDA libraries) hides
        nothing: the driver's readings of these GPUs stay worth showing."""
        if self.machine.listed() and self.nvml.available():
            return sorted(set(self.machine.cuda_map()))
        return self.visible_gpus()

    def limit_bytes_by_gpu(self) -> dict[int, int]:
        """The cap of each visible GPU, in bytes (the panel's limit line, the out-of-memory text).

        Once a framework is imported, the caps it was given (none if it was given nothing: a
        framework that found no GPU has no cap); before, the accepted request's, which it will
        be given.  Read from the record only: safe on the sampler thread, and never re-derived
        from the driver.
        """
        imported = [f.key for f in self._frameworks if f.stage() is not Stage.NOT_IMPORTED]
        with self._lock:
            if imported:  # the kernel's limit: the parts its frameworks were given, added up
                sharing = [key for key in imported if key in self._parts] or imported
                total: dict[int, int] = {}
                for key in sharing:
                    for index, cap in (self.applied[key].caps_bytes() if key in self.applied else {}).items():
                        total[index] = total.get(index, 0) + cap
                return total
            accepted = self._accepted
        return accepted.caps_bytes() if accepted is not None else {}

    # -- configuration ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """A command that raises, at any step, leaves the request, its record and the environment as
        they were (claims released on the way stay released: that happened, and the record says so)."""
        with self._lock:
            saved = (
                self._requested,
                self._accepted,
                self._accepted_blind,
                dict(self.applied),
                set(self._parts),
                self.hard_by,
            )
        environment = self.machine.save_env()
        try:
            yield
        except BaseException:
            with self._lock:
                (
                    self._requested,
                    self._accepted,
                    self._accepted_blind,
                    self.applied,
                    self._parts,
                    self.hard_by,
                ) = saved
            self.machine.restore_env(environment)
            raise

    def configure(self, command: Any, chosen_by_auto: bool = False) -> str:
        """Carry out a configuration command; returns what happened, raises SessionError.

        Each framework says what the command means for it before anything changes (a refusal
        changes nothing); then the environment, then what each can take now, then the record."""
        with self._all_or_nothing():
            before = self.requested
            try:
                plan = before.with_command(command)
            except PlanError as err:
                raise SessionError(str(err)) from None
            what = _describe_command(command)
            if isinstance(command, commands.Precision):  # the dtype policy is never frozen
                return f"{what}: {self._set_precision(plan)}"
            started = any(f.enumerated() and f.stage() is Stage.STARTED for f in self._frameworks)
            resolution = self.resolution(plan, started=started)
            changes = self._changes(Change(command, what, plan, before, resolution, self.machine))
            clauses = self._consider(changes)
            self._hand_over(resolution, changes)
            self._settle(resolution, chosen_by_auto, before)
            note = self._sharing_note(resolution)
            if note is not None and isinstance(command, commands.Limit):
                clauses.append(note)
            return f"{what}{_resolved_suffix(command, resolution)}: {'; '.join(clauses)}"

    def _changes(self, change: Change) -> dict[str, Change]:
        """The change as each framework is handed it: its part of the kernel's limit, the others named."""
        return {
            f.key: replace(
                change,
                resolution=self._share_of(f, change.resolution),
                others=tuple(o for o in self._frameworks if o is not f),
            )
            for f in self._frameworks
        }

    def _hand_over(self, resolution: Resolution, changes: dict[str, Change]) -> None:
        """The environment CUDA and every framework read at their start, then what each can take now."""
        self._set_cuda_environment(resolution)
        self._set_hard_limit(resolution)
        for framework in self._frameworks:
            framework.prepare(changes[framework.key])
        for framework in self._frameworks:
            try:
                self._give(framework, changes[framework.key].resolution)
            except Refusal as err:
                raise SessionError(str(err)) from None

    # -- one kernel, one limit -----------------------------------------------------------------------
    def _sharers(
        self, framework: Framework | None = None, named: tuple[str, ...] = ()
    ) -> list[shares.Sharer]:
        """The frameworks taking a part of the kernel's limit (``framework`` and those ``named`` among them)."""
        found = []
        for f in self._frameworks:
            if f is not framework and f.key not in named and not f.takes_share():
                continue
            given = self.applied.get(f.key)
            fixed = None
            if f.share_fixed() and given is not None:
                fixed = {g.index: g.cap_mib for g in given.gpus if g.cap_mib is not None}
            found.append(shares.Sharer(f.key, f.name, fixed))
        return found

    def _share_of(self, framework: Framework, resolution: Resolution) -> Resolution:
        """``resolution`` with ``framework``'s part of each GPU's cap (the whole when it is alone)."""
        capped = [g for g in resolution.gpus if g.cap_mib is not None]
        if not capped or not (framework.takes_share() or resolution.plan.shares):
            return resolution
        sharers = self._sharers(framework)
        if len(sharers) < 2 and not resolution.plan.shares:
            return resolution
        return resolution.with_caps({g.index: shares.part_mib(framework.key, g, sharers) for g in capped})

    def limit_division(self) -> str | None:
        """How the accepted request's limit is divided between the kernel's frameworks (for `%gpu`),
        or None where one framework (or none) holds it."""
        accepted = self._accepted
        return None if accepted is None else self._sharing_note(accepted)

    def _sharing_note(self, resolution: Resolution) -> str | None:
        named = tuple(key for key, _ in resolution.plan.shares or ())
        return shares.sharing_note(list(resolution.gpus), self._sharers(named=named))

    def _starting(self, framework: Framework) -> None:
        """Just before ``framework`` reads its settings, on the starting thread: its part of the
        kernel's limit now that it is known to be used (JAX imported by TensorFlow was not counted),
        and the others' parts again where they can still change."""
        accepted = self._accepted
        if accepted is None or not any(g.cap_mib is not None for g in accepted.gpus):
            return
        part = self._share_of(framework, accepted)
        framework.prepare(Change(None, "", accepted.plan, accepted.plan, part, self.machine))
        self._give(framework, part)
        self._reshare(framework, accepted)

    def _reshare(self, newcomer: Framework, resolution: Resolution) -> None:
        """A framework took a part of the limit: the others whose part can still change get theirs
        again (their environment before their start, their caps), and the division is said."""
        sharers = self._sharers()
        if len(sharers) < 2 or not any(g.cap_mib is not None for g in resolution.gpus):
            return
        plan = resolution.plan
        for framework in self._frameworks:
            if framework is newcomer or not framework.takes_share() or framework.share_fixed():
                continue
            part = self._share_of(framework, resolution)
            framework.prepare(Change(None, "", plan, plan, part, self.machine))
            self._give(framework, part)
        note = self._sharing_note(resolution)
        if note is not None and note not in self.notes:
            self.notes.append(note)
            print(f"tfgpu_magic: {note}", file=sys.stderr)

    def _consider(self, changes: dict[str, Change]) -> list[str]:
        """Each framework's clause, those whose setting it is first; when nothing is imported yet,
        when it takes effect (unless one framework alone takes it, and says so itself)."""
        frameworks = self._frameworks
        command = next(iter(changes.values())).command
        takers = [f for f in frameworks if f.takes(command)]
        clauses = []
        for framework in sorted(frameworks, key=lambda f: f not in takers):
            try:
                clause = framework.consider(changes[framework.key])
            except Refusal as err:
                raise SessionError(str(err)) from None
            if clause:
                clauses.append(clause)
        imported = self.imported_frameworks()
        if not imported and not (len(takers) == 1 and clauses):  # one framework's own word says when itself
            installed = [f.name for f in takers if f.installed()] or [f.name for f in takers or frameworks]
            clauses.insert(0, f"takes effect when {_either(installed)} starts in this kernel")
        elif not clauses:  # a setting that undoes one (`use all`, `limit off`): when they read it
            clauses = [f"{f.name}: takes effect {f.takes_effect}" for f in imported]
        return clauses

    def _set_cuda_environment(self, resolution: Resolution) -> None:
        """The variables CUDA reads as it starts: only until a framework started it."""
        machine = self.machine
        if machine.cuda_record.capture is None and not machine.listed():
            machine.set_env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi does
            machine.set_env("CUDA_VISIBLE_DEVICES", machine.visible_value(resolution))
        elif (
            resolution.plan.visible is None
        ):  # CUDA has read it; the variable should not claim a request that is gone
            machine.set_env("CUDA_VISIBLE_DEVICES", machine.unmanaged_value("CUDA_VISIBLE_DEVICES"))

    # -- hard or soft --------------------------------------------------------------------------------
    def _set_hard_limit(self, resolution: Resolution) -> None:
        """`limit ... --hard`: MPS's per-process limit in the environment before CUDA starts (the
        MPS server reads it at the CUDA context's creation), or the MIG instance; refused in one line
        where neither can hold it.  Otherwise MPS's variable is what the kernel inherited."""
        machine, started = self.machine, self._cuda_started()
        if started and self.hard_by == "MPS":
            self._within_mps_caps(resolution)
            return  # CUDA read MPS's limit as it started: it holds, whatever is asked since
        self.hard_by = self._hard_enforcer(resolution, started)
        if started:
            return  # CUDA read the variable already: changing it now would claim what is not in force
        if self.hard_by == "MPS":
            value = ",".join(
                f"{k}={g.cap_mib}M" for k, g in enumerate(resolution.gpus) if g.cap_mib is not None
            )
            machine.set_env(platform.MPS_LIMIT_ENV, value)
            self._mps_caps = {g.index: g.cap_mib for g in resolution.gpus if g.cap_mib is not None}
        else:
            self._mps_caps = {}
            machine.set_env(platform.MPS_LIMIT_ENV, machine.unmanaged_value(platform.MPS_LIMIT_ENV))

    def _within_mps_caps(self, resolution: Resolution) -> None:
        """After CUDA started under a `--hard` MPS limit the MPS server holds each GPU to what CUDA
        read then: a larger limit, or none, could not be in force, so it is refused in one line."""
        for gpu in resolution.gpus:
            held = self._mps_caps.get(gpu.index)
            if held is None or (gpu.cap_mib is not None and gpu.cap_mib <= held):
                continue
            refused = (
                "the limit cannot be lifted" if gpu.cap_mib is None else f"{gpu.cap_mib} MiB cannot hold"
            )
            raise SessionError(
                f"MPS holds this kernel to {held} MiB on GPU {gpu.index} since CUDA started "
                f"({platform.MPS_LIMIT_ENV} is read only then), so {refused}: "
                f"ask for at most `%gpu limit {held}M`, or restart the kernel to lift it"
            )

    def _cuda_started(self) -> bool:
        return self.machine.cuda_record.capture is not None or self.machine.listed()

    def _hard_enforcer(self, resolution: Resolution, started: bool) -> str | None:
        """What holds a `--hard` limit for the whole process: "MIG" when every visible GPU is a MIG
        instance, "MPS" when an MPS control daemon runs and CUDA has not started; None for a soft limit."""
        if not resolution.plan.hard:
            return None
        shares = self.machine.platform_shares()
        indices = [g.index for g in resolution.gpus]
        pipe = platform.mps_pipe_directory(self.machine.inherited_platform)
        if indices and all(i in shares and shares[i].source == "MIG" for i in indices):
            below = [g for g in resolution.gpus if (g.cap_mib or 0) < shares[g.index].bytes // MIB]
            if not below:
                return "MIG"  # the limit is the instance's whole memory: the GPU holds exactly that
            if pipe is None:  # (MPS runs on a MIG instance too: it can hold less than the instance)
                size = shares[below[0].index].bytes // MIB
                raise SessionError(
                    f"`--hard` cannot hold {below[0].cap_mib} MiB here: the MIG instance on GPU "
                    f"{below[0].index} holds this kernel to its {size} MiB, not less, and no MPS control "
                    f"daemon runs; ask `%gpu limit {size}M --hard` for the whole instance, or drop --hard "
                    "for a soft limit"
                )
        if pipe is not None and not started:
            return "MPS"
        if pipe is not None:
            raise SessionError(
                f"too late for `--hard`: CUDA has started in this kernel, and MPS reads "
                f"{platform.MPS_LIMIT_ENV} only when CUDA starts; restart the kernel and run "
                "`%gpu limit ... --hard` before the first framework import (or drop --hard for a soft limit)"
            )
        raise SessionError(
            "`--hard` cannot hold here: no MPS control daemon (no control pipe in "
            f"{self.machine.inherited_platform.get('CUDA_MPS_PIPE_DIRECTORY') or platform.MPS_DEFAULT_PIPE_DIRECTORY}) "
            "and this kernel is not on a MIG instance, so a limit holds only in the frameworks' allocators; "
            "an administrator can start MPS (`nvidia-cuda-mps-control -d`) or create MIG instances "
            "(`sudo nvidia-smi mig -cgi <profile> -C`), or drop --hard for a soft limit"
        )

    def limit_label(self) -> str | None:
        """``hard (MPS)``, ``hard (MIG)`` or ``soft (TensorFlow's allocator)``: who holds the accepted
        limit (None without one).  Soft names the allocators of the frameworks that take it (the
        imported ones, else the installed ones): the CUDA context and libraries that call CUDA
        directly are outside them."""
        try:
            capped = any(g.cap_mib is not None for g in self.resolved().gpus)
        except SessionError:
            return None
        if not capped:
            return None
        if self.hard_by is not None:
            return f"hard ({self.hard_by})"
        takers = self.imported_frameworks() or tuple(f for f in self._frameworks if f.installed())
        holders = ", ".join(f.limit_holder() for f in takers) or "the frameworks' allocators"
        return f"soft ({holders})"

    def _settle(self, resolution: Resolution, chosen_by_auto: bool, before: Plan) -> None:
        """The request is accepted (if no other command changed it meanwhile): claims follow it
        (what is claimed is what is requested)."""
        with self._lock:
            if self._requested is not before:
                raise SessionError("another `%gpu` command changed the request meanwhile: run this one again")
            self._requested, self._accepted = resolution.plan, resolution
            self._accepted_blind = not self.machine.listed()
            claimed = self.claimed
        plan = resolution.plan
        visible = plan.visible if isinstance(plan.visible, tuple) else ()
        keep = visible if chosen_by_auto else tuple(i for i in claimed if i in visible)
        for index in claimed:
            if index not in keep:
                from . import choosing  # claims: only when some were made

                choosing.release(self, index)
        self.claimed = keep

    def _set_precision(self, plan: Plan) -> str:
        """The dtype policy: recorded with the accepted request (its GPU part unchanged), then each
        framework's clause."""
        with self._lock:
            accepted = self._accepted
            self._requested = plan
            self._accepted = None if accepted is None else replace(accepted, plan=plan)
        clauses = [c for f in self._frameworks if (c := f.set_precision(plan.precision))]
        return "; ".join(clauses) or "recorded; no framework here takes a dtype policy"

    # -- reset, free ------------------------------------------------------------------------------
    def reset(self) -> str:
        """Back to the configured defaults; says what is requested now and what cannot be undone."""
        with self._all_or_nothing():
            before = self.requested
            target = self.defaults
            frozen = [f for f in self._frameworks if f.enumerated() and f.stage() is Stage.STARTED]
            kept = _gpu_part(before) if frozen else Plan()
            if frozen:  # a started framework's GPU settings are fixed: only the precision can go back
                target = Plan(**{**_fields(kept), "precision": self.defaults.precision})
                resolution = self._frozen_resolution(target)
                held_by_mps = False
            else:
                target, held_by_mps = self._kept_under_mps(target, before)
                resolution = self.resolution(target)
                self._hand_over(
                    resolution, self._changes(Change(None, "reset", target, before, resolution, self.machine))
                )
            if before.precision != target.precision:
                for framework in self._frameworks:
                    framework.set_precision(target.precision)
            self._settle(resolution, False, before)
            forgot = [line for line in before.describe() if line not in target.describe()]
            lines = ["forgot: " + "; ".join(forgot) if forgot else "nothing to forget"]
            now = target.describe()
            lines.append(
                "requested now: " + ("; ".join(now) if now else "nothing (each framework's defaults)")
            )
            for framework in self._frameworks:
                lines.extend(f"cannot undo: {why}" for why in framework.frozen(kept, self.machine))
            if not frozen and held_by_mps:
                lines.append(
                    f"cannot undo: the hard limit ({platform.MPS_LIMIT_ENV}, read by CUDA as it started): "
                    "the MPS server holds it until the kernel restarts"
                )
            return "\n".join(lines)

    def _kept_under_mps(self, target: Plan, before: Plan) -> tuple[Plan, bool]:
        """``target``, or, where the MPS server holds a hard limit CUDA read at its start and
        ``target`` asks for more (or none), ``target`` with the limit of ``before`` kept (True)."""
        if self.hard_by != "MPS" or not self._cuda_started():
            return target, False
        try:
            self._within_mps_caps(self.resolution(target))
        except SessionError:
            return replace(target, limits=before.limits, shares=before.shares, hard=before.hard), True
        return target, False

    def _frozen_resolution(self, target: Plan) -> Resolution:
        """``target`` keeps the started framework's GPU settings: so does its resolution."""
        accepted = self._accepted
        if accepted is not None:
            return replace(accepted, plan=target)
        try:
            return self.resolution(target, started=True)
        except SessionError:
            return Resolution(target, None, ())

    def free(self) -> str:
        """Garbage collection, then each framework lets go of what it can, with before/after
        readings (its allocator's, and the driver's for this process)."""
        imported = self.imported_frameworks()
        before = {f.key: f.free_reading() for f in imported}  # all read before anything is freed
        before_driver = self._my_device_memory()
        gc.collect()
        plan = self.requested
        reports = [f.free(plan, before[f.key]) for f in imported]
        after_driver = self._my_device_memory()
        openers = [r.opener for r in reports if r.opener]
        lines = [openers[0] if openers else "Ran garbage collection."]
        for report in reports:
            lines += report.lines
        if not imported:
            lines.append("No framework is imported in this kernel, so none holds GPU memory to free.")
        returned = 0
        for index in sorted(set(before_driver.by_gpu) | set(after_driver.by_gpu)):
            b_n, a_n = before_driver.by_gpu.get(index), after_driver.by_gpu.get(index)
            lines.append(
                f"GPU {index}  this process per the driver (NVML): {format_bytes(b_n)} -> "
                f"{format_bytes(a_n)} ({format_change(b_n, a_n)})"
            )
            if b_n is not None and a_n is not None and a_n < b_n:
                returned += b_n - a_n
        if returned:
            lines.append(f"{format_bytes(returned)} went back to the driver (NVML reading).")
        else:
            missing = before_driver.missing
            reading = (
                "The driver's reading shows nothing returned"
                if missing is None
                else missing[0].upper() + missing[1:]
            )
            lines += [reading + report.kept for report in reports if report.kept]
        return "\n".join(lines)

    def _accepted_visible(self) -> tuple[int, ...] | None:
        accepted = self._accepted
        return None if accepted is None else accepted.visible

    def _my_device_memory(self) -> DriverReading:
        """Bytes this process holds on each GPU according to the driver (NVML), and why not."""
        if not self.nvml.available():
            return DriverReading({}, "no driver reading (NVML unavailable)")
        mine: dict[int, int | None] = {}
        pid = os.getpid()
        for index in range(self.nvml.device_count()):
            try:
                for proc in self.nvml.processes(index):
                    if proc.pid == pid:
                        mine[index] = proc.used_memory_bytes
            except Exception:  # a lost GPU or a refused listing: no reading, not zero
                continue
        if mine:
            return DriverReading(mine, None)
        if self.machine.cuda_found() == () or self._accepted_visible() == ():
            return DriverReading({}, "the driver lists no GPU memory for this kernel, which uses no GPU")
        return DriverReading(
            {},
            f"the driver (NVML) lists no GPU memory for this kernel's pid {pid}: it holds none yet, or "
            "it runs in a container with its own pid namespace, where NVML shows host pids",
        )

    # -- what the adapters' reports read of the kernel ---------------------------------------------
    def view(self, framework: Framework | None = None, notes: list[str] | None = None) -> ReportView:
        """The kernel's facts for an adapter's report (status, the out-of-memory text, `%%gpu on`,
        the trace): one place that gathers them, so every report reads the same.  ``framework``:
        whose applied record it carries; ``notes``: where a reading that failed is said."""
        machine = self.machine
        try:
            accepted: Resolution | None = self.resolved()
        except SessionError:
            accepted = None  # the request cannot hold: status says so
        exposed = self.exposed_gpus()
        try:
            visible = self.visible_gpus()
        except Exception:  # no reading: None is "unknown" to every adapter
            visible = None
        return ReportView(
            cuda_map=tuple(machine.cuda_map()),
            env=machine.env,
            cuda_env=machine.cuda_env(),
            applied=None if framework is None else self.applied.get(framework.key),
            accepted=accepted,
            exposed_gpus=None if exposed is None else tuple(exposed),
            visible_gpus=None if visible is None else tuple(visible),
            cuda_found=machine.cuda_found(),
            nvml=machine.nvml,
            precision=self.requested.precision,
            notes=[] if notes is None else notes,
        )

    def found_no_gpu(self) -> str | None:
        """The name of the framework CUDA listed the GPUs for, when it found none although CUDA was
        shown some (a CPU-only build, missing CUDA libraries); None otherwise."""
        if self.machine.cuda_found() != () or not self.exposed_gpus():
            return None
        return next((f.name for f in self._frameworks if f.enumerated()), None)

    # -- import hooks ---------------------------------------------------------------------------------
    def install_import_hooks(self) -> None:
        """Hand the request to each framework the moment its import finishes (and to the modules
        it must hear of besides: Keras, for TensorFlow's precision)."""
        for framework in self._frameworks:
            run_after_import(framework.module, functools.partial(self._on_import, framework))
            for module, hook in framework.side_imports().items():
                run_after_import(module, functools.partial(self._on_side_import, hook))

    def _impostor(self, framework: Framework) -> bool:
        """Whether what the import gave is not ``framework`` (a planted module): said once, in one note."""
        refused = getattr(framework, "refused", None)
        if refused is None:
            return False
        if refused not in self.notes:
            self.notes.append(refused)
            print(f"tfgpu_magic: {refused}", file=sys.stderr)
        return True

    def _on_import(self, framework: Framework, module: Any) -> None:
        """On the importing thread, once ``import <framework>`` has finished: give it the request.
        Never raises into the user's import."""
        framework.on_import(module)
        if self._impostor(framework):
            return
        plan = self.requested
        try:
            if not (plan.gpu_settings or self._within_share()) or framework.stage() is Stage.STARTED:
                if framework.enumerated():  # listed already (before tfgpu_magic loaded, or by a hook)
                    self._meet_enumeration(framework)
                return
            problem = framework.arrived(plan)  # TensorFlow lists its GPUs here: CUDA reads its variables
            if problem is not None:
                self._hook_failed(problem)
                return
            if framework.enumerated():
                self._meet_enumeration(framework)
            resolution = self.resolved()  # what was promised when the request was accepted
            part = self._share_of(framework, resolution)
            framework.prepare(Change(None, "", plan, plan, part, self.machine))  # read at its start
            self._give(framework, part)
            if framework.takes_share():
                self._reshare(framework, resolution)
        except Exception as err:
            self._hook_failed(f"could not apply {'; '.join(plan.describe())} to {framework.name}: {err}")

    def _within_share(self) -> bool:
        """Whether the accepted request caps a GPU at the platform's share (no limit asked under one)."""
        if not self.machine.platform_shares():
            return False
        try:
            return any(g.within_share for g in self.resolved().gpus)
        except SessionError:
            return False

    def _on_side_import(self, hook: Callable[[Any, Plan], None], module: Any) -> None:
        plan = self.requested
        try:
            hook(module, plan)
        except Exception as err:  # never break the user's import
            self._hook_failed(
                f"could not apply {'; '.join(plan.describe())} at `import {module.__name__}`: {err}"
            )

    def _hook_failed(self, message: str) -> None:
        self.hook_errors.append(message)
        print(f"tfgpu_magic: {message}. Run `%gpu` for details.", file=sys.stderr)


class DriverReading:
    """This process's memory per GPU from NVML, or why there is none."""

    def __init__(self, by_gpu: dict[int, int | None], missing: str | None) -> None:
        self.by_gpu = by_gpu
        self.missing = missing


# -- helpers ----------------------------------------------------------------------------------------
def _either(names: list[str], last: str = "or") -> str:
    """``A``, ``A or B``, ``A, B or C``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _describe_command(command: Any) -> str:
    if isinstance(command, commands.Use) and not isinstance(command.gpus, commands.Auto):
        plan = Plan(visible=command.gpus)
    else:  # (`use auto` is described once it chose GPU numbers)
        plan = Plan().with_command(command)
    described = plan.describe()
    if described:
        return described[0]
    if isinstance(command, commands.Limit):
        return "limit off"
    if isinstance(command, commands.Split):
        return "split off"
    return str(command)


def _resolved_suffix(command: Any, resolution: Resolution) -> str:
    """Per-GPU sizes where the command left them to be worked out (percentages, `split N`)."""
    relative = (
        isinstance(command, commands.Limit)
        and any(isinstance(s, commands.Percent) for s in command.sizes or ())
    ) or (isinstance(command, commands.Split) and command.count is not None)
    if not relative or not resolution.gpus:
        return ""
    return " (" + resolution.describe()[-1] + ")"


def _gpu_part(plan: Plan) -> Plan:
    return Plan(**{**_fields(plan), "precision": None})


def _fields(plan: Plan) -> dict[str, Any]:
    return {
        name: getattr(plan, name)
        for name in ("visible", "growth", "limits", "split", "allocator", "precision")
    }


_SESSION: Session | None = None
_SESSION_LOCK = threading.Lock()


def get_session() -> Session:
    """The process's session for the magic, created on first use (creating it reads nothing).

    TensorFlow is process-wide, so one kernel has one.  Hooks and threads are handed the
    session (or its machine) when they are made; they never call this.
    """
    global _SESSION
    finish = None
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = Session()
            finish = deferred.take()  # what `%load_ext` left for now (magics.load), taken once
        session = _SESSION
    if finish is not None:  # outside the lock: it installs hooks that may start a framework's setup
        finish(session)
    return session


def set_device_source(lib: Any) -> None:
    """Read GPUs through ``lib`` (a pynvml-like object, e.g. ``tfgpu_magic.simulated.shared_server()``)."""
    get_session().machine.nvml = Nvml(lib=lib)
