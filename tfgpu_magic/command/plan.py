"""What was asked (:class:`Plan`), and what it means on this machine (:func:`resolve`).

A :class:`Plan` is the request, independent of TensorFlow's stage.  ``None`` in a field means
"not asked; TensorFlow's default".  :func:`resolve` turns it, once, into a :class:`Resolution`:
which nvidia-smi GPUs TensorFlow is shown, and each one's logical GPUs in MiB.  The
environment variables, the ``tf.config`` calls, ``%gpu``, the panel, the out-of-memory
explanation and the claims all read that one object.

Decisions on combinations TensorFlow mishandles:

* growth and a limit together: TensorFlow silently drops growth on a GPU with a logical
  device configuration, so growth is carried by ``TF_FORCE_GPU_ALLOW_GROWTH=true``, which its
  allocator honours for virtual devices too.  The user gets both: grow up to the cap.
* growth is always the same on every visible GPU (TensorFlow fails at the first op otherwise).
* ``split N`` divides the limit (or, without one, the GPU's memory less a reserve for the
  CUDA context) into N equal logical GPUs; ``split 4G,4G`` names the sizes and excludes a limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from typing import Protocol

from ..records import Record
from . import commands
from .commands import Percent, Size
from .units import MIB, format_bytes


class PlatformShare(Protocol):
    """The platform's share of one GPU as resolving reads it (``tfgpu_magic.gpus.platform`` makes them)."""

    @property
    def bytes(self) -> int: ...

    def short(self) -> str: ...


__all__ = ["CONTEXT_RESERVE_MIB", "GpuPlan", "MachineFacts", "Plan", "PlanError", "Resolution", "resolve"]

# Memory a CUDA context and TensorFlow's libraries take outside any TensorFlow limit
# (landscape.md: a 512 MB limit showed 1869 MiB in nvidia-smi).  Left free when `split N`
# must divide a whole GPU.
CONTEXT_RESERVE_MIB = 1536

# A CUDA context with lazy loading (CUDA >= 11.7), outside any framework's pool: what a kernel
# under a platform share is left free when it asks for no limit of its own (sharing.md).
SHARE_CONTEXT_MIB = 300


class PlanError(ValueError):
    """A request that contradicts itself or the machine; the message says how to resolve it."""


Visible = (
    tuple[int, ...] | commands.Everything | None
)  # nvidia-smi indices, "all", "none", or None (not asked)


class Plan(Record):
    """What was asked, field by field (``None``: not asked, the framework's default)."""

    visible: Visible = None
    growth: bool | None = None
    limits: tuple[Size, ...] | None = None
    split: commands.Split | None = None
    allocator: str | None = None  # "async", "default" or "platform" (JAX only)
    precision: str | None = None
    # The kernel's limit named in shares (framework key, size on each visible GPU); `limits` is
    # then None, and each GPU's cap is the shares' sum.
    shares: tuple[tuple[str, Size], ...] | None = None
    # `limit ... --hard`: the limit is to hold for the whole process (MPS or MIG), checked by the session.
    hard: bool = False

    def with_command(self, command: object) -> Plan:
        """The plan after one configuration command; raises :class:`PlanError` on a conflict."""
        if isinstance(command, commands.Use):
            if isinstance(command.gpus, commands.Auto):
                raise PlanError("`use auto` is resolved to GPU numbers before it is planned")
            return replace(self, visible=command.gpus)
        if isinstance(command, commands.Grow):
            return replace(self, growth=command.on)
        if isinstance(command, commands.Limit):
            if (command.sizes is not None or command.shares is not None) and self.split and self.split.sizes:
                raise PlanError(
                    "`%gpu split` already names the size of each logical GPU, so a limit would "
                    "contradict it; run `%gpu split off` first, or `%gpu split N` to divide the limit"
                )
            return replace(self, limits=command.sizes, shares=command.shares, hard=command.hard)
        if isinstance(command, commands.Split):
            if command.sizes and (self.limits or self.shares):
                raise PlanError(
                    f"`%gpu split {_sizes_text(command.sizes)}` names sizes, but a limit of "
                    f"{(self.describe_limit() or 'limit ?')[6:]} is set; run `%gpu limit off` first, or use "
                    "`%gpu split N` to divide the limit into N logical GPUs"
                )
            return replace(self, split=None if command.off else command)
        if isinstance(command, commands.Allocator):
            return replace(self, allocator=command.name)
        if isinstance(command, commands.Precision):
            return replace(self, precision=command.policy)
        raise TypeError(f"not a configuration command: {command!r}")

    def describe_limit(self) -> str | None:
        """The limit as its command would give it again ("limit 4096MiB", "limit 6144MiB tensorflow, ...")."""
        return next((line for line in self.describe() if line.startswith("limit ")), None)

    def describe(self) -> list[str]:
        """One line per requested setting, in the words of the commands that set it."""
        lines = []
        if self.visible is not None:
            shown = self.visible if isinstance(self.visible, str) else ",".join(map(str, self.visible))
            lines.append(f"use {shown}")
        if self.growth is not None:
            lines.append("grow" if self.growth else "grow off")
        hard = " --hard" if self.hard else ""
        if self.limits is not None:
            lines.append(f"limit {_sizes_text(self.limits)}{hard}")
        if self.shares is not None:
            lines.append(
                "limit " + ", ".join(f"{_sizes_text((size,))} {key}" for key, size in self.shares) + hard
            )
        if self.split is not None:
            shown = str(self.split.count) if self.split.count else _sizes_text(self.split.sizes or ())
            lines.append(f"split {shown}")
        if self.allocator is not None:
            lines.append(f"allocator {self.allocator}")
        if self.precision is not None:
            lines.append(f"precision {self.precision}")
        return lines

    @property
    def gpu_settings(self) -> bool:
        """True when something is asked that needs a GPU to take effect.

        TensorFlow's own defaults (`use all`, `use none`, `grow off`, `allocator default`) hold
        without one; the precision is Keras's, not the GPU's.
        """
        named_gpus = isinstance(self.visible, tuple) and bool(self.visible)
        capped = self.limits is not None or self.shares is not None
        return (
            named_gpus
            or self.growth is True
            or capped
            or self.split is not None
            or (self.allocator in ("async", "platform"))
        )


