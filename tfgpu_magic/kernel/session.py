"""The kernel's GPU session: what was asked, and getting it into TensorFlow at the right moment.

A :class:`Session` holds the request (a :class:`~tfgpu_magic.command.plan.Plan`) and the
:class:`~tfgpu_magic.kernel.machine.Machine`.  Each command is resolved once against the machine
(:func:`~tfgpu_magic.command.plan.resolve`); the environment variables CUDA and TensorFlow read at
start-up, the ``tf.config`` calls and every report come from that one resolution.  Settings
that TensorFlow reads at import time wait in a post-import hook, so ``import tensorflow`` and
the first op may share a cell; what a started TensorFlow can no longer change is refused with
the exact remedy.  Works without IPython; messages are plain strings.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..command import grammar
from ..command.plan import Plan, PlanError, Resolution, resolve
from ..command.units import MIB, format_bytes, format_change
from ..frameworks.base import Framework, Stage, too_late
from ..frameworks.import_hooks import run_after_import
from ..frameworks.jax import (
    ALLOCATOR_ENV,
    ALLOCATOR_NAMES,
    JAX_DEFAULT_FRACTION,
    MEM_FRACTION_ENV,
    PREALLOCATE_ENV,
    Jax,
    mem_fraction_name,
)
from ..frameworks.pytorch import ALLOC_CONF_ENV, ASYNC_BACKEND, PyTorch, alloc_conf_with_backend, ignored_by_async
from ..frameworks.tensorflow import (
    ASYNC_ALLOCATOR,
    AllocatorStats,
    ApplyError,
    InForce,
    TensorFlow,
    distribution_installed,
)
from ..gpus import numbering
from ..gpus.nvml import Nvml
from .machine import Machine

if TYPE_CHECKING:  # imported by no_gpu_diagnosis when TensorFlow found no GPU, not at `%load_ext`
    from ..frameworks.tensorflow_diagnosis import NoGpuDiagnosis

__all__ = ["Session", "SessionError", "get_session", "set_device_source"]

class SessionError(ValueError):
    """A command that cannot be carried out; the message (one line) says what to do."""


class Session:
    def __init__(
        self,
        nvml: Optional[Nvml] = None,
        env: Optional[MutableMapping[str, str]] = None,
        tf: Optional[TensorFlow] = None,
        machine: Optional[Machine] = None,
        torch: Optional[PyTorch] = None,
        jax: Optional[Jax] = None,
    ) -> None:
        self.machine = machine if machine is not None else Machine(nvml, env, tf)
        self.torch = torch if torch is not None else PyTorch()
        self.jax = jax if jax is not None else Jax()
        for adapter in (self.torch, self.jax):  # one record of CUDA's start, one environment
            adapter.cuda_record, adapter.environ = self.machine.cuda_record, self.machine.env
        self.jax.on_start = self._on_jax_start
        self.defaults = Plan()  # an administrator's defaults (traitlets); `reset` returns here
        self._requested = Plan()
        # The request as resolved when it was accepted (sizes in MiB per GPU): made once, read
        # by every report afterwards, so a driver that stops answering later changes nothing.
        self._accepted: Optional[Resolution] = None
        # True while that resolution predates CUDA's listing of the GPUs: it is met with what CUDA
        # found once it has listed them (see _meet_enumeration).
        self._accepted_blind = False
        # Each framework's resolution, recorded the moment it was given to that framework: the
        # limits the panel draws and the out-of-memory text quotes are the ones it received.
        self.applied: dict[str, Resolution] = {}
        self.claimed: tuple[int, ...] = ()  # GPUs this kernel claimed through `%gpu use auto`
        self.hook_errors: list[str] = []
        self.notes: list[str] = []  # said once, shown by `%gpu` afterwards
        self._no_gpu_diagnosis: Optional[NoGpuDiagnosis] = None  # kept once made: its facts never change
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

    @property
    def tf(self) -> TensorFlow:
        return self.machine.tf

    def frameworks(self) -> tuple[Framework, ...]:
        """Every framework's adapter, TensorFlow first (the order of every report)."""
        return (self.tf, self.torch, self.jax)

    def imported_frameworks(self) -> tuple[Framework, ...]:
        return tuple(f for f in self.frameworks() if f.stage() is not Stage.NOT_IMPORTED)

    def prepare(self, say: Callable[[str], None] = print) -> None:
        """At extension load: watch for TensorFlow, and number CUDA's GPUs as nvidia-smi does."""
        self._install_import_hooks()
        if self.machine.inherited["CUDA_VISIBLE_DEVICES"] is not None:
            odd = self.machine.allocation().note  # an invalid entry: which, and what CUDA does with it
            if odd:
                say(f"tfgpu_magic: {odd}")
        if self.tf.stage() >= Stage.ENUMERATED:
            return
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
        self._requested = plan
        self._accepted = None

    def _accept(self, resolution: Resolution) -> None:
        self._requested = resolution.plan
        self._accepted = resolution
        self._accepted_blind = self.tf.stage() < Stage.ENUMERATED

    def resolved(self) -> Resolution:
        """The request as resolved when it was accepted; raises SessionError if it cannot hold.

        A request never resolved (the empty one a kernel starts with) is resolved on first
        read, once the machine can answer, and kept.
        """
        accepted = self._accepted
        if accepted is not None:
            if self._accepted_blind and self.tf.stage() >= Stage.ENUMERATED:
                self._meet_enumeration()
                accepted = self._accepted if self._accepted is not None else accepted
            return accepted
        plan = self._requested
        blind = self.tf.stage() < Stage.ENUMERATED
        resolution = self.resolution(plan)
        # Kept only if the request is still the one resolved: the sampler thread may get here
        # while `configure` accepts a new one (it holds the lock while it does; never wait for it).
        if self._lock.acquire(blocking=False):
            try:
                if self._accepted is None and self._requested is plan:
                    self._accepted = resolution
                    self._accepted_blind = blind
            finally:
                self._lock.release()
        return resolution

    def _meet_enumeration(self, can_apply: bool = False, listed: bool = False) -> None:
        """CUDA has listed TensorFlow's GPUs since the request was accepted: a request that names
        no GPU (`use all`, `use none`, or no `use`) meets what CUDA found then.

        CUDA read ``CUDA_VISIBLE_DEVICES`` as it stood at that moment, so a value set by hand after
        the command is what TensorFlow has.  The hand-made value is kept, as everywhere (see
        ``Machine.unmanaged_value``): the record follows what CUDA found, and a request it
        overrode is said.  ``can_apply``: TensorFlow's visibility may still be narrowed through
        tf.config here (the import hook, before the first op); ``listed``: the hook has just listed
        TensorFlow's GPUs.  Named GPUs need nothing here:
        tf.config shows exactly them, or the hook says it could not (``TensorFlow.apply``).
        """
        if not self._lock.acquire(blocking=False):
            return  # `configure` holds it on another thread: it accepts a request of its own
        try:
            accepted = self._accepted
            stage = self.tf.stage()
            if accepted is None or not self._accepted_blind or (stage < Stage.ENUMERATED and not listed):
                return
            self._accepted_blind = False
            plan = accepted.plan
            if isinstance(plan.visible, tuple):
                return
            found = self.machine.cuda_found()
            if not found:
                return  # TensorFlow found no GPU: the hook and the diagnosis say so
            what = "; ".join(plan.describe())
            value = self.machine.cuda_env().get("CUDA_VISIBLE_DEVICES")
            by_hand = (
                f"CUDA_VISIBLE_DEVICES={value} was set by hand after `%gpu use {plan.visible}`, and CUDA "
                f"read it when TensorFlow listed its devices"
            )
            shown = "GPU " + ", ".join(map(str, found))
            # Said at once from the import hook; found later (by `%gpu`), recorded for its report.
            failed = self._hook_failed if can_apply else self.hook_errors.append
            if plan.visible == "none":
                if can_apply and stage is not Stage.STARTED:
                    self._apply_tf(accepted, stage)  # tf.config hides what CUDA showed: the request holds
                    return
                failed(
                    f"could not apply {what}: {by_hand}, so TensorFlow has {shown}; restart the kernel "
                    "and leave CUDA_VISIBLE_DEVICES to `%gpu use`"
                )
                return
            try:
                now = self._narrowed(accepted, found)
            except SessionError as err:
                failed(f"could not apply {what}: {err}")
                return
            if can_apply and stage is not Stage.STARTED and now.visible is not None and now.visible != found:
                self._apply_tf(now, stage)  # CUDA showed GPUs outside the allocation: tf.config hides them
            if now == accepted:
                return
            self._accepted = now
            if self.applied.get("tensorflow") is accepted:
                self._record_applied(now)
            hidden = [g.index for g in accepted.gpus if now.gpu(g.index) is None]
            if plan.visible == "all" and hidden and now.visible is not None:
                kept = "GPU " + ", ".join(map(str, now.visible)) if now.visible else "no GPU"
                self.notes.append(
                    f"{by_hand}: `use all` is {kept}, the GPUs CUDA showed; GPU {', '.join(map(str, hidden))} "
                    "stay hidden until the kernel restarts (to use them, restart and leave CUDA_VISIBLE_DEVICES "
                    "to `%gpu use`)"
                )
        finally:
            self._lock.release()

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

    def meet_enumeration(self) -> None:
        """Before a report: the request meets TensorFlow's listing of the GPUs, if it happened since
        (its notes then belong in this report)."""
        if self._accepted_blind and self.tf.stage() >= Stage.ENUMERATED:
            self._meet_enumeration()

    def _record_applied(self, resolution: Resolution) -> None:
        """TensorFlow has been given ``resolution`` (by tf.config, or by the environment it is
        about to read): from now on that is what it runs with, whatever the driver says later."""
        self.applied["tensorflow"] = resolution

    # -- the resolution -------------------------------------------------------------------------
    def resolution(self, plan: Optional[Plan] = None, *, started: bool = False) -> Resolution:
        """The request (or ``plan``) on this machine; raises SessionError if it cannot hold.

        ``started``: TensorFlow's GPUs are fixed, so the question is only whether the plan
        equals them (a GPU CUDA never listed is then "different", with the restart remedy).
        """
        facts = self.machine.facts()
        if started:
            facts = replace(facts, cuda_found=None)
        try:
            return resolve(self.requested if plan is None else plan, facts)
        except PlanError as err:
            raise SessionError(str(err)) from None

    def visible_gpus(self) -> Optional[list[int]]:
        """nvidia-smi indices this kernel sees (TensorFlow's view once it enumerated); None: unknown."""
        if self.tf.stage() >= Stage.ENUMERATED:
            return sorted(set(self.tf.gpu_names(self.machine.cuda_map()).values()))
        try:
            visible = self.resolved().visible
        except SessionError:
            return None
        return None if visible is None else list(visible)

    def exposed_gpus(self) -> Optional[list[int]]:
        """nvidia-smi indices CUDA shows (or will show) this kernel: what ``%gpu use`` or
        ``CUDA_VISIBLE_DEVICES`` hid is left out, as CUDA read them at enumeration.  Unlike
        :meth:`visible_gpus`, a TensorFlow that then found no GPU (a CPU-only build, missing CUDA
        libraries) hides nothing: the driver's readings of these GPUs stay worth showing."""
        if self.tf.stage() >= Stage.ENUMERATED and self.nvml.available():
            return sorted(set(self.machine.cuda_map()))
        return self.visible_gpus()

    def tensorflow_found_no_gpu(self) -> bool:
        """TensorFlow listed its devices and found no GPU, although CUDA was shown some."""
        return self.machine.cuda_found() == () and bool(self.exposed_gpus())

    def no_gpu_diagnosis(self) -> Optional[NoGpuDiagnosis]:
        """Why TensorFlow found no GPU although CUDA was shown some; None when it found its GPUs.

        Made on the user's thread (``%gpu``, the trace) the first time it is asked after
        TensorFlow listed its devices, then kept: the build, the driver's CUDA version, the
        installed packages and what TensorFlow listed do not change while the kernel lives.
        """
        if self._no_gpu_diagnosis is None and self.tensorflow_found_no_gpu():
            from ..frameworks import tensorflow_diagnosis as tf_diagnosis  # rarely needed: not at `%load_ext`

            self._no_gpu_diagnosis = tf_diagnosis.diagnose(
                driver_gpus=len(self.exposed_gpus() or ()),
                build_info=self.tf.build_info(),
                driver_cuda=self.nvml.cuda_driver_version(),
                installed=distribution_installed,
            )
        return self._no_gpu_diagnosis

    def in_force(self) -> Optional[InForce]:
        """What TensorFlow runs with (started) or will start with (enumerated); None before."""
        if self.tf.stage() < Stage.ENUMERATED:
            return None
        return self.tf.in_force(self.machine.cuda_map(), self.env)

    def limit_bytes_by_gpu(self) -> dict[int, int]:
        """The cap of each visible GPU, in bytes (the panel's limit line, the out-of-memory text).

        Once TensorFlow is imported, the caps it was given (none if it was given nothing: a
        TensorFlow that found no GPU has no cap); before, the accepted request's, which it will
        be given.  Read from the record only: safe on the sampler thread, and never re-derived
        from the driver.
        """
        if self.tf.stage() >= Stage.IMPORTED:
            applied = self.applied.get("tensorflow")
            return applied.caps_bytes() if applied is not None else {}
        accepted = self._accepted
        return accepted.caps_bytes() if accepted is not None else {}

    def gpu_by_tf_name(self) -> dict[str, int]:
        """TensorFlow's ``GPU:j`` -> nvidia-smi index (empty before enumeration)."""
        return self.tf.gpu_names(self.machine.cuda_map())

    # -- configuration ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """A command that raises, at any step, leaves the request, its record and the environment as
        they were (claims released on the way stay released: that happened, and the record says so)."""
        saved = (self._requested, self._accepted, self._accepted_blind, dict(self.applied))
        environment = self.machine.save_env(ALLOC_CONF_ENV)  # PYTORCH_ALLOC_CONF is edited in place too
        try:
            yield
        except BaseException:
            self._requested, self._accepted, self._accepted_blind, self.applied = saved
            self.machine.restore_env(environment)
            raise

    def configure(self, command: Any, chosen_by_auto: bool = False) -> str:
        """Carry out a configuration command; returns what happened, raises SessionError."""
        with self._lock, self._all_or_nothing():
            try:
                plan = self.requested.with_command(command)
            except PlanError as err:
                raise SessionError(str(err)) from None
            what = _describe_command(command)
            if isinstance(command, grammar.Precision):  # the Keras policy is never frozen
                return f"{what}: {self._set_precision(plan)}{self._precision_for_torch(command)}"
            stage = self.tf.stage()
            resolution = self.resolution(plan, started=stage is Stage.STARTED)
            shown = what + _resolved_suffix(command, resolution)
            self._check_cuda_not_started_by_torch(command, plan, what)
            self._check_jax_fraction_names(command)
            # One "; Framework: ..." part per framework the command means something to.
            parts = (
                self._torch_part(command, plan) + self._async_ignores(command)
                + self._jax_part(command, plan, resolution, what)
            )
            jax_only = isinstance(command, grammar.Allocator) and command.name == "platform"
            if stage is Stage.STARTED:
                if plan != self.requested and not jax_only:
                    self._check_in_force(resolution, command, what)
                answer = (
                    "already requested; nothing changed (TensorFlow has started)"
                    if plan == self.requested
                    else "already in force (TensorFlow has started); nothing changed"
                )
                if jax_only and plan != self.requested:
                    answer = "JAX only, read when its backends start; TensorFlow keeps the allocator it has"
                self._settle(resolution, chosen_by_auto)
                self._give_torch(resolution)
                if self.jax.stage() is not Stage.STARTED:  # JAX reads its variables at its own start
                    self._set_jax_environment(resolution)
                self._give_jax(resolution)
                return f"{shown}: {answer}{parts}"
            self._apply(resolution, stage)
            self._settle(resolution, chosen_by_auto)
            self._give_torch(resolution)
            self._give_jax(resolution)
            if jax_only:
                others = [f.name for f in self.imported_frameworks() if f is not self.jax]
                kept = "keeps its allocator" if len(others) == 1 else "keep their allocators"
                keep = f"; {_either(others, 'and')} {kept}" if others else ""
                when = (
                    "JAX only, read when its backends start: it allocates on demand and hands freed "
                    f"memory back, slowly{keep}"
                )
            elif stage is not Stage.NOT_IMPORTED:
                when = "applied to TensorFlow now (imported, not started)"
            elif self.imported_frameworks():  # each imported framework's part says when
                if not parts:  # a setting that undoes one (`use all`, `limit off`): when they read it
                    parts = "".join(f"; {f.name}: takes effect {f.takes_effect}" for f in self.imported_frameworks())
                return f"{shown}: {parts.removeprefix('; ')}"
            else:
                when = self._waiting_for()
            return f"{shown}: {when}{parts}"

    def _waiting_for(self) -> str:
        """Before any framework is imported: the ones the setting will reach (those installed)."""
        installed = [f.name for f in self.frameworks() if f.installed()] or [f.name for f in self.frameworks()]
        return f"takes effect when {_either(installed)} starts in this kernel"

    # -- PyTorch ------------------------------------------------------------------------------------
    def _check_cuda_not_started_by_torch(self, command: Any, plan: Plan, what: str) -> None:
        """CUDA reads CUDA_VISIBLE_DEVICES once per process: after PyTorch started it, `use` is too late
        for every framework of this kernel."""
        if not isinstance(command, grammar.Use) or self.torch.stage() is not Stage.STARTED:
            return
        if plan.visible == self.requested.visible:
            return
        seen = self.torch.cuda_seen
        value = seen.get("CUDA_VISIBLE_DEVICES") if seen is not None else None
        shown = f"CUDA_VISIBLE_DEVICES={value}" if value is not None else "every GPU visible"
        raise SessionError(
            f"PyTorch has already started CUDA with {shown}, and CUDA reads it once per process. "
            f"Put `%gpu {what}` at the top of the notebook, before `import torch`, and restart the kernel"
        )

    def _async_ignores(self, command: Any) -> str:
        """`allocator async` over the user's own PyTorch allocator options: the ones it ignores, named."""
        if not (isinstance(command, grammar.Allocator) and command.name == "async"):
            return ""
        if self.torch.stage() is not Stage.NOT_IMPORTED or not self.torch.installed():
            return ""  # loaded already: its part says with which allocator
        for name in ALLOC_CONF_ENV:  # the one torch reads: the old name when both are set
            conf = self.machine.unmanaged_value(name) if name in self.machine.inherited else self.env.get(name)
            if conf:
                break
        ignored = ignored_by_async(conf)
        if not ignored:
            return ""
        return (
            f"; PyTorch: cudaMallocAsync ignores your {name} options {', '.join(ignored)} (they tune PyTorch's "
            "own caching allocator, which `allocator async` replaces)"
        )

    def _torch_part(self, command: Any, plan: Plan) -> str:
        """What the command means for an imported PyTorch (raises SessionError when it cannot hold)."""
        torch = self.torch
        if torch.stage() is Stage.NOT_IMPORTED:
            return ""
        if isinstance(command, grammar.Allocator) and command.name == "platform":
            return ""  # JAX's own word: the reply already says PyTorch keeps its allocator
        if isinstance(command, grammar.Allocator):
            loaded = torch.backend()
            if loaded != command.name:
                raise SessionError(
                    f"PyTorch loaded with the {loaded} allocator and reads it only at `import torch`. "
                    f"Put `%gpu allocator {command.name}` at the top of the notebook, before `import torch`, "
                    "and restart the kernel"
                )
            return f"; PyTorch: already loaded with the {loaded} allocator"
        if isinstance(command, grammar.Grow):
            return "; PyTorch: allocates on demand already, so `grow` changes nothing for it"
        if isinstance(command, grammar.Split):
            return "; PyTorch: has no logical GPUs, so `split` does not reach it"
        if isinstance(command, (grammar.Limit, grammar.Use)) and plan.gpu_settings:
            if not torch.cuda_build():
                return "; PyTorch: a CPU build (torch.version.cuda is None), so no GPU setting reaches it"
            if isinstance(command, grammar.Limit):
                started = torch.stage() is Stage.STARTED
                return "; PyTorch: capped now" if started else "; PyTorch: capped when it starts CUDA"
            if self.tf.stage() >= Stage.ENUMERATED:  # CUDA read CUDA_VISIBLE_DEVICES when TensorFlow listed its GPUs
                return "; PyTorch: sees the GPUs CUDA showed when TensorFlow listed its devices (`use` cannot change them)"
            return "; PyTorch: takes effect when it starts CUDA"
        return ""

    def _give_torch(self, resolution: Resolution) -> None:
        """The caps of an accepted request reach an imported PyTorch (at once, or when CUDA starts)."""
        torch = self.torch
        if torch.stage() is Stage.NOT_IMPORTED or not torch.cuda_build():
            return
        cuda_map = self.machine.cuda_map()
        by_nvml = {g.index: g.cap_mib for g in resolution.gpus if g.cap_mib is not None}
        torch.cap({k: by_nvml[index] * MIB for k, index in enumerate(cuda_map) if index in by_nvml})
        self.applied["pytorch"] = resolution

    def _on_torch_import(self, module: Any) -> None:
        self.torch.on_import(module)
        if self._impostor(self.torch):
            return
        with self._lock:
            plan = self.requested
            if not plan.gpu_settings:
                return
            try:
                if not self.torch.cuda_build():
                    if plan.limits is not None or isinstance(plan.visible, tuple):
                        self._hook_failed(
                            "PyTorch is a CPU build (torch.version.cuda is None), so these GPU settings "
                            f"cannot take effect for it: {'; '.join(plan.describe())}"
                        )
                    return
                self._give_torch(self.resolved())
            except Exception as err:  # never break the user's import
                self._hook_failed(f"could not apply {'; '.join(plan.describe())} to PyTorch: {err}")

    # -- JAX ------------------------------------------------------------------------------------------
    def _jax_part(self, command: Any, plan: Plan, resolution: Resolution, what: str) -> str:
        """What the command means for JAX once its backends started (raises SessionError when it
        cannot hold).  Before that JAX is given everything through the environment and nothing
        is said: TensorFlow 2.21 imports jax itself where it is installed (tensorflow/lite/python/
        util.py), so an imported JAX is no sign that the notebook uses it."""
        jax = self.jax
        stage = jax.stage()
        if isinstance(command, grammar.Limit) and stage is Stage.NOT_IMPORTED and jax.installed():
            rounded = _jax_rounded_up(resolution)
            return "" if rounded is None else f"; {rounded}"
        if isinstance(command, grammar.Split) and stage is not Stage.NOT_IMPORTED and self.tf.stage() is Stage.NOT_IMPORTED:
            return "; JAX: has no logical GPUs, so `split` does not reach it"
        if stage is Stage.NOT_IMPORTED or not isinstance(
            command, (grammar.Use, grammar.Grow, grammar.Limit, grammar.Allocator)
        ):
            return ""
        problem = _jax_limit_problem(resolution) if isinstance(command, grammar.Limit) else None
        rounded = _jax_rounded_up(resolution) if isinstance(command, grammar.Limit) else None
        if rounded is not None and stage is not Stage.STARTED:
            return f"; {rounded}"
        if stage is Stage.STARTED:
            start = jax.start()
            if start is None or not start.gpu:
                return "; JAX: started without a GPU backend, so GPU settings do not reach it"
            if problem is not None:
                raise SessionError(problem)
            differs, now = self._jax_difference(command, resolution, start)
            if differs:
                raise SessionError(too_late("JAX", "jax", what, now))
            return "; JAX: already started with it"
        if problem is not None:  # accepted for the other frameworks; JAX starts uncapped
            return f"; JAX gets no memory fraction from it: {problem}"
        if self.tf.stage() is Stage.NOT_IMPORTED:  # imported by the user (TensorFlow imports it itself)
            if isinstance(command, grammar.Allocator) and command.name == "platform":
                return ""  # the reply is JAX's already
            return f"; JAX: takes effect {jax.takes_effect}"
        return ""

    def _jax_difference(self, command: Any, resolution: Resolution, start: Any) -> tuple[bool, str]:
        """Whether a started JAX runs with something else than ``command`` asks, and with what."""
        if isinstance(command, grammar.Grow):
            return start.preallocate == command.on, f"preallocation {'on' if start.preallocate else 'off'}"
        if isinstance(command, grammar.Allocator):
            wanted = ALLOCATOR_NAMES[command.name] or "default"
            return start.allocator != wanted, f"the {start.allocator} allocator"
        if isinstance(command, grammar.Limit):
            wanted = _jax_fraction(resolution)
            now = start.memory_fraction
            in_effect = JAX_DEFAULT_FRACTION if now is None else now
            same = abs((JAX_DEFAULT_FRACTION if wanted is None else float(wanted)) - in_effect) < 1e-3
            shown = "its default memory fraction (0.75)" if now is None else f"a memory fraction of {now:g}"
            return not same, shown
        value = start.cuda_visible_devices
        shown = f"CUDA_VISIBLE_DEVICES={value}" if value is not None else "every GPU visible"
        return self._visible_env(resolution) != value, shown

    def jax_limit_problem(self) -> Optional[str]:
        """Why the accepted request's limits give JAX no memory fraction (None: they do, or none asked)."""
        accepted = self._accepted
        return None if accepted is None else _jax_limit_problem(accepted)

    def _on_jax_start(self) -> None:
        """Run by the adapter as JAX's backends start, on the starting thread: a limit JAX cannot
        take is said now, to whoever uses JAX (TensorFlow imports jax without using it)."""
        problem = self.jax_limit_problem()
        if problem is not None:
            self._hook_failed(f"JAX starts without a memory fraction: {problem}")

    def _check_jax_fraction_names(self, command: Any) -> None:
        """JAX's CUDA plugin refuses to start when both names of its fraction are set."""
        if not isinstance(command, grammar.Limit) or self.jax.stage() is Stage.STARTED:
            return
        if all(self.env.get(name) for name in MEM_FRACTION_ENV):
            old, new = MEM_FRACTION_ENV
            raise SessionError(
                f"{old} and {new} are both set, and JAX refuses to start its CUDA client with both: "
                f"remove one first (`del os.environ['{old}']`), then run `%gpu {_describe_command(command)}` again"
            )

    def _give_jax(self, resolution: Resolution) -> None:
        """JAX reads the environment at its start: until then, this is what it will be given."""
        if Stage.IMPORTED <= self.jax.stage() < Stage.STARTED:
            self.applied["jax"] = resolution

    def _on_jax_import(self, module: Any) -> None:
        self.jax.on_import(module)
        if self._impostor(self.jax):
            return
        with self._lock:
            plan = self.requested
            if not plan.gpu_settings or self.jax.stage() is Stage.STARTED:
                return
            try:
                self._give_jax(self.resolved())
            except Exception as err:  # never break the user's import
                self._hook_failed(f"could not apply {'; '.join(plan.describe())} to JAX: {err}")

    def _settle(self, resolution: Resolution, chosen_by_auto: bool) -> None:
        """The request is accepted: claims follow it (what is claimed is what is requested)."""
        self._accept(resolution)
        plan = resolution.plan
        visible = plan.visible if isinstance(plan.visible, tuple) else ()
        if chosen_by_auto:
            keep = visible
        else:
            keep = tuple(i for i in self.claimed if i in visible)
        for index in self.claimed:
            if index not in keep:
                from . import choosing  # claims: only when some were made

                choosing.release(self, index)
        self.claimed = keep

    def _precision_for_torch(self, command: Any) -> str:
        """The policy is Keras's (all three back ends); plain PyTorch code has its own tool."""
        if self.torch.stage() is Stage.NOT_IMPORTED or command.policy == "float32":
            return ""
        dtype = "torch.bfloat16" if "bfloat16" in command.policy else "torch.float16"
        return (
            "; PyTorch: the Keras policy does not reach plain PyTorch code: wrap the forward pass in "
            f"`torch.autocast(\"cuda\", dtype={dtype})`"
        )

    def _set_precision(self, plan: Plan) -> str:
        accepted = self._accepted  # the GPU part is unchanged: its resolution stands
        self.requested = plan
        if accepted is not None:
            self._accepted = replace(accepted, plan=plan)
        if self.tf.keras_policy() is None:
            return "set when Keras is imported"
        self.tf.set_keras_policy(plan.precision or "float32")
        return "Keras global policy set now"

    def _apply(self, resolution: Resolution, stage: Stage) -> None:
        """Environment first (read at CUDA start-up), then tf.config once TensorFlow is here.
        Called inside _all_or_nothing: a refusal leaves the environment as it was."""
        try:
            self._set_environment(resolution, stage)
            if Stage.IMPORTED <= stage < Stage.STARTED:
                self._apply_tf(resolution, stage)
                self._record_applied(resolution)
        except (ApplyError, ValueError, RuntimeError) as err:
            if isinstance(err, ApplyError):
                raise SessionError(str(err)) from None
            raise SessionError(f"TensorFlow refused it: {err}") from None

    def _set_environment(self, resolution: Resolution, stage: Stage) -> None:
        """The variables CUDA reads at enumeration and TensorFlow at its first op."""
        plan, machine = resolution.plan, self.machine
        if stage < Stage.ENUMERATED:
            machine.set_env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs as nvidia-smi does
            machine.set_env("CUDA_VISIBLE_DEVICES", self._visible_env(resolution))
        elif plan.visible is None:  # CUDA has read it; the variable should not claim a request that is gone
            machine.set_env("CUDA_VISIBLE_DEVICES", machine.unmanaged_value("CUDA_VISIBLE_DEVICES"))
        growth = None if plan.growth is None else ("true" if plan.growth else "false")
        machine.set_env("TF_FORCE_GPU_ALLOW_GROWTH", growth or machine.unmanaged_value("TF_FORCE_GPU_ALLOW_GROWTH"))
        # `platform` is JAX's word: TensorFlow and PyTorch keep what they had, as if not asked.
        framework_allocator = None if plan.allocator == "platform" else plan.allocator
        allocator = {"async": ASYNC_ALLOCATOR, "default": None}
        machine.set_env(
            "TF_GPU_ALLOCATOR",
            allocator[framework_allocator] if framework_allocator else machine.unmanaged_value("TF_GPU_ALLOCATOR"),
        )
        if self.torch.stage() is Stage.NOT_IMPORTED:
            self._set_torch_allocator(framework_allocator)
        if self.jax.stage() is not Stage.STARTED:
            self._set_jax_environment(resolution)

    def _set_jax_environment(self, resolution: Resolution) -> None:
        """JAX's variables, read when its backends start (see frameworks/jax.py)."""
        plan, machine = resolution.plan, self.machine
        # What was never asked keeps the user's own value; what was asked is set, defaults included.
        preallocate = {None: machine.unmanaged_value(PREALLOCATE_ENV), True: "false", False: "true"}
        machine.set_env(PREALLOCATE_ENV, preallocate[plan.growth])
        if plan.allocator is None:
            machine.set_env(ALLOCATOR_ENV, machine.unmanaged_value(ALLOCATOR_ENV))
        else:
            machine.set_env(ALLOCATOR_ENV, ALLOCATOR_NAMES[plan.allocator])
        fraction = _jax_fraction(resolution) if plan.limits is not None else None
        chosen = mem_fraction_name({n: machine.unmanaged_value(n) or "" for n in MEM_FRACTION_ENV})
        for name in MEM_FRACTION_ENV:  # exactly one name: the user's choice, else the old one
            value = fraction if name == chosen and fraction is not None else machine.unmanaged_value(name)
            machine.set_env(name, value)

    def _set_torch_allocator(self, allocator: Optional[str]) -> None:
        """PyTorch's back end, in the variable it reads at load: the user's own options are kept,
        and a user who chose PYTORCH_ALLOC_CONF keeps that name (see frameworks/pytorch.py)."""
        machine = self.machine
        old_name, new_name = ALLOC_CONF_ENV
        backend = ASYNC_BACKEND if allocator == "async" else None
        if self.env.get(new_name) and not self.env.get(old_name):
            # The user chose the new name alone; with both set, torch reads only the old one.
            if allocator is not None:
                self.env[new_name] = alloc_conf_with_backend(self.env.get(new_name), backend) or ""
            return
        base = machine.unmanaged_value(old_name)
        machine.set_env(old_name, base if allocator is None else alloc_conf_with_backend(base, backend))

    def _visible_env(self, resolution: Resolution) -> Optional[str]:
        plan, allocation = resolution.plan, self.machine.allocation()
        if plan.visible is None or (plan.visible == "all" and not allocation.restricted):
            return self.machine.unmanaged_value("CUDA_VISIBLE_DEVICES") if plan.visible is None else None
        if plan.visible == "all" and resolution.visible is None:
            return allocation.raw  # the allocation as the environment wrote it
        gpus = resolution.visible if resolution.visible is not None else tuple(sorted(plan.visible))  # type: ignore[arg-type]
        if allocation.restricted and allocation.gpus is not None:
            return allocation.env_value(gpus)  # a GPU allocated as MIG instances keeps their UUIDs
        return numbering.visible_env_value(gpus)

    def _apply_tf(self, resolution: Resolution, stage: Stage) -> None:
        """tf.config work.  Before enumeration only what the environment cannot carry."""
        plan, tf = resolution.plan, self.tf
        logical = any(g.logical_mib for g in resolution.gpus)
        if stage < Stage.ENUMERATED and not (logical or tf.owned_logical):
            return
        asked = plan.visible is not None or tf.owned_visibility
        tf.apply(resolution.visible if asked else None, resolution.logical_mib(), plan.growth, self.machine.cuda_map())

    def _check_in_force(self, resolution: Resolution, command: Any, what: str) -> None:
        """After start-up: an identical setting passes, a different one gets the remedy."""
        force = self.in_force()
        assert force is not None
        differs, now = _difference(resolution, command, force)
        if differs:
            raise SessionError(
                f"TensorFlow has already started with {now}, and cannot change it in a running "
                f"kernel. Put `%gpu {what}` at the top of the notebook, before `import tensorflow`, "
                "and restart the kernel"
            )

    # -- reset, free ------------------------------------------------------------------------------
    def reset(self) -> str:
        """Back to the configured defaults; says what is requested now and what cannot be undone."""
        with self._lock, self._all_or_nothing():
            stage = self.tf.stage()
            before = self.requested
            target = self.defaults
            kept = _gpu_part(before) if stage is Stage.STARTED else Plan()
            if stage is Stage.STARTED:  # GPU settings are frozen: only the precision can go back
                target = Plan(**{**_fields(kept), "precision": self.defaults.precision})
                resolution = self._frozen_resolution(target)
            else:
                resolution = self.resolution(target)
                self._apply(resolution, stage)
            if before.precision != target.precision and self.tf.keras_policy() is not None:
                self.tf.set_keras_policy(target.precision or "float32")
            self._settle(resolution, chosen_by_auto=False)
            forgot = [line for line in before.describe() if line not in target.describe()]
            lines = ["forgot: " + "; ".join(forgot) if forgot else "nothing to forget"]
            now = target.describe()
            lines.append("requested now: " + ("; ".join(now) if now else "nothing (each framework's defaults)"))
            lines.extend(f"cannot undo: {why}" for why in self._frozen(stage, kept))
            return "\n".join(lines)

    def _frozen_resolution(self, target: Plan) -> Resolution:
        """``target`` keeps the started TensorFlow's GPU settings: so does its resolution."""
        accepted = self._accepted
        if accepted is not None:
            return replace(accepted, plan=target)
        try:
            return self.resolution(target, started=True)
        except SessionError:
            return Resolution(target, None, ())

    def _frozen(self, stage: Stage, kept: Plan) -> list[str]:
        """What reset leaves in place because CUDA or TensorFlow has already read it."""
        reasons = []
        if stage is Stage.STARTED and kept.describe():
            reasons.append(
                f"{'; '.join(kept.describe())} (TensorFlow has started with them; restart the kernel to drop them)"
            )
        jax_start = self.jax.start()
        if jax_start is not None and jax_start.gpu:
            reasons.append(f"JAX started with {jax_start.describe()} (restart the kernel to change them)")
        seen = self.tf.cuda_seen
        if stage is Stage.ENUMERATED and seen is not None:
            value = seen.get("CUDA_VISIBLE_DEVICES")
            if value is not None and value != self.machine.inherited["CUDA_VISIBLE_DEVICES"]:
                reasons.append(
                    f"CUDA_VISIBLE_DEVICES={value} was read by CUDA when TensorFlow listed its devices; "
                    "GPUs hidden then stay hidden until the kernel restarts"
                )
        return reasons

    def free(self) -> str:
        """Keras clear_session and garbage collection, with before/after readings."""
        with self._lock:
            tf = self.tf
            started = tf.stage() is Stage.STARTED
            before_tf, before_driver = tf.allocator_stats(), self._my_device_memory()
            before_torch, before_jax = self.torch.memory(), self.jax.device_memory()  # all before any freeing
            keras_cleared = tf.clear_session()
            policy = self.requested.precision
            if policy is not None and tf.keras_policy() not in (None, policy):
                tf.set_keras_policy(policy)  # clear_session resets the global policy
            torch_emptied = self.torch.free()
            jax_cleared = self.jax.free()
            after_tf, after_driver = tf.allocator_stats(), self._my_device_memory()
            after_torch = self.torch.memory()
            after_jax = self.jax.device_memory()
            force = self.in_force() if started else None
            report = _free_report(
                keras_cleared, tf.stage(), force, policy, before_tf, after_tf, before_driver, after_driver
            )
            lines = report.split("\n")
            extra = []
            if self.torch.stage() is not Stage.NOT_IMPORTED:
                extra += _torch_free_lines(torch_emptied, before_torch, after_torch)
            if jax_cleared:
                extra += _jax_free_lines(self.jax.start(), before_jax, after_jax)
            if not self.imported_frameworks():
                extra.append("No framework is imported in this kernel, so none holds GPU memory to free.")
            lines[1:1] = extra
            return "\n".join(lines)

    def _my_device_memory(self) -> "DriverReading":
        """Bytes this process holds on each GPU according to the driver (NVML), and why not."""
        if not self.nvml.available():
            return DriverReading({}, "no driver reading (NVML unavailable)")
        mine: dict[int, Optional[int]] = {}
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
        force = self.in_force()
        if force is not None and not force.visible_nvml:
            return DriverReading({}, "the driver lists no GPU memory for this kernel, which uses no GPU")
        return DriverReading(
            {},
            f"the driver (NVML) lists no GPU memory for this kernel's pid {pid}: it holds none yet, or "
            "it runs in a container with its own pid namespace, where NVML shows host pids",
        )

    # -- import hooks ---------------------------------------------------------------------------------
    def _install_import_hooks(self) -> None:
        """Apply this session's request the moment each framework (and Keras) finishes importing."""
        run_after_import("tensorflow", self._on_tensorflow_import)
        run_after_import("keras", self._on_keras_import)
        run_after_import("torch", self._on_torch_import)
        run_after_import("jax", self._on_jax_import)

    def _impostor(self, framework: Framework) -> bool:
        """Whether what the import gave is not ``framework`` (a planted module): said once, in one note."""
        refused = getattr(framework, "refused", None)
        if refused is None:
            return False
        if refused not in self.notes:
            self.notes.append(refused)
            print(f"tfgpu_magic: {refused}", file=sys.stderr)
        return True

    def _on_tensorflow_import(self, module: Any) -> None:
        self.tf.on_import(module)
        if self._impostor(self.tf):
            return
        with self._lock:
            stage = self.tf.stage()
            plan = self.requested
            if stage is Stage.STARTED or not plan.gpu_settings:
                if stage >= Stage.ENUMERATED:  # listed already (before tfgpu_magic loaded, or by a hook)
                    self._safely_meet_enumeration()
                return
            try:
                if self.tf.physical_gpu_indices() == []:  # a CPU-only build, or no driver at all
                    self._hook_failed(
                        f"TensorFlow found no GPU (a CPU-only build, or no working NVIDIA driver), so "
                        f"these GPU settings cannot take effect: {'; '.join(plan.describe())}"
                    )
                    return
                self._meet_enumeration(can_apply=True, listed=True)  # listing them above is when CUDA read its variables
                resolution = self.resolved()  # what was promised when the request was accepted
                self._apply_tf(resolution, self.tf.stage())
                self._record_applied(resolution)
            except Exception as err:  # never break the user's import
                self._hook_failed(f"could not apply {'; '.join(plan.describe())}: {err}")

    def _safely_meet_enumeration(self) -> None:
        try:
            self._meet_enumeration(can_apply=True)
        except Exception as err:  # never break the user's import
            self._hook_failed(f"could not apply {'; '.join(self.requested.describe())}: {err}")

    def _on_keras_import(self, module: Any) -> None:
        policy = self.requested.precision
        if policy is None:
            return
        try:
            module.mixed_precision.set_global_policy(policy)
        except Exception as err:
            self._hook_failed(f"could not set precision {policy}: {err}")

    def _hook_failed(self, message: str) -> None:
        self.hook_errors.append(message)
        print(f"tfgpu_magic: {message}. Run `%gpu` for details.", file=sys.stderr)


