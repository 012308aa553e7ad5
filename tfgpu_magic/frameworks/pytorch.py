"""PyTorch's side: the only code that touches ``torch``.

Like the TensorFlow adapter it never imports its framework: :meth:`PyTorch.on_import` receives
the module from the post-import hook once ``import torch`` has finished.

PyTorch starts CUDA lazily, at the first CUDA call (``torch.cuda.is_initialized()`` says
whether it has; ../shared/notes/frameworks.md).  Until then ``CUDA_VISIBLE_DEVICES`` still
works; the allocator's back end (``backend:cudaMallocAsync``) is read once, when the library
loads, so it must be in the environment before ``import torch`` (pytorch#104801).  A memory cap
is ``torch.cuda.set_per_process_memory_fraction``, which itself starts CUDA: the adapter queues
the caps with PyTorch's own ``torch.cuda._lazy_call``, so they are set the moment CUDA starts
(whoever starts it) and importing torch creates no CUDA context.  The same queued call records
the environment CUDA read.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..command import commands
from ..command.plan import Plan, Resolution
from ..command.units import MIB, format_bytes, format_change, format_size
from ..records import Record
from .base import (
    CUDA_ENV,
    Capture,
    Change,
    ChartedFigure,
    CudaRecord,
    DeviceMemory,
    FreeReport,
    Host,
    OomFacts,
    Refusal,
    ReportingDefaults,
    ReportView,
    ResettingPeakWindow,
    Stage,
    capture,
    installed,
    not_the_framework,
)

__all__ = [
    "ALLOC_CONF_ENV",
    "ASYNC_BACKEND",
    "NATIVE_ONLY_OPTIONS",
    "PyTorch",
    "TorchMemory",
    "alloc_conf_with_backend",
    "ignored_by_async",
]

# The allocator's settings.  From 2.8 the old name warns that it is deprecated in favour of
# PYTORCH_ALLOC_CONF, but 2.9.1 ignores the new name for CUDA (pytorch#183387): the old name is
# the one every release reads, so it is the one set unless the user chose the new one.
ALLOC_CONF_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
ASYNC_BACKEND = "cudaMallocAsync"
# Options that tune PyTorch's own (native) caching allocator: PyTorch's "CUDA semantics" page says
# they are specific to it, so under backend:cudaMallocAsync they do nothing.
NATIVE_ONLY_OPTIONS = (
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "release_lock_on_cudamalloc",
)


# Its out-of-memory message: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ..."
@functools.cache
def _oom_pattern() -> re.Pattern[str]:
    """The size and GPU in PyTorch's message: compiled at the first out-of-memory error, not at
    import (a status, which builds every adapter, never needs it)."""
    return re.compile(r"Tried to allocate (?P<size>[\d.]+ [KMGT]?i?B)\.(?: GPU (?P<gpu>\d+))?")


# What the adapter uses of ``torch``: a module without them is not PyTorch (a planted torch.py).
NEEDS = (
    "version",
    "cuda.is_initialized",
    "cuda._lazy_call",
    "cuda.device_count",
    "cuda.memory_allocated",
    "cuda.max_memory_allocated",
    "cuda.memory_reserved",
    "cuda.empty_cache",
    "cuda.reset_peak_memory_stats",
    "cuda.set_per_process_memory_fraction",
    "cuda.get_device_properties",
    "cuda.device",
)


class TorchMemory(Record):
    """PyTorch's caching allocator on one CUDA device, in bytes (not the driver's view)."""

    allocated_bytes: int  # held by live tensors
    peak_allocated_bytes: int  # since the last reset_peak_memory_stats
    reserved_bytes: int  # held by the allocator's cache (what the driver sees as this process's)


class PyTorch(ReportingDefaults):
    """The adapter: every question to PyTorch goes through one of these (one per process)."""

    key = "pytorch"
    name = "PyTorch"
    module = "torch"
    start_variables = ALLOC_CONF_ENV
    managed_variables = ALLOC_CONF_ENV  # what tfgpu_magic sets for it (the back end only)
    takes_effect = "when it starts CUDA"  # what a setting waits for once torch is imported

    def __init__(self) -> None:
        self._torch: Any = None
        self._lock = threading.Lock()
        self.loaded_with: Capture | None = None  # the allocator variables at import
        self.settings_at_import: str | None = None  # the allocator settings torch itself parsed then
        self.cuda_seen: Capture | None = None  # CUDA's variables when PyTorch started CUDA
        self.environ: Mapping[str, str] = os.environ  # where CUDA and the framework read their variables
        self.cuda_record: CudaRecord | None = None  # the kernel's, handed over by the session
        self.caps_bytes: dict[int, int] = {}  # CUDA index -> the cap queued or set
        self.caps_set: dict[int, float] = {}  # CUDA index -> the fraction set when CUDA started
        self.cap_errors: list[str] = []
        self._open_windows: set[ResettingPeakWindow] = set()
        self.refused: str | None = None  # why what `import torch` gave is not PyTorch
        self.memory_error: str | None = None  # the last reading of the allocator that failed

    # -- the moment torch arrives -----------------------------------------------------------------
    def on_import(self, module: Any) -> None:
        """Called on the importing thread once ``import torch`` has finished."""
        with self._lock:
            if self._torch is not None or self.refused is not None:
                return
            self.refused = not_the_framework(module, self.name, self.module, NEEDS)
            if self.refused is not None:
                return
            self._torch = module
            started = self._cuda_started()
            self.loaded_with = capture(ALLOC_CONF_ENV, late=started, env=self.environ)
            self.settings_at_import = _allocator_settings(module)
            if started:
                self.cuda_seen = capture(CUDA_ENV, late=True, env=self.environ)
                self._record_cuda()
        if not started:  # outside our lock: _lazy_call takes torch's initialisation lock
            module.cuda._lazy_call(self._note_cuda_start)

    def _note_cuda_start(self) -> None:
        """Run by PyTorch right after it started CUDA (its queued calls), on the starting thread."""
        if self.cuda_seen is None:
            self.cuda_seen = capture(CUDA_ENV, env=self.environ)
            self._record_cuda()
        self._set_caps()

    def _record_cuda(self) -> None:
        if self.cuda_record is not None and self.cuda_seen is not None:
            self.cuda_record.note(self.cuda_seen, self.name)

    def installed(self) -> bool:
        return self._torch is not None or installed(self.module)

    def read_environment(self, env: Mapping[str, str]) -> dict[str, str | None]:
        """Its allocator variables as torch read them at its import, or as ``env`` holds them before."""
        if self.loaded_with is not None:
            return dict(self.loaded_with.env)
        return {name: env.get(name) for name in self.start_variables}

    # -- the write side: what a setting means for PyTorch ---------------------------------------------
    def takes(self, command: Any) -> bool:
        """Not `split` (PyTorch has no logical GPUs) nor `allocator platform` (JAX's word)."""
        if isinstance(command, commands.Allocator):
            return command.name != "platform"
        return not isinstance(command, commands.Split)

    def consider(self, change: Change) -> str | None:
        """Its clause of the reply: refused where CUDA or the allocator has been read already."""
        command = change.command
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return self._async_ignores(change)
        if isinstance(command, commands.Allocator) and not self.takes(command):
            return "PyTorch keeps its allocator"  # `allocator platform`: JAX's own word
        if (
            isinstance(command, commands.Use)
            and stage is Stage.STARTED
            and change.plan.visible != change.before.visible
        ):
            seen = self.cuda_seen
            value = seen.get("CUDA_VISIBLE_DEVICES") if seen is not None else None
            shown = f"CUDA_VISIBLE_DEVICES={value}" if value is not None else "every GPU visible"
            raise Refusal(
                f"PyTorch has already started CUDA with {shown}, and CUDA reads it once per process. "
                f"Put `%gpu {change.what}` at the top of the notebook, before `import torch`, and restart the kernel"
            )
        if isinstance(command, commands.Allocator) and not self.cuda_build():
            return "PyTorch: a CPU build (torch.version.cuda is None) has no CUDA allocator to choose"
        if isinstance(command, commands.Allocator):
            loaded = self.backend()
            if loaded != command.name:
                raise Refusal(
                    f"PyTorch loaded with the {loaded} allocator and reads it only at `import torch`. "
                    f"Put `%gpu allocator {command.name}` at the top of the notebook, before `import torch`, "
                    "and restart the kernel"
                )
            return f"PyTorch: already loaded with the {loaded} allocator"
        if isinstance(command, commands.Grow):
            return "PyTorch: allocates on demand already, so `grow` changes nothing for it"
        if isinstance(command, commands.Split):
            return "PyTorch: has no logical GPUs, so `split` does not reach it"
        if isinstance(command, (commands.Limit, commands.Use)) and change.plan.gpu_settings:
            if not self.cuda_build():
                return "PyTorch: a CPU build (torch.version.cuda is None), so no GPU setting reaches it"
            if isinstance(command, commands.Limit):
                return (
                    "PyTorch: capped now" if stage is Stage.STARTED else "PyTorch: capped when it starts CUDA"
                )
            record = self.cuda_record
            if record is not None and record.capture is not None and record.by != self.name:
                return f"PyTorch: sees the GPUs CUDA showed {record.when} (`use` cannot change them)"
            lister = next((o for o in change.others if o.enumerated()), None)
            if lister is not None:  # listed before tfgpu_magic could record it
                return f"PyTorch: sees the GPUs CUDA showed when {lister.name} listed its devices (`use` cannot change them)"
            return "PyTorch: takes effect when it starts CUDA"
        return None

    def _async_ignores(self, change: Change) -> str | None:
        """`allocator async` over the user's own allocator options: the ones it ignores, named."""
        command = change.command
        if not (isinstance(command, commands.Allocator) and command.name == "async") or not self.installed():
            return None
        host = change.host
        for name in ALLOC_CONF_ENV:  # the one torch reads: the old name when both are set
            conf = host.unmanaged_value(name) if name in host.inherited else host.env.get(name)
            if conf:
                break
        ignored = ignored_by_async(conf)
        if not ignored:
            return None
        return (
            f"PyTorch: cudaMallocAsync ignores your {name} options {', '.join(ignored)} (they tune PyTorch's "
            "own caching allocator, which `allocator async` replaces)"
        )

    def prepare(self, change: Change) -> None:
        """The allocator's back end, in the variable torch reads at load (before `import torch` only):
        the user's own options are kept, and a user who chose PYTORCH_ALLOC_CONF keeps that name."""
        if self.stage() is not Stage.NOT_IMPORTED:
            return
        allocator = None if change.plan.allocator == "platform" else change.plan.allocator  # platform: JAX's
        host = change.host
        old_name, new_name = ALLOC_CONF_ENV
        backend = ASYNC_BACKEND if allocator == "async" else None
        if host.env.get(new_name) and not host.env.get(old_name):
            # The user chose the new name alone; with both set, torch reads only the old one.
            if allocator is not None:
                host.set_env(new_name, alloc_conf_with_backend(host.env.get(new_name), backend) or "")
            return
        base = host.unmanaged_value(old_name)
        host.set_env(old_name, base if allocator is None else alloc_conf_with_backend(base, backend))

    def give(self, resolution: Resolution, host: Host) -> bool:
        """The caps reach an imported CUDA build of torch (at once, or when CUDA starts)."""
        if self.stage() is Stage.NOT_IMPORTED or not self.cuda_build():
            return False
        cuda_map = host.cuda_map()
        by_nvml = {g.index: g.cap_mib for g in resolution.gpus if g.cap_mib is not None}
        self.cap({k: by_nvml[index] * MIB for k, index in enumerate(cuda_map) if index in by_nvml})
        return True

    def takes_share(self) -> bool:
        """A CUDA build that sees a GPU (the CUDA build on a machine without one takes no part)."""
        try:
            return self.found_gpus() > 0
        except Exception:  # no answer: it is not counted
            return False

    def share_fixed(self) -> bool:
        return False  # set_per_process_memory_fraction changes its cap at any time

    def arrived(self, plan: Plan) -> str | None:
        """A CPU build of torch: the settings that would have reached a CUDA build are named (a
        limit, named GPUs); growth means nothing to PyTorch and the precision is Keras's."""
        named = Plan(
            visible=plan.visible if isinstance(plan.visible, tuple) else None,
            limits=plan.limits,
            shares=plan.shares,
        )
        if self.cuda_build() or not named.describe():
            return None
        return (
            "PyTorch is a CPU build (torch.version.cuda is None), so these GPU settings cannot take effect "
            f"for it: {'; '.join(named.describe())}"
        )

    def enumerated(self) -> bool:
        return False  # PyTorch lists CUDA's GPUs as it starts it: no stage of its own

    def cuda_found(self) -> list[int] | None:
        return None

    def device_gpus(self, cuda_map: list[int]) -> dict[str, int]:
        """``cuda:k`` -> nvidia-smi index, once PyTorch started CUDA."""
        if self.stage() is not Stage.STARTED:
            return {}
        return {f"cuda:{k}": index for k, index in enumerate(cuda_map)}

    def set_precision(self, policy: str | None) -> str | None:
        """The policy is Keras's; plain PyTorch code has its own tool, named here."""
        if self.stage() is Stage.NOT_IMPORTED or policy in (None, "float32"):
            return None
        dtype = "torch.bfloat16" if "bfloat16" in str(policy) else "torch.float16"
        return (
            "PyTorch: the Keras policy does not reach plain PyTorch code: wrap the forward pass in "
            f'`torch.autocast("cuda", dtype={dtype})`'
        )

    def side_imports(self) -> dict[str, Callable[[Any, Plan], None]]:
        return {}

    def frozen(self, kept: Plan, host: Host) -> list[str]:
        return []  # its caps can change at any time; the allocator is refused at `%gpu allocator`

    def free_reading(self) -> dict[str, TorchMemory]:
        return self.memory()

    def free(self, plan: Plan, before: Any) -> FreeReport:
        """``torch.cuda.empty_cache()`` (after the kernel's garbage collection), with its figures."""
        if self.stage() is Stage.NOT_IMPORTED:
            return FreeReport()
        if not self.empty_cache():
            return FreeReport(("PyTorch has not started CUDA, so it holds no GPU memory to free.",))
        after = self.memory()
        lines = ["Ran torch.cuda.empty_cache(): PyTorch's unused cached blocks go back to the driver."]
        for device in sorted(set(before) | set(after)):
            b, a = before.get(device), after.get(device)
            b_alloc, a_alloc = (b.allocated_bytes if b else None), (a.allocated_bytes if a else None)
            b_res, a_res = (b.reserved_bytes if b else None), (a.reserved_bytes if a else None)
            lines.append(
                f"{device}  PyTorch allocator: allocated {format_bytes(b_alloc)} -> {format_bytes(a_alloc)}, "
                f"reserved {format_bytes(b_res)} -> {format_bytes(a_res)} ({format_change(b_res, a_res)})"
            )
        return FreeReport(tuple(lines))

    # -- the stage ----------------------------------------------------------------------------------
    def stage(self) -> Stage:
        """NOT_IMPORTED, IMPORTED (CUDA not started: visibility and caps still apply) or STARTED."""
        if self._torch is None:
            return Stage.NOT_IMPORTED
        return Stage.STARTED if self._cuda_started() else Stage.IMPORTED

    def _cuda_started(self) -> bool:
        try:
            return bool(self._torch.cuda.is_initialized())
        except Exception:  # a build without CUDA answers False; anything else is not a start
            return False

    def cuda_build(self) -> bool:
        """Whether this torch was built with CUDA (``torch.version.cuda``); a CPU build never sees a GPU."""
        return self._torch is not None and getattr(self._torch.version, "cuda", None) is not None

    def found_gpus(self) -> int:
        """How many GPUs PyTorch can use (``torch.cuda.device_count()``, which starts nothing)."""
        if not self.cuda_build():
            return 0
        return int(self._torch.cuda.device_count())

    def backend(self) -> str:
        """The allocator back end PyTorch loaded with, "async" or "default": from the settings torch
        parsed at load (``torch._C._accelerator_getAllocatorSettings``), else from the variables then.

        Torch 2.13 reads both names and, when both are set, only PYTORCH_CUDA_ALLOC_CONF.
        """
        if self.settings_at_import is not None:
            values = [self.settings_at_import]
        else:
            conf = self.loaded_with
            values = [] if conf is None else [conf.get(name) or "" for name in ALLOC_CONF_ENV]
        return "async" if any(f"backend:{ASYNC_BACKEND}" in v.replace(" ", "") for v in values) else "default"

    # -- caps ------------------------------------------------------------------------------------------
    def cap(self, caps_bytes: Mapping[int, int]) -> None:
        """Cap the caching allocator per CUDA device: now if CUDA has started, else when it starts."""
        with self._lock:
            self.caps_bytes = dict(caps_bytes)
        if self.stage() is Stage.STARTED:
            self._set_caps()

    def _set_caps(self) -> None:
        """``set_per_process_memory_fraction``: the cap over the device's total, as PyTorch reads it."""
        cuda = self._torch.cuda
        for index, cap in sorted(self.caps_bytes.items()):
            try:
                total = int(cuda.get_device_properties(index).total_memory)
                fraction = min(1.0, cap / total)
                cuda.set_per_process_memory_fraction(fraction, index)
                self.caps_set[index] = fraction
            except Exception as err:  # reported by %gpu; never raised into the user's first CUDA call
                self.cap_errors.append(f"cuda:{index}: {type(err).__name__}: {err}")

    # -- memory -------------------------------------------------------------------------------------------
    def memory(self) -> dict[str, TorchMemory]:
        """The caching allocator per started CUDA device (``cuda:0`` ...); empty before CUDA starts."""
        if self.stage() is not Stage.STARTED:
            return {}
        cuda = self._torch.cuda
        figures = {}
        try:
            count = int(cuda.device_count())
        except Exception as err:  # a fault in one reading is a note (%gpu shows it), not a broken %gpu
            self.memory_error = f"torch.cuda.device_count(): {type(err).__name__}: {err}"
            return {}
        for k in range(count):
            try:
                figures[f"cuda:{k}"] = TorchMemory(
                    int(cuda.memory_allocated(k)),
                    int(cuda.max_memory_allocated(k)),
                    int(cuda.memory_reserved(k)),
                )
            except Exception as err:
                self.memory_error = f"cuda:{k}: {type(err).__name__}: {err}"
        return figures

    def device_memory(self) -> dict[str, DeviceMemory]:
        """The protocol's figures: allocated, peak allocated and reserved per ``cuda:k``."""
        return {
            device: DeviceMemory(m.allocated_bytes, m.peak_allocated_bytes, reserved_bytes=m.reserved_bytes)
            for device, m in self.memory().items()
        }

    def open_peak_window(self) -> ResettingPeakWindow:
        """``reset_peak_memory_stats`` per device, the peaks of open windows kept whole."""
        return ResettingPeakWindow(self.device_memory, self._reset_peak, self._open_windows)

    def _reset_peak(self, device: str) -> None:
        self._torch.cuda.reset_peak_memory_stats(int(device.split(":")[1]))

    def device_scope(self, cuda_index: int) -> Any:
        """``torch.cuda.device(k)``: the cell's default CUDA device (``%%gpu on``)."""
        return self._torch.cuda.device(cuda_index)

    def empty_cache(self) -> bool:
        """``torch.cuda.empty_cache()``: unused cached blocks go back to the driver.  Call it after
        ``gc.collect()`` (the session's ``free`` does), so dropped tensors' blocks are unused by
        then.  True if the cache was emptied (CUDA had started)."""
        if self.stage() is not Stage.STARTED:
            return False
        try:
            self._torch.cuda.empty_cache()
        except Exception as err:  # said by %gpu free's figures (nothing went back) and %gpu's note
            self.memory_error = f"torch.cuda.empty_cache(): {type(err).__name__}: {err}"
            return False
        return True

    def oom_error_type(self) -> type | None:
        """``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``), or None before the import."""
        return None if self._torch is None else getattr(self._torch, "OutOfMemoryError", None)

    # -- figures for the panel and the trace --
    charted_figures = (
        ChartedFigure("allocated", "in_use_bytes", "allocated"),
        ChartedFigure("reserved", "reserved_bytes", "reserved"),
    )

    def figures_absent(self) -> str | None:
        """A CPU build has no CUDA allocator; a CUDA build has none until CUDA starts."""
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return None
        if not self.cuda_build():
            return "on this build (CPU only: no CUDA allocator)"
        if stage is not Stage.STARTED:
            return "until it starts CUDA (not started in this kernel)"
        return None if self.memory() else "on this build (no CUDA device reported)"

    def gpu_numbering(self, cuda_map: list[int]) -> dict[str, int]:
        """``cuda:k`` -> nvidia-smi index: CUDA's device k."""
        return {f"cuda:{k}": index for k, index in enumerate(cuda_map)}

    # Its import alone says the user works with it; the no-GPU diagnosis is TensorFlow's.
    import_says_little = False
    no_gpu_diagnosed = False

    # -- reports (status, out-of-memory, %%gpu on) --------------------------------------------------
    def report(self, view: ReportView) -> dict[str, Any]:
        """Its entry under ``frameworks`` in ``%gpu status --json``: the stage, and once imported
        its build, allocator, caps and the allocator's figures per device."""
        stage = self.stage()
        entry: dict[str, Any] = {
            "stage": stage.name.lower(),
            "imported": stage is not Stage.NOT_IMPORTED,
            "installed": self.installed(),
        }
        if stage is Stage.NOT_IMPORTED:
            return entry
        entry.update(
            {
                "cuda_build": self.cuda_build(),
                "allocator": self.backend(),
                "cuda_started": stage is Stage.STARTED,
                "applied": None if view.applied is None else view.applied.describe(),
                "caps": {
                    f"cuda:{k}": {"bytes": b, "fraction_set": self.caps_set.get(k)}
                    for k, b in self.caps_bytes.items()
                },
                "cap_errors": list(self.cap_errors),
                "memory": {
                    device: {
                        "allocated_bytes": m.allocated_bytes,
                        "peak_allocated_bytes": m.peak_allocated_bytes,
                        "reserved_bytes": m.reserved_bytes,
                    }
                    for device, m in self.memory().items()
                },
            }
        )
        entry["memory_error"] = self.memory_error  # after the reading, which records a failure
        return entry

    def status_lines(self, entry: dict[str, Any]) -> list[str]:
        """Its stage, allocator and caps: shown once it is imported."""
        if not entry.get("imported"):
            return []
        label = f"{self.name + ':':<11}"
        if not entry["cuda_build"]:
            return [f"{label} imported; a CPU build (torch.version.cuda is None): it uses no GPU"]
        started = (
            "CUDA started: GPU settings other than `limit` are frozen"
            if entry["cuda_started"]
            else "CUDA not started"
        )
        lines = [f"{label} imported, {started}; the {entry['allocator']} allocator"]
        for device, cap in entry["caps"].items():
            fraction = cap["fraction_set"]
            when = f"set as fraction {fraction:.4f}" if fraction is not None else "set when CUDA starts"
            lines.append(f"  {device} cap: {format_bytes(cap['bytes'])} ({when})")
        lines.extend(f"  cap not set: {error}" for error in entry["cap_errors"])
        if entry.get("memory_error"):
            lines.append(f"  note: no allocator reading for {entry['memory_error']}")
        for device, memory in entry["memory"].items():
            lines.append(
                f"  {device} {self.name} allocator: {format_bytes(memory['allocated_bytes'])} allocated, "
                f"{format_bytes(memory['reserved_bytes'])} reserved, peak {format_bytes(memory['peak_allocated_bytes'])}"
            )
        return lines

    def oom_facts(self, error: BaseException, view: ReportView) -> OomFacts | None:
        """``torch.OutOfMemoryError``: the request and the CUDA device it names, its allocator, its cap."""
        oom_type = self.oom_error_type()
        if oom_type is None or not isinstance(error, oom_type):
            return None
        found = _oom_pattern().search(str(error))
        request = found.group("size") if found is not None else None
        cuda_index = int(found.group("gpu") or 0) if found is not None else 0
        device = f"cuda:{cuda_index}"
        memory = self.device_memory().get(device)
        figures = "no figures (CUDA has not started)"
        if memory is not None:
            figures = f"{format_size(memory.in_use_bytes)} in use"
            if memory.reserved_bytes is not None:  # PyTorch's reading has it; DeviceMemory's may not
                figures += f", {format_size(memory.reserved_bytes)} reserved"
        gpu = view.cuda_map[cuda_index] if cuda_index < len(view.cuda_map) else None
        if gpu is None:
            limit = "unknown (the GPU could not be mapped to nvidia-smi's numbering)"
        elif self.caps_set.get(cuda_index) is None:
            limit = f"none set ({self.name} may take the whole GPU)"
        else:
            fraction = self.caps_set[cuda_index]
            limit = (
                f"{format_size(self.caps_bytes[cuda_index])} (`%gpu limit`, set as fraction {fraction:.4f})"
            )
        lines = ([f"Failed request: {request}"] if request else []) + [
            f"{self.name}'s allocator: {figures}; limit: {limit}"
        ]
        steps = (
            f"`del` the tensors you no longer need, then `%gpu free` (it empties {self.name}'s cache), "
            "then run the cell again",
            "a smaller batch size (halve it until the cell fits)",
            '`with torch.autocast("cuda", dtype=torch.float16):` around the forward pass: half the activations',
        )
        named = f"{self.name} {device}"
        return OomFacts(device, named, named, True, gpu, tuple(lines), steps)

    def gpu_scope(self, gpu: int, view: ReportView) -> tuple[list[int] | None, Any]:
        """For ``%%gpu on``: the GPUs it can use (nvidia-smi numbers), and ``torch.cuda.device`` on ``gpu``."""
        if self.stage() is Stage.NOT_IMPORTED:
            return None, None
        seen = list(view.cuda_map[: self.found_gpus()])
        return seen, self.device_scope(list(view.cuda_map).index(gpu)) if gpu in seen else None

    def scope_hint(self) -> tuple[str, str]:
        return "torch.cuda.device", "`import torch`"


def _allocator_settings(module: Any) -> str | None:
    """The allocator settings string torch parsed (None where this version cannot say)."""
    getter = getattr(getattr(module, "_C", None), "_accelerator_getAllocatorSettings", None)
    try:
        return None if getter is None else str(getter())
    except Exception:
        return None


def alloc_conf_with_backend(current: str | None, backend: str | None) -> str | None:
    """The allocator settings with ``backend:`` replaced (None: removed), the user's other options kept.

    >>> alloc_conf_with_backend("expandable_segments:True", "cudaMallocAsync")
    'expandable_segments:True,backend:cudaMallocAsync'
    >>> alloc_conf_with_backend("backend:cudaMallocAsync,max_split_size_mb:128", None)
    'max_split_size_mb:128'
    """
    options = [
        o.strip() for o in (current or "").split(",") if o.strip() and not o.strip().startswith("backend:")
    ]
    if backend is not None:
        options.append(f"backend:{backend}")
    return ",".join(options) or None


def ignored_by_async(conf: str | None) -> list[str]:
    """The user's options in ``conf`` that backend:cudaMallocAsync ignores, as written.

    >>> ignored_by_async("max_split_size_mb:128,garbage_collection_threshold:0.8,pinned_use_cuda_host_register:True")
    ['max_split_size_mb:128', 'garbage_collection_threshold:0.8']
    """
    options = [o.strip() for o in (conf or "").split(",") if o.strip()]
    return [o for o in options if o.split(":", 1)[0].strip() in NATIVE_ONLY_OPTIONS]
