"""The Jupyter server extension: ``GET {base_url}tfgpu/api/status``, who holds what on the GPUs, per kernel.

Enabled on install (``etc/jupyter/jupyter_server_config.d/tfgpu_magic.json``); the entry point
``tfgpu_magic._jupyter_server_extension_points`` names this module and :class:`GpuStatusApp`, a
jupyter_server ``ExtensionApp`` whose ``stop_extension`` stops the culler, the metrics' refresh and
the readings under way when the server stops (importing the package never imports jupyter_server).  The reply is :func:`tfgpu_magic.server.kernel_inventory.inventory`'s
(the contract with the JupyterLab extension, ``version`` 1), always with status 200: no
driver, a lost GPU or a failed reading are data in it, never an error page.

How a request is served: the kernels and their sessions are read from the server's managers
on the event loop (they live there), then NVML and psutil are read in a worker thread, so a
slow driver never blocks the server.  At most one reading is made per ``refresh_interval``;
requests that arrive while one is under way wait for that one (one shared future), so many
browser tabs polling cost one reading.  The reply is encoded once per reading.

The same reading feeds the server's ``/metrics`` (:mod:`.metrics`) and the GPU idle culler
(:mod:`.culler`): one inventory per interval, whoever asks.

A notebook with saved GPU settings (metadata ``tfgpu``) gets an IPython kernel that loads
tfgpu_magic as it starts, so they apply before its first cell (:mod:`.notebook_kernels`).

Configuration (traitlets, section ``TfgpuMagic``)::

    c.TfgpuMagic.device_source = "tfgpu_magic.simulated:kernels_server"   # default: the real driver
    c.TfgpuMagic.refresh_interval = 2.0                                     # seconds
    c.TfgpuMagic.reading_timeout = 10.0                                     # seconds
    c.TfgpuMagic.cull_idle_gpu_kernels_after = 3600                         # seconds; 0 (default): off
    c.TfgpuMagic.cull_min_gpu_memory = "1G"                                 # default: any GPU memory
    c.TfgpuMagic.cull_only_when_free_below = "8G"                           # default: whatever is free
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

import tornado.ioloop
import tornado.web
from jupyter_client.provisioning import LocalProvisioner
from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import APIHandler, PrometheusMetricsHandler
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import ensure_async, url_path_join
from traitlets import Callable as CallableTrait
from traitlets import Float, TraitError, Unicode, Union, validate
from traitlets.config import Configurable
from traitlets.config.loader import DeferredConfigString, LazyConfigValue

from .._version import __version__
from ..command import grammar
from ..command.units import MIB
from ..gpus import owners, platform
from ..gpus.nvml import Nvml
from ..gpus.utilization import CULLER_ENV, UtilizationReader
from ..safe_text import strict_json
from . import gpu_idle, kernel_inventory, metrics
from .activity import Activity, ActivityWatcher
from .culler import Culler, CullPolicy, LiveState, StaleReading, epoch
from .kernel_inventory import KernelDescription
from .kernel_start import KernelStartHook
from .notebook_kernels import NotebookSettingsLoader

__all__ = [
    "ROUTE",
    "GpuStatusApp",
    "KernelEnvironment",
    "MetricsHandler",
    "Reading",
    "SharedRefresh",
    "StatusHandler",
    "StatusSource",
    "TfgpuMagic",
    "load_device_source",
    "load_settings",
    "reply_text",
]

ROUTE = ("tfgpu", "api", "status")  # under the server's base_url

T = TypeVar("T")


class TfgpuMagic(Configurable):
    """Settings of the server extension (``c.TfgpuMagic.*`` in ``jupyter_server_config.py``)."""

    device_source = Union(
        [Unicode(), CallableTrait()],
        default_value="",
        help="""Where GPU readings come from: an import string "module:callable" naming a
        zero-argument callable that returns a pynvml-like object, or (in a Python config file)
        the callable itself.  Empty (the default): the NVIDIA driver, through pynvml.  To try
        the extension without a GPU: "tfgpu_magic.simulated:kernels_server", a simulated
        four-GPU server on which this server's kernels hold memory (the kernels this server
        starts read the same simulated server: it is named in their environment).""",
    ).tag(config=True)

    refresh_interval = Float(
        kernel_inventory.REFRESH_INTERVAL_S,
        help="""Seconds between two readings of NVML and the process table, however many
        browser tabs poll: replies within this interval repeat the last reading (its
        generated_at says when it was made).  0 reads on every request, though requests
        arriving during a reading still share it.""",
    ).tag(config=True)

    reading_timeout = Float(
        10.0,
        help="""Seconds a reading of the driver may take.  A driver that does not answer in time
        gives the last good reading with a note saying so (or, before any, "unavailable ...
        timed out"); no request waits longer, and the culler culls nothing from such a reply.""",
    ).tag(config=True)

    cull_idle_gpu_kernels_after = Float(
        0.0,
        help="""Shut down kernels that hold GPU memory and have been idle this many seconds
        (e.g. 3600).  0 (the default): never.  Kernels without GPU memory and busy kernels (a
        cell running, whatever status messages say) are never touched; the %gpu monitor panel's
        own messages are not activity; each shutdown is logged with the notebook and the memory
        it held.""",
    ).tag(config=True)

    cull_min_gpu_memory = Unicode(
        "",
        help="""Cull only kernels holding at least this much GPU memory in all ("1G", "512M";
        a bare number is MiB).  Empty (the default): any GPU memory at all.""",
    ).tag(config=True)

    cull_only_when_free_below = Unicode(
        "",
        help="""Cull only while a GPU the kernel holds memory on has less than this free
        ("8G").  Empty (the default): whatever is free.""",
    ).tag(config=True)

    cull_interval = Float(
        60.0,
        help="""Seconds between two checks of the GPU idle culler (at least 1).""",
    ).tag(config=True)

    idle_notice_after = Float(
        gpu_idle.DEFAULT_AFTER_S,
        help="""Seconds a kernel may hold GPU memory with its processes at 0% GPU utilization
        (NVML's per-process samples, as the server's readings see them) before its notebook is
        told so: the GPU panel's kernel row and the status bar show what it holds, for how long,
        and what to do (`%gpu free`, or when the idle culler acts).  The kernel's own notice
        under a cell has its own setting (%config GpuMagics.idle_notice_after).""",
    ).tag(config=True)

    idle_notice_min_memory = Unicode(
        "1G",
        help="""The least GPU memory (all GPUs together, the driver's figure) a kernel at 0% must
        hold before its notebook is told ("1G", "512M"; a bare number is MiB).""",
    ).tag(config=True)

    def idle_tracker(self) -> gpu_idle.IdleTracker:
        """The idle notice's thresholds as a tracker; raises TraitError for a size that is not one."""
        least = _size_bytes(self.idle_notice_min_memory, "idle_notice_min_memory")
        return gpu_idle.IdleTracker(self.idle_notice_after, least if least is not None else 0)

    @validate(
        "refresh_interval",
        "reading_timeout",
        "cull_idle_gpu_kernels_after",
        "cull_interval",
        "idle_notice_after",
    )
    def _finite(self, proposal: Any) -> float:
        value, name = proposal["value"], proposal["trait"].name
        if not math.isfinite(value):  # Float(min=...) lets NaN through, and NaN is never stale
            raise TraitError(f"TfgpuMagic.{name} must be a number of seconds, not {value}")
        least = _LEAST_SECONDS[name]
        if value < least:
            raise TraitError(f"TfgpuMagic.{name} must be at least {least:g} s, not {value:g}")
        return value

    def cull_policy(self) -> CullPolicy:
        """The culler's settings as one value (the reply, /metrics and the culler read it);
        raises TraitError, one line per size that is not one."""
        sizes, wrong = {}, []
        for name in ("cull_min_gpu_memory", "cull_only_when_free_below"):
            try:
                sizes[name] = _size_bytes(getattr(self, name), name)
            except TraitError as err:
                wrong.append(str(err))
        if wrong:
            raise TraitError("\n".join(wrong))
        return CullPolicy(
            after_s=self.cull_idle_gpu_kernels_after,
            min_memory_bytes=sizes["cull_min_gpu_memory"] or 1,
            free_below_bytes=sizes["cull_only_when_free_below"],
        )


