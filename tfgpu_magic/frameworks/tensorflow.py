"""TensorFlow's side: one adapter object, the only code that touches ``tensorflow`` (and Keras).

It never imports TensorFlow: :meth:`TensorFlow.on_import` receives the module from the
post-import hook, on the importing thread, once the import has finished, and only then does
the adapter read anything.  A background thread (the monitor's sampler) may ask for the stage
or the allocator at any time: before ``on_import`` the answer is "not imported", so no
thread ever triggers an import of its own (that deadlocks TensorFlow's import; issue 10).

TensorFlow starts in two stages (../shared/notes/tensorflow.md): *enumeration* (the first
device query: CUDA reads ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` then) and *runtime
start* (the first op: visibility, growth, logical devices and the allocator variables freeze).
The adapter records the environment at the moment each happens, through one-shot wrappers
around TensorFlow's own entry points, so later reports say what TensorFlow really read, not
what the environment says now.
"""

from __future__ import annotations

import functools
import gc
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from ..command import commands
from ..command.plan import Plan, Resolution
from ..command.units import MIB, format_bytes, format_change, format_size
from ..gpus.holdings import allocator_by_gpu
from ..records import Record
from .base import (
    CUDA_ENV,
    Capture,
    Change,
    ChartedFigure,
    CudaRecord,
    DeviceMemory,
    FreeReport,
    GpuShare,
    Host,
    OomFacts,
    PeakReading,
    Refusal,
    ReportView,
    Stage,
    capture,
    environment_line,
    installed,
    not_the_framework,
    too_late,
)
from .import_hooks import run_after_import

__all__ = [
    "ASYNC_ALLOCATOR",
    "CPU_STATS_ENV",
    "CUDA_ENV",
    "START_ENV",
    "AllocatorStats",
    "ApplyError",
    "Capture",
    "InForce",
    "OomSite",
    "PeakWindow",
    "Stage",
    "TensorFlow",
    "parse_oom_message",
]

START_ENV = ("TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR")  # read by TensorFlow at its first op
ASYNC_ALLOCATOR = "cuda_malloc_async"
# What the adapter uses of ``tensorflow``: a module without them is not TensorFlow (a planted tensorflow.py).
NEEDS = ("config.list_physical_devices", "config.experimental.get_memory_info", "sysconfig")
CPU_STATS_ENV = "TF_CPU_ALLOCATOR_USE_BFC"  # read when TensorFlow creates its CPU allocator
CPU_LIMIT_ENV = "TF_CPU_BFC_MEM_LIMIT_IN_MB"  # the CPU BFC allocator's cap; TensorFlow's default below
CPU_DEFAULT_LIMIT_MIB = 1 << 16
# What `%gpu trace` (and a budget) says when TensorFlow started and no allocator keeps statistics.
TRACE_NO_STATS = (
    "TensorFlow's allocator keeps no statistics in this kernel: no GPU is visible and TensorFlow "
    f"started without {CPU_STATS_ENV}=true. Restart the kernel and run `%gpu trace` "
    "before `import tensorflow` (it sets the variable), or set it in the kernel's environment"
)


class ApplyError(RuntimeError):
    """TensorFlow refused a configuration; the message says why and what to do."""


class AllocatorStats(Record):
    """TensorFlow's own allocator for one device, in bytes (not the driver's view)."""

    current_bytes: int
    peak_bytes: int


class InForce(Record):
    """What TensorFlow runs with (once started) or will start with (once enumerated)."""

    visible_nvml: tuple[int, ...]  # nvidia-smi indices of the GPUs TensorFlow uses
    logical_mib: dict[int, tuple[int, ...] | None]  # nvidia-smi index -> logical GPU caps, or None
    growth: bool | None  # None: TensorFlow's default (no growth)
    allocator: str  # "async" or "default"


