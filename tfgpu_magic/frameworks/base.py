"""What every framework adapter shares: the start-up stage, and the record of what CUDA saw.

A framework accepts GPU settings only before it starts; each adapter says where its framework
is (:class:`Stage`), records the environment at the moment CUDA read it, and never imports its
framework: it is handed the module by a post-import hook once the user's import has finished.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Protocol, runtime_checkable

from ..command.plan import Plan, Resolution
from ..records import Record

__all__ = [
    "CUDA_ENV",
    "Capture",
    "Change",
    "ChartedFigure",
    "CudaRecord",
    "DeviceMemory",
    "Framework",
    "FreeReport",
    "GpuShare",
    "Host",
    "OomFacts",
    "PeakReading",
    "PeakWindow",
    "Refusal",
    "ReportView",
    "Reporting",
    "ReportingDefaults",
    "ResettingPeakWindow",
    "Stage",
    "UnresettablePeakWindow",
    "attribute",
    "capture",
    "environment_line",
    "installed",
    "not_the_framework",
    "too_late",
]

CUDA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")  # read by CUDA when it starts in the process


class Stage(enum.IntEnum):
    NOT_IMPORTED = 0
    IMPORTED = 1  # imported, no device query yet: CUDA_VISIBLE_DEVICES still works
    ENUMERATED = 2  # CUDA listed the devices (TensorFlow): only tf.config changes visibility now
    STARTED = 3  # the framework's GPU state exists: its GPU settings are frozen

    def describe(self) -> str:
        return {
            Stage.NOT_IMPORTED: "not imported",
            Stage.IMPORTED: "imported, devices not yet enumerated",
            Stage.ENUMERATED: "devices enumerated, runtime not started",
            Stage.STARTED: "started (first op ran); GPU settings are frozen",
        }[self]


class Capture(Record):
    """Environment variables as they were when a framework (or CUDA) read them.

    ``late`` is True when the moment had passed before tfgpu_magic was loaded, so the values
    are the ones found at load time (the best evidence left).
    """

    env: Mapping[str, str | None]
    late: bool = False

    def get(self, name: str) -> str | None:
        return self.env.get(name)


def capture(names: tuple[str, ...], late: bool = False, env: Mapping[str, str] | None = None) -> Capture:
    """The variables as ``env`` (the process environment unless the session gave its own) holds them now."""
    source = os.environ if env is None else env
    return Capture({name: source.get(name) for name in names}, late)


class CudaRecord:
    """What CUDA read when it started in this process: made once, by whichever framework started it
    first (TensorFlow listing its devices, PyTorch's first CUDA call, JAX's backends on a GPU).

    CUDA reads ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` once per process, so a later
    framework (or a later change of the variables) sees the GPUs of this record, whatever it
    captured itself.  One per kernel: the machine owns it and hands it to every adapter.
    """

    def __init__(self) -> None:
        self.capture: Capture | None = None
        self.by: str | None = None  # the framework that started CUDA ("PyTorch", ...)
        self.when: str | None = None  # the moment, in words ("when PyTorch started CUDA")
        self._lock = threading.Lock()

    def note(self, seen: Capture, by: str, when: str | None = None) -> None:
        """``by`` started CUDA with ``seen``: kept if it is the first; a later one changes nothing."""
        with self._lock:
            if self.capture is None:
                self.capture, self.by = seen, by
                self.when = when or f"when {by} started CUDA"


# -- what the kernel hands an adapter to change its settings -------------------------------------------
class Refusal(ValueError):
    """A setting this framework cannot take now; the message (one line) says what to do instead."""


class Host(Protocol):
    """The kernel's side of a setting, as an adapter sees it (the machine implements it): the
    environment its framework reads at start-up, and CUDA's numbering."""

    @property
    def env(self) -> Mapping[str, str]:
        """The kernel's environment (read here; set through ``set_env``)."""
        ...

    @property
    def inherited(self) -> Mapping[str, str | None]:
        """The managed variables as the kernel inherited them."""
        ...

    def set_env(self, name: str, value: str | None) -> None:
        """Set (None: remove) a variable the framework reads, remembering it was set for it."""
        ...

    def unmanaged_value(self, name: str) -> str | None:
        """The variable as the user left it: what tfgpu_magic set undone, a hand-made value kept."""
        ...

    def cuda_map(self) -> list[int]:
        """nvidia-smi index of each CUDA device (the framework's device k is entry k)."""
        ...

    def visible_value(self, resolution: Resolution) -> str | None:
        """The CUDA_VISIBLE_DEVICES that shows CUDA ``resolution``'s GPUs (None: unset)."""
        ...


class Change(Record):
    """One `%gpu` setting on its way to the frameworks: what was asked, resolved once.

    Every adapter is handed the same Change; it says what the setting means for its framework
    at its current stage (:meth:`Framework.consider`), what to put in the environment before
    its start (:meth:`Framework.prepare`), and gives it what it can take now
    (:meth:`Framework.give`).
    """

    command: Any  # the parsed command (tfgpu_magic.command.grammar)
    what: str  # the command as the user would write it again ("limit 4096")
    plan: Plan  # the whole request with this command
    before: Plan  # the request before it
    resolution: Resolution  # ``plan`` on this machine, resolved once
    host: Host
    others: tuple[Framework, ...] = ()  # the kernel's other adapters

    @property
    def changed(self) -> bool:
        return self.plan != self.before


class FreeReport(Record):
    """A framework's part of `%gpu free`: what was run and its allocator's figures before and after."""

    lines: tuple[str, ...] = ()
    opener: str | None = None  # a first line that replaces "Ran garbage collection." (Keras's)
    kept: str | None = None  # why nothing went back to the driver, said when nothing did


# -- what every adapter answers -----------------------------------------------------------------------
class DeviceMemory(Record):
    """One device as its framework's allocator reports it, in bytes (never the driver's view)."""

    in_use_bytes: int  # held by live tensors or arrays
    peak_bytes: int  # the most in use since the last peak reset (since start-up where none exists)
    reserved_bytes: int | None = None  # taken from the driver by the allocator's pool
    limit_bytes: int | None = None  # the most the allocator will take, by its own account


class ChartedFigure(Record):
    """One figure of a framework's allocator that the memory panel draws as a series of its own.

    ``field`` names the :class:`DeviceMemory` attribute it is read from; ``series`` is its key in
    the panel's wire format (under the framework's key); ``label`` is what the legend calls it,
    after "<framework> allocator: ".  ``wire_field`` names an older per-device field of the
    panel's samples that the figure also fills (TensorFlow's ``tf_in_use_bytes``, kept stable).
    """

    series: str  # "allocated", "reserved", "in_use", "peak"
    field: str  # "in_use_bytes", "peak_bytes", "reserved_bytes", "limit_bytes"
    label: str  # "allocated", "in use", ...
    wire_field: str | None = None


class PeakReading(Record):
    """A device's allocator over one window (a traced cell, a budgeted cell).

    ``exact`` is False where the framework cannot reset its peak (JAX) and the peak did not rise
    during the window: ``peak_bytes`` is then the highest since start-up, an upper bound only.
    """

    start_bytes: int  # in use when the window opened
    now_bytes: int
    peak_bytes: int
    exact: bool = True


class PeakWindow(Protocol):
    def peaks(self) -> dict[str, PeakReading]:
        """Per device: in use at the start and now, and the peak between."""
        ...

    def close(self) -> None: ...


class Reporting(Protocol):
    """What ``%gpu status``, the out-of-memory explanation and ``%%gpu on`` ask of each adapter.

    Every method is handed a :class:`ReportView` (or the adapter's own report entry), never the
    session: the kernel loops over its adapters and names none of them.
    """

    key: str
    name: str

    def report(self, view: ReportView) -> dict[str, Any]:
        """Its entry under ``frameworks`` in ``%gpu status --json`` (keys are added, never renamed)."""
        ...

    def report_keys(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Top-level keys of the report it has always had (scripts read them there); {} for most."""
        ...

    def status_lines(self, entry: dict[str, Any]) -> list[str]:
        """Its lines of ``%gpu status`` (text and card alike): ``"Name:       value"`` then
        ``"  continuation"`` lines; none while it is not imported."""
        ...

    def in_force_lines(self, view: ReportView) -> list[str] | None:
        """What it runs with for ``In force``; None where the environment it will read says it
        (said once for every framework)."""
        ...

    def in_force_notes(self, view: ReportView) -> list[str]:
        """Lines of ``In force`` after the GPU settings (a precision policy)."""
        ...

    def limit_holder(self) -> str:
        """Who holds a limit given to this framework, the soft label's words ("TensorFlow's
        allocator"): its own pool only, not the CUDA context or libraries calling CUDA directly."""
        ...

    def listed_gpus(self, view: ReportView) -> list[int] | None:
        """nvidia-smi indices it listed and uses (None: it has not listed them itself)."""
        ...

    def gpu_shares(self, view: ReportView) -> dict[int, GpuShare]:
        """Its part of each GPU (by nvidia-smi index) it knows of."""
        ...

    def gpu_keys(self, share: GpuShare | None) -> dict[str, Any]:
        """Its own keys in every GPU's entry of the report (kept for scripts; new adapters have none)."""
        ...

    def started_gpus(self, view: ReportView) -> tuple[int, ...] | None:
        """nvidia-smi indices it started with where it can no longer change them; None: it can."""
        ...

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether ``error``, of its ``oom_error_type()``, is about memory (JAX's covers every failure)."""
        ...

    def oom_facts(self, error: BaseException, view: ReportView) -> OomFacts | None:
        """What its out-of-memory ``error`` says (None: not an error of its own)."""
        ...

    def gpu_scope(self, gpu: int, view: ReportView) -> tuple[list[int] | None, Any]:
        """For ``%%gpu on``: the GPUs it sees (nvidia-smi numbers; None: none it could run on,
        not imported or not started) and, when ``gpu`` is among them, its scope for a cell there."""
        ...

    def scope_hint(self) -> tuple[str, str]:
        """Its scope for a ``%%gpu on`` cell, and what makes it usable: ("tf.device", "`import tensorflow as tf`")."""
        ...

    def in_use(self) -> bool:
        """Whether the notebook uses it (imported; JAX: started, as TensorFlow imports jax itself)."""
        ...

    def attach(self) -> None:
        """Take the framework from ``sys.modules`` when the caller knows its import has finished."""
        ...

    def device_label(self, device: str, view: ReportView) -> str:
        """One of its devices as ``%gpu`` names it: ``GPU 1 (PyTorch cuda:0)``, nvidia-smi's number first."""
        ...

    def measurement_problem(self, view: ReportView) -> str | None:
        """Why a cell's peak cannot be measured on it although it started (None: it can, or it has not started)."""
        ...

    def keep_statistics(self, view: ReportView, alone: bool) -> str | None:
        """Before a measured cell: make its allocator keep statistics if it can; what it did, to say
        (None: nothing).  ``alone``: no other framework is in use."""
        ...


@runtime_checkable
class Framework(Reporting, Protocol):
    """What the kernel asks of each framework's adapter.  An adapter never imports its
    framework: ``on_import`` hands it the module once the user's import has finished."""

    key: str  # "tensorflow", "pytorch", "jax": its key in `%gpu status --json` and `Session.applied`
    name: str  # as shown: "TensorFlow", "PyTorch", "JAX"
    module: str  # what the user imports: "tensorflow", "torch", "jax"

    # (read-only: an adapter's own tuple type, of its length, is one of these)
    @property
    def start_variables(self) -> tuple[str, ...]:
        """The environment variables it reads as it starts (CUDA's aside)."""
        ...

    @property
    def managed_variables(self) -> tuple[str, ...]:
        """Those tfgpu_magic may set for it."""
        ...

    environ: Mapping[str, str]  # where it reads them (the machine's environment)
    cuda_record: CudaRecord | None  # the kernel's one record of CUDA's start
    takes_effect: str  # when a setting reaches it once imported: "when it starts CUDA", ...

    def on_import(self, module: Any) -> None: ...

    # -- the write side: what a setting means for it, and getting it there ------------------------
    def takes(self, command: Any) -> bool:
        """Whether ``command`` is one of its settings (``allocator platform`` is JAX's alone)."""
        ...

    def consider(self, change: Change) -> str | None:
        """Its clause of the reply ("PyTorch: capped now"), or None when it has nothing to add;
        raises :class:`Refusal` when the setting cannot hold for it (too late, a CPU build...).
        Called before anything is changed, so a refusal leaves everything as it was."""
        ...

    def prepare(self, change: Change) -> None:
        """Its start variables in ``change.host``'s environment, while it can still read them."""
        ...

    def give(self, resolution: Resolution, host: Host) -> bool:
        """Give it what it can take now (tf.config, caps queued until CUDA starts, ...); True when
        it now runs with, or will start with, ``resolution`` (the kernel records that)."""
        ...

    def takes_share(self) -> bool:
        """Whether it takes a part of the kernel's limit now: imported by the notebook, able to use
        a GPU (a CPU build, or JAX imported by TensorFlow for its own use, takes none)."""
        ...

    def share_fixed(self) -> bool:
        """Whether the part it was given can no longer change (it has started with it)."""
        ...

    def arrived(self, plan: Plan) -> str | None:
        """Just imported, with ``plan`` requested: why these settings cannot reach it (None: they can)."""
        ...

    def enumerated(self) -> bool:
        """Whether CUDA listed its GPUs for it as a stage of its own (TensorFlow's enumeration)."""
        ...

    def cuda_found(self) -> list[int] | None:
        """CUDA's index of each GPU it found when it listed them; None before (or never listed)."""
        ...

    def device_gpus(self, cuda_map: list[int]) -> dict[str, int]:
        """Its device names ("GPU:0", "cuda:0", "gpu:0") -> nvidia-smi index; empty before it knows."""
        ...

    def set_precision(self, policy: str | None) -> str | None:
        """Apply the dtype policy (None: the default); its clause of the reply, or None."""
        ...

    def side_imports(self) -> dict[str, Callable[[Any, Plan], None]]:
        """Other modules whose import it must hear of, each with what to do then (Keras: the precision)."""
        ...

    def frozen(self, kept: Plan, host: Host) -> list[str]:
        """What `%gpu reset` cannot undo for it, and why (it has started with it)."""
        ...

    def free_reading(self) -> Any:
        """Its allocator's figures before `%gpu free` frees anything (handed back to ``free``)."""
        ...

    def free(self, plan: Plan, before: Any) -> FreeReport:
        """Let go of what it can (caches, sessions) after garbage collection; its part of the reply."""
        ...

    def installed(self) -> bool:
        """Whether the framework can be imported in this kernel (imported, or found without importing)."""
        ...

    def read_environment(self, env: Mapping[str, str]) -> dict[str, str | None]:
        """Its ``start_variables`` as it read them (recorded then), or as ``env`` holds them before."""
        ...

    def stage(self) -> Stage: ...

    def device_memory(self) -> dict[str, DeviceMemory]:
        """Per device (the framework's own name for it), once started; empty before."""
        ...

    def open_peak_window(self) -> PeakWindow: ...

    def oom_error_type(self) -> type | None: ...

    # -- figures for the panel and the trace --
    @property
    def charted_figures(self) -> tuple[ChartedFigure, ...]:
        """What the panel draws of device_memory(), in order."""
        ...

    def figures_absent(self) -> str | None:
        """Imported or started, why this build keeps no allocator figures to chart (a short phrase,
        shown after "<name>: no allocator figures"); None where it keeps them, or where it is
        not imported.  Asked on the user's thread only; never starts anything."""
        ...

    def gpu_numbering(self, cuda_map: list[int]) -> dict[str, int]:
        """The framework's GPU device names (``cuda:0``) -> nvidia-smi index, given CUDA's numbering
        (``cuda_map[k]`` is CUDA device k's nvidia-smi index); empty where it cannot tell yet."""
        ...

    def trace_label(self, device: str, gpu: int | None) -> str:
        """How the trace names one of its devices, given its nvidia-smi index (None: none)."""
        ...

    import_says_little: (
        bool  # its import alone does not say the user works with it (another framework imports it)
    )
    # The session's found-no-GPU answer and diagnosis are about it: the panel names it, the trace
    # says the diagnosis before its lines.
    no_gpu_diagnosed: bool

    def trace_absent(self) -> str | None:
        """The trace's line (said once) when it started and keeps no allocator figures; None: nothing to say."""
        ...

    def trace_ready(
        self, env: MutableMapping[str, str], visible: Callable[[], list[int] | None]
    ) -> bool | None:
        """Before it starts, set what its allocator needs to keep figures for the trace (True: set now,
        False: set already, None: nothing to set, or too late).  ``visible``: the GPUs CUDA will show."""
        ...

    def trace_reply(
        self,
        env: MutableMapping[str, str],
        visible: Callable[[], list[int] | None],
        label: Callable[[str], str],
    ) -> str | None:
        """Its own words for what ``%gpu trace`` will show (set up for it: see :meth:`trace_ready`);
        None where the reply names it with the others.  ``label`` names one of its devices."""
        ...

    def trace_stopped(self) -> None:
        """``%gpu trace off``: undo what tracing set up for the start."""
        ...


@functools.cache
def installed(module: str) -> bool:
    """Whether ``import module`` would find something, found without importing it (kept for the
    kernel's life: a framework installed while it runs is imported by a restarted kernel)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def attribute(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` or None: a framework's private layout may move between releases."""
    for name in path.split("."):
        try:
            obj = getattr(obj, name, None)
        except Exception:  # a hostile or half-built object: its attribute is simply not there
            return None
    return obj