class DriverReading:
    """This process's memory per GPU from NVML, or why there is none."""

    def __init__(self, by_gpu: dict[int, Optional[int]], missing: Optional[str]) -> None:
        self.by_gpu = by_gpu
        self.missing = missing


# -- helpers ----------------------------------------------------------------------------------------
def _either(names: list[str], last: str = "or") -> str:
    """``A``, ``A or B``, ``A, B or C``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _describe_command(command: Any) -> str:
    if isinstance(command, grammar.Use):
        plan = Plan(visible=command.gpus)  # type: ignore[arg-type]
    else:
        plan = Plan().with_command(command)
    described = plan.describe()
    if described:
        return described[0]
    if isinstance(command, grammar.Limit):
        return "limit off"
    if isinstance(command, grammar.Split):
        return "split off"
    return str(command)


def _resolved_suffix(command: Any, resolution: Resolution) -> str:
    """Per-GPU sizes where the command left them to be worked out (percentages, `split N`)."""
    relative = (isinstance(command, grammar.Limit) and any(isinstance(s, grammar.Percent) for s in command.sizes or ())) or (
        isinstance(command, grammar.Split) and command.count is not None
    )
    if not relative or not resolution.gpus:
        return ""
    return " (" + resolution.describe()[-1] + ")"


def _jax_fraction(resolution: Resolution) -> Optional[str]:
    """JAX's one memory fraction for the request's caps (rounded down: JAX never exceeds a cap);
    None without a cap, or where the caps are different fractions (see _jax_limit_problem)."""
    limits = resolution.plan.limits or ()
    if len(limits) == 1 and isinstance(limits[0], grammar.Percent):  # JAX's fraction exactly, above the step
        return f"{max(limits[0].value / 100, JAX_FRACTION_STEP):g}"
    fractions = [g.cap_mib / g.total_mib for g in resolution.gpus if g.cap_mib is not None and g.total_mib]
    # Sizes in MiB: the same share of two GPUs can differ in the fourth decimal, no more.
    if not fractions or max(fractions) - min(fractions) > 0.001:
        return None
    # Never 0, which JAX would take as "no memory at all": a cap below the smallest step gets
    # that step (said in the reply, see _jax_rounded_up).
    return f"{max(math.floor(min(fractions) / JAX_FRACTION_STEP), 1) * JAX_FRACTION_STEP:g}"


JAX_FRACTION_STEP = 0.0001  # the fractions given to JAX are multiples of this


def _jax_rounded_up(resolution: Resolution) -> Optional[str]:
    """The note for caps below JAX's smallest fraction step (which JAX gets instead), or None."""
    caps = [g for g in resolution.gpus if g.cap_mib is not None and g.total_mib]
    fraction = _jax_fraction(resolution)
    if not caps or fraction is None or any(g.cap_mib / g.total_mib >= JAX_FRACTION_STEP for g in caps):
        return None
    given = ", ".join(f"{format_bytes(int(g.total_mib * JAX_FRACTION_STEP * MIB))} of GPU {g.index}" for g in caps)
    return f"JAX: gets a memory fraction of {fraction}, the smallest it is given ({given}), above this limit"