class TensorFlow:
    """The adapter: every question to TensorFlow goes through one of these (one per process).

    It answers :class:`~tfgpu_magic.frameworks.base.Framework`'s questions, and the ones only
    TensorFlow raises: a stage between import and start (devices enumerated), ``tf.config``,
    logical GPUs, Keras.
    """

    key = "tensorflow"
    name = "TensorFlow"
    module = "tensorflow"
    start_variables = START_ENV
    managed_variables = START_ENV  # what tfgpu_magic sets for it
    takes_effect = "at its first op"  # once tensorflow is imported

    def __init__(self) -> None:
        self._tf: Any = None  # the tensorflow module, once its import has finished
        self._context_module: Any = None
        self._lock = threading.Lock()
        self.cuda_seen: Capture | None = None  # CUDA's variables at enumeration
        self.environ: Mapping[str, str] = os.environ  # where CUDA and the framework read their variables
        self.cuda_record: CudaRecord | None = None  # the kernel's, handed over by the machine
        self.started_with: Capture | None = None  # TensorFlow's start variables at the first op
        self.owned_logical: set[int] = set()  # nvidia-smi indices whose logical devices we configured
        self.owned_visibility = False  # True once we called set_visible_devices
        self._memory_devices: tuple[str, ...] | None = None  # fixed once the runtime has started
        self._open_windows: weakref.WeakSet[PeakWindow] = weakref.WeakSet()
        # Set by `%gpu trace` when GPUs are expected: if TensorFlow then lists none, its CPU
        # allocator is made to keep statistics just before the runtime starts (see _note_start).
        self.cpu_stats_if_no_gpu = False
        self.cpu_stats_set_at_start = False  # True once _note_start set CPU_STATS_ENV for that
        self.refused: str | None = None  # why what `import tensorflow` gave is not TensorFlow

    def cpu_only_build(self) -> bool:
        """Whether the installed TensorFlow can never see a GPU, known without importing it.

        ``tensorflow-cpu`` is built without CUDA; ``tensorflow`` itself is a CUDA build on Linux
        (whether CUDA's libraries are installed or not), so it is not taken for a CPU build.
        """
        return distribution_installed("tensorflow-cpu") and not distribution_installed("tensorflow")

    # -- the moment TensorFlow arrives ----------------------------------------------------------
    def on_import(self, module: Any) -> None:
        """Called on the importing thread once ``import tensorflow`` has finished."""
        with self._lock:
            if self._tf is not None or self.refused is not None:
                return
            self.refused = not_the_framework(module, self.name, self.module, NEEDS)
            if self.refused is not None:
                return
            from tensorflow.python.eager import (
                context,  # loaded with tensorflow: no new import
            )

            self._context_module = context
            ctx = context.context_safe()
            if ctx is not None and getattr(ctx, "_physical_devices", None) is not None:
                self.cuda_seen = capture(
                    CUDA_ENV, late=True, env=self.environ
                )  # listed before we were loaded
                self._record_cuda()
            if ctx is not None and getattr(ctx, "_context_handle", None) is not None:
                self.started_with = capture(START_ENV, late=True, env=self.environ)
            self._watch(context.Context)
            self._tf = module
        _watch_device_lib(self)

    def attach(self) -> None:
        """Take TensorFlow from ``sys.modules`` when the caller knows its import has finished.

        For code on the user's own thread that runs after ``import tensorflow`` (a Keras
        callback made without ``%load_ext``); background threads never call this.
        """
        module = sys.modules.get("tensorflow")
        if module is not None and self._tf is None:
            self.on_import(module)

    def _watch(self, context_class: Any) -> None:
        """Wrap enumeration and runtime start so the environment is recorded as they happen.

        Each wrapper removes itself after its moment, so TensorFlow's hot paths pay nothing.
        """
        if self.cuda_seen is None:
            _one_shot(
                context_class,
                "_initialize_physical_devices",
                self._note_enumeration,
                done=lambda ctx: getattr(ctx, "_physical_devices", None) is not None,
            )
        if self.started_with is None:
            _one_shot(
                context_class,
                "ensure_initialized",
                self._note_start,
                done=lambda ctx: getattr(ctx, "_context_handle", None) is not None,
            )

    def _note_enumeration(self) -> None:
        if self.cuda_seen is None:
            self.cuda_seen = capture(CUDA_ENV, env=self.environ)
            self._record_cuda()

    def _record_cuda(self) -> None:
        if self.cuda_record is not None and self.cuda_seen is not None:
            self.cuda_record.note(self.cuda_seen, self.name, "when TensorFlow listed its devices")

    def _note_start(self) -> None:
        self._note_enumeration()  # the runtime lists devices if nothing did before
        self._cpu_stats_when_no_gpu()
        if self.started_with is None:
            self.started_with = capture(START_ENV, env=self.environ)

    def _cpu_stats_when_no_gpu(self) -> None:
        """Just before the runtime starts, the last moment the CPU allocator can still be chosen:
        if tracing asked for it and TensorFlow found no GPU, turn on the CPU allocator's statistics.

        Listing the devices here is what ``ensure_initialized`` is about to do itself, so it
        starts nothing TensorFlow would not; a variable the user set, to any value, is left alone.
        """
        if not self.cpu_stats_if_no_gpu or os.environ.get(CPU_STATS_ENV) is not None or self._tf is None:
            return
        if not self._tf.config.list_physical_devices("GPU"):
            os.environ[CPU_STATS_ENV] = "true"
            self.cpu_stats_set_at_start = True

    def build_info(self) -> dict[str, Any] | None:
        """``tf.sysconfig.get_build_info()`` (is_cuda_build, cuda_version, cudnn_version); None
        before the import or when this TensorFlow cannot say.  Reading it starts nothing."""
        if self._tf is None:
            return None
        try:
            return dict(self._tf.sysconfig.get_build_info())
        except Exception:  # an old or unusual build: its facts are unknown, not an error
            return None

    def installed(self) -> bool:
        return self._tf is not None or installed(self.module)

    # -- the write side: what a setting means for TensorFlow ------------------------------------------
    def takes(self, command: Any) -> bool:
        return not (isinstance(command, commands.Allocator) and command.name == "platform")

    def consider(self, change: Change) -> str | None:
        """Its clause: applied now (imported, not started), or, once started, the same setting
        passes and a different one is refused with the line to put first."""
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return None
        if not self.takes(change.command):
            return "TensorFlow keeps its allocator"
        if stage is not Stage.STARTED:
            return "applied to TensorFlow now (imported, not started)"
        if not change.changed:
            return "already requested; nothing changed (TensorFlow has started)"
        differs, now = _difference(
            change.resolution, change.command, self.in_force(change.host.cuda_map(), change.host.env)
        )
        if differs:
            raise Refusal(too_late(self.name, self.module, change.what, now))
        return "already in force (TensorFlow has started); nothing changed"

    def prepare(self, change: Change) -> None:
        """The variables TensorFlow reads at its first op (growth, allocator)."""
        if self.stage() is Stage.STARTED:
            return
        plan, host = change.plan, change.host
        growth = None if plan.growth is None else ("true" if plan.growth else "false")
        host.set_env("TF_FORCE_GPU_ALLOW_GROWTH", growth or host.unmanaged_value("TF_FORCE_GPU_ALLOW_GROWTH"))
        allocator = None if plan.allocator == "platform" else plan.allocator  # platform: JAX's word
        names = {"async": ASYNC_ALLOCATOR, "default": None}
        host.set_env(
            "TF_GPU_ALLOCATOR", names[allocator] if allocator else host.unmanaged_value("TF_GPU_ALLOCATOR")
        )

    def give(self, resolution: Resolution, host: Host) -> bool:
        """tf.config work, between import and start; before enumeration only what the environment
        cannot carry (logical GPUs).  True: TensorFlow will start with ``resolution``."""
        stage = self.stage()
        if not Stage.IMPORTED <= stage < Stage.STARTED:
            return False
        plan = resolution.plan
        logical = any(g.logical_mib for g in resolution.gpus)
        if stage >= Stage.ENUMERATED or logical or self.owned_logical:
            asked = plan.visible is not None or self.owned_visibility
            try:
                self.apply(
                    resolution.visible if asked else None,
                    resolution.logical_mib(),
                    plan.growth,
                    host.cuda_map(),
                )
            except ApplyError as err:
                raise Refusal(str(err)) from None
            except (ValueError, RuntimeError) as err:
                raise Refusal(f"TensorFlow refused it: {err}") from None
        return True

    def takes_share(self) -> bool:
        if self.stage() is Stage.NOT_IMPORTED or self.cpu_only_build():
            return False
        return not self.enumerated() or bool(self.cuda_found())

    def share_fixed(self) -> bool:
        return self.stage() is Stage.STARTED

    def arrived(self, plan: Plan) -> str | None:
        """Listing its GPUs here is when CUDA reads its variables: none found is said now."""
        if self.stage() is Stage.STARTED or self.physical_gpu_indices():
            return None
        return (
            f"TensorFlow found no GPU (a CPU-only build, or no working NVIDIA driver), so these GPU "
            f"settings cannot take effect: {'; '.join(plan.describe())}"
        )

    def enumerated(self) -> bool:
        return self.stage() >= Stage.ENUMERATED

    def cuda_found(self) -> list[int] | None:
        return self.physical_gpu_indices() if self.enumerated() else None

    def device_gpus(self, cuda_map: list[int]) -> dict[str, int]:
        return self.gpu_names(cuda_map)

    def set_precision(self, policy: str | None) -> str | None:
        """Keras's global dtype policy: now if Keras is imported, else at its import (see side_imports)."""
        if self.keras_policy() is None:
            return "set when Keras is imported"
        self.set_keras_policy(policy or "float32")
        return "Keras global policy set now"

    def side_imports(self) -> dict[str, Callable[[Any, Plan], None]]:
        """Modules besides TensorFlow whose import it must hear of: Keras, for the precision."""
        return {"keras": _set_policy_at_keras_import}

    def frozen(self, kept: Plan, host: Host) -> list[str]:
        """What `reset` leaves: settings TensorFlow started with, GPUs CUDA hid at its enumeration."""
        stage, reasons = self.stage(), []
        if stage is Stage.STARTED and kept.describe():
            reasons.append(
                f"{'; '.join(kept.describe())} (TensorFlow has started with them; restart the kernel to drop them)"
            )
        seen = self.cuda_seen
        if stage is Stage.ENUMERATED and seen is not None:
            value = seen.get("CUDA_VISIBLE_DEVICES")
            if value is not None and value != host.inherited.get("CUDA_VISIBLE_DEVICES"):
                reasons.append(
                    f"CUDA_VISIBLE_DEVICES={value} was read by CUDA when TensorFlow listed its devices; "
                    "GPUs hidden then stay hidden until the kernel restarts"
                )
        return reasons

    def free_reading(self) -> dict[str, AllocatorStats]:
        return self.allocator_stats()

    def free(self, plan: Plan, before: Any) -> FreeReport:
        """Keras ``clear_session`` (and the precision it resets), with the allocator's figures."""
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return FreeReport()
        cleared = self.clear_session()
        policy = plan.precision
        if cleared:
            opener = "Ran Keras clear_session and garbage collection."
            if policy is not None:
                if self.keras_policy() not in (None, policy):
                    self.set_keras_policy(policy)
                opener += f" Re-applied precision {policy} (clear_session resets it)."
        else:
            opener = "Ran garbage collection (Keras is not imported: no Keras session to clear)."
        after = self.allocator_stats()
        lines = (
            [] if stage is Stage.STARTED else ["TensorFlow has not started, so it holds no memory to free."]
        )
        for device in sorted(set(before) | set(after)):
            b, a = before.get(device), after.get(device)
            b_n, a_n = (b.current_bytes if b else None), (a.current_bytes if a else None)
            lines.append(
                f"{device}  TensorFlow allocator in use: {format_bytes(b_n)} -> {format_bytes(a_n)} ({format_change(b_n, a_n)})"
            )
        if stage is Stage.STARTED and not before:
            lines.append("TensorFlow's allocator keeps no statistics on these devices (nothing to compare).")
        kept = None
        if stage is Stage.STARTED:
            if self.start_env(self.environ).get("TF_GPU_ALLOCATOR") == ASYNC_ALLOCATOR:
                kept = "; the async allocator returns freed memory as CUDA trims its pool."
            else:
                kept = (
                    ": TensorFlow keeps the memory it reserved until the kernel restarts; what clear_session "
                    "frees is reusable by this kernel only. For memory that goes back, put `%gpu allocator async` "
                    "before TensorFlow starts."
                )
        return FreeReport(tuple(lines), opener=opener, kept=kept)

    # -- the stage ------------------------------------------------------------------------------
    def stage(self) -> Stage:
        """TensorFlow's start-up stage, read without advancing it (safe on any thread)."""
        if self._tf is None:
            return Stage.NOT_IMPORTED
        ctx = self._context_module.context_safe()
        if self.started_with is not None or (
            ctx is not None and getattr(ctx, "_context_handle", None) is not None
        ):
            return Stage.STARTED
        if self.cuda_seen is not None or (
            ctx is not None and getattr(ctx, "_physical_devices", None) is not None
        ):
            return Stage.ENUMERATED
        return Stage.IMPORTED

    def read_environment(self, env: Mapping[str, str]) -> dict[str, str | None]:
        return self.start_env(env)

    def start_env(self, env: Mapping[str, str]) -> dict[str, str | None]:
        """TensorFlow's start variables as it read them, or as ``env`` holds them before the start."""
        if self.started_with is not None:
            return dict(self.started_with.env)
        return {name: env.get(name) for name in START_ENV}

    def enumerate_devices(self) -> None:
        """List TensorFlow's devices (stage ENUMERATED) so GPU numbering is known; no op runs."""
        if self.stage() is Stage.IMPORTED:
            self._tf.config.list_physical_devices()

    # -- applying a configuration before the runtime starts -------------------------------------
    def physical_gpus(self) -> list[Any]:
        """TensorFlow's physical GPUs (enumerates them if needed)."""
        return list(self._tf.config.list_physical_devices("GPU"))

    def physical_gpu_indices(self) -> list[int]:
        """CUDA's index of each GPU TensorFlow found (enumerates them if needed)."""
        return [_physical_index(g) for g in self.physical_gpus()]

    def apply(
        self,
        visible: tuple[int, ...] | None,
        logical_mib: Mapping[int, tuple[int, ...] | None],
        growth: bool | None,
        cuda_map: list[int],
    ) -> None:
        """Visibility, growth and logical devices through ``tf.config`` (runtime not started).

        ``visible`` lists nvidia-smi indices (None: leave TensorFlow's visibility alone);
        ``logical_mib`` the logical GPUs of each visible one; ``cuda_map[k]`` is the
        nvidia-smi index of CUDA device k, as CUDA numbered them at enumeration.
        """
        tf = self._tf
        by_nvml = {
            cuda_map[_physical_index(g)]: g
            for g in self.physical_gpus()
            if _physical_index(g) < len(cuda_map)
        }
        if visible is not None:
            missing = [i for i in visible if i not in by_nvml]
            if missing:
                raise ApplyError(
                    f"TensorFlow did not list GPU {','.join(map(str, missing))}"
                )  # resolve() checks first
            try:
                tf.config.set_visible_devices([by_nvml[i] for i in visible], "GPU")
                self.owned_visibility = True
            except RuntimeError as err:  # started between our stage check and now
                raise ApplyError(f"TensorFlow refused to change visible GPUs: {err}") from err
        shown = tf.config.get_visible_devices("GPU")
        nvml_of = {g: n for n, g in by_nvml.items()}
        for index in sorted(self.owned_logical):
            device = by_nvml.get(index)
            if device is not None and device not in shown:
                self._drop_logical_configuration(device)  # a hidden GPU's stale entry drops growth for all
                self.owned_logical.discard(index)
        for device in shown:
            index = nvml_of.get(device, _physical_index(device))
            self._apply_device(device, index, growth, logical_mib.get(index))

    def _apply_device(
        self, device: Any, index: int, growth: bool | None, sizes: tuple[int, ...] | None
    ) -> None:
        """Growth and logical devices for one GPU, in the only order TensorFlow accepts."""
        tf = self._tf
        current = tf.config.get_logical_device_configuration(device)
        wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=s) for s in sizes or ()]
        if current and index in self.owned_logical and current != wanted:
            self._drop_logical_configuration(device)  # ours to replace; growth must be set without it
            self.owned_logical.discard(index)
            current = None
        if growth is not None and not current:
            # Growth goes in before any logical configuration; with one, TensorFlow keeps the
            # growth flag out of GPUOptions and TF_FORCE_GPU_ALLOW_GROWTH carries it instead.
            tf.config.experimental.set_memory_growth(device, growth)
        if wanted:
            tf.config.set_logical_device_configuration(device, wanted)
            self.owned_logical.add(index)

    def _drop_logical_configuration(self, device: Any) -> None:
        """Forget a logical device configuration before start-up; tf.config has no public way."""
        self._context_module.context()._virtual_device_map.pop(device, None)

    # -- reading what is in force -----------------------------------------------------------------
    def in_force(self, cuda_map: list[int], env: Mapping[str, str]) -> InForce:
        """TensorFlow's GPU configuration (stage ENUMERATED or later)."""
        tf = self._tf
        visible = tf.config.get_visible_devices("GPU")
        logical: dict[int, tuple[int, ...] | None] = {}
        growth_flags = set()
        for device in visible:
            index = _nvml_index(device, cuda_map)
            config = tf.config.get_logical_device_configuration(device)
            logical[index] = tuple(int(c.memory_limit) for c in config) if config else None
            growth_flags.add(tf.config.experimental.get_memory_growth(device))
        start = self.start_env(env)
        forced = (start.get("TF_FORCE_GPU_ALLOW_GROWTH") or "").lower()
        if forced in ("true", "false"):
            growth: bool | None = forced == "true"
        else:
            growth = growth_flags.pop() if len(growth_flags) == 1 else None
        allocator = "async" if start.get("TF_GPU_ALLOCATOR") == ASYNC_ALLOCATOR else "default"
        return InForce(tuple(logical), logical, growth, allocator)

    def gpu_names(self, cuda_map: list[int]) -> dict[str, int]:
        """``"GPU:j"`` (TensorFlow's logical numbering) -> nvidia-smi index, once enumerated."""
        if self.stage() < Stage.ENUMERATED:
            return {}
        tf = self._tf
        result: dict[str, int] = {}
        for device in tf.config.get_visible_devices("GPU"):
            count = len(tf.config.get_logical_device_configuration(device) or [None])
            for _ in range(count):
                result[f"GPU:{len(result)}"] = _nvml_index(device, cuda_map)
        return result

    # -- the allocator ------------------------------------------------------------------------------
    def allocator_stats(self) -> dict[str, AllocatorStats]:
        """In-use and peak bytes per device, once the runtime has started (never starts it).

        Devices whose allocator keeps no statistics (the default CPU allocator) are left out.
        """
        if self.stage() < Stage.STARTED:
            return {}
        stats: dict[str, AllocatorStats] = {}
        for device in self._tf.config.list_logical_devices():
            if device.device_type in ("GPU", "CPU"):
                name = device.name.rsplit("device:", 1)[-1]
                info = self.memory_info(name)
                if info is not None:
                    stats[name] = info
        return stats

    def device_memory(self) -> dict[str, DeviceMemory]:
        """The protocol's figures: in use and peak per device (TensorFlow reports no pool size)."""
        return {d: DeviceMemory(s.current_bytes, s.peak_bytes) for d, s in self.allocator_stats().items()}

    def memory_info(self, device: str) -> AllocatorStats | None:
        """One device's allocator reading; None without statistics or before start-up."""
        if self.stage() < Stage.STARTED:
            return None
        try:
            info = self._tf.config.experimental.get_memory_info(device)
        except (ValueError, RuntimeError):
            return None
        return AllocatorStats(int(info["current"]), int(info["peak"]))

    def memory_devices(self) -> tuple[str, ...]:
        """Devices whose allocator keeps statistics: the GPUs, or ``CPU:0`` where no GPU is visible.

        Empty before start-up and where no allocator keeps statistics.  Computed once: devices
        freeze at start.
        """
        if self._memory_devices is not None:
            return self._memory_devices
        if self.stage() < Stage.STARTED:
            return ()
        names = tuple(self.allocator_stats())
        gpus = tuple(n for n in names if n.startswith("GPU:"))
        self._memory_devices = gpus or tuple(n for n in names if n == "CPU:0")
        return self._memory_devices

    def reset_peak(self, device: str) -> bool:
        try:
            self._tf.config.experimental.reset_memory_stats(device)
        except (ValueError, RuntimeError):
            return False
        return True

    # Peaks: TensorFlow keeps one per device and `reset_memory_stats` is global, so nested
    # measurements (a traced cell holding a budget holding a Keras MemoryCallback) would destroy
    # each other's peaks.  Before any reset made here, the peak about to be lost is folded into
    # every open window.
    def open_peak_window(self) -> PeakWindow:
        """Reset TensorFlow's peaks (keeping open windows whole) and start measuring from now."""
        start: dict[str, int] = {}
        for device in self.memory_devices():
            info = self.memory_info(device)
            if info is None:
                continue
            for window in list(self._open_windows):
                window.folded[device] = max(window.folded.get(device, 0), info.peak_bytes)
            if self.reset_peak(device):
                start[device] = info.current_bytes
        window = PeakWindow(self, start)
        self._open_windows.add(window)
        return window

    # -- Keras ----------------------------------------------------------------------------------------
    def keras_policy(self) -> str | None:
        """The Keras global dtype policy's name, or None when Keras is not imported."""
        keras = sys.modules.get("keras")
        if keras is None or not hasattr(keras, "mixed_precision"):
            return None
        return str(keras.mixed_precision.global_policy().name)

    def set_keras_policy(self, policy: str) -> None:
        sys.modules["keras"].mixed_precision.set_global_policy(policy)

    def clear_session(self) -> bool:
        """Keras ``clear_session`` (if Keras is imported) and ``gc.collect``; True if Keras was cleared."""
        keras = sys.modules.get("keras")
        cleared = False
        if keras is not None and hasattr(keras, "utils"):
            keras.utils.clear_session()
            cleared = True
        gc.collect()
        return cleared

    # -- cells ------------------------------------------------------------------------------------------
    def device_scope(self, name: str) -> Any:
        """``tf.device("/GPU:0")``: ops created inside run on that device (starts the runtime)."""
        return self._tf.device(f"/{name}")

    def oom_error_type(self) -> type | None:
        """``tf.errors.ResourceExhaustedError``, or None while TensorFlow is not imported."""
        errors = getattr(self._tf, "errors", None)
        return getattr(errors, "ResourceExhaustedError", None)

    def write_scalars(
        self, log_dir: str, writers: dict[str, Any], values: dict[str, float], step: int
    ) -> None:
        """TensorBoard scalars; ``writers`` caches one writer per directory.

        ``tf.summary.scalar`` lives in the tensorboard package, which TensorFlow does not require;
        this writes what it writes (a float32 tensor tagged for the "scalars" plugin) with core
        TensorFlow.
        """
        tf = self._tf
        writer = writers.get(log_dir)
        if writer is None:
            writer = writers[log_dir] = tf.summary.create_file_writer(log_dir)
        metadata = tf.compat.v1.SummaryMetadata()
        metadata.plugin_data.plugin_name = "scalars"
        with writer.as_default():
            for tag, value in values.items():
                tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=metadata)
        writer.flush()

    # -- figures for the panel and the trace --
    # In use and peak; they also fill the panel's older per-device fields (a stable wire format).
    charted_figures = (
        ChartedFigure("in_use", "in_use_bytes", "in use", wire_field="tf_in_use_bytes"),
        ChartedFigure("peak", "peak_bytes", "peak", wire_field="tf_peak_bytes"),
    )

    def figures_absent(self) -> str | None:
        """Why there is nothing to chart: not started yet, or no allocator keeps statistics."""
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return None
        if stage is not Stage.STARTED:
            return "until its first op"
        if self.memory_devices():
            return None
        return f"on this build: no GPU, and its CPU allocator keeps none without {CPU_STATS_ENV}=true"

    def gpu_numbering(self, cuda_map: list[int]) -> dict[str, int]:
        """``GPU:j`` (logical) -> nvidia-smi index; ``CPU:0`` maps to none."""
        return self.gpu_names(cuda_map)

    def trace_label(self, device: str, gpu: int | None) -> str:
        """``GPU 1 (TF GPU:0)``: nvidia-smi's number first; ``CPU:0`` as it is."""
        if not device.startswith("GPU:") or gpu is None:
            return device
        return f"GPU {gpu} (TF {device})"

    # Its import alone says the user works with it; the session's no-GPU diagnosis is about it.
    import_says_little = False
    no_gpu_diagnosed = True

    def trace_absent(self) -> str | None:
        """The trace's line, once, when it started and no allocator keeps statistics."""
        return TRACE_NO_STATS

    def trace_ready(
        self, env: MutableMapping[str, str], visible: Callable[[], list[int] | None]
    ) -> bool | None:
        """Before start-up with no GPU to be visible: turn on the CPU allocator's statistics.

        True when it set ``TF_CPU_ALLOCATOR_USE_BFC=true`` now, False when it was set already, None
        when it does not apply (GPUs will be traced, or TensorFlow has started: too late).
        ``visible``: the nvidia-smi indices CUDA will show (None: no NVML).
        """
        if self.stage() is Stage.STARTED or self._gpus_expected(visible):
            return None
        if env.get(CPU_STATS_ENV, "").lower() == "true":
            return False
        env[CPU_STATS_ENV] = "true"  # the session's environment is the process's, except in tests
        return True

    def _gpus_expected(self, visible: Callable[[], list[int] | None]) -> bool:
        if self.cpu_only_build():
            return False  # tensorflow-cpu: whatever the driver lists, TensorFlow will see no GPU
        try:
            shown = visible()
        except Exception:  # no reading: assume GPUs rather than change the CPU allocator uninvited
            return True
        return bool(shown)  # None: no NVML, so no NVIDIA driver and no GPU for TensorFlow

    def trace_reply(
        self,
        env: MutableMapping[str, str],
        visible: Callable[[], list[int] | None],
        label: Callable[[str], str],
    ) -> str | None:
        """What ``%gpu trace`` will show of TensorFlow, set up for it (its CPU allocator's statistics)."""
        if self.stage() is Stage.STARTED:
            devices = self.memory_devices()
            if not devices:
                return TRACE_NO_STATS
            return f"after each cell, TensorFlow's allocator peak and retained change on {', '.join(map(label, devices))}"
        text = "after each cell once TensorFlow has started, its allocator peak and retained change"
        changed = self.trace_ready(env, visible)
        if changed is None:
            # GPUs are expected; should TensorFlow find none (a CPU-only build, CUDA's libraries
            # missing), its CPU allocator is traced instead, set up just before the runtime starts.
            self.cpu_stats_if_no_gpu = True
            return f"{text}; if TensorFlow finds no GPU, its CPU allocator is traced instead"
        if changed:
            return (
                f"{text}; no GPU will be visible, so {CPU_STATS_ENV}=true is now set for TensorFlow's CPU "
                "allocator to keep statistics"
            )
        return f"{text}; no GPU will be visible, so the CPU allocator is traced ({CPU_STATS_ENV}=true is set)"

    def trace_stopped(self) -> None:
        """Untraced, the CPU allocator stays TensorFlow's choice."""
        self.cpu_stats_if_no_gpu = False

    # -- reports (status, out-of-memory, %%gpu on) --------------------------------------------------
    def report(self, view: ReportView) -> dict[str, Any]:
        """Its entry under ``frameworks`` in ``%gpu status --json``: the stage, the allocator once
        started, why it found no GPU once it listed them, what it was given, whether installed."""
        stage = self.stage()
        entry: dict[str, Any] = {"stage": stage.name.lower(), "description": stage.describe()}
        if stage is Stage.STARTED:
            entry["allocator"] = {
                device: {"current_bytes": s.current_bytes, "peak_bytes": s.peak_bytes}
                for device, s in self.allocator_stats().items()
            }
        if stage >= Stage.ENUMERATED:
            entry["found_no_gpu"] = self._found_no_gpu(view)
        entry["applied"] = None if view.applied is None else view.applied.describe()
        entry["installed"] = self.installed()
        return entry

    def report_keys(self, entry: dict[str, Any]) -> dict[str, Any]:
        """``tensorflow`` at the report's top level, as scripts have read it from the start."""
        return {self.key: {k: v for k, v in entry.items() if k not in ("applied", "installed")}}

    def _found_no_gpu(self, view: ReportView) -> dict[str, Any] | None:
        """Why it found no GPU while the driver lists some for this kernel (None: it found them)."""
        try:
            diagnosis = self.no_gpu_diagnosis(view)
        except Exception as err:  # one reading's fault is a note, never a broken %gpu
            view.notes.append(f"could not tell why {self.name} found no GPU ({type(err).__name__}: {err})")
            return None
        return None if diagnosis is None else diagnosis.as_json()

    def no_gpu_diagnosis(self, view: ReportView) -> Any:
        """Why it found no GPU although CUDA was shown some; None when it found its GPUs.

        Made the first time it is asked after the listing, then kept: the build, the driver's CUDA
        version, the installed packages and what it listed do not change while the kernel lives.
        """
        diagnosis = getattr(self, "_no_gpu_diagnosis", None)
        if diagnosis is None and view.cuda_found == () and view.exposed_gpus:
            from . import tensorflow_diagnosis  # rarely needed: not at `%load_ext`

            diagnosis = self._no_gpu_diagnosis = tensorflow_diagnosis.diagnose(
                driver_gpus=len(view.exposed_gpus),
                build_info=self.build_info(),
                driver_cuda=view.nvml.cuda_driver_version() if view.nvml is not None else None,
                installed=distribution_installed,
            )
        return diagnosis

    def status_lines(self, entry: dict[str, Any]) -> list[str]:
        """Its stage, why it found no GPU, its allocator per device: shown once it is imported."""
        if entry.get("stage", "not_imported") == "not_imported":
            return []
        lines = [f"{self.name + ':':<11} {entry['description']}"]
        no_gpu = entry.get("found_no_gpu")
        if no_gpu:
            lines += [f"  found no GPU: {no_gpu['why']}", f"  fix: {no_gpu['fix']}"]
        for device, stats in entry.get("allocator", {}).items():
            lines.append(
                f"  {device} {self.name} allocator: {format_bytes(stats['current_bytes'])} in use, "
                f"peak {format_bytes(stats['peak_bytes'])}"
            )
        return lines

    def in_force_lines(self, view: ReportView) -> list[str] | None:
        """What it runs with (started), or the environment it will read at its start; None before
        the import (the environment every framework will read is said once, for all)."""
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return None
        if stage is not Stage.STARTED:
            # The variables as it will read them: CUDA's as CUDA read them once it listed devices.
            env = dict(self.start_env(view.env))
            cuda = view.cuda_env if stage is Stage.ENUMERATED else view.env
            env["CUDA_VISIBLE_DEVICES"] = cuda.get("CUDA_VISIBLE_DEVICES")
            return environment_line(f"environment for {self.name}'s start", env)
        force = self.in_force(list(view.cuda_map), view.env)
        shown = ",".join(map(str, force.visible_nvml)) or "none"
        lines = [f"GPUs visible to {self.name}: {shown}"]
        if force.visible_nvml:
            lines.append(f"memory growth: {'on' if force.growth else 'off'}")
            for index, sizes in force.logical_mib.items():
                if sizes:
                    lines.append(f"GPU {index}: logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}")
            lines.append(f"allocator: {force.allocator}")
        return lines

    def limit_holder(self) -> str:
        return "TensorFlow's allocator"  # its BFC pool per GPU; the CUDA context and cuDNN's workspaces are outside

    def in_force_notes(self, view: ReportView) -> list[str]:
        """The Keras precision policy, once Keras is imported (by whichever back end)."""
        policy = self.keras_policy()
        return [] if policy is None else [f"Keras precision: {policy}"]

    def listed_gpus(self, view: ReportView) -> list[int] | None:
        """The GPUs it listed (nvidia-smi numbers), once it enumerated; None before."""
        if self.stage() < Stage.ENUMERATED:
            return None
        return sorted(set(self.gpu_names(list(view.cuda_map)).values()))

    def gpu_shares(self, view: ReportView) -> dict[int, GpuShare]:
        """Its ``GPU:j`` names per GPU, and its allocator summed over its logical GPUs there."""
        names = self.gpu_names(list(view.cuda_map))
        stats = self.allocator_stats() if self.stage() is Stage.STARTED else {}
        sums = allocator_by_gpu(stats, names)
        by_gpu: dict[int, list[str]] = {}
        for device, index in names.items():
            by_gpu.setdefault(index, []).append(device)
        return {
            index: GpuShare(tuple(by_gpu.get(index, ())), *(sums[index] if index in sums else (None, None)))
            for index in sorted(set(by_gpu) | set(sums))
        }

    def gpu_keys(self, share: GpuShare | None) -> dict[str, Any]:
        """``tensorflow_names``, ``tensorflow_in_use_bytes``, ``tensorflow_peak_bytes`` in every GPU's entry."""
        return {
            f"{self.key}_names": list(share.names) if share else [],
            f"{self.key}_in_use_bytes": share.in_use_bytes if share else None,
            f"{self.key}_peak_bytes": share.peak_bytes if share else None,
        }

    def started_gpus(self, view: ReportView) -> tuple[int, ...] | None:
        """The GPUs it started with (its visibility is frozen then); None before its first op."""
        if self.stage() is not Stage.STARTED:
            return None
        return self.in_force(list(view.cuda_map), view.env).visible_nvml

    def is_out_of_memory(self, error: BaseException) -> bool:
        return True  # ResourceExhaustedError is about memory

    def oom_facts(self, error: BaseException, view: ReportView) -> OomFacts:
        """Its message names the device (``GPU:0``, in its numbering) and the tensor: any error
        handed here is read as its own (the kernel tries the other frameworks' types first)."""
        site = parse_oom_message(str(error))
        device = site.device or (self.memory_devices() or ("CPU:0",))[0]
        lines = []
        if site.request_text:
            size = f" = {format_size(site.request_bytes)}" if site.request_bytes is not None else ""
            by = f", allocator {site.allocator}" if site.allocator else ""
            lines.append(f"Failed request: {site.request_text}{size}{by}")
        on_gpu = device.startswith("GPU:")
        gpu = self.gpu_names(list(view.cuda_map)).get(device) if on_gpu else None
        limit = self._oom_limit_text(gpu, view) if on_gpu else self.cpu_limit_text()
        stats = self.memory_info(device)
        if stats is not None:
            lines.append(
                f"{self.name}'s allocator: {format_size(stats.current_bytes)} in use; limit: {limit}"
            )
        else:
            lines.append(f"{self.name}'s allocator keeps no statistics here; limit: {limit}")
        steps = [
            "`%gpu free`: drop Keras models and tensors left by earlier cells (their memory returns to "
            f"{self.name}'s pool), then run the cell again",
            "a smaller batch size (halve it until the cell fits)",
        ]
        if on_gpu and view.precision != "mixed_float16":
            steps.append(
                "`%gpu precision mixed_float16`, then rebuild the model: float16 activations take half the memory"
            )
        return OomFacts(
            device,
            f"TF {device}",
            device,
            on_gpu,
            gpu,
            tuple(lines),
            tuple(steps),
            cpu_step=f"a higher {CPU_LIMIT_ENV} (MiB) in the kernel's environment before {self.name} starts, or a GPU",
        )

    def _oom_limit_text(self, gpu: int | None, view: ReportView) -> str:
        """The cap it was given on nvidia-smi's GPU ``gpu`` (the record, never re-derived from the request)."""
        if gpu is None:
            return f"unknown ({self.name}'s GPU numbering could not be mapped to nvidia-smi's)"
        given = view.applied if self.stage() >= Stage.IMPORTED else view.accepted
        cap = given.caps_bytes().get(gpu) if given is not None else None
        if cap is not None:
            return f"{format_size(cap)} (`%gpu limit`)"
        info = view.nvml.gpu(gpu) if view.nvml is not None and view.nvml.available() else None
        if info is not None and info.memory is not None:
            return f"none set ({self.name} may take most of the GPU's {format_size(info.memory.total_bytes)})"
        return "none set"

    def cpu_limit_text(self) -> str:
        """The CPU allocator's cap, as it will read it (its BFC allocator's only where asked for)."""
        if os.environ.get(CPU_STATS_ENV, "").lower() != "true":
            return f"none of {self.name}'s own (the default CPU allocator takes what the system gives)"
        raw = os.environ.get(CPU_LIMIT_ENV)
        # '²'.isdigit() is True and int('²') fails; int() refuses over 4,300 digits, and TensorFlow
        # reads the value as an int64 (at most 19 digits), so a longer one is not a limit it uses.
        if raw and raw.isascii() and raw.isdigit() and len(raw.lstrip("0")) <= 18:
            return f"{format_size(int(raw) * MIB)} ({CPU_LIMIT_ENV}={raw})"
        return f"{format_size(CPU_DEFAULT_LIMIT_MIB * MIB)} ({self.name}'s default for the CPU BFC allocator)"

    def gpu_scope(self, gpu: int, view: ReportView) -> tuple[list[int] | None, Any]:
        """For ``%%gpu on``: the GPUs it lists (listing them now if it has not), and ``tf.device``
        on the first of its logical GPUs on nvidia-smi's GPU ``gpu``."""
        if self.stage() is Stage.NOT_IMPORTED:
            return None, None
        self.enumerate_devices()
        names = self.gpu_names(list(view.cuda_map))
        name = next((n for n, index in names.items() if index == gpu), None)
        return sorted(set(names.values())), None if name is None else self.device_scope(name)

    def scope_hint(self) -> tuple[str, str]:
        return "tf.device", "`import tensorflow as tf`"

    def in_use(self) -> bool:
        return self.stage() is not Stage.NOT_IMPORTED

    def device_label(self, device: str, view: ReportView) -> str:
        """``CPU:0``, or ``GPU 1 (TF GPU:0)``: nvidia-smi's number first, as everywhere in %gpu."""
        if not device.startswith("GPU:"):
            return device
        try:
            index = self.gpu_names(list(view.cuda_map)).get(device)
        except Exception:
            index = None
        return device if index is None else f"GPU {index} (TF {device})"

    def measurement_problem(self, view: ReportView) -> str | None:
        """Started, and no allocator of its keeps statistics (no GPU, and the CPU's default allocator)."""
        if self.stage() is not Stage.STARTED or self.memory_devices():
            return None
        return (
            f"{self.name}'s allocator keeps no statistics in this kernel: no GPU is visible and {self.name} "
            f"started without {CPU_STATS_ENV}=true. Restart the kernel and run `%gpu trace` "
            f"before `import {self.module}` (it sets the variable), or set it in the kernel's environment"
        )

    def keep_statistics(self, view: ReportView, alone: bool) -> str | None:
        """Before its start with no GPU to be visible: turn on the CPU allocator's statistics (in the
        kernel's environment, read at its start), if it is the one measured: imported, or alone."""
        if self.stage() is Stage.STARTED or (self.stage() is Stage.NOT_IMPORTED and not alone):
            return None
        if not self.cpu_only_build() and view.visible_gpus:
            return None  # GPUs are expected: the CPU allocator is left as chosen (None: no NVML, no driver, no GPU)
        env = view.env
        if env.get(CPU_STATS_ENV, "").lower() == "true":
            return None
        env[CPU_STATS_ENV] = "true"  # the kernel's environment (the process's)
        return (
            f"no GPU will be visible, so {CPU_STATS_ENV}=true is now set for {self.name}'s CPU allocator "
            "to keep the statistics a budget needs"
        )