def not_the_framework(module: Any, framework: str, imported_as: str, needs: tuple[str, ...]) -> str | None:
    """Why what ``import imported_as`` gave is not ``framework`` (None: it is).

    ``sys.modules`` holds whatever the import found first: a ``torch.py`` in the notebook's folder,
    a stand-in object.  An adapter that took it for the framework would fail on every `%gpu`, so it
    checks the attributes it will use, and leaves anything else alone (one note says so).
    """
    missing = [path for path in needs if attribute(module, path) is None]
    if not missing:
        return None
    where = attribute(module, "__file__")  # an object whose every attribute raises has none
    found = f"the module {where}" if isinstance(where, str) else f"a {type(module).__name__}"
    return (
        f"`import {imported_as}` gave {found}, which is not {framework} (it has no `{missing[0]}`): "
        f"tfgpu_magic leaves it alone, and GPU settings reach no {framework} in this kernel"
    )


def too_late(framework: str, module: str, what: str, now: str) -> str:
    """The one wording of "too late": what the framework started with, and the line to put first."""
    return (
        f"{framework} has already started with {now}, and cannot change it in a running kernel. "
        f"Put `%gpu {what}` at the top of the notebook, before `import {module}`, and restart the kernel"
    )


class ResettingPeakWindow:
    """A window over a framework that keeps one resettable peak per device (PyTorch).

    Resets are global, so nested windows (a traced cell holding a budgeted cell) would destroy
    each other's peaks: before each reset the peak about to be lost is folded into every window
    still open, as TensorFlow's adapter does.
    """

    def __init__(
        self,
        read: Callable[[], dict[str, DeviceMemory]],
        reset: Callable[[str], None],
        open_windows: set[ResettingPeakWindow],
    ) -> None:
        self._read, self._open = read, open_windows
        self.folded: dict[str, int] = {}
        self.start: dict[str, int] = {}
        for device, memory in read().items():
            for window in list(open_windows):
                window.folded[device] = max(window.folded.get(device, 0), memory.peak_bytes)
            reset(device)
            self.start[device] = memory.in_use_bytes
        open_windows.add(self)

    def peaks(self) -> dict[str, PeakReading]:
        return {
            device: PeakReading(
                self.start.get(device, 0),
                memory.in_use_bytes,
                max(memory.peak_bytes, self.folded.get(device, 0)),
            )
            for device, memory in self._read().items()
        }

    def close(self) -> None:
        self._open.discard(self)


