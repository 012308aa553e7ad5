"""TensorFlow's side: the only module that touches ``tensorflow`` (and Keras).

It never imports TensorFlow itself: every function works on the module the user already
imported (``sys.modules``) and answers "not started" otherwise.  TensorFlow starts in two
stages (see ../shared/notes/tensorflow.md): *enumeration* (the first device query; CUDA reads
``CUDA_VISIBLE_DEVICES`` then) and *runtime start* (the first op; visibility, growth and logical
devices freeze then).  :func:`stage` tells which, without causing either.
"""

from __future__ import annotations

import enum
import gc
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from . import plan as planning
from .plan import Plan

__all__ = [
    "AllocatorStats",
    "ApplyError",
    "CPU_STATS_ENV",
    "InForce",
    "PeakWindow",
    "Stage",
    "allocator_stats",
    "apply_before_start",
    "clear_session",
    "device_scope",
    "enumerate_devices",
    "in_force",
    "is_oom_error",
    "keras_policy",
    "memory_devices",
    "memory_info",
    "oom_error_type",
    "open_peak_window",
    "set_keras_policy",
    "stage",
    "tf_gpu_to_nvml",
    "write_scalars",
]

# Environment variables TensorFlow reads when its runtime starts (first op).
START_ENV = ("TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "CUDA_VISIBLE_DEVICES")
ASYNC_ALLOCATOR = "cuda_malloc_async"


class Stage(enum.IntEnum):
    NOT_IMPORTED = 0
    IMPORTED = 1  # imported, no device query yet: CUDA_VISIBLE_DEVICES still works
    ENUMERATED = 2  # devices listed: only tf.config changes visibility now
    STARTED = 3  # first op ran: visibility, growth and logical devices are frozen

    def describe(self) -> str:
        return {
            Stage.NOT_IMPORTED: "not imported",
            Stage.IMPORTED: "imported, devices not yet enumerated",
            Stage.ENUMERATED: "devices enumerated, runtime not started",
            Stage.STARTED: "started (first op ran); GPU settings are frozen",
        }[self]


class ApplyError(RuntimeError):
    """TensorFlow refused a configuration; the message says why and what to do."""


@dataclass(frozen=True)
class AllocatorStats:
    """TensorFlow's own allocator for one device, in bytes (not the driver's view)."""

    current_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class InForce:
    """What TensorFlow runs with, once started."""

    visible_nvml: tuple[int, ...]  # NVML indices of the GPUs TensorFlow uses
    logical_mib: dict[int, Optional[tuple[int, ...]]]  # NVML index -> logical GPU caps, or None
    growth: Optional[bool]  # None: TensorFlow's default (no growth)
    allocator: str  # "async" or "default"


# -- private internals, kept in one place --------------------------------------------------------
_start_env: Optional[dict[str, Optional[str]]] = None  # environment when the runtime started


def _tf() -> Any:
    return sys.modules["tensorflow"]


def _context() -> Any:
    """TensorFlow's eager context, or None if it does not exist yet (private API, TF 2.x)."""
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.eager import context  # already loaded with tensorflow

    return context.context_safe()


def stage() -> Stage:
    """TensorFlow's start-up stage, read without advancing it.

    The first time it sees the runtime started it notes the start-up environment variables,
    which TensorFlow read at that moment, so later reports can say what is in force.
    """
    global _start_env
    ctx = _context()
    if "tensorflow" not in sys.modules:
        return Stage.NOT_IMPORTED
    if ctx is None:
        return Stage.IMPORTED
    if getattr(ctx, "_context_handle", None) is not None:
        if _start_env is None:
            _start_env = {name: os.environ.get(name) for name in START_ENV}
        return Stage.STARTED
    if getattr(ctx, "_physical_devices", None) is not None:
        return Stage.ENUMERATED
    return Stage.IMPORTED


def start_env() -> dict[str, Optional[str]]:
    """The start-up variables as TensorFlow read them (or as they are now, before start)."""
    return dict(_start_env) if _start_env is not None else {n: os.environ.get(n) for n in START_ENV}


def _drop_logical_configuration(device: Any) -> None:
    """Forget a logical device configuration before start-up; tf.config has no public way."""
    _context()._virtual_device_map.pop(device, None)


def _physical_index(device: Any) -> int:
    return int(device.name.rsplit(":", 1)[1])


# -- applying a plan before start-up --------------------------------------------------------------
def apply_before_start(
    plan: Plan,
    cuda_map: list[int],
    totals_mib: dict[int, Optional[int]],
    owned_logical: set[int],
) -> list[str]:
    """Apply ``plan`` through ``tf.config`` (TensorFlow imported, runtime not started).

    ``cuda_map[k]`` is the NVML index of CUDA device k; ``totals_mib`` each GPU's memory for
    percentages; ``owned_logical`` the NVML indices whose logical configuration we set (and may
    therefore replace or drop).  Returns notes for the user.  Enumerates devices if needed.
    """
    tf = _tf()
    gpus = tf.config.list_physical_devices("GPU")
    by_nvml = {cuda_map[_physical_index(g)]: g for g in gpus if _physical_index(g) < len(cuda_map)}
    notes: list[str] = []
    if plan.visible is not None:
        _apply_visible(tf, plan.visible, by_nvml)
    visible = tf.config.get_visible_devices("GPU")
    nvml_of = {g: n for n, g in by_nvml.items()}
    for index in sorted(owned_logical):
        device = by_nvml.get(index)
        if device is not None and device not in visible:
            _drop_logical_configuration(device)  # a hidden GPU's stale entry drops growth for all
            owned_logical.discard(index)
    for position, device in enumerate(visible):
        index = nvml_of.get(device, _physical_index(device))
        sizes = planning.logical_sizes_mib(plan, position, totals_mib.get(index))
        _apply_device(tf, device, index, plan.growth, sizes, owned_logical)
        if sizes and plan.split is not None:
            notes.append(f"GPU {index}: {len(sizes)} logical GPUs of {', '.join(f'{s} MiB' for s in sizes)}")
    return notes


def _apply_visible(tf: Any, visible: Any, by_nvml: dict[int, Any]) -> None:
    if visible == "all":
        wanted = list(by_nvml.values())
    elif visible == "none":
        wanted = []
    else:
        missing = [i for i in visible if i not in by_nvml]
        if missing and not by_nvml:
            raise ApplyError(
                "TensorFlow found no GPU at all (a CPU-only TensorFlow build, or no working "
                "NVIDIA driver), so `%gpu use` cannot take effect; check `nvidia-smi` and "
                "`pip show tensorflow`"
            )
        if missing:
            found = ",".join(map(str, sorted(by_nvml))) or "none"
            raise ApplyError(
                f"TensorFlow did not find GPU {','.join(map(str, missing))} (it found: {found}); "
                "it was hidden by CUDA_VISIBLE_DEVICES before TensorFlow listed its devices. "
                "Restart the kernel and put the `%gpu use` line before `import tensorflow`"
            )
        wanted = [by_nvml[i] for i in sorted(visible)]
    try:
        tf.config.set_visible_devices(wanted, "GPU")
    except RuntimeError as err:  # started between our stage check and now
        raise ApplyError(f"TensorFlow refused to change visible GPUs: {err}") from err


def _apply_device(
    tf: Any,
    device: Any,
    index: int,
    growth: Optional[bool],
    sizes: Optional[list[int]],
    owned_logical: set[int],
) -> None:
    """Growth and logical devices for one GPU, in the only order TensorFlow accepts."""
    current = tf.config.get_logical_device_configuration(device)
    wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=s) for s in sizes or []]
    if current and index in owned_logical and current != wanted:
        _drop_logical_configuration(device)  # ours to replace; growth must be set without it
        owned_logical.discard(index)
        current = None
    if growth is not None and not current:
        # Growth goes in before any logical configuration; with one, TensorFlow keeps the
        # growth flag out of GPUOptions and TF_FORCE_GPU_ALLOW_GROWTH carries it instead.
        tf.config.experimental.set_memory_growth(device, growth)
    if wanted:
        tf.config.set_logical_device_configuration(device, wanted)
        owned_logical.add(index)