def _jax_limit_problem(resolution: Resolution) -> Optional[str]:
    """Why JAX cannot be given these caps: it takes one fraction of total memory for all its GPUs."""
    caps = [g for g in resolution.gpus if g.cap_mib is not None and g.total_mib]
    if not caps or _jax_fraction(resolution) is not None:
        return None
    shown = ", ".join(f"{g.cap_mib / g.total_mib:.0%} of GPU {g.index}" for g in caps)
    return (
        f"JAX takes one memory fraction for all its GPUs, and these limits are {shown}; for JAX, "
        "give one percentage for all (`%gpu limit 50%`) or sizes that are the same share of each GPU"
    )


def _gpu_part(plan: Plan) -> Plan:
    return Plan(**{**_fields(plan), "precision": None})


def _fields(plan: Plan) -> dict[str, Any]:
    return {name: getattr(plan, name) for name in ("visible", "growth", "limits", "split", "allocator", "precision")}


def _difference(resolution: Resolution, command: Any, force: InForce) -> tuple[bool, str]:
    visible = force.visible_nvml
    shown = "GPU " + ",".join(map(str, visible)) if visible else "no GPU"
    if isinstance(command, grammar.Use):
        wanted = resolution.visible
        return (wanted is not None and tuple(wanted) != visible), f"{shown} visible"
    if not visible:
        return True, "no GPU visible (so GPU memory settings cannot take effect)"
    if isinstance(command, grammar.Grow):
        return bool(force.growth) != command.on, f"memory growth {'on' if force.growth else 'off'}"
    if isinstance(command, grammar.Allocator):
        wanted = "default" if command.name == "platform" else command.name  # platform: JAX's only
        return force.allocator != wanted, f"the {force.allocator} allocator"
    for index in visible:
        planned = resolution.gpu(index)
        current = force.logical_mib.get(index)
        if (planned.logical_mib if planned else None) != current:
            return True, f"GPU {index} at {_logical_text(current)}"
    return False, ""