class UnresettablePeakWindow:
    """A window over a framework whose peak cannot be reset (JAX): exact only when the peak rose."""

    def __init__(self, read: Callable[[], dict[str, DeviceMemory]]) -> None:
        self._read = read
        self.start = {device: (m.in_use_bytes, m.peak_bytes) for device, m in read().items()}

    def peaks(self) -> dict[str, PeakReading]:
        readings = {}
        for device, memory in self._read().items():
            in_use, peak = self.start.get(device, (0, 0))
            rose = memory.peak_bytes > peak  # the process's peak was set inside this window
            readings[device] = PeakReading(in_use, memory.in_use_bytes, memory.peak_bytes, exact=rose)
        return readings

    def close(self) -> None:
        pass


# -- reports (status, out-of-memory, %%gpu on) ----------------------------------------------------------
class ReportView(Record):
    """What an adapter's report reads of the kernel, handed over by the caller (never the session):
    frameworks/ knows nothing of kernel/.  Made for one report; ``notes`` is that report's list,
    where an adapter says a reading that failed (a note, never a broken ``%gpu``)."""

    cuda_map: tuple[int, ...] = ()  # CUDA device k -> nvidia-smi index, as CUDA numbered them
    # The kernel's environment now: the live one (keep_statistics may set a variable there).
    env: MutableMapping[str, str] = dataclasses.field(default_factory=dict)
    cuda_env: Mapping[str, str | None] = dataclasses.field(
        default_factory=dict
    )  # as CUDA read them (or will)
    applied: Any = None  # the Resolution this framework was given (``Session.applied[key]``); None: nothing
    accepted: Any = None  # the request as resolved when it was accepted; None: it cannot hold
    exposed_gpus: tuple[int, ...] | None = None  # nvidia-smi indices CUDA shows this kernel; None: unknown
    visible_gpus: tuple[int, ...] | None = None  # nvidia-smi indices this kernel sees; None: unknown
    cuda_found: tuple[int, ...] | None = None  # nvidia-smi indices the listing framework found
    nvml: Any = None  # the machine's Nvml (driver facts: its CUDA version)
    precision: str | None = None  # the requested mixed-precision policy
    notes: list[str] = dataclasses.field(default_factory=list)