# -- reading what is in force ---------------------------------------------------------------------
def in_force(cuda_map: list[int]) -> InForce:
    """TensorFlow's GPU configuration (call when :func:`stage` is STARTED or ENUMERATED)."""
    tf = _tf()
    env = start_env()
    visible = tf.config.get_visible_devices("GPU")
    logical: dict[int, Optional[tuple[int, ...]]] = {}
    growth_flags = set()
    for device in visible:
        index = _nvml_index(device, cuda_map)
        config = tf.config.get_logical_device_configuration(device)
        logical[index] = tuple(int(c.memory_limit) for c in config) if config else None
        growth_flags.add(tf.config.experimental.get_memory_growth(device))
    forced = env.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if forced is not None and forced.lower() in ("true", "false"):
        growth: Optional[bool] = forced.lower() == "true"
    else:
        growth = growth_flags.pop() if len(growth_flags) == 1 else None
    allocator = "async" if env.get("TF_GPU_ALLOCATOR") == ASYNC_ALLOCATOR else "default"
    return InForce(tuple(sorted(logical)), logical, growth, allocator)


def _nvml_index(device: Any, cuda_map: list[int]) -> int:
    k = _physical_index(device)
    return cuda_map[k] if k < len(cuda_map) else k


def tf_gpu_to_nvml(cuda_map: Optional[list[int]] = None) -> dict[str, int]:
    """``"GPU:j"`` (TensorFlow's logical numbering) -> NVML index, once devices are enumerated."""
    if stage() < Stage.ENUMERATED:
        return {}
    tf = _tf()
    cuda_map = cuda_map if cuda_map is not None else list(range(64))
    result: dict[str, int] = {}
    for device in tf.config.get_visible_devices("GPU"):
        count = len(tf.config.get_logical_device_configuration(device) or [None])
        for _ in range(count):
            result[f"GPU:{len(result)}"] = _nvml_index(device, cuda_map)
    return result


