"""JAX's side: the only code that touches ``jax``.

Like the other adapters it never imports its framework: :meth:`Jax.on_import` receives the
module from the post-import hook once ``import jax`` has finished.

JAX reads every GPU setting from the environment once, when its backends start: at the first
operation or the first ``jax.devices()``, not at ``import jax`` (jax-ml/jax#5555; measured with
jax 0.10.2: ``backends_are_initialized()`` is False after the import).  The CUDA plugin's options
are made by ``jaxlib.xla_client.generate_pjrt_gpu_plugin_options()`` from those variables; the
adapter calls that same function at the moment the backends start, so what it records is what
JAX itself read, not a copy of its rules.  After the start, nothing changes JAX's GPU settings.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
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
    Stage,
    UnresettablePeakWindow,
    attribute,
    capture,
    installed,
    not_the_framework,
    too_late,
)

__all__ = [
    "ALLOCATOR_ENV",
    "ALLOCATOR_NAMES",
    "FRACTION_STEP",
    "JAX_DEFAULT_FRACTION",
    "JAX_START_ENV",
    "MEM_FRACTION_ENV",
    "PREALLOCATE_ENV",
    "Jax",
    "JaxStart",
    "fraction_for",
    "limit_problem",
    "mem_fraction_name",
    "rounded_up_note",
]

PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"  # "false": take memory as needed, not 75% at the first op
ALLOCATOR_ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"
# The fraction of each GPU's total memory JAX's pool may take.  jaxlib 0.10.2 reads both names
# and refuses to start its CUDA client when both are set ("Remove the latter one, it is
# deprecated"): exactly one is ever set.  The old name is the one every release reads.
MEM_FRACTION_ENV = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
# `%gpu allocator NAME` -> the value JAX's CUDA plugin accepts (None: JAX's default, unset).
# "platform" allocates and frees on demand through CUDA: the only one that hands memory back, and slow.
ALLOCATOR_NAMES = {"async": "cuda_async", "platform": "platform", "default": None}
JAX_DEFAULT_FRACTION = 0.75  # of each GPU's total, taken at the first operation (JAX's documentation)


# Its out-of-memory messages (XLA): "Out of memory while trying to allocate 4294967296 bytes." or "Failed
# to allocate request for 1.00GiB (1073741824B) on device ordinal 1".
@functools.cache
def _oom_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(the size, the device ordinal) in XLA's message: compiled at the first out-of-memory error,
    not at import (a status, which builds every adapter, never needs them)."""
    return re.compile(r"allocate (?P<bytes>\d+) bytes|\((?P<b>\d+)B\)"), re.compile(
        r"device ordinal (?P<ordinal>\d+)"
    )


# What the adapter uses of ``jax``: a module without them is not JAX (a planted jax.py).
NEEDS = ("devices", "default_device", "clear_caches")
JAX_START_ENV = (*CUDA_ENV, PREALLOCATE_ENV, ALLOCATOR_ENV, *MEM_FRACTION_ENV, "JAX_PLATFORMS")


def mem_fraction_name(env: Mapping[str, str]) -> str:
    """The name to set: the new one only where the user chose it alone (never both)."""
    old, new = MEM_FRACTION_ENV
    return new if env.get(new) and not env.get(old) else old


class JaxStart(Record):
    """What JAX started its backends with, as its CUDA plugin read the variables."""

    preallocate: bool  # True: 75% of each GPU (or the fraction) taken at the first op
    memory_fraction: float | None  # None: JAX's default (0.75)
    allocator: str  # "default", "platform", "cuda_async", "bfc" or "vmm"
    cuda_visible_devices: str | None  # as CUDA read it then (None: unset, every GPU)
    gpu: bool  # a GPU backend started (False on the CPU build, or with no GPU to see)

    def describe(self) -> str:
        fraction = "the default 0.75" if self.memory_fraction is None else f"{self.memory_fraction:g}"
        return (
            f"preallocation {'on' if self.preallocate else 'off'}, memory fraction {fraction}, "
            f"the {self.allocator} allocator"
        )