class GpuShare(Record):
    """A framework's part of one GPU (by nvidia-smi index): its names for the devices there, and
    what its allocator holds on them, summed over them, in bytes (None: no reading)."""

    names: tuple[str, ...] = ()  # "GPU:0", "GPU:1" (two logical GPUs on one physical)
    in_use_bytes: int | None = None
    peak_bytes: int | None = None  # the sum of the devices' peaks: an upper bound


class OomFacts(Record):
    """What a framework's out-of-memory error says, read by its adapter right after the failure;
    the kernel adds the driver's view (how full the GPU is, who else is on it, a freer GPU)."""

    device: str  # its own name for the device: "GPU:0", "cuda:1", "gpu:0", "CPU:0"
    named: str  # the device in its words, inside the GPU's: "GPU 1 (TF GPU:0, NVIDIA A100)"
    label: str  # the device as said where no GPU is known: "CPU:0", "PyTorch cuda:3"
    on_gpu: bool  # a GPU's memory ran out (False: the CPU's)
    gpu: int | None = None  # nvidia-smi index; None: not a GPU, or not mapped to nvidia-smi's numbering
    lines: tuple[str, ...] = ()  # the failed request, its allocator's figures and its limit
    steps: tuple[str, ...] = ()  # its own remedies, said first
    cpu_step: str | None = None  # the last remedy where no GPU ran out (None: a higher `%gpu limit`)


