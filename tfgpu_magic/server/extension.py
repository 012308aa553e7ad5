"""The Jupyter server extension: ``GET {base_url}tfgpu/api/status``, who holds what on the GPUs, per kernel.

Enabled on install (``etc/jupyter/jupyter_server_config.d/tfgpu_magic.json``); the entry point
``tfgpu_magic._jupyter_server_extension_points`` only names this module, so importing the
package never imports jupyter_server.  The reply is :func:`tfgpu_magic.server.kernel_inventory.inventory`'s
(the contract with the JupyterLab extension, ``version`` 1), always with status 200: no
driver, a lost GPU or a failed reading are data in it, never an error page.

How a request is served: the kernels and their sessions are read from the server's managers
on the event loop (they live there), then NVML and psutil are read in a worker thread, so a
slow driver never blocks the server.  At most one reading is made per ``refresh_interval``;
requests that arrive while one is under way wait for that one (one shared future), so many
browser tabs polling cost one reading.  The reply is encoded once per reading.

The same reading feeds the server's ``/metrics`` (:mod:`.metrics`) and the GPU idle culler
(:mod:`.culler`): one inventory per interval, whoever asks.

Configuration (traitlets, section ``TfgpuMagic``)::

    c.TfgpuMagic.device_source = "tfgpu_magic.simulated:kernels_server"   # default: the real driver
    c.TfgpuMagic.refresh_interval = 2.0                                     # seconds
    c.TfgpuMagic.cull_idle_gpu_kernels_after = 3600                         # seconds; 0 (default): off
    c.TfgpuMagic.cull_min_gpu_memory = "1G"                                 # default: any GPU memory
    c.TfgpuMagic.cull_only_when_free_below = "8G"                           # default: whatever is free
"""

from __future__ import annotations

import asyncio
import importlib
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Optional, TypeVar

import tornado.ioloop
import tornado.web
from jupyter_client.provisioning import LocalProvisioner
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from traitlets import Callable as CallableTrait
from traitlets import Float, TraitError, Unicode, Union, validate
from traitlets.config import Configurable

from .. import __version__
from ..command import grammar
from ..command.units import MIB
from ..gpus import owners
from ..gpus.nvml import Nvml
from ..safe_text import strict_json
from . import kernel_inventory, metrics
from .culler import Culler, CullPolicy, epoch
from .kernel_inventory import KernelDescription

__all__ = [
    "ROUTE",
    "Reading",
    "SharedRefresh",
    "StatusHandler",
    "StatusSource",
    "TfgpuMagic",
    "load_device_source",
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
        four-GPU server on which this server's kernels hold memory.""",
    ).tag(config=True)

    refresh_interval = Float(
        kernel_inventory.REFRESH_INTERVAL_S,
        min=0.0,
        help="""Seconds between two readings of NVML and the process table, however many
        browser tabs poll: replies within this interval repeat the last reading (its
        generated_at says when it was made).  0 reads on every request, though requests
        arriving during a reading still share it.""",
    ).tag(config=True)

    cull_idle_gpu_kernels_after = Float(
        0.0,
        min=0.0,
        help="""Shut down kernels that hold GPU memory and have been idle this many seconds
        (e.g. 3600).  0 (the default): never.  Kernels without GPU memory and busy kernels are
        never touched; each shutdown is logged with the notebook and the memory it held.""",
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
        min=1.0,
        help="""Seconds between two checks of the GPU idle culler.""",
    ).tag(config=True)

    @validate("refresh_interval", "cull_idle_gpu_kernels_after", "cull_interval")
    def _finite(self, proposal: Any) -> float:
        value = proposal["value"]
        if not math.isfinite(value):  # Float(min=...) lets NaN through, and NaN is never stale
            raise TraitError(f"TfgpuMagic.{proposal['trait'].name} must be a number of seconds, not {value}")
        return value

    def cull_policy(self) -> CullPolicy:
        """The culler's settings as one value (the reply, /metrics and the culler read it);
        raises TraitError, one line, for a size that is not one."""
        return CullPolicy(
            after_s=self.cull_idle_gpu_kernels_after,
            min_memory_bytes=_size_bytes(self.cull_min_gpu_memory, "cull_min_gpu_memory") or 1,
            free_below_bytes=_size_bytes(self.cull_only_when_free_below, "cull_only_when_free_below"),
        )


def _size_bytes(text: str, name: str) -> Optional[int]:
    if not text.strip():
        return None
    try:
        return int(grammar.parse_size(text, percent=False)) * MIB
    except Exception:
        raise TraitError(
            f"TfgpuMagic.{name} {text!r} is not a size (like \"1G\", \"512M\", or a bare number of MiB)"
        ) from None


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
        self, refresh: Callable[[], Awaitable[T]], interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._refresh = refresh
        self._interval = interval
        self._clock = clock
        self._value: Optional[T] = None
        self._started_at: Optional[float] = None  # of the refresh that made _value
        self._in_flight: Optional[asyncio.Task[T]] = None
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
    def latest(self) -> Optional[T]:
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
    """One reading: the reply (for /metrics and the culler) and its JSON text (for the endpoint), made once."""

    reply: dict[str, Any]
    text: str