# The least each number of seconds may be (Float's own min= would let NaN through, and word it as traitlets does).
_LEAST_SECONDS = {
    "refresh_interval": 0.0,
    "reading_timeout": 0.1,
    "cull_idle_gpu_kernels_after": 0.0,
    "cull_interval": 1.0,
    "idle_notice_after": 0.0,
}


def _size_bytes(text: str, name: str) -> int | None:
    if not text.strip():
        return None
    try:
        return int(grammar.parse_size(text, percent=False)) * MIB
    except Exception:
        raise TraitError(
            f'TfgpuMagic.{name} {text!r} is not a size (like "1G", "512M", or a bare number of MiB)'
        ) from None


_CULLER_SETTINGS = (
    "cull_idle_gpu_kernels_after",
    "cull_min_gpu_memory",
    "cull_only_when_free_below",
    "cull_interval",
)


def load_settings(config: Any, log: logging.Logger) -> tuple[TfgpuMagic, CullPolicy]:
    """The settings, checked together: each wrong one is one line in the log.  A wrong culler
    setting turns the culler off; any other wrong one keeps its default; the GPU status and the
    metrics stay on whatever is wrong."""
    settings = TfgpuMagic()
    culler_off = False
    given = dict(config.get("TfgpuMagic", {})) if hasattr(config, "get") else {}
    for name, value in given.items():
        if not settings.has_trait(name):
            log.warning("tfgpu_magic: TfgpuMagic.%s is not a setting (ignored)", name)
            continue
        try:
            setattr(settings, name, _resolved(settings, name, value))
        except (TraitError, ValueError) as err:
            said = _one_line(err)
            if f"TfgpuMagic.{name}" not in said:  # traitlets' own words ("expected a float, not the str ...")
                said = f"TfgpuMagic.{name}: {said}"
            if name in _CULLER_SETTINGS:
                culler_off = True
                log.error("tfgpu_magic: %s; the GPU idle culler is off", said)
            else:
                default = settings.trait_defaults(name)
                log.error(
                    "tfgpu_magic: %s; %s is used instead",
                    said,
                    f"{default} s" if isinstance(default, float) else repr(default),
                )
    try:
        policy = settings.cull_policy()
    except TraitError as err:  # sizes: one line each
        culler_off = True
        for line in str(err).split("\n"):
            log.error("tfgpu_magic: %s; the GPU idle culler is off", line)
        policy = CullPolicy()
    return settings, (CullPolicy() if culler_off else policy)