def environment_line(label: str, env: Mapping[str, str | None]) -> list[str]:
    """``label: NAME=value, ...`` for the variables set (none set: no line); an inherited value may
    be megabytes of anything: shown escaped and cut."""
    from ..gpus.numbering import shown as cut

    shown = [f"{k}={cut(v, 80)}" for k, v in env.items() if v is not None]
    return [f"{label}: " + ", ".join(shown)] if shown else []


class ReportingDefaults:
    """:class:`Reporting`'s answers for a framework with nothing of its own to say there: no
    top-level keys, no ``In force`` lines, no listing, no per-GPU part, nothing frozen, no
    out-of-memory facts, no ``%%gpu on`` scope.  An adapter overrides what it has."""

    def report_keys(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {}

    def in_force_lines(self, view: ReportView) -> list[str] | None:
        return None

    def limit_holder(self) -> str:
        return f"{getattr(self, 'name', 'the framework')}'s allocator"

    def in_force_notes(self, view: ReportView) -> list[str]:
        return []

    def listed_gpus(self, view: ReportView) -> list[int] | None:
        return None

    def gpu_shares(self, view: ReportView) -> dict[int, GpuShare]:
        return {}

    def gpu_keys(self, share: GpuShare | None) -> dict[str, Any]:
        return {}

    def started_gpus(self, view: ReportView) -> tuple[int, ...] | None:
        return None

    def is_out_of_memory(self, error: BaseException) -> bool:
        return True

    def oom_facts(self, error: BaseException, view: ReportView) -> OomFacts | None:
        return None

    def gpu_scope(self, gpu: int, view: ReportView) -> tuple[list[int] | None, Any]:
        return None, None

    def in_use(self: Framework) -> bool:
        return self.stage() is not Stage.NOT_IMPORTED

    def attach(self: Framework) -> None:
        """Take the framework from ``sys.modules`` when the caller knows its import has finished
        (code on the user's thread after the import, without ``%load_ext``)."""
        import sys

        module = sys.modules.get(self.module)
        if module is not None and self.stage() is Stage.NOT_IMPORTED:
            self.on_import(module)

    def device_label(self: Framework, device: str, view: ReportView) -> str:
        """``GPU 1 (PyTorch cuda:0)`` for its CUDA device ``cuda:0`` (or ``gpu:0``); its name alone unmapped."""
        named = f"{self.name} {device}"
        try:
            return f"GPU {view.cuda_map[int(device.rsplit(':', 1)[1])]} ({named})"
        except (IndexError, ValueError):
            return named

    def measurement_problem(self, view: ReportView) -> str | None:
        return None

    def keep_statistics(self, view: ReportView, alone: bool) -> str | None:
        return None

    # The trace, for a framework whose allocator keeps its figures whatever the environment.
    def trace_label(self: Framework, device: str, gpu: int | None) -> str:
        """``GPU 1 (PyTorch cuda:0)``: nvidia-smi's number first, its own name after."""
        name = self.name
        return f"{name} {device}" if gpu is None else f"GPU {gpu} ({name} {device})"

    def trace_absent(self: Framework) -> str | None:
        """Started without figures (the panel's note says why): nothing of it to trace."""
        why = self.figures_absent()
        return None if why is None else f"{self.name}: no allocator figures {why}; nothing of it to trace"

    def trace_ready(
        self, env: MutableMapping[str, str], visible: Callable[[], list[int] | None]
    ) -> bool | None:
        """Nothing to set up: its allocator keeps its figures whatever the environment."""
        return None

    def trace_reply(
        self,
        env: MutableMapping[str, str],
        visible: Callable[[], list[int] | None],
        label: Callable[[str], str],
    ) -> str | None:
        """None: the trace's reply names it with the others."""
        return None

    def trace_stopped(self) -> None:
        pass