class StatusSource:
    """One reading of the server's kernels and GPUs; never raises."""

    def __init__(self, serverapp: Any, settings: TfgpuMagic, policy: CullPolicy) -> None:
        self._serverapp = serverapp
        self._log = serverapp.log
        self._interval = settings.refresh_interval
        self._policy = policy
        self._load_error: Optional[str] = None
        self._nvml: Optional[Nvml] = None
        self._table: Optional[owners.ProcessTable] = None
        try:
            self._nvml = Nvml(lib=load_device_source(settings.device_source))
            self._table = owners.process_table_for(self._nvml, os.getpid())
        except Exception as err:  # a wrong setting must not stop the server: the reply says it
            self._load_error = f"TfgpuMagic.device_source {settings.device_source!r} could not be loaded ({_reason(err)})"
            self._log.error("tfgpu_magic: %s", self._load_error)

    async def read(self) -> Reading:
        kernels, notes = await self._kernels()
        try:
            reply = await asyncio.to_thread(self._read_devices, kernels, notes)
        except Exception as err:  # a bug of ours or a device source's: logged, and said in the reply
            self._log.exception("tfgpu_magic: reading the GPUs failed")
            reply = self._unavailable(kernels, f"reading the GPUs failed ({_reason(err)}); see the server's log", notes)
        self._policy.annotate(reply)
        return Reading(reply, reply_text(reply))

    async def _kernels(self) -> tuple[list[KernelDescription], list[str]]:
        """The kernels, read on the event loop where the managers live; a failure is a note."""
        try:
            return await describe_kernels(self._serverapp), []
        except Exception as err:
            self._log.exception("tfgpu_magic: listing the kernels failed")
            return [], [f"the kernels could not be listed ({_reason(err)})"]

    def _read_devices(self, kernels: list[KernelDescription], notes: list[str]) -> dict[str, Any]:
        """In a worker thread: NVML and the process table (both may block)."""
        if self._nvml is None:
            return self._unavailable(kernels, self._load_error or "no device source", notes)
        return kernel_inventory.inventory(self._nvml, kernels, self._table, refresh_interval_s=self._interval, notes=notes)

    def _unavailable(self, kernels: list[KernelDescription], reason: str, notes: list[str]) -> dict[str, Any]:
        return kernel_inventory.unavailable(kernels, reason, refresh_interval_s=self._interval, notes=notes)


async def describe_kernels(serverapp: Any) -> list[KernelDescription]:
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
        described.append(_describe(kernel_id, kernel, sessions.get(kernel_id, {})))
    return described


def _describe(kernel_id: str, kernel: Any, session: dict[str, Any]) -> KernelDescription:
    return KernelDescription(
        id=kernel_id,
        name=getattr(kernel, "kernel_name", None),
        path=session.get("path"),
        session_name=session.get("name"),
        session_type=session.get("type"),
        execution_state=getattr(kernel, "execution_state", None),
        last_activity=kernel_inventory.iso_utc(getattr(kernel, "last_activity", None)),
        pid=_local_pid(kernel),
    )


def _local_pid(kernel: Any) -> Optional[int]:
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


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Register the status handler under the server's base URL, the metrics, and the culler if asked."""
    try:
        settings = TfgpuMagic(parent=serverapp, config=serverapp.config)
    except TraitError as err:  # one line, not jupyter_server's traceback
        serverapp.log.error("tfgpu_magic: %s; the GPU status, metrics and culler are off", err)
        return
    try:
        policy = settings.cull_policy()
    except TraitError as err:  # a wrong culler setting leaves the panel and the metrics working
        serverapp.log.error("tfgpu_magic: %s; the GPU idle culler is off", err)
        policy = CullPolicy()
    source = StatusSource(serverapp, settings, policy)
    status: SharedRefresh[Reading] = SharedRefresh(source.read, settings.refresh_interval)
    route = url_path_join(serverapp.web_app.settings["base_url"], *ROUTE)
    serverapp.web_app.add_handlers(".*$", [(route, StatusHandler, {"status": status})])
    serverapp.log.info("tfgpu_magic: GPU status at %s (refresh every %s s)", route, settings.refresh_interval)
    # /metrics asks only for a login (none at all with authenticate_prometheus off), where the
    # status endpoint asks for the right to read kernels: without a login, no kernel's path or id.
    per_kernel = bool(getattr(serverapp, "authenticate_prometheus", True))
    if not per_kernel:
        serverapp.log.warning("tfgpu_magic: /metrics is not authenticated, so it carries no per-kernel series")
    metrics.install(
        metrics.GpuMetrics(
            latest=lambda: status.latest.reply if status.latest is not None else None,
            refresh=status.get,
            interval=settings.refresh_interval,
            version=__version__,
            log=serverapp.log,
            # Under JupyterHub the hub's user name; every server of a KubeSpawner runs as jovyan.
            user=os.environ.get("JUPYTERHUB_USER") or None,
            per_kernel=per_kernel,
        )
    )
    if policy.enabled:
        serverapp.tfgpu_culler = culler = _culler(serverapp, policy, status)
        tornado.ioloop.PeriodicCallback(culler.check, settings.cull_interval * 1000).start()
        serverapp.log.info("tfgpu_magic: culling kernels idle %s s while they hold GPU memory", policy.after_s)


def _culler(serverapp: Any, policy: CullPolicy, status: SharedRefresh[Reading]) -> Culler:
    manager = serverapp.kernel_manager

    async def reading() -> dict[str, Any]:
        return (await status.get()).reply

    async def fresh_reading() -> dict[str, Any]:
        return (await status.fresh()).reply

    def live(kernel_id: str) -> Optional[tuple[Optional[str], Optional[float]]]:
        try:
            kernel = manager.get_kernel(kernel_id)
        except KeyError:
            return None
        return getattr(kernel, "execution_state", None), epoch(getattr(kernel, "last_activity", None))

    async def shutdown(kernel_id: str) -> None:
        await manager.shutdown_kernel(kernel_id)

    return Culler(policy, reading, fresh_reading, live, shutdown, serverapp.log)


def _reason(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