def allocator_stats() -> dict[str, AllocatorStats]:
    """TensorFlow's allocator in-use and peak bytes per device, once its runtime has started.

    Devices whose allocator keeps no statistics (the default CPU allocator) are left out.
    Never starts TensorFlow: before start-up the answer is empty.
    """
    if stage() < Stage.STARTED:
        return {}
    stats: dict[str, AllocatorStats] = {}
    for device in _tf().config.list_logical_devices():
        if device.device_type in ("GPU", "CPU"):
            name = device.name.rsplit("device:", 1)[-1]
            info = memory_info(name)
            if info is not None:
                stats[name] = info
    return stats


def memory_info(device: str) -> Optional[AllocatorStats]:
    """One device's allocator reading, or None without statistics or before start-up."""
    if stage() < Stage.STARTED:
        return None
    try:
        info = _tf().config.experimental.get_memory_info(device)
    except (ValueError, RuntimeError):
        return None
    return AllocatorStats(int(info["current"]), int(info["peak"]))


# -- Keras ----------------------------------------------------------------------------------------
def keras_policy() -> Optional[str]:
    """The Keras global dtype policy's name, or None when Keras is not imported."""
    keras = sys.modules.get("keras")
    if keras is None or not hasattr(keras, "mixed_precision"):
        return None
    return str(keras.mixed_precision.global_policy().name)


def set_keras_policy(policy: str) -> None:
    sys.modules["keras"].mixed_precision.set_global_policy(policy)


def clear_session() -> bool:
    """Keras ``clear_session`` (if Keras is imported) and ``gc.collect``; True if Keras was cleared."""
    keras = sys.modules.get("keras")
    cleared = keras is not None and hasattr(keras, "utils")
    if cleared:
        keras.utils.clear_session()
    gc.collect()
    return cleared


# -- per-cell memory: peaks, device scopes, out-of-memory errors ----------------------------------
# These serve `%gpu trace`, `%%gpu budget`, `%%gpu on`, the OOM explanation and the Keras callback.
# TensorFlow keeps one peak per device, and `reset_memory_stats` is global, so nested measurements
# (a traced cell holding a budget holding a training run with MemoryCallback) would destroy each
# other's peaks.  :class:`PeakWindow` solves it: before any reset through here, the peak about to be
# lost is folded into every open window.