class Jax(ReportingDefaults):
    """The adapter: every question to JAX goes through one of these (one per process)."""

    key = "jax"
    name = "JAX"
    module = "jax"
    start_variables = tuple(n for n in JAX_START_ENV if n not in CUDA_ENV)
    managed_variables = (PREALLOCATE_ENV, *MEM_FRACTION_ENV, ALLOCATOR_ENV)  # what tfgpu_magic sets for it
    takes_effect = "when its backends start (its first operation)"  # once jax is imported

    def __init__(self) -> None:
        self._jax: Any = None
        self._bridge: Any = None  # jax._src.xla_bridge: where the backends start
        self._lock = threading.Lock()
        self.started_with: Capture | None = None  # the variables when the backends started
        self.plugin_options: dict[str, Any] | None = None  # what JAX's CUDA plugin made of them
        self.plugin_error: str | None = None  # why it would refuse them (both fraction names set...)
        self._gpu_seen: bool | None = None
        self.memory_error: str | None = None  # the last device whose statistics could not be read
        self.warn: Callable[[str], None] | None = (
            None  # the kernel's: said at JAX's start, to whoever uses it
        )
        self.given: Resolution | None = None  # the request given to it, read at its start
        self.imported_by_tensorflow = False  # see on_import
        self.in_use_now = False  # its backends are starting: the notebook uses it, whoever imported it
        self.starting: Callable[[], None] | None = None  # the kernel's, just before its backends start
        self.refused: str | None = None  # why what `import jax` gave is not JAX
        self.environ: Mapping[str, str] = os.environ  # where CUDA and the framework read their variables
        self.cuda_record: CudaRecord | None = None  # the kernel's, handed over by the session

    # -- the moment jax arrives ---------------------------------------------------------------------
    def on_import(self, module: Any) -> None:
        """Called on the importing thread once ``import jax`` has finished."""
        with self._lock:
            if self._jax is not None or self.refused is not None:
                return
            self.refused = not_the_framework(module, self.name, self.module, NEEDS)
            if self.refused is not None:
                return
            self._jax = module
            self._bridge = attribute(module, "_src.xla_bridge")
            # TensorFlow 2.21 imports jax while it is itself being imported (measured here):
            # then jax is TensorFlow's, not the notebook's, and takes no share of the limit.
            tensorflow = sys.modules.get("tensorflow")
            self.imported_by_tensorflow = bool(attribute(tensorflow, "__spec__._initializing"))
            if self._started():
                self._note_start(late=True)
            elif self._bridge is not None:
                try:
                    _before_first_call(
                        self._bridge, "backends", self._note_start, self._started, self._note_started
                    )
                except Exception as err:  # a bridge that cannot be wrapped: its start is recorded late
                    self.plugin_error = f"JAX's start could not be watched ({type(err).__name__}: {err})"

    def _note_start(self, late: bool = False) -> None:
        """Just before JAX starts its backends: record the variables and JAX's reading of them."""
        if self.started_with is not None:
            return
        if not late and self.starting is not None:
            # Its first operation says the notebook uses it (TensorFlow's import of jax says
            # nothing): the kernel gives it its part of the limit now, before it reads its variables.
            self.in_use_now = True
            try:
                self.starting()
            except Exception:  # JAX starts, with what the environment holds
                pass
        self.started_with = capture(JAX_START_ENV, late=late, env=self.environ)
        make_options = attribute(self._jax, "_src.lib.xla_client.generate_pjrt_gpu_plugin_options")
        if make_options is None:
            return
        try:
            self.plugin_options = dict(make_options())
        except Exception as err:  # JAX will fail the same way on a GPU; say so in %gpu
            self.plugin_error = f"{type(err).__name__}: {err}"

    def _note_started(self, backends: Any) -> None:
        """Right after the backends started, with what ``backends()`` returned: whether one is a GPU's,
        kept (clear_backends forgets it); the session hears of a start on a GPU (a CPU-only JAX has
        no GPU settings to speak of).

        JAX's own answer is read, never ``jax.devices()``: that goes through a cached
        ``get_backend()`` which JAX 0.11 cannot enter again while its first call is still starting
        the backends (on an H100 the adapter recorded "no GPU" that way)."""
        if self._gpu_seen is not None:
            return
        self._gpu_seen = _has_gpu_backend(backends)
        if self._gpu_seen and self.cuda_record is not None and self.started_with is not None:
            cuda = {name: self.started_with.get(name) for name in CUDA_ENV}  # as its plugin read them
            self.cuda_record.note(
                Capture(cuda, self.started_with.late), self.name, "when JAX's backends started"
            )
        if self._gpu_seen and not getattr(self.started_with, "late", True):
            self._say_missing_fraction()

    def _say_missing_fraction(self) -> None:
        """On the starting thread: a limit JAX cannot take is said now, to whoever uses JAX
        (TensorFlow imports jax without using it, so not at its import)."""
        problem = None if self.given is None else limit_problem(self.given)
        if problem is None or self.warn is None:
            return
        try:
            self.warn(f"JAX starts without a memory fraction: {problem}")
        except Exception:  # a note that cannot be made must not stop JAX
            pass

    def installed(self) -> bool:
        return self._jax is not None or installed(self.module)

    # -- the write side: what a setting means for JAX ---------------------------------------------------
    def takes(self, command: Any) -> bool:
        return not isinstance(command, (commands.Split, commands.Precision))

    def consider(self, change: Change) -> str | None:
        """Its clause of the reply.  Before its backends start JAX is given everything through the
        environment, and said only when the user imported it: TensorFlow 2.21 imports jax itself
        where it is installed (tensorflow/lite/python/util.py), so an imported JAX is no sign that
        the notebook uses it."""
        command, resolution, stage = change.command, change.resolution, self.stage()
        if isinstance(command, commands.Limit) and stage is not Stage.STARTED:
            self._check_fraction_names(change)
        platform = isinstance(command, commands.Allocator) and command.name == "platform"
        if platform and stage is not Stage.STARTED:
            return "JAX only, read when its backends start: it allocates on demand and hands freed memory back, slowly"
        if isinstance(command, commands.Limit) and stage is Stage.NOT_IMPORTED and self.installed():
            return rounded_up_note(resolution)
        by_user = stage is not Stage.NOT_IMPORTED and not self._imported_with_tensorflow(change)
        if isinstance(command, commands.Split) and by_user:
            return "JAX: has no logical GPUs, so `split` does not reach it"
        if stage is Stage.NOT_IMPORTED or not isinstance(
            command, (commands.Use, commands.Grow, commands.Limit, commands.Allocator)
        ):
            return None
        limit = isinstance(command, commands.Limit)
        problem = limit_problem(resolution) if limit else None
        rounded = rounded_up_note(resolution) if limit else None
        if rounded is not None and stage is not Stage.STARTED:
            return rounded
        if stage is Stage.STARTED:
            start = self.start()
            if start is None or not start.gpu:
                return "JAX: started without a GPU backend, so GPU settings do not reach it"
            if problem is not None:
                raise Refusal(problem)
            differs, now = self._difference(command, resolution, start, change.host)
            if differs:
                raise Refusal(too_late(self.name, self.module, change.what, now))
            return "JAX: already started with it"
        if problem is not None:  # accepted for the other frameworks; JAX starts uncapped
            return f"JAX gets no memory fraction from it: {problem}"
        return f"JAX: takes effect {self.takes_effect}" if by_user else None

    @staticmethod
    def _imported_with_tensorflow(change: Change) -> bool:
        return any(o.key == "tensorflow" and o.stage() is not Stage.NOT_IMPORTED for o in change.others)

    def _check_fraction_names(self, change: Change) -> None:
        """JAX's CUDA plugin refuses to start when both names of its fraction are set."""
        if all(change.host.env.get(name) for name in MEM_FRACTION_ENV):
            old, new = MEM_FRACTION_ENV
            raise Refusal(
                f"{old} and {new} are both set, and JAX refuses to start its CUDA client with both: "
                f"remove one first (`del os.environ['{old}']`), then run `%gpu {change.what}` again"
            )

    def _difference(
        self, command: Any, resolution: Resolution, start: JaxStart, host: Host
    ) -> tuple[bool, str]:
        """Whether a started JAX runs with something else than ``command`` asks, and with what."""
        if isinstance(command, commands.Grow):
            return start.preallocate == command.on, f"preallocation {'on' if start.preallocate else 'off'}"
        if isinstance(command, commands.Allocator):
            wanted = ALLOCATOR_NAMES[command.name] or "default"
            return start.allocator != wanted, f"the {start.allocator} allocator"
        if isinstance(command, commands.Limit):
            fraction = fraction_for(resolution)
            now = start.memory_fraction
            in_effect = JAX_DEFAULT_FRACTION if now is None else now
            same = abs((JAX_DEFAULT_FRACTION if fraction is None else float(fraction)) - in_effect) < 1e-3
            shown = "its default memory fraction (0.75)" if now is None else f"a memory fraction of {now:g}"
            return not same, shown
        value = start.cuda_visible_devices
        shown = f"CUDA_VISIBLE_DEVICES={value}" if value is not None else "every GPU visible"
        return host.visible_value(resolution) != value, shown

    def prepare(self, change: Change) -> None:
        """Its variables, read when its backends start: what was never asked keeps the user's own
        value; what was asked is set, defaults included; exactly one name of the fraction."""
        if self.stage() is Stage.STARTED:
            return
        plan, host = change.plan, change.host
        preallocate = {None: host.unmanaged_value(PREALLOCATE_ENV), True: "false", False: "true"}
        host.set_env(PREALLOCATE_ENV, preallocate[plan.growth])
        if plan.allocator is None:
            host.set_env(ALLOCATOR_ENV, host.unmanaged_value(ALLOCATOR_ENV))
        else:
            host.set_env(ALLOCATOR_ENV, ALLOCATOR_NAMES[plan.allocator])
        # A limit asked, or a platform share's default cap (resolved into the GPUs' caps).
        capped = any(g.cap_mib is not None for g in change.resolution.gpus)
        fraction = fraction_for(change.resolution) if capped else None
        chosen = mem_fraction_name({n: host.unmanaged_value(n) or "" for n in MEM_FRACTION_ENV})
        for name in MEM_FRACTION_ENV:  # exactly one name: the user's choice, else the old one
            value = fraction if name == chosen and fraction is not None else host.unmanaged_value(name)
            host.set_env(name, value)

    def give(self, resolution: Resolution, host: Host) -> bool:
        """JAX reads the environment at its start: until then, this is what it will be given."""
        if Stage.IMPORTED <= self.stage() < Stage.STARTED:
            self.given = resolution
            return True
        return False

    def takes_share(self) -> bool:
        """Imported by the notebook (TensorFlow 2.21 imports jax for its own use), or started on a GPU."""
        if self.stage() is Stage.NOT_IMPORTED:
            return False
        return (
            not self.imported_by_tensorflow
            or self.in_use_now
            or (self.stage() is Stage.STARTED and self._started_a_gpu())
        )

    def share_fixed(self) -> bool:
        return self.stage() is Stage.STARTED

    def arrived(self, plan: Plan) -> str | None:
        return None

    def enumerated(self) -> bool:
        return False  # JAX lists CUDA's GPUs as its backends start: no stage of its own

    def cuda_found(self) -> list[int] | None:
        return None

    def device_gpus(self, cuda_map: list[int]) -> dict[str, int]:
        """``gpu:k`` -> nvidia-smi index, once its backends started on a GPU."""
        return {f"gpu:{k}": cuda_map[k] for k in self.gpu_ids() if k < len(cuda_map)}

    def set_precision(self, policy: str | None) -> str | None:
        return None  # the Keras policy reaches JAX code through Keras alone

    def side_imports(self) -> dict[str, Callable[[Any, Plan], None]]:
        return {}

    def frozen(self, kept: Plan, host: Host) -> list[str]:
        start = self.start()
        if start is None or not start.gpu:
            return []
        return [f"JAX started with {start.describe()} (restart the kernel to change them)"]

    def free_reading(self) -> dict[str, DeviceMemory]:
        return self.device_memory()

    def free(self, plan: Plan, before: Any) -> FreeReport:
        """Its caches cleared, its arrays left alone, its pool as it is."""
        if not self.clear_caches():
            return FreeReport()
        after = self.device_memory()
        lines = [
            "Ran jax.clear_caches(): compiled functions are dropped. JAX's arrays are yours and are not "
            "deleted: `del` the ones you no longer need, then run `%gpu free` again."
        ]
        for device in sorted(set(before) | set(after)):
            b, a = before.get(device), after.get(device)
            b_n, a_n = (b.in_use_bytes if b else None), (a.in_use_bytes if a else None)
            lines.append(
                f"{device}  JAX allocator in use: {format_bytes(b_n)} -> {format_bytes(a_n)} ({format_change(b_n, a_n)})"
            )
        start = self.start()
        if start is not None and start.gpu and start.allocator != "platform":
            lines.append(
                f"JAX's pool keeps what it took (the {start.allocator} allocator) until the kernel restarts; "
                "only `%gpu allocator platform` before JAX starts hands freed memory back."
            )
        return FreeReport(tuple(lines))

    def read_environment(self, env: Mapping[str, str]) -> dict[str, str | None]:
        """Its variables as JAX read them when its backends started, or as ``env`` holds them before."""
        if self.started_with is not None:
            return {name: self.started_with.get(name) for name in self.start_variables}
        return {name: env.get(name) for name in self.start_variables}

    # -- the stage --------------------------------------------------------------------------------------
    def stage(self) -> Stage:
        """NOT_IMPORTED, IMPORTED (backends not started: every setting still applies) or STARTED.

        STARTED stays once the first start was attempted: JAX's CUDA plugin reads its options once,
        when the plugins are discovered, and ``clear_backends()`` (or a failed start) does not
        make it read them again."""
        if self._jax is None:
            return Stage.NOT_IMPORTED
        return Stage.STARTED if self.started_with is not None or self._started() else Stage.IMPORTED

    def _started(self) -> bool:
        try:
            return bool(self._bridge.backends_are_initialized())
        except Exception:
            return False

    def start(self) -> JaxStart | None:
        """What JAX started with (the record made at its start); None before."""
        seen = self.started_with
        if seen is None or self.stage() is not Stage.STARTED:
            return None
        options = self.plugin_options if self.plugin_options is not None else _options_from(seen)
        fraction = options.get("memory_fraction")
        return JaxStart(
            preallocate=bool(options.get("preallocate", True)),
            memory_fraction=None if fraction is None else float(fraction),
            allocator=str(options.get("allocator", "default")),
            cuda_visible_devices=seen.get("CUDA_VISIBLE_DEVICES"),
            gpu=self._started_a_gpu(),
        )

    def _started_a_gpu(self) -> bool:
        """Whether the backends started with a GPU: recorded at the start, or (JAX started before
        tfgpu_magic was loaded) asked of the running backends once, then kept."""
        if self._gpu_seen is None and self._started():
            try:
                self._gpu_seen = _has_gpu_backend(self._bridge.backends())
            except Exception:  # a start that failed: no GPU backend runs
                self._gpu_seen = False
        return bool(self._gpu_seen)

    def platforms(self) -> list[str]:
        """The started backends' devices' platforms (``["cpu"]`` on the CPU build); [] before."""
        if not self._started():  # never start (or restart) JAX's backends to answer
            return []
        try:
            return sorted({d.platform for d in self._jax.devices()})
        except Exception:
            return []

    def _gpu_devices(self) -> list[Any]:
        if not self._started():
            return []
        try:
            return [d for d in self._jax.devices() if d.platform in GPU_PLATFORMS]
        except Exception:  # no GPU backend: the default backend is the CPU
            return []

    # -- memory -------------------------------------------------------------------------------------------
    def device_memory(self) -> dict[str, DeviceMemory]:
        """``device.memory_stats()`` per GPU (the CPU backend keeps none); empty before the start."""
        figures = {}
        for device in self._gpu_devices():
            try:
                stats = device.memory_stats()
            except Exception as err:  # one device's fault is a note (%gpu shows it), not a broken %gpu
                self.memory_error = f"gpu:{device.id}: {type(err).__name__}: {err}"
                continue
            if not stats:
                continue
            figures[f"gpu:{device.id}"] = DeviceMemory(
                int(stats.get("bytes_in_use", 0)),
                int(stats.get("peak_bytes_in_use", 0)),
                reserved_bytes=_int_or_none(stats.get("pool_bytes", stats.get("bytes_reserved"))),
                limit_bytes=_int_or_none(stats.get("bytes_limit")),
            )
        return figures

    def open_peak_window(self) -> UnresettablePeakWindow:
        """JAX cannot reset its peak: a window knows the peak only when it rose inside it."""
        return UnresettablePeakWindow(self.device_memory)

    def clear_caches(self) -> bool:
        """``jax.clear_caches()``: compiled functions and their constants.  Arrays are the user's:
        never deleted here.  True if JAX had started (before, it holds nothing)."""
        if self.stage() is not Stage.STARTED:
            return False
        self._jax.clear_caches()
        return True

    def device_scope(self, cuda_index: int) -> Any:
        """``jax.default_device``: new arrays of the cell go to JAX's GPU ``cuda_index``."""
        devices = {d.id: d for d in self._gpu_devices()}
        if cuda_index not in devices:
            raise LookupError(cuda_index)
        return self._jax.default_device(devices[cuda_index])

    def gpu_ids(self) -> list[int]:
        return sorted(d.id for d in self._gpu_devices())

    def oom_error_type(self) -> type | None:
        """``jax.errors.JaxRuntimeError`` (out of memory is its RESOURCE_EXHAUSTED kind)."""
        if self._jax is None:
            return None
        return getattr(getattr(self._jax, "errors", None), "JaxRuntimeError", None)

    # -- figures for the panel and the trace --
    charted_figures = (ChartedFigure("in_use", "in_use_bytes", "in use"),)

    def figures_absent(self) -> str | None:
        """Nothing before its first operation; its CPU backend keeps no statistics (memory_stats() is None)."""
        stage = self.stage()
        if stage is Stage.NOT_IMPORTED:
            return None
        if stage is not Stage.STARTED:
            return "until its first operation"
        if self._gpu_devices():
            return None
        return "on this build (its CPU backend keeps none)"

    def gpu_numbering(self, cuda_map: list[int]) -> dict[str, int]:
        """``gpu:k`` -> nvidia-smi index: CUDA's device k (JAX numbers GPUs as CUDA does)."""
        return {f"gpu:{k}": index for k, index in enumerate(cuda_map)}

    # TensorFlow imports jax itself where it is installed: only a start says the user works with it.
    # The session's no-GPU diagnosis is TensorFlow's.
    import_says_little = True
    no_gpu_diagnosed = False

    # -- reports (status, out-of-memory, %%gpu on) --------------------------------------------------
    def report(self, view: ReportView) -> dict[str, Any]:
        """Its entry under ``frameworks`` in ``%gpu status --json``: the stage and, once its backends
        started, what it started with: the variables as they were then and the options its CUDA
        plugin made of them (JAX's own reading)."""
        stage = self.stage()
        entry: dict[str, Any] = {
            "stage": stage.name.lower(),
            "imported": stage is not Stage.NOT_IMPORTED,
            "installed": self.installed(),
        }
        if stage is Stage.NOT_IMPORTED:
            return entry
        start = self.start()
        seen = self.started_with
        memory = self.device_memory()  # before memory_error: a failed reading is recorded by it
        entry.update(
            {
                "started": stage is Stage.STARTED,
                "applied": None if view.applied is None else view.applied.describe(),
                "platforms": self.platforms(),
                "started_with": None
                if start is None
                else {
                    "preallocate": start.preallocate,
                    "memory_fraction": start.memory_fraction,
                    "allocator": start.allocator,
                    "cuda_visible_devices": start.cuda_visible_devices,
                    "gpu": start.gpu,
                },
                "environment_at_start": None if seen is None else dict(seen.env),
                # True: JAX had started before tfgpu_magic loaded; the variables are the ones found then.
                "recorded_late": None if seen is None else seen.late,
                "plugin_error": self.plugin_error,
                "no_fraction": None if view.accepted is None else limit_problem(view.accepted),
                "memory_error": self.memory_error,
                "memory": {
                    device: {
                        "in_use_bytes": m.in_use_bytes,
                        "peak_bytes": m.peak_bytes,
                        "reserved_bytes": m.reserved_bytes,
                        "limit_bytes": m.limit_bytes,
                    }
                    for device, m in memory.items()
                },
            }
        )
        return entry

    def status_lines(self, entry: dict[str, Any]) -> list[str]:
        """Its stage and what it started with: shown once it is imported."""
        if not entry.get("imported"):
            return []
        label = f"{self.name + ':':<11}"
        if not entry["started"]:
            lines = [f"{label} imported, backends not started: every GPU setting still applies"]
            if entry.get("no_fraction"):
                lines.append(f"  no memory fraction for {self.name}: {entry['no_fraction']}")
            return lines
        start = entry["started_with"]
        platforms = ", ".join(entry["platforms"]) or "unknown"
        refused = (
            [f"  its CUDA plugin refuses the variables: {entry['plugin_error']}"]
            if entry["plugin_error"]
            else []
        )
        if start is None or not start["gpu"]:
            return [
                f"{label} started on {platforms}: no GPU backend, so GPU settings do not reach it",
                *refused,
            ]
        fraction = "0.75 (default)" if start["memory_fraction"] is None else f"{start['memory_fraction']:g}"
        late = (
            f" (as found when tfgpu_magic loaded: {self.name} had started before)"
            if entry["recorded_late"]
            else ""
        )
        lines = [
            f"{label} started on {platforms} with preallocation {'on' if start['preallocate'] else 'off'}, "
            f"memory fraction {fraction}, the {start['allocator']} allocator{late}",
            *refused,
        ]
        if entry["memory_error"]:
            lines.append(f"  note: no memory reading for {entry['memory_error']}")
        for device, memory in entry["memory"].items():
            lines.append(
                f"  {device} {self.name} allocator: {format_bytes(memory['in_use_bytes'])} in use, "
                f"peak {format_bytes(memory['peak_bytes'])}, pool {format_bytes(memory['reserved_bytes'])}"
            )
        return lines

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Its runtime error covers every failure: only its RESOURCE_EXHAUSTED kind is memory."""
        return "RESOURCE_EXHAUSTED" in str(error)

    def oom_facts(self, error: BaseException, view: ReportView) -> OomFacts | None:
        """``JaxRuntimeError``: the request and the device ordinal it names, its pool, its fraction."""
        oom_type = self.oom_error_type()
        if oom_type is None or not isinstance(error, oom_type):
            return None
        message = str(error)
        size_pattern, ordinal_pattern = _oom_patterns()
        found = size_pattern.search(message)
        request = format_size(int(found.group("bytes") or found.group("b"))) if found is not None else None
        ordinal = ordinal_pattern.search(message)
        cuda_index = int(ordinal.group("ordinal")) if ordinal else 0
        requested = [f"Failed request: {request}"] if request else []
        steps = (
            f"`del` the arrays you no longer need ({self.name} keeps every live array), then run the cell again",
            "a smaller batch size (halve it until the cell fits)",
        )
        start = self.start()
        if start is None or not start.gpu:  # JAX on the CPU: no GPU to blame
            lines = [
                *requested,
                f"{self.name}'s allocator: no figures (CUDA has not started); "
                f"limit: none of {self.name}'s own on the CPU (the system's memory)",
            ]
            label = f"the CPU ({self.name} has no GPU backend)"
            return OomFacts("CPU:0", label, label, False, None, tuple(lines), steps)
        device = f"gpu:{cuda_index}"
        memory = self.device_memory().get(device)
        figures = "no figures (CUDA has not started)"
        if memory is not None:
            reserved = (
                f", {format_size(memory.reserved_bytes)} reserved"
                if memory.reserved_bytes is not None
                else ""
            )
            figures = f"{format_size(memory.in_use_bytes)} in use{reserved}"
        gpu = view.cuda_map[cuda_index] if cuda_index < len(view.cuda_map) else None
        if gpu is None:
            limit = "unknown (the GPU could not be mapped to nvidia-smi's numbering)"
        else:
            fraction = (
                f"0.75, {self.name}'s default"
                if start.memory_fraction is None
                else f"{start.memory_fraction:g}"
            )
            pool = f"{format_size(memory.limit_bytes)}, " if memory is not None and memory.limit_bytes else ""
            limit = f"{pool}memory fraction {fraction} (read when {self.name} started)"
        named = f"{self.name} {device}"
        lines = [*requested, f"{self.name}'s allocator: {figures}; limit: {limit}"]
        return OomFacts(device, named, named, True, gpu, tuple(lines), steps)

    def gpu_scope(self, gpu: int, view: ReportView) -> tuple[list[int] | None, Any]:
        """For ``%%gpu on``, once its backends started: its GPUs (nvidia-smi numbers), and
        ``jax.default_device`` on ``gpu``."""
        if self.stage() is not Stage.STARTED:
            return None, None
        cuda_map = list(view.cuda_map)
        seen = [cuda_map[k] for k in self.gpu_ids() if k < len(cuda_map)]
        return seen, self.device_scope(cuda_map.index(gpu)) if gpu in seen else None

    def scope_hint(self) -> tuple[str, str]:
        return "jax.default_device", "a first JAX operation"

    def in_use(self) -> bool:
        """Started: TensorFlow 2.21 imports jax itself where it is installed, so an import says nothing."""
        return self.stage() is Stage.STARTED


GPU_PLATFORMS = ("gpu", "cuda", "rocm")  # a client's or a device's platform, as JAX names it


def _has_gpu_backend(backends: Any) -> bool:
    """Whether ``xla_bridge.backends()``'s answer (platform name -> client) holds a GPU's client."""
    try:
        return any(
            name in GPU_PLATFORMS or getattr(client, "platform", None) in GPU_PLATFORMS
            for name, client in dict(backends).items()
        )
    except Exception:
        return False


def _options_from(seen: Capture) -> dict[str, Any]:
    """What the variables JAX read at its start ask for, where its CUDA plugin could not say
    (it refused them, or this jaxlib has no such function): never JAX's defaults in their place."""
    options: dict[str, Any] = {}
    preallocate = (seen.get(PREALLOCATE_ENV) or "").strip().lower()
    if preallocate:
        options["preallocate"] = preallocate not in ("false", "0")
    for name in MEM_FRACTION_ENV:
        try:
            options["memory_fraction"] = float(seen.get(name) or "")
            break
        except ValueError:
            continue
    allocator = seen.get(ALLOCATOR_ENV)
    if allocator:
        options["allocator"] = allocator
    return options


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _before_first_call(owner: Any, name: str, note: Any, done: Any, after: Any) -> None:
    """Call ``note()`` before ``owner.name()`` runs until ``done()``; then put the original back
    and call ``after(result)`` with what that call returned."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not done():
            try:
                note()
            except Exception:  # recording must never break JAX
                pass
        result = None
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            if done() and getattr(owner, name) is wrapper:
                setattr(owner, name, original)
                try:
                    after(result)  # None where the start raised: no GPU backend runs
                except Exception:  # recording must never break JAX
                    pass

    functools.update_wrapper(wrapper, original, assigned=(), updated=())  # __wrapped__ only
    setattr(owner, name, wrapper)


# -- JAX's one memory fraction ----------------------------------------------------------------------------
FRACTION_STEP = 0.0001  # the fractions given to JAX are multiples of this


class _Cap(Record):
    """A GPU's cap and total (MiB) in a resolution."""

    index: int  # nvidia-smi's
    cap_mib: int
    total_mib: int