def _set_policy_at_keras_import(keras: Any, plan: Plan) -> None:
    if plan.precision is not None:
        keras.mixed_precision.set_global_policy(plan.precision)


def _difference(resolution: Resolution, command: Any, force: InForce) -> tuple[bool, str]:
    """Whether a started TensorFlow runs with something else than ``command`` asks, and with what."""
    visible = force.visible_nvml
    shown = "GPU " + ",".join(map(str, visible)) if visible else "no GPU"
    if isinstance(command, commands.Use):
        wanted = resolution.visible
        return (wanted is not None and tuple(wanted) != visible), f"{shown} visible"
    if not visible:
        return True, "no GPU visible (so GPU memory settings cannot take effect)"
    if isinstance(command, commands.Grow):
        return bool(force.growth) != command.on, f"memory growth {'on' if force.growth else 'off'}"
    if isinstance(command, commands.Allocator):
        return force.allocator != command.name, f"the {force.allocator} allocator"
    for index in visible:
        planned = resolution.gpu(index)
        current = force.logical_mib.get(index)
        if (planned.logical_mib if planned else None) != current:
            return True, f"GPU {index} at {_logical_text(current)}"
    return False, ""


def _logical_text(sizes: tuple[int, ...] | None) -> str:
    if not sizes:
        return "no limit"
    if len(sizes) == 1:
        return f"a limit of {sizes[0]} MiB"
    return f"{len(sizes)} logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}"