def _resolved(settings: TfgpuMagic, name: str, value: Any) -> Any:
    """A value from the command line (``--TfgpuMagic.cull_interval=60``: text until a trait reads
    it) or a lazy one (``c.TfgpuMagic.x.append``), as traitlets' own config loading reads it."""
    if isinstance(value, DeferredConfigString):
        return value.get_value(settings.traits()[name])
    if isinstance(value, LazyConfigValue):
        return value.get_value(getattr(settings, name))
    return value


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def load_device_source(spec: Any) -> Any:
    """The pynvml-like object ``spec`` names (None: the real driver); raises what importing or calling raises."""
    if callable(spec):
        return spec()
    if not spec:
        return None  # Nvml imports pynvml itself, in the worker thread, at the first reading
    module_name, _, attribute = str(spec).partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected 'module:callable', got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target()


class SharedRefresh(Generic[T]):
    """A value refreshed at most once per ``interval`` seconds; callers during a refresh share it.

    Runs on one event loop, so no lock is needed: the first caller to find the value stale
    starts the refresh as a task, every caller awaits that task.  A caller that is cancelled
    (a closed connection) does not cancel the refresh the others wait for.
    """

    def __init__(
        self,
        refresh: Callable[[], Awaitable[T]],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._refresh = refresh
        self._interval = interval
        self._clock = clock
        self._value: T | None = None
        self._started_at: float | None = None  # of the refresh that made _value
        self._in_flight: asyncio.Task[T] | None = None
        self._in_flight_started = 0.0
        self.refreshes = 0  # how many refreshes were started (for tests and benchmarks)

    async def get(self) -> T:
        if self._in_flight is None and self._stale():
            self._start()
        if self._in_flight is not None:
            return await asyncio.shield(self._in_flight)
        assert self._value is not None
        return self._value

    @property
    def latest(self) -> T | None:
        """The last value read (None before the first), without reading."""
        return self._value

    async def fresh(self) -> T:
        """A value whose refresh started at or after this call (one under way since before is waited out)."""
        asked_at = self._clock()
        if self._in_flight is not None and self._in_flight_started < asked_at:
            await asyncio.shield(self._in_flight)
        if self._in_flight is None:
            self._start()
        assert self._in_flight is not None
        return await asyncio.shield(self._in_flight)

    def stop(self) -> list[asyncio.Future[Any]]:
        """Cancel the refresh under way (the server is stopping); returns it, to be waited out."""
        if self._in_flight is None or self._in_flight.done():
            return []
        self._in_flight.cancel()
        return [self._in_flight]

    def _start(self) -> None:
        self._in_flight_started = self._clock()
        self._in_flight = asyncio.ensure_future(self._run(self._in_flight_started))

    def _stale(self) -> bool:
        return self._started_at is None or self._clock() - self._started_at >= self._interval

    async def _run(self, started: float) -> T:
        self.refreshes += 1
        try:
            value = await self._refresh()
        finally:
            self._in_flight = None
        self._value, self._started_at = value, started
        return value


def reply_text(reply: dict[str, Any]) -> str:
    """The endpoint's JSON text of a reply: strict JSON (a NaN or infinity is null, and a note says where)."""
    return strict_json(reply)


@dataclass(frozen=True)
class Reading:
    """One reading: the reply (for /metrics and the culler) and its JSON text (for the endpoint), made once.
    ``complete`` False: the driver did not answer in time, and the reply repeats the last good one (or none)."""

    reply: dict[str, Any]
    text: str
    complete: bool = True


class StatusSource:
    """One reading of the server's kernels and GPUs; never raises, never waits past ``reading_timeout``."""

    def __init__(
        self, serverapp: Any, settings: TfgpuMagic, policy: CullPolicy, watcher: ActivityWatcher | None = None
    ) -> None:
        self._serverapp = serverapp
        self._log = serverapp.log
        self._interval = settings.refresh_interval
        self._timeout = settings.reading_timeout
        self._policy = policy
        self._watcher = watcher
        self._load_error: str | None = None
        self._nvml: Nvml | None = None
        self._table: owners.ProcessTable | None = None
        self._device_read: asyncio.Future[dict[str, Any]] | None = None  # the driver's reading under way
        self._device_read_since = 0.0
        self._last_good: Reading | None = None
        # The platform's share of each GPU, from the environment this server inherited (gpus/platform.py).
        self._shares = platform.ShareRecord(os.environ)
        self._utilization: UtilizationReader | None = None  # each GPU read since the previous reading
        self._idle = _idle_tracker(settings, self._log)
        self.device: Any = None  # the device source's object (None: the real driver)
        try:
            self.device = load_device_source(settings.device_source)
            self._nvml = Nvml(lib=self.device)
            self._utilization = UtilizationReader(self._nvml)
            self._table = owners.process_table_for(self._nvml, os.getpid())
        except Exception as err:  # a wrong setting must not stop the server: the reply says it
            self._load_error = (
                f"TfgpuMagic.device_source {settings.device_source!r} could not be loaded ({_reason(err)})"
            )
            self._log.error("tfgpu_magic: %s", self._load_error)

    def stop(self) -> list[asyncio.Future[Any]]:
        """Stop waiting for the driver's reading under way (its thread ends when the driver answers)."""
        if self._device_read is None or self._device_read.done():
            return []
        self._device_read.cancel()
        return [self._device_read]

    async def read(self) -> Reading:
        kernels, notes = await self._kernels()
        if self._device_read is not None and not self._device_read.done():
            return self._late(kernels, notes)  # a reading still hangs in its thread: never a second one
        self._device_read_since = time.time()
        self._device_read = asyncio.ensure_future(asyncio.to_thread(self._read_devices, kernels, notes))
        self._device_read.add_done_callback(_retrieve)
        try:
            reply = await asyncio.wait_for(asyncio.shield(self._device_read), self._timeout)
        except asyncio.TimeoutError:
            self._log.warning("tfgpu_magic: the GPU driver did not answer within %s s", f"{self._timeout:g}")
            return self._late(kernels, notes)
        except Exception as err:  # a bug of ours or a device source's: logged, and said in the reply
            self._log.exception("tfgpu_magic: reading the GPUs failed")
            reply = self._unavailable(
                kernels, f"reading the GPUs failed ({_reason(err)}); see the server's log", notes
            )
        self._annotate(reply)
        reading = Reading(reply, reply_text(reply))
        self._last_good = reading
        return reading

    def _late(self, kernels: list[KernelDescription], notes: list[str]) -> Reading:
        """The driver has not answered: the last good reading with a note, or "unavailable ... timed out"."""
        since = kernel_inventory.iso_utc(datetime.fromtimestamp(self._device_read_since, tz=timezone.utc))
        if self._last_good is not None:
            reply = copy.deepcopy(self._last_good.reply)
            reply["notes"] = [
                *reply.get("notes", []),
                *notes,
                (
                    f"the GPU driver did not answer within {self._timeout:g} s (a reading under way since {since}): "
                    "these are the figures of the last reading (generated_at)"
                ),
            ]
        else:
            reply = self._unavailable(
                kernels,
                (
                    f"reading the GPUs timed out: the driver did not answer within {self._timeout:g} s "
                    f"(a reading under way since {since})"
                ),
                notes,
            )
            self._annotate(reply)
        return Reading(reply, reply_text(reply), complete=False)

    def _cullable(self, kernel_id: str) -> bool:
        """Watched since its start: only such a kernel can be culled (see Culler._still_idle)."""
        activity = self._watcher.activity(kernel_id) if self._watcher is not None else None
        return activity is not None and activity.from_start

    def _annotate(self, reply: dict[str, Any]) -> None:
        try:
            self._policy.annotate(reply, cullable=self._cullable)
            gpu_idle.add_cull_deadline(reply)
        except Exception as err:  # a bug of ours: the reply still goes out, without due times
            self._log.exception("tfgpu_magic: the culler's due times could not be added")
            reply["notes"] = [
                *reply.get("notes", []),
                f"the culler's due times could not be worked out ({_reason(err)})",
            ]
            for kernel in reply.get("kernels", []):
                kernel["cull_due_at"] = None

    async def _kernels(self) -> tuple[list[KernelDescription], list[str]]:
        """The kernels, read on the event loop where the managers live; a failure is a note."""
        try:
            return await describe_kernels(self._serverapp, self._watcher), []
        except Exception as err:
            self._log.exception("tfgpu_magic: listing the kernels failed")
            return [], [f"the kernels could not be listed ({_reason(err)})"]

    def _read_devices(self, kernels: list[KernelDescription], notes: list[str]) -> dict[str, Any]:
        """In a worker thread: NVML and the process table (both may block)."""
        if self._nvml is None:
            return self._unavailable(kernels, self._load_error or "no device source", notes)
        reply = kernel_inventory.inventory(
            self._nvml,
            kernels,
            self._table,
            refresh_interval_s=self._interval,
            notes=notes,
            shares=self._shares,
            utilization=self._utilization,
        )
        self._idle.annotate(reply)  # here, one reading at a time: the idle stretches follow the readings
        return reply

    def _unavailable(self, kernels: list[KernelDescription], reason: str, notes: list[str]) -> dict[str, Any]:
        return kernel_inventory.unavailable(kernels, reason, refresh_interval_s=self._interval, notes=notes)


def _idle_tracker(settings: TfgpuMagic, log: logging.Logger) -> gpu_idle.IdleTracker:
    try:
        return settings.idle_tracker()
    except TraitError as err:
        log.error("tfgpu_magic: %s; 1 GiB is used instead", _one_line(err))
        return gpu_idle.IdleTracker(settings.idle_notice_after)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A reading finished after everyone stopped waiting: its error is not "never retrieved"."""
    if not future.cancelled():
        future.exception()


async def describe_kernels(serverapp: Any, watcher: ActivityWatcher | None = None) -> list[KernelDescription]:
    """Every kernel the server runs, with its session (if any) and its local process (if any)."""
    sessions: dict[str, dict[str, Any]] = {}
    for session in await serverapp.session_manager.list_sessions():
        kernel_id = (session.get("kernel") or {}).get("id")
        if kernel_id is not None:
            sessions.setdefault(kernel_id, session)  # a kernel shared by sessions: the first names it
    manager = serverapp.kernel_manager
    described = []
    for kernel_id in manager.list_kernel_ids():
        try:
            kernel = manager.get_kernel(kernel_id)
        except KeyError:  # shut down since it was listed: simply not there
            continue
        activity = watcher.activity(kernel_id) if watcher is not None else None
        described.append(_describe(kernel_id, kernel, sessions.get(kernel_id, {}), activity))
    return described


def live_state(kernel: Any, activity: Activity | None) -> LiveState:
    """What a kernel is doing: busy while an execution it started is under way (the watcher's),
    whatever its last status said; its last activity without the monitor panel's messages.
    Not watched: jupyter_server's own figures, and ``watched`` False (the culler leaves it alone)."""
    state = getattr(kernel, "execution_state", None)
    if activity is None:
        return LiveState(state, epoch(getattr(kernel, "last_activity", None)), watched=False)
    if state not in ("starting", "restarting", "dead", "autorestarting") and (
        activity.busy or state == "busy"
    ):
        state = "busy"
    return LiveState(state, activity.last_activity, watched=activity.from_start)


def _describe(
    kernel_id: str, kernel: Any, session: dict[str, Any], activity: Activity | None = None
) -> KernelDescription:
    if activity is None:  # the culler is off: jupyter_server's own figures, as they are
        state, last = getattr(kernel, "execution_state", None), getattr(kernel, "last_activity", None)
    else:
        live = live_state(kernel, activity)
        state = live.execution_state
        last = (
            None
            if live.last_activity is None
            else datetime.fromtimestamp(live.last_activity, tz=timezone.utc)
        )
    return KernelDescription(
        id=kernel_id,
        name=getattr(kernel, "kernel_name", None),
        path=session.get("path"),
        session_name=session.get("name"),
        session_type=session.get("type"),
        execution_state=state,
        last_activity=kernel_inventory.iso_utc(last),
        pid=_local_pid(kernel),
    )


def _local_pid(kernel: Any) -> int | None:
    """The kernel's process id when it runs here; a remote or container provisioner's pid means nothing here."""
    provisioner = getattr(kernel, "provisioner", None)
    if not isinstance(provisioner, LocalProvisioner):
        return None
    pid = provisioner.pid or getattr(provisioner.process, "pid", None)
    return int(pid) if pid else None


class StatusHandler(APIHandler):
    """``GET {base_url}tfgpu/api/status``: the contract's JSON, authenticated like every API handler."""

    # Browser tabs poll this every few seconds: that must not count as activity, or an idle
    # server would never be culled (JupyterHub reads the server's last activity).
    _track_activity = False
    # The reply shows the server's kernels and sessions: whoever may not read kernels may not read it.
    auth_resource = "kernels"

    def initialize(self, status: SharedRefresh[Reading]) -> None:
        self._status = status

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.set_header("Cache-Control", "no-store")  # a reading, not a resource to keep
        self.set_header("Content-Type", "application/json")
        self.finish((await self._status.get()).text)


class MetricsHandler(PrometheusMetricsHandler):
    """The server's own ``{base_url}metrics`` (this route comes before jupyter_server's), with one
    difference: tfgpu's per-kernel series (a kernel's id and notebook path) are served only to a
    login that may read kernels, the status endpoint's permission.  Everything else is as before."""

    # jupyter_server's get is synchronous; tornado awaits a handler's coroutine just the same.
    @allow_unauthenticated
    async def get(self) -> None:  # type: ignore[override]
        allowed = False
        if self.settings.get("authenticate_prometheus", True) and self.logged_in:
            try:
                allowed = bool(
                    await ensure_async(
                        self.authorizer.is_authorized(self, self.current_user, "read", "kernels")
                    )
                )
            except Exception:  # an authorizer that fails says no
                self.log.exception(
                    "tfgpu_magic: the authorizer failed; /metrics leaves out per-kernel series"
                )
        token = metrics.PER_KERNEL_ALLOWED.set(allowed)
        try:
            super().get()
        finally:
            metrics.PER_KERNEL_ALLOWED.reset(token)


STOP_TIMEOUT_S = 5.0  # the most the extension's stop waits for its own tasks to end


class KernelEnvironment(KernelStartHook):
    """Variables for each kernel the server starts, from a device source that has some to give
    (``kernel_environment()``: the simulated servers name themselves, so a kernel reads the same
    one): added to the kernel's environment when the kernel manager starts it, and kept on restarts
    (jupyter_client starts a restarted kernel with the same environment)."""

    def __init__(self, manager: Any, variables: Callable[[], dict[str, str]]) -> None:
        super().__init__(manager)
        self._variables = variables

    async def adjust(self, kwargs: dict[str, Any]) -> None:
        env = kwargs.get("env")
        kwargs["env"] = {**(os.environ if env is None else env), **self._variables()}


def _kernel_variables(device_variables: Any, policy: CullPolicy) -> Callable[[], dict[str, str]] | None:
    """What each kernel the server starts finds in its environment: a simulated server's name (the
    kernels read it too), and the idle culler's settings while it is on (a kernel's idle notice says
    when it would act: ``TFGPU_MAGIC_CULLER`` = "<idle seconds>,<least bytes>[,<free below bytes>]");
    None: nothing to add."""
    culler = {}
    if policy.enabled:
        parts = [f"{policy.after_s:g}", str(policy.min_memory_bytes)]
        if policy.free_below_bytes is not None:
            parts.append(str(policy.free_below_bytes))
        culler = {CULLER_ENV: ",".join(parts)}
    if not callable(device_variables) and not culler:
        return None

    def variables() -> dict[str, str]:
        return {**(device_variables() if callable(device_variables) else {}), **culler}

    return variables


class _Extension:
    """What the extension started on one server, stopped by :meth:`stop` when the server stops."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.callback: tornado.ioloop.PeriodicCallback | None = None
        self.culler: Culler | None = None
        self.watcher: ActivityWatcher | None = None
        self.metrics: metrics.GpuMetrics | None = None
        self.source: StatusSource | None = None
        self.status: SharedRefresh[Reading] | None = None
        self.kernel_environment: KernelEnvironment | None = None
        self.notebook_settings: NotebookSettingsLoader | None = None
        self.culling: asyncio.Future[Any] | None = None  # the culler's pass under way
        self.stopped = False

    def cull(self) -> None:
        """The periodic callback: one culler pass at a time, held here so that a stop can end it."""
        if self.culler is not None and (self.culling is None or self.culling.done()):
            self.culling = asyncio.ensure_future(self.culler.check())

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the culler's passes, the metrics' refresh and the readings under way, and wait (at
        most ``timeout``) until each task has ended, so none is left pending when the loop closes."""
        if self.stopped:
            return
        self.stopped = True
        if self.callback is not None:
            self.callback.stop()
        pending: list[asyncio.Future[Any]] = []
        if self.culling is not None and not self.culling.done():
            self.culling.cancel()
            pending.append(self.culling)
        if self.culler is not None:
            pending += self.culler.stop()
        if self.metrics is not None:
            pending += self.metrics.stop()
        if self.status is not None:
            pending += self.status.stop()
        if self.source is not None:
            pending += self.source.stop()
        if self.watcher is not None:
            self.watcher.uninstall()
        if self.notebook_settings is not None:  # installed last, so taken off first
            self.notebook_settings.uninstall()
        if self.kernel_environment is not None:
            self.kernel_environment.uninstall()
        left: set[asyncio.Future[Any]] = set()
        if pending:
            done, left = await asyncio.wait(pending, timeout=timeout)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: a failure while stopping is not "never retrieved"
        if left:
            self.log.warning(
                "tfgpu_magic: stopped, but %d task(s) did not end within %s s of the server's stop",
                len(left),
                f"{timeout:g}",
            )
        else:
            self.log.info("tfgpu_magic: stopped (%d task(s) under way ended)", len(pending))


class GpuStatusApp(ExtensionApp):
    """The server extension as jupyter_server's ``ExtensionApp``: loaded with the server (the status
    endpoint, ``/metrics``, the culler), stopped with it (:meth:`stop_extension`, called by the
    server's clean-up on SIGTERM, a confirmed Ctrl-C, ``/api/shutdown`` or a JupyterHub stop).

    Its settings stay in the ``TfgpuMagic`` section (:class:`TfgpuMagic`, read by
    :func:`load_settings`, which logs a wrong one instead of failing the server)."""

    name = "tfgpu_magic"
    load_other_extensions = True

    def initialize_handlers(self) -> None:
        serverapp = self.serverapp
        assert serverapp is not None
        self.started = _start(serverapp, self.handlers)

    async def stop_extension(self) -> None:
        started = getattr(self, "started", None)
        if started is not None:
            await started.stop()


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """The module's loader, for a server that names only this module (jupyter_server before
    ExtensionApp, or a hand-written ``jpserver_extensions`` entry): the same extension, stopped with
    the server's clean-up of its extensions."""
    started = _start(serverapp, None)
    cleanup = serverapp.cleanup_extensions

    async def cleanup_extensions() -> None:
        await started.stop()
        await cleanup()

    serverapp.cleanup_extensions = cleanup_extensions


def _start(serverapp: Any, handlers: list[Any] | None) -> _Extension:
    """Start the extension on ``serverapp``: the status handler and /metrics (added to ``handlers``,
    which the ExtensionApp puts under the base URL, or added here when None), and the culler if asked."""
    settings, policy = load_settings(serverapp.config, serverapp.log)
    serverapp.tfgpu_extension = started = _Extension(serverapp.log)
    if policy.enabled:
        try:
            watcher = ActivityWatcher(serverapp.kernel_manager, serverapp.log)
            watcher.install()
            started.watcher = watcher
        except Exception as err:  # a kernel manager whose kernels cannot be watched (a gateway's?)
            serverapp.log.error(
                "tfgpu_magic: the kernels of %s cannot be watched (%s); the GPU idle culler is off",
                type(serverapp.kernel_manager).__name__,
                _reason(err),
            )
            policy = CullPolicy()
    started.source = source = StatusSource(serverapp, settings, policy, started.watcher)
    started.status = status = SharedRefresh(source.read, settings.refresh_interval)
    variables = _kernel_variables(getattr(source.device, "kernel_environment", None), policy)
    if variables is not None:
        started.kernel_environment = KernelEnvironment(serverapp.kernel_manager, variables)
        started.kernel_environment.install()
    # A notebook with saved GPU settings: its kernel loads tfgpu_magic at start to apply them.
    started.notebook_settings = NotebookSettingsLoader(serverapp.kernel_manager, serverapp.log)
    started.notebook_settings.install()
    routes: list[tuple[str, Any] | tuple[str, Any, dict[str, Any]]] = [
        (url_path_join(*ROUTE), StatusHandler, {"status": status}),
        ("metrics", MetricsHandler),
    ]
    base_url = serverapp.web_app.settings["base_url"]
    if handlers is None:
        prefixed = [(url_path_join(base_url, path), *rest) for path, *rest in routes]
        serverapp.web_app.add_handlers(".*$", prefixed)
    else:
        handlers.extend(routes)
    route = url_path_join(base_url, *ROUTE)
    serverapp.log.info("tfgpu_magic: GPU status at %s (refresh every %s s)", route, settings.refresh_interval)
    # /metrics asks only for a login (none at all with authenticate_prometheus off), where the
    # status endpoint asks for the right to read kernels: per-kernel series only for a login
    # that may read kernels (MetricsHandler), none at all without a login.
    per_kernel = bool(getattr(serverapp, "authenticate_prometheus", True))
    if not per_kernel:
        serverapp.log.warning(
            "tfgpu_magic: /metrics is not authenticated, so it carries no per-kernel series"
        )
    started.metrics = metrics.GpuMetrics(
        latest=lambda: status.latest.reply if status.latest is not None else None,
        refresh=status.get,
        interval=settings.refresh_interval,
        version=__version__,
        log=serverapp.log,
        # Under JupyterHub the hub's user name; every server of a KubeSpawner runs as jovyan.
        user=os.environ.get("JUPYTERHUB_USER") or None,
        per_kernel=per_kernel,
    )
    metrics.install(started.metrics)
    if policy.enabled:
        assert started.watcher is not None
        serverapp.tfgpu_culler = started.culler = _culler(
            serverapp, policy, status, started.watcher, settings
        )
        started.callback = tornado.ioloop.PeriodicCallback(started.cull, settings.cull_interval * 1000)
        started.callback.start()
        serverapp.log.info(
            "tfgpu_magic: culling kernels idle %s s while they hold GPU memory", policy.after_s
        )
    return started


def _culler(
    serverapp: Any,
    policy: CullPolicy,
    status: SharedRefresh[Reading],
    watcher: ActivityWatcher,
    settings: TfgpuMagic,
) -> Culler:
    manager = serverapp.kernel_manager

    def complete(reading: Reading) -> dict[str, Any]:
        if not reading.complete:
            raise StaleReading(f"the driver did not answer within {settings.reading_timeout:g} s")
        return reading.reply

    async def reading() -> dict[str, Any]:
        return complete(await status.get())

    async def fresh_reading() -> dict[str, Any]:
        return complete(await status.fresh())

    def live(kernel_id: str) -> LiveState | None:
        try:
            kernel = manager.get_kernel(kernel_id)
        except KeyError:
            return None
        return live_state(kernel, watcher.activity(kernel_id))

    async def shutdown(kernel_id: str) -> None:
        await manager.shutdown_kernel(kernel_id)

    # A reading waits at most reading_timeout in StatusSource; the culler's own bound covers the rest.
    return Culler(
        policy,
        reading,
        fresh_reading,
        live,
        shutdown,
        serverapp.log,
        reading_timeout_s=settings.reading_timeout * 2 + 5,
    )


def _reason(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