def _caps(resolution: Resolution) -> list[_Cap]:
    """The GPUs with a cap and a known total."""
    return [
        _Cap(g.index, g.cap_mib, g.total_mib)
        for g in resolution.gpus
        if g.cap_mib is not None and g.total_mib
    ]


def fraction_for(resolution: Resolution) -> str | None:
    """JAX's one memory fraction for the request's caps (rounded down: JAX never exceeds a cap);
    None without a cap, or where the caps are different fractions (see limit_problem)."""
    limits = resolution.plan.limits or ()
    capped = _caps(resolution)
    if len(limits) == 1 and isinstance(
        limits[0], commands.Percent
    ):  # JAX's fraction exactly, above the step,
        percent = limits[0].value  # unless the kernel's limit was divided (its part is then a smaller one)
        if all(g.cap_mib == max(1, int(g.total_mib * percent / 100)) for g in capped):
            return f"{max(percent / 100, FRACTION_STEP):g}"
    fractions = [g.cap_mib / g.total_mib for g in capped]
    # Sizes in MiB: the same share of two GPUs can differ in the fourth decimal, no more.
    if not fractions or max(fractions) - min(fractions) > 0.001:
        return None
    # Never 0, which JAX would take as "no memory at all": a cap below the smallest step gets
    # that step (said in the reply, see rounded_up_note).
    return f"{max(math.floor(min(fractions) / FRACTION_STEP), 1) * FRACTION_STEP:g}"


def rounded_up_note(resolution: Resolution) -> str | None:
    """The note for caps below JAX's smallest fraction step (which JAX gets instead), or None."""
    caps = _caps(resolution)
    fraction = fraction_for(resolution)
    if not caps or fraction is None or any(g.cap_mib / g.total_mib >= FRACTION_STEP for g in caps):
        return None
    given = ", ".join(
        f"{format_bytes(int(g.total_mib * FRACTION_STEP * MIB))} of GPU {g.index}" for g in caps
    )
    return f"JAX: gets a memory fraction of {fraction}, the smallest it is given ({given}), above this limit"


def limit_problem(resolution: Resolution) -> str | None:
    """Why JAX cannot be given these caps: it takes one fraction of total memory for all its GPUs."""
    caps = _caps(resolution)
    if not caps or fraction_for(resolution) is not None:
        return None
    shown = ", ".join(f"{g.cap_mib / g.total_mib:.0%} of GPU {g.index}" for g in caps)
    return (
        f"JAX takes one memory fraction for all its GPUs, and these limits are {shown}; for JAX, "
        "give one percentage for all (`%gpu limit 50%`) or sizes that are the same share of each GPU"
    )