def _logical_text(sizes: Optional[tuple[int, ...]]) -> str:
    if not sizes:
        return "no limit"
    if len(sizes) == 1:
        return f"a limit of {sizes[0]} MiB"
    return f"{len(sizes)} logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}"


def _free_report(
    keras_cleared: bool,
    tf_stage: Stage,
    force: Optional[InForce],
    policy: Optional[str],
    before_tf: dict[str, AllocatorStats],
    after_tf: dict[str, AllocatorStats],
    before: DriverReading,
    after: DriverReading,
) -> str:
    started = tf_stage is Stage.STARTED
    if keras_cleared:
        lines = ["Ran Keras clear_session and garbage collection."]
    elif tf_stage is not Stage.NOT_IMPORTED:
        lines = ["Ran garbage collection (Keras is not imported: no Keras session to clear)."]
    else:
        lines = ["Ran garbage collection."]
    if policy is not None and keras_cleared:
        lines[0] += f" Re-applied precision {policy} (clear_session resets it)."
    if tf_stage is not Stage.NOT_IMPORTED and not started:
        lines.append("TensorFlow has not started, so it holds no memory to free.")
    lines += _in_use_lines(
        "TensorFlow", {d: s.current_bytes for d, s in before_tf.items()}, {d: s.current_bytes for d, s in after_tf.items()}
    )
    if started and not before_tf:
        lines.append("TensorFlow's allocator keeps no statistics on these devices (nothing to compare).")
    returned = 0
    for index in sorted(set(before.by_gpu) | set(after.by_gpu)):
        b_n, a_n = before.by_gpu.get(index), after.by_gpu.get(index)
        lines.append(
            f"GPU {index}  this process per the driver (NVML): {format_bytes(b_n)} -> "
            f"{format_bytes(a_n)} ({format_change(b_n, a_n)})"
        )
        if b_n is not None and a_n is not None and a_n < b_n:
            returned += b_n - a_n
    if returned:
        lines.append(f"{format_bytes(returned)} went back to the driver (NVML reading).")
    elif started:
        allocator = force.allocator if force is not None else "default"
        lines.append(_kept_memory_note(allocator, before.missing))
    return "\n".join(lines)