def distribution_installed(distribution: str) -> bool:
    """Whether a pip distribution is installed (its metadata only: nothing is imported)."""
    from importlib import (
        metadata,  # here: asked only before `%gpu trace` or a budget, not at load
    )

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


class PeakWindow:
    """The allocator peak of each device between :meth:`TensorFlow.open_peak_window` and :meth:`read`.

    A window opened before TensorFlow started counts from zero (the allocator did not exist).
    """

    def __init__(self, tf: TensorFlow, start: dict[str, int]) -> None:
        self._tf = tf
        self.start = start  # bytes in use per device when the window opened
        self.folded: dict[str, int] = {}  # peaks lost to resets made by nested windows

    def read(self) -> dict[str, tuple[int, AllocatorStats]]:
        """``device -> (bytes in use at the start, AllocatorStats(now, peak in the window))``."""
        result: dict[str, tuple[int, AllocatorStats]] = {}
        for device in self._tf.memory_devices():
            info = self._tf.memory_info(device)
            if info is None:
                continue
            peak = max(info.peak_bytes, self.folded.get(device, 0))
            result[device] = (self.start.get(device, 0), AllocatorStats(info.current_bytes, peak))
        return result

    def peaks(self) -> dict[str, PeakReading]:
        """The same figures as :meth:`read`, as every framework's window gives them."""
        return {
            device: PeakReading(start, stats.current_bytes, stats.peak_bytes)
            for device, (start, stats) in self.read().items()
        }

    def close(self) -> None:
        self._tf._open_windows.discard(self)