CPU_STATS_ENV = "TF_CPU_ALLOCATOR_USE_BFC"  # read when TensorFlow creates its CPU allocator
CPU_LIMIT_ENV = "TF_CPU_BFC_MEM_LIMIT_IN_MB"  # the CPU BFC allocator's cap; TensorFlow's default below
CPU_DEFAULT_LIMIT_MIB = 1 << 16

_memory_devices: Optional[tuple[str, ...]] = None  # fixed once the runtime has started
_open_windows: "weakref.WeakSet[PeakWindow]" = weakref.WeakSet()


def memory_devices() -> tuple[str, ...]:
    """Devices whose allocator keeps statistics: the GPUs, or ``CPU:0`` where no GPU is visible.

    Empty before start-up (never starts TensorFlow) and where no allocator keeps statistics (the
    default CPU allocator; see ``TF_CPU_ALLOCATOR_USE_BFC``).  Computed once: devices freeze at start.
    """
    global _memory_devices
    if _memory_devices is not None:
        return _memory_devices
    if stage() < Stage.STARTED:
        return ()
    names = tuple(allocator_stats())
    gpus = tuple(n for n in names if n.startswith("GPU:"))
    _memory_devices = gpus or tuple(n for n in names if n == "CPU:0")
    return _memory_devices


class PeakWindow:
    """The allocator peak of each device between :func:`open_peak_window` and :meth:`read`.

    A window opened before TensorFlow started counts from zero (the allocator did not exist).
    """

    def __init__(self, start: dict[str, int]) -> None:
        self.start = start  # bytes in use per device when the window opened
        self.folded: dict[str, int] = {}  # peaks lost to resets made by nested windows

    def read(self) -> dict[str, tuple[int, AllocatorStats]]:
        """``device -> (bytes in use at the start, AllocatorStats(now, peak in the window))``."""
        result: dict[str, tuple[int, AllocatorStats]] = {}
        for device in memory_devices():
            info = memory_info(device)
            if info is None:
                continue
            peak = max(info.peak_bytes, self.folded.get(device, 0))
            result[device] = (self.start.get(device, 0), AllocatorStats(info.current_bytes, peak))
        return result

    def close(self) -> None:
        _open_windows.discard(self)


def open_peak_window() -> PeakWindow:
    """Reset TensorFlow's peaks (keeping open windows whole) and start measuring from now."""
    start: dict[str, int] = {}
    for device in memory_devices():
        info = memory_info(device)
        if info is None:
            continue
        for window in list(_open_windows):
            window.folded[device] = max(window.folded.get(device, 0), info.peak_bytes)
        if _reset_peak(device):
            start[device] = info.current_bytes
    window = PeakWindow(start)
    _open_windows.add(window)
    return window


def _reset_peak(device: str) -> bool:
    try:
        _tf().config.experimental.reset_memory_stats(device)
    except (ValueError, RuntimeError):
        return False
    return True


def enumerate_devices() -> None:
    """List TensorFlow's devices (stage ENUMERATED) so GPU numbering is known; no op runs."""
    if stage() is Stage.IMPORTED:
        _tf().config.list_physical_devices()


def device_scope(name: str) -> Any:
    """``tf.device("/GPU:0")``: ops created inside run on that device (starts the runtime)."""
    return _tf().device(f"/{name}")


def oom_error_type() -> Optional[type]:
    """``tf.errors.ResourceExhaustedError``, or None while TensorFlow is not imported."""
    tf = sys.modules.get("tensorflow")
    errors = getattr(tf, "errors", None)
    return getattr(errors, "ResourceExhaustedError", None)


def is_oom_error(exc: BaseException) -> bool:
    error_type = oom_error_type()
    return error_type is not None and isinstance(exc, error_type)


def write_scalars(log_dir: str, writers: dict[str, Any], values: dict[str, float], step: int) -> None:
    """TensorBoard scalars; ``writers`` caches one writer per directory.

    ``tf.summary.scalar`` lives in the tensorboard package, which TensorFlow does not require; this
    writes what it writes (a float32 tensor tagged for the "scalars" plugin) with core TensorFlow.
    """
    tf = _tf()
    writer = writers.get(log_dir)
    if writer is None:
        writer = writers[log_dir] = tf.summary.create_file_writer(log_dir)
    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    with writer.as_default():
        for tag, value in values.items():
            tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=metadata)
    writer.flush()