def _torch_free_lines(emptied: bool, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """PyTorch's part of `%gpu free`: its allocator's figures per device, before and after."""
    if not emptied:
        return ["PyTorch has not started CUDA, so it holds no GPU memory to free."]
    lines = ["Ran torch.cuda.empty_cache(): PyTorch's unused cached blocks go back to the driver."]
    for device in sorted(set(before) | set(after)):
        b, a = before.get(device), after.get(device)
        b_alloc, a_alloc = (b.allocated_bytes if b else None), (a.allocated_bytes if a else None)
        b_res, a_res = (b.reserved_bytes if b else None), (a.reserved_bytes if a else None)
        lines.append(
            f"{device}  PyTorch allocator: allocated {format_bytes(b_alloc)} -> {format_bytes(a_alloc)}, "
            f"reserved {format_bytes(b_res)} -> {format_bytes(a_res)} ({format_change(b_res, a_res)})"
        )
    return lines


def _in_use_lines(whose: str, before: dict[str, int], after: dict[str, int]) -> list[str]:
    """One line per device: the allocator's bytes in use before and after `%gpu free`."""
    return [
        f"{device}  {whose} allocator in use: {format_bytes(before.get(device))} -> "
        f"{format_bytes(after.get(device))} ({format_change(before.get(device), after.get(device))})"
        for device in sorted(set(before) | set(after))
    ]


def _jax_free_lines(start: Any, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """JAX's part of `%gpu free`: its caches cleared, its arrays left alone, its pool as it is."""
    lines = [
        "Ran jax.clear_caches(): compiled functions are dropped. JAX's arrays are yours and are not "
        "deleted: `del` the ones you no longer need, then run `%gpu free` again."
    ]
    lines += _in_use_lines(
        "JAX", {d: m.in_use_bytes for d, m in before.items()}, {d: m.in_use_bytes for d, m in after.items()}
    )
    if start is not None and start.gpu and start.allocator != "platform":
        lines.append(
            f"JAX's pool keeps what it took (the {start.allocator} allocator) until the kernel restarts; "
            "only `%gpu allocator platform` before JAX starts hands freed memory back."
        )
    return lines


def _kept_memory_note(allocator: str, missing: Optional[str]) -> str:
    reading = "The driver's reading shows nothing returned" if missing is None else missing[0].upper() + missing[1:]
    if allocator == "async":
        return f"{reading}; the async allocator returns freed memory as CUDA trims its pool."
    return (
        f"{reading}: TensorFlow keeps the memory it reserved until the kernel restarts; what "
        "clear_session frees is reusable by this kernel only. For memory that goes back, put "
        "`%gpu allocator async` before TensorFlow starts."
    )


_SESSION: Optional[Session] = None
_SESSION_LOCK = threading.Lock()


def get_session() -> Session:
    """The process's session for the magic, created on first use (creating it reads nothing).

    TensorFlow is process-wide, so one kernel has one.  Hooks and threads are handed the
    session (or its machine) when they are made; they never call this.
    """
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = Session()
        return _SESSION


def set_device_source(lib: Any) -> None:
    """Read GPUs through ``lib`` (a pynvml-like object, e.g. ``tfgpu_magic.simulated.shared_server()``)."""
    get_session().machine.nvml = Nvml(lib=lib)
