"""The machine as one kernel sees it: NVML, the process environment, CUDA, the allocation.

One :class:`Machine` is passed explicitly to whatever needs it (the session, the import hooks,
the monitor's sampler, the out-of-memory explanation); nothing looks it up from a global.
Facts are captured when they become true and read from that one record afterwards:

* the **allocation**, the ``CUDA_VISIBLE_DEVICES`` the kernel inherited (a scheduler's or an
  administrator's), read when the machine is created;
* what **CUDA saw** when it started in the process (:class:`~tfgpu_magic.frameworks.base.CudaRecord`,
  made by whichever framework started it), and the GPUs CUDA found for a framework that lists
  them as a stage of its own; each framework's adapter records those at the moment they happen.

Nothing is read from NVML or a framework when a Machine is created.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from ..command.plan import MachineFacts, Resolution
from ..command.units import MIB
from ..frameworks.base import CUDA_ENV, CudaRecord, Framework
from ..gpus import SIMULATED_SOURCE_ENV, numbering, platform
from ..gpus.nvml import GpuLost, Nvml, NvmlUnavailable, ReadingFailed

__all__ = ["Machine"]


class Machine:
    def __init__(
        self,
        nvml: Nvml | None = None,
        env: MutableMapping[str, str] | None = None,
    ) -> None:
        self.env: MutableMapping[str, str] = os.environ if env is None else env
        # The real driver, unless the Jupyter server that started this kernel reads a simulated
        # one and named it in the kernel's environment (then the kernel reads that same one).
        self.nvml = nvml if nvml is not None else Nvml(lib=_simulated_source(self.env))
        self.cuda_record = CudaRecord()  # what CUDA read at its start, whichever framework started it
        self.frameworks: tuple[Framework, ...] = ()  # the kernel's adapters (see attach)
        self._frozen_cuda_map: list[int] | None = None  # CUDA's numbering, fixed once CUDA started
        # The variables tfgpu_magic may set, as the kernel inherited them: CUDA's now, each
        # framework's as it is attached (at extension load, before any command).
        self.inherited = {name: self.env.get(name) for name in CUDA_ENV}
        # MPS's per-process limit: set by `%gpu limit ... --hard` before CUDA starts (kept if inherited).
        self.inherited[platform.MPS_LIMIT_ENV] = self.env.get(platform.MPS_LIMIT_ENV)
        self._written: dict[str, str | None] = {}  # what we last set each variable to
        self._allocation: numbering.Allocation | None = None
        # The platform's share variables as the kernel inherited them, and the shares they make
        # (read once NVML can number the GPUs; see platform_shares).
        self.inherited_platform = platform.inherited_variables(self.env)
        self._platform_shares: dict[int, platform.PlatformShare] | None = None

    def attach(self, frameworks: tuple[Framework, ...]) -> None:
        """The kernel's adapters: they read and write this machine's environment and CUDA record."""
        self.frameworks = frameworks
        for framework in frameworks:
            framework.environ, framework.cuda_record = self.env, self.cuda_record
            for name in framework.managed_variables:
                self.inherited.setdefault(name, self.env.get(name))

    # -- the environment ------------------------------------------------------------------------
    def met_at_load(self, environment: Mapping[str, str], written: Mapping[str, str | None]) -> None:
        """The machine is made after the extension loaded (at the first ``%gpu`` or framework
        import): what the kernel inherited is the environment as it was at load (``environment``,
        a copy taken then), and ``written`` is what loading set in it since."""
        for name in self.inherited:
            self.inherited[name] = environment.get(name)
        self.inherited_platform = platform.inherited_variables(environment)
        self._platform_shares = None
        self._written.update(written)

    def set_env(self, name: str, value: str | None) -> None:
        """Set (or, with None, remove) a variable CUDA or a framework reads, remembering we did."""
        if value is None:
            self.env.pop(name, None)
        else:
            self.env[name] = value
        self._written[name] = value

    def save_env(self, also: tuple[str, ...] = ()) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """The managed variables (and ``also``) as they are now, with what we wrote: for restore_env."""
        names = dict.fromkeys((*self.inherited, *also))
        return {name: self.env.get(name) for name in names}, dict(self._written)

    def restore_env(self, saved: tuple[dict[str, str | None], dict[str, str | None]]) -> None:
        """Put back what save_env saw: a command that failed half-way leaves no variable behind."""
        values, written = saved
        for name, value in values.items():
            if self.env.get(name) != value:
                if value is None:
                    self.env.pop(name, None)
                else:
                    self.env[name] = value
        self._written = written

    def unmanaged_value(self, name: str) -> str | None:
        """The variable as the user or the environment left it: ours undone, a hand-made value kept."""
        if name in self._written and self.env.get(name) == self._written[name]:
            return self.inherited.get(name)
        return self.env.get(name)

    def set_by_hand(self, name: str) -> bool:
        """Whether the variable's value now is neither what the kernel inherited nor what
        tfgpu_magic last wrote: someone set (or removed) it in ``os.environ`` by hand."""
        value = self.env.get(name)
        if name in self._written:
            return value != self._written[name]
        return value != self.inherited.get(name)

    # -- GPUs -----------------------------------------------------------------------------------
    def gpu_count(self) -> int | None:
        return self.nvml.device_count() if self.nvml.available() else None

    def uuids(self) -> list[str | None] | None:
        """Every GPU's UUID in nvidia-smi order, or None without NVML."""
        count = self.gpu_count()
        return None if count is None else [self.nvml.uuid(i) for i in range(count)]

    def totals_mib(self) -> dict[int, int | None]:
        count = self.gpu_count()
        if count is None:
            return {}
        totals = {i: self.nvml.total_bytes(i) for i in range(count)}
        return {i: None if t is None else t // MIB for i, t in totals.items()}

    def mig_instances(self) -> list[numbering.MigInstance] | None:
        """Every MIG instance on the machine (what ``MIG-`` entries name); None when unknown:
        no NVML, or a GPU whose MIG mode or instances could not be read."""
        count = self.gpu_count()
        if count is None:
            return None
        found = []
        try:
            for index in range(count):
                for device in self.nvml.mig_devices(index):
                    if (
                        device.uuid is None
                        or device.gpu_instance_id is None
                        or device.compute_instance_id is None
                    ):
                        return None
                    total = device.memory.total_bytes if device.memory else None
                    found.append(
                        numbering.MigInstance(
                            device.uuid, index, device.gpu_instance_id, device.compute_instance_id, total
                        )
                    )
        except (GpuLost, ReadingFailed, NvmlUnavailable):
            return None
        return found

    def _mig_for(self, value: str | None) -> list[numbering.MigInstance] | None:
        """MIG instances, read only for a value that names some (they cost NVML calls per GPU)."""
        return self.mig_instances() if value is not None and "MIG-" in value else None

    def allocation(self) -> numbering.Allocation:
        """The GPUs the environment allocated to this kernel (read once NVML can match UUIDs)."""
        if self._allocation is None or (self._allocation.gpus is None and self.nvml.available()):
            raw = self.inherited["CUDA_VISIBLE_DEVICES"]
            self._allocation = numbering.allocation_from(raw, self.uuids(), self._mig_for(raw))
        return self._allocation

    def platform_shares(self) -> dict[int, platform.PlatformShare]:
        """Each GPU's platform share (nvidia-smi index -> share), read from what the kernel
        inherited the first time NVML can number the GPUs, and kept: every report reads this."""
        if self._platform_shares is not None:
            return self._platform_shares
        raw_visible = self.inherited.get("CUDA_VISIBLE_DEVICES")
        if not platform.may_grant_a_share(self.inherited_platform, raw_visible):
            self._platform_shares = {}  # nothing inherited could: no NVML start for it (a framework's import asks)
            return self._platform_shares
        count = self.gpu_count()
        if count is None:
            return {}
        gpus = [platform.GpuFacts(i, self.nvml.uuid(i), self.nvml.total_bytes(i)) for i in range(count)]
        inherited_cuda = {name: self.inherited.get(name) for name in CUDA_ENV}
        raw = inherited_cuda.get("CUDA_VISIBLE_DEVICES")
        cuda_map = numbering.cuda_to_nvml(inherited_cuda, [g.uuid for g in gpus], self._mig_for(raw))
        mig: dict[int, int] = {}
        for instance in self.allocation().mig:
            if instance.total_bytes is not None:
                mig[instance.gpu] = min(mig.get(instance.gpu, instance.total_bytes), instance.total_bytes)
        self._platform_shares = platform.read_shares(self.inherited_platform, gpus, cuda_map, mig)
        return self._platform_shares

    # -- CUDA's numbering -----------------------------------------------------------------------
    def cuda_env(self) -> dict[str, str | None]:
        """CUDA's variables as CUDA read them at its start in this process (whichever framework
        started it), or as it would read them now."""
        seen = self.cuda_record.capture
        if seen is not None:
            return {name: seen.get(name) for name in CUDA_ENV}
        return {name: self.env.get(name) for name in CUDA_ENV}

    def cuda_map(self) -> list[int]:
        """nvidia-smi index of each CUDA device (TensorFlow's physical GPU k, PyTorch's cuda:k and
        JAX's gpu:k are entry k); made once after CUDA started (its numbering never changes then)."""
        if self._frozen_cuda_map is not None:
            return list(self._frozen_cuda_map)
        started = self.cuda_record.capture is not None
        uuids = self.uuids()
        env = self.cuda_env()
        if uuids is None:  # no NVML: trust the indices as written
            return numbering.cuda_to_nvml(env, [None] * 64)
        found = numbering.cuda_to_nvml(env, uuids, self._mig_for(env.get("CUDA_VISIBLE_DEVICES")))
        if started:
            self._frozen_cuda_map = found
        return list(found)

    def numbering_note(self) -> str | None:
        """Why CUDA's numbers may differ from nvidia-smi's, when they may (once CUDA has numbered them)."""
        if self.cuda_record.capture is None:
            return None
        env = self.cuda_env()
        if numbering.order_is_nvml(env):
            return None
        names = {self.nvml.name(i) for i in range(self.gpu_count() or 0)}
        if len(names) <= 1:
            return None  # one model: fastest-first ties fall back to bus order
        return (
            f"CUDA numbered the GPUs with CUDA_DEVICE_ORDER={env.get('CUDA_DEVICE_ORDER') or 'FASTEST_FIRST'} "
            "before tfgpu_magic was loaded, so on this machine of mixed GPUs its numbers may not be "
            f"nvidia-smi's; load the extension before {self.cuda_record.by or 'a framework'} starts CUDA"
        )

    def listed(self) -> bool:
        """Whether CUDA has listed the GPUs for a framework that lists them as a stage of its own."""
        return any(f.enumerated() for f in self.frameworks)

    def _lister(self) -> Framework | None:
        """The framework CUDA listed the GPUs for, as a stage of its own (TensorFlow's enumeration)."""
        return next((f for f in self.frameworks if f.enumerated()), None)

    def cuda_found(self) -> tuple[int, ...] | None:
        """nvidia-smi indices of the GPUs CUDA found when a framework listed them; None before."""
        lister = self._lister()
        found = None if lister is None else lister.cuda_found()
        if found is None:
            return None
        cuda_map = self.cuda_map()
        return tuple(sorted(cuda_map[k] for k in found if k < len(cuda_map)))

    def visible_value(self, resolution: Resolution) -> str | None:
        """The CUDA_VISIBLE_DEVICES that shows CUDA ``resolution``'s GPUs (None: unset), in the
        allocation's own words where a scheduler allocated GPUs (MIG instances keep their UUIDs)."""
        plan, allocation = resolution.plan, self.allocation()
        if plan.visible is None or (plan.visible == "all" and not allocation.restricted):
            return self.unmanaged_value("CUDA_VISIBLE_DEVICES") if plan.visible is None else None
        if plan.visible == "all" and resolution.visible is None:
            return allocation.raw  # the allocation as the environment wrote it
        if resolution.visible is not None:
            gpus = resolution.visible
        else:  # unresolved: the GPUs as asked ("all" and "none" are resolved, or returned above)
            gpus = tuple(sorted(plan.visible)) if isinstance(plan.visible, tuple) else ()
        if allocation.restricted and allocation.gpus is not None:
            return allocation.env_value(gpus)
        return numbering.visible_env_value(gpus)

    def facts(self) -> MachineFacts:
        """What :func:`tfgpu_magic.command.plan.resolve` needs, read now."""
        count = self.gpu_count()
        allocation = self.allocation()
        cuda_found = self.cuda_found()
        if cuda_found is not None:
            default = cuda_found
        elif count is None:
            default = None
        else:
            # Once a framework started CUDA, the value CUDA read then (the record); before, the user's.
            started = self.cuda_record.capture is not None
            raw = (
                self.cuda_env()["CUDA_VISIBLE_DEVICES"]
                if started
                else self.unmanaged_value("CUDA_VISIBLE_DEVICES")
            )
            visible = numbering.cuda_to_nvml(
                {"CUDA_VISIBLE_DEVICES": raw}, self.uuids() or [], self._mig_for(raw)
            )
            default = tuple(sorted(set(visible)))
        totals = self.totals_mib()
        for index in {m.gpu for m in allocation.mig}:  # a MIG instance's memory, not its GPU's
            sizes = [m.total_bytes for m in allocation.instances_on(index)]
            known = [size for size in sizes if size is not None]
            totals[index] = None if len(known) < len(sizes) else min(known) // MIB
        return MachineFacts(
            count=count,
            totals_mib=totals,
            allocated=allocation.gpus,
            allocation_text=allocation.describe() if allocation.restricted else None,
            cuda_found=cuda_found,
            default_visible=default,
            shares=self.platform_shares(),
            listed_by=("the framework", "it")
            if (lister := self._lister()) is None
            else (lister.name, lister.module),
        )


def _simulated_source(env: Mapping[str, str]) -> Any:
    """The simulated server the environment names (a kernel of a Jupyter server reading one), else
    None: the real driver, and the simulated servers' module is not imported."""
    if not env.get(SIMULATED_SOURCE_ENV):
        return None
    from ..gpus import simulated

    return simulated.from_environment(env)
