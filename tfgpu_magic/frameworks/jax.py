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

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, MutableMapping, Optional

from .base import CUDA_ENV, Capture, ChartedFigure, CudaRecord, DeviceMemory, Stage, UnresettablePeakWindow, attribute, capture, installed, not_the_framework

__all__ = [
    "ALLOCATOR_ENV",
    "ALLOCATOR_NAMES",
    "JAX_DEFAULT_FRACTION",
    "JAX_START_ENV",
    "Jax",
    "JaxStart",
    "MEM_FRACTION_ENV",
    "PREALLOCATE_ENV",
    "mem_fraction_name",
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
# What the adapter uses of ``jax``: a module without them is not JAX (a planted jax.py).
NEEDS = ("devices", "default_device", "clear_caches")
JAX_START_ENV = CUDA_ENV + (PREALLOCATE_ENV, ALLOCATOR_ENV, *MEM_FRACTION_ENV, "JAX_PLATFORMS")


def mem_fraction_name(env: Mapping[str, str]) -> str:
    """The name to set: the new one only where the user chose it alone (never both)."""
    old, new = MEM_FRACTION_ENV
    return new if env.get(new) and not env.get(old) else old


@dataclass(frozen=True)
class JaxStart:
    """What JAX started its backends with, as its CUDA plugin read the variables."""

    preallocate: bool  # True: 75% of each GPU (or the fraction) taken at the first op
    memory_fraction: Optional[float]  # None: JAX's default (0.75)
    allocator: str  # "default", "platform", "cuda_async", "bfc" or "vmm"
    cuda_visible_devices: Optional[str]  # as CUDA read it then (None: unset, every GPU)
    gpu: bool  # a GPU backend started (False on the CPU build, or with no GPU to see)

    def describe(self) -> str:
        fraction = "the default 0.75" if self.memory_fraction is None else f"{self.memory_fraction:g}"
        return (
            f"preallocation {'on' if self.preallocate else 'off'}, memory fraction {fraction}, "
            f"the {self.allocator} allocator"
        )


class Jax:
    """The adapter: every question to JAX goes through one of these (one per process)."""

    key = "jax"
    name = "JAX"
    module = "jax"
    start_variables = tuple(n for n in JAX_START_ENV if n not in CUDA_ENV)
    takes_effect = "when its backends start (its first operation)"  # once jax is imported

    def __init__(self) -> None:
        self._jax: Any = None
        self._bridge: Any = None  # jax._src.xla_bridge: where the backends start
        self._lock = threading.Lock()
        self.started_with: Optional[Capture] = None  # the variables when the backends started
        self.plugin_options: Optional[dict[str, Any]] = None  # what JAX's CUDA plugin made of them
        self.plugin_error: Optional[str] = None  # why it would refuse them (both fraction names set...)
        self._gpu_seen: Optional[bool] = None
        self.memory_error: Optional[str] = None  # the last device whose statistics could not be read
        self.on_start: Optional[Callable[[], None]] = None  # the session's, called once JAX started on a GPU
        self.refused: Optional[str] = None  # why what `import jax` gave is not JAX
        self.environ: Mapping[str, str] = os.environ  # where CUDA and the framework read their variables
        self.cuda_record: Optional[CudaRecord] = None  # the kernel's, handed over by the session

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
            if self._started():
                self._note_start(late=True)
            elif self._bridge is not None:
                try:
                    _before_first_call(self._bridge, "backends", self._note_start, self._started, self._note_started)
                except Exception as err:  # a bridge that cannot be wrapped: its start is recorded late
                    self.plugin_error = f"JAX's start could not be watched ({type(err).__name__}: {err})"

    def _note_start(self, late: bool = False) -> None:
        """Just before JAX starts its backends: record the variables and JAX's reading of them."""
        if self.started_with is not None:
            return
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
            self.cuda_record.note(Capture(cuda, self.started_with.late), self.name)
        if self._gpu_seen and self.on_start is not None and not getattr(self.started_with, "late", True):
            try:
                self.on_start()
            except Exception:  # a note that cannot be made must not stop JAX
                pass

    def installed(self) -> bool:
        return self._jax is not None or installed(self.module)

    def read_environment(self, env: Mapping[str, str]) -> dict[str, Optional[str]]:
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

    def start(self) -> Optional[JaxStart]:
        """What JAX started with (the record made at its start); None before."""
        seen = self.started_with
        if seen is None or self.stage() is not Stage.STARTED:
            return None
        options = self.plugin_options if self.plugin_options is not None else {}
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

    def free(self) -> bool:
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

    def oom_error_type(self) -> Optional[type]:
        """``jax.errors.JaxRuntimeError`` (out of memory is its RESOURCE_EXHAUSTED kind)."""
        if self._jax is None:
            return None
        return getattr(getattr(self._jax, "errors", None), "JaxRuntimeError", None)

    # -- figures for the panel and the trace --
    charted_figures = (ChartedFigure("in_use", "in_use_bytes", "in use"),)

    def figures_absent(self) -> Optional[str]:
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

    def trace_label(self, device: str, gpu: Optional[int]) -> str:
        """``GPU 1 (JAX gpu:0)``: nvidia-smi's number first, its own name after."""
        return f"{self.name} {device}" if gpu is None else f"GPU {gpu} ({self.name} {device})"

    # TensorFlow imports jax itself where it is installed: only a start says the user works with it.
    # The session's no-GPU diagnosis is TensorFlow's.
    import_says_little = True
    no_gpu_diagnosed = False

    def trace_absent(self) -> Optional[str]:
        """Started without figures (the panel's note says why): nothing of it to trace."""
        why = self.figures_absent()
        return None if why is None else f"{self.name}: no allocator figures {why}; nothing of it to trace"

    def trace_ready(self, env: MutableMapping[str, str], visible: Callable[[], Optional[list[int]]]) -> Optional[bool]:
        """Nothing to set up: its allocator keeps its figures whatever the environment."""
        return None

    def trace_reply(
        self, env: MutableMapping[str, str], visible: Callable[[], Optional[list[int]]], label: Callable[[str], str]
    ) -> Optional[str]:
        """None: the trace's reply names it with the others."""
        return None

    def trace_stopped(self) -> None:
        pass



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


def _int_or_none(value: Any) -> Optional[int]:
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

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)