# -- helpers ------------------------------------------------------------------------------------------
def _one_shot(owner: Any, name: str, note: Callable[[], None], done: Callable[[Any], bool]) -> None:
    """Call ``note()`` just before ``owner.name`` first runs, and unwrap once ``done(self)``."""
    original = getattr(owner, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not done(self):
            try:
                note()
            except Exception:  # recording must never break TensorFlow
                pass
        try:
            return original(self, *args, **kwargs)
        finally:
            if done(self) and owner.__dict__.get(name) is wrapper:
                setattr(owner, name, original)

    functools.update_wrapper(wrapper, original, assigned=(), updated=())  # __wrapped__ only
    setattr(owner, name, wrapper)


def _watch_device_lib(tf: TensorFlow) -> None:
    """``device_lib.list_local_devices()`` starts CUDA without TensorFlow's context: record it too."""

    def wrap(module: Any) -> None:
        original = module.list_local_devices

        def list_local_devices(*args: Any, **kwargs: Any) -> Any:
            tf._note_enumeration()
            return original(*args, **kwargs)

        if getattr(original, "__name__", "") == "list_local_devices" and not hasattr(original, "__wrapped__"):
            functools.update_wrapper(list_local_devices, original, assigned=(), updated=())  # __wrapped__
            module.list_local_devices = list_local_devices

    run_after_import("tensorflow.python.client.device_lib", wrap)


def _physical_index(device: Any) -> int:
    return int(device.name.rsplit(":", 1)[1])


def _nvml_index(device: Any, cuda_map: list[int]) -> int:
    k = _physical_index(device)
    return cuda_map[k] if k < len(cuda_map) else k


# -- its out-of-memory message --------------------------------------------------------------------------
# "OOM when allocating tensor with shape[268435456] and type float on
#  /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu_bfc"
@functools.cache
def _oom_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(the whole message, its device alone): compiled at the first out-of-memory error, not at
    import (a status, which builds every adapter, never needs them)."""
    return (
        re.compile(
            r"OOM when allocating tensor with shape\[(?P<shape>[\d,\s]*)\] and type (?P<dtype>\w+)"
            r" on \S*?device:(?P<device>[A-Z_]+:\d+)(?: by allocator (?P<allocator>\S+))?"
        ),
        re.compile(r"device:(?P<device>(?:GPU|CPU):\d+)"),
    )


_DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}


class OomSite(Record):
    """What TensorFlow's out-of-memory message says about the failed allocation."""

    device: str | None  # "GPU:0" (TensorFlow's numbering) or "CPU:0"; None when not named
    request_bytes: int | None
    request_text: str | None  # "float tensor of shape [268435456]"
    allocator: str | None  # TensorFlow's allocator name, e.g. "GPU_0_bfc"


def parse_oom_message(message: str) -> OomSite:
    message_pattern, device_pattern = _oom_patterns()
    match = message_pattern.search(message)
    if match is None:
        found = device_pattern.search(message)
        return OomSite(found.group("device") if found else None, None, None, None)
    dims = [int(d) for d in match.group("shape").replace(" ", "").split(",") if d]
    dtype = match.group("dtype")
    count = 1
    for d in dims:
        count *= d
    size = _DTYPE_BYTES.get(dtype)
    text = f"{dtype} tensor of shape [{','.join(map(str, dims))}]"
    return OomSite(match.group("device"), count * size if size else None, text, match.group("allocator"))