def _sizes_text(sizes: tuple[Size, ...]) -> str:
    return ",".join(str(s) if isinstance(s, Percent) else f"{s}MiB" for s in sizes)


class MachineFacts(Record):
    """What resolving needs to know about the machine (built by :class:`tfgpu_magic.kernel.machine.Machine`).

    ``count`` and ``totals_mib`` come from NVML (None without it).  ``allocated`` are the
    nvidia-smi indices the environment allows (None: unknown); ``cuda_found`` the GPUs CUDA
    listed at enumeration (None before it).  ``default_visible`` is what TensorFlow shows when
    no ``%gpu use`` is asked.
    """

    count: int | None
    totals_mib: dict[int, int | None]
    allocated: tuple[int, ...] | None
    allocation_text: str | None  # "GPU 2, 3" when the environment restricts, else None
    cuda_found: tuple[int, ...] | None
    default_visible: tuple[int, ...] | None
    # The framework CUDA listed the GPUs for (as shown, and as imported): said when a GPU is missing.
    listed_by: tuple[str, str] = ("the framework", "it")
    # nvidia-smi index -> the platform's share of that GPU (gpus/platform.py), as inherited.
    shares: Mapping[int, PlatformShare] = field(default_factory=dict)


class GpuPlan(Record):
    """One visible GPU as the plan configures it."""

    index: int  # nvidia-smi's
    total_mib: int | None
    cap_mib: int | None  # the per-GPU limit, resolved (None: no limit)
    logical_mib: tuple[int, ...] | None  # logical GPUs to create (a limit alone: one of that size)
    shares_mib: tuple[tuple[str, int], ...] = ()  # the named shares of ``cap_mib`` (framework key, MiB)
    # Set when no limit was asked and ``cap_mib`` is the platform's share less a CUDA context:
    # the share's one-line description (said as such wherever the limit is shown).
    within_share: str | None = None

    def with_cap(self, cap_mib: int) -> GpuPlan:
        """This GPU with a part of its cap (a framework's share of the kernel's limit): a limit's
        one logical GPU shrinks to it, `split N`'s N logical GPUs divide it."""
        logical = self.logical_mib
        if logical:
            count = len(logical) if len(set(logical)) == 1 and self.cap_mib is not None else 1
            logical = (max(1, cap_mib // count),) * count
        return replace(self, cap_mib=cap_mib, logical_mib=logical, shares_mib=())

    @property
    def configured_bytes(self) -> int | None:
        """Everything TensorFlow may take on this GPU (the panel's limit line), or None."""
        return None if not self.logical_mib else sum(self.logical_mib) * MIB


class Resolution(Record):
    """A plan made concrete for this machine: the one answer every reader uses."""

    plan: Plan
    visible: tuple[int, ...] | None  # nvidia-smi indices TensorFlow will see; None: unknown
    gpus: tuple[GpuPlan, ...]  # one per visible GPU, in order

    def gpu(self, index: int) -> GpuPlan | None:
        return next((g for g in self.gpus if g.index == index), None)

    def logical_mib(self) -> dict[int, tuple[int, ...] | None]:
        return {g.index: g.logical_mib for g in self.gpus}

    def with_caps(self, caps_mib: dict[int, int]) -> Resolution:
        """The same request, with each listed GPU's cap replaced (a framework's share of it)."""
        gpus = tuple(g.with_cap(caps_mib[g.index]) if g.index in caps_mib else g for g in self.gpus)
        return replace(self, gpus=gpus)

    def caps_bytes(self) -> dict[int, int]:
        """nvidia-smi index -> bytes TensorFlow may take there (only GPUs with a configured cap)."""
        return {g.index: g.configured_bytes for g in self.gpus if g.configured_bytes is not None}

    def describe(self) -> list[str]:
        """The request in the commands' words, percentages and splits shown per GPU."""
        lines = self.plan.describe()
        sized = [g for g in self.gpus if g.logical_mib]
        if not sized or (self.plan.limits is None and self.plan.shares is None and self.plan.split is None):
            return lines
        per_gpu = "; ".join(f"GPU {g.index}: {_logical_text(g)}" for g in sized)
        return [*lines, f"per GPU: {per_gpu}"]


def _logical_text(gpu: GpuPlan) -> str:
    sizes = gpu.logical_mib or ()
    if len(sizes) == 1:
        return format_bytes(sizes[0] * MIB)
    return (
        f"{len(sizes)} x {format_bytes(sizes[0] * MIB)}"
        if len(set(sizes)) == 1
        else " + ".join(format_bytes(s * MIB) for s in sizes)
    )


def resolve(plan: Plan, facts: MachineFacts) -> Resolution:
    """The plan on this machine; raises :class:`PlanError` (one line, with the remedy)."""
    visible = _visible(plan, facts)
    if plan.limits is not None and len(plan.limits) > 1:
        count = len(visible) if visible is not None else None
        if count is not None and count != len(plan.limits):
            raise PlanError(
                f"`%gpu limit` gives {len(plan.limits)} sizes but {count} GPU"
                f"{'s are' if count != 1 else ' is'} visible; give one size for all GPUs "
                "or one per visible GPU"
            )
    positions = visible if visible is not None else tuple(range(len(plan.limits or ())))
    gpus = tuple(
        _gpu_plan(plan, position, index, facts.totals_mib.get(index), facts.shares.get(index))
        for position, index in enumerate(positions)
    )
    return Resolution(plan, visible, gpus if visible is not None else ())


def _visible(plan: Plan, facts: MachineFacts) -> tuple[int, ...] | None:
    if plan.visible is None:
        return facts.default_visible
    if plan.visible == "none":
        return ()
    if facts.allocation_text is not None and facts.allocated is None:
        allowed = None  # an allocation whose GPUs cannot be numbered: not every GPU either
    else:
        allowed = (
            facts.allocated
            if facts.allocated is not None
            else (None if facts.count is None else tuple(range(facts.count)))
        )
    if not isinstance(plan.visible, tuple):  # "all"
        return (
            allowed
            if facts.cuda_found is None or allowed is None
            else tuple(i for i in allowed if i in facts.cuda_found)
        )
    wanted = tuple(sorted(plan.visible))
    if facts.count is not None:
        missing = [i for i in wanted if i >= facts.count]
        if missing:
            valid = f"0-{facts.count - 1}" if facts.count else "none"
            raise PlanError(
                f"no GPU {','.join(map(str, missing))}: this machine has {facts.count} GPU"
                f"{'s' if facts.count != 1 else ''} (numbers {valid}, as nvidia-smi shows); {_use_forms()}"
            )
    if facts.allocation_text is not None and facts.allocated is None:
        raise PlanError(
            f"GPU {','.join(map(str, wanted))} cannot be checked against this kernel's allocation: the "
            f"environment allocated {facts.allocation_text}, whose GPUs cannot be numbered here, and a GPU "
            "number could leave it; valid here: %gpu use all | %gpu use none"
        )
    if facts.allocation_text is not None and facts.allocated is not None:
        outside = [i for i in wanted if i not in facts.allocated]
        if outside:
            raise PlanError(
                f"GPU {','.join(map(str, outside))} is outside this kernel's allocation: the environment "
                f"allocated {facts.allocation_text} (CUDA_VISIBLE_DEVICES was set before the kernel started); "
                f"{_use_forms()}"
            )
    if facts.cuda_found is not None:
        hidden = [i for i in wanted if i not in facts.cuda_found]
        if hidden:
            raise PlanError(_not_found_by_cuda(hidden, facts.cuda_found, *facts.listed_by))
    return wanted


def _not_found_by_cuda(hidden: list[int], found: tuple[int, ...], name: str, module: str) -> str:
    if not found:
        return (
            f"{name} found no GPU at all (a CPU-only {name} build, or no working NVIDIA "
            f"driver), so `%gpu use` cannot take effect; check `nvidia-smi` and `pip show {module}`"
        )
    return (
        f"{name} did not find GPU {','.join(map(str, hidden))} (it found: {','.join(map(str, found))}); "
        f"it was hidden by CUDA_VISIBLE_DEVICES before {name} listed its devices. Restart the kernel "
        f"and put the `%gpu use` line before `import {module}`"
    )


def _gpu_plan(
    plan: Plan, position: int, index: int, total_mib: int | None, share: PlatformShare | None = None
) -> GpuPlan:
    cap = _cap_mib(plan, position, index, total_mib)
    within = None
    if share is not None:
        share_mib = share.bytes // MIB
        asked = cap if cap is not None else sum(plan.split.sizes) if plan.split and plan.split.sizes else None
        if asked is not None and asked > share_mib:
            raise PlanError(
                f"{asked} MiB is above this kernel's share of GPU {index} ({share.short()}); {_within(share_mib)}"
            )
        whole_gpu = total_mib is not None and share_mib >= total_mib
        if cap is None and not whole_gpu and (plan.split is None or plan.split.count):
            cap, within = max(1, share_mib - SHARE_CONTEXT_MIB), share.short()
    if cap is not None and total_mib is not None and cap > total_mib:
        raise PlanError(
            f"GPU {index} has {total_mib} MiB; {cap} MiB does not fit "
            "(use a smaller size or a percentage, e.g. `%gpu limit 90%`)"
        )
    shares = tuple((key, _mib(size, total_mib)) for key, size in plan.shares or ())
    return GpuPlan(index, total_mib, cap, _logical_sizes(plan, index, cap, total_mib), shares, within)


def _within(share_mib: int) -> str:
    """What to ask for under a share: its size less a CUDA context, where the share has room for one."""
    if share_mib <= SHARE_CONTEXT_MIB:
        return (
            f"ask for at most {share_mib} MiB, though that leaves no room for a CUDA context (about "
            f"{SHARE_CONTEXT_MIB} MiB): no framework can start on this GPU within it; ask the platform for more"
        )
    return (
        f"ask for at most {share_mib} MiB, e.g. `%gpu limit {share_mib - SHARE_CONTEXT_MIB}M` "
        "(the share less a CUDA context)"
    )


def _cap_mib(plan: Plan, position: int, index: int, total_mib: int | None) -> int | None:
    """The cap of the ``position``-th visible GPU, in MiB; a list gives one size per GPU, in order;
    named shares add up to the kernel's cap."""
    if plan.shares is not None:
        return sum(_mib(size, total_mib) for _, size in plan.shares)
    if plan.limits is None:
        return None
    sizes = plan.limits
    return _mib(sizes[0] if len(sizes) == 1 else sizes[position], total_mib)


def _mib(size: Size, total_mib: int | None) -> int:
    if isinstance(size, Percent):
        if total_mib is None:
            raise PlanError(
                f"a limit of {size} needs each GPU's total memory, which NVML cannot read here; "
                "give the limit in MiB or GiB instead (e.g. `%gpu limit 4G`)"
            )
        return max(1, int(total_mib * size.value / 100))
    return int(size)


def _logical_sizes(plan: Plan, index: int, cap: int | None, total_mib: int | None) -> tuple[int, ...] | None:
    split = plan.split
    if split is None:
        return None if cap is None else (cap,)
    if split.sizes:
        if total_mib is not None and sum(split.sizes) > total_mib:
            raise PlanError(  # the remedy names the verb typed: `split`, not `limit`
                f"GPU {index} has {total_mib} MiB; {sum(split.sizes)} MiB does not fit "
                f"(use sizes that add up to at most {total_mib} MiB, or a count, e.g. `%gpu split 2`)"
            )
        return tuple(split.sizes)
    assert split.count is not None
    if cap is None:
        if total_mib is None:
            raise PlanError(
                f"`%gpu split {split.count}` needs the GPU's memory, which NVML cannot read here; "
                "name the sizes instead (e.g. `%gpu split 4G,4G`)"
            )
        cap = max(split.count, total_mib - CONTEXT_RESERVE_MIB)
    return (cap // split.count,) * split.count


def _use_forms() -> str:
    """``use``'s valid forms, for a refusal (the command language is loaded only to word one)."""
    from .grammar import usage

    return usage("use")
