"""GPU memory per notebook for Prometheus, on the Jupyter server's own ``/metrics``.

jupyter_server serves ``prometheus_client``'s default registry at ``{base_url}metrics``,
authenticated like the rest of the server (``ServerApp.authenticate_prometheus``, on by
default): this module adds a collector to that registry, so there is no new port, no new
dependency and no second authentication to configure.

The figures are the GPU panel's: :func:`families` turns one inventory reply (the one that
``GET tfgpu/api/status`` returns) into metric families, and nothing else is read.  A scrape
must never block the server's event loop (jupyter_server calls the collector from a
synchronous handler, on the loop), so :class:`GpuMetrics` serves the latest reading in memory
and keeps it warm: the first scrape starts a refresh task that re-reads at most once per
refresh interval while scrapes keep coming (and stops ``KEEP_WARM_S`` after the last), shared
with the panel's polls, however many scrapers there are.  ``tfgpu_reading_timestamp_seconds``
says when the figures were read.  Labels are the reply's strings, already made safe
(``safe_text``), and prometheus_client escapes them: another user's process name never forges
a label or a line.

Series labelled with a kernel's id and notebook path are served only to a login that may read
kernels (the status endpoint's permission): the server extension's ``/metrics`` handler asks the
server's authorizer and says so in :data:`PER_KERNEL_ALLOWED` for the scrape; a scrape that did
not come through it (that context variable unset) gets none.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from .culler import parse_iso_utc

__all__ = ["KEEP_WARM_S", "PER_KERNEL_ALLOWED", "GpuMetrics", "families", "install"]

# Set by the /metrics handler for one scrape: whether its login may read kernels.
PER_KERNEL_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tfgpu_per_kernel_allowed", default=False
)

KEEP_WARM_S = 300.0  # keep reading this long after the last scrape (longer than any scrape interval)

_KERNEL = ["kernel_id", "kernel_name", "path"]
IDLE_MEMORY_TIME = "tfgpu_kernel_idle_gpu_memory_byte_seconds"
_GPU = ["gpu", "gpu_uuid", "name"]


def _gauges() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """Every family this collector exposes, empty (also its ``describe``)."""
    specs = [
        (
            "tfgpu_kernel_gpu_memory_bytes",
            "GPU memory a Jupyter kernel (and its child processes) holds on a GPU, the driver's reading",
            [*_KERNEL, "gpu", "gpu_uuid"],
        ),
        ("tfgpu_gpu_memory_used_bytes", "GPU memory in use by all processes, the driver's reading", _GPU),
        ("tfgpu_gpu_memory_total_bytes", "GPU memory in all", _GPU),
        (
            "tfgpu_gpu_utilization_ratio",
            "GPU utilization, 0 to 1 (absent where the driver does not report it)",
            _GPU,
        ),
        (
            "tfgpu_other_users_gpu_memory_bytes",
            "GPU memory held by other users' processes",
            ["gpu", "gpu_uuid"],
        ),
        (
            "tfgpu_kernel_idle_seconds",
            "Seconds since the kernel's last activity (0 while busy), for kernels holding GPU memory",
            _KERNEL,
        ),
        (
            "tfgpu_kernel_cull_due_timestamp_seconds",
            "When the GPU idle culler shuts the kernel down if it stays idle (only when the culler is on)",
            _KERNEL,
        ),
        (
            "tfgpu_gpu_share_bytes",
            "GPU memory the platform granted this server's kernels (MPS, MIG, HAMi, Alibaba gpushare, Slurm) "
            "and whether it holds: enforcement is hard or soft",
            ["gpu", "gpu_uuid", "source", "enforcement"],
        ),
        (
            "tfgpu_kernel_gpu_utilization_ratio",
            "A Jupyter kernel's GPU utilization on a GPU it holds memory on, 0 to 1, the driver's figure: "
            "its processes' samples since the last reading (scope \"process\"), or the whole GPU's where the "
            'driver gives none per process (scope "device", e.g. MIG); absent where it could not be read',
            [*_KERNEL, "gpu", "gpu_uuid", "scope"],
        ),
        ("tfgpu_driver_available", "1 when the NVIDIA driver could be read, else 0", []),
        ("tfgpu_reading_timestamp_seconds", "When these figures were read (Unix time)", []),
        (
            "tfgpu_server_info",
            "This Jupyter server's user and tfgpu_magic's version (always 1)",
            ["user", "version"],
        ),
    ]
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        name: GaugeMetricFamily(name, text, labels=labels) for name, text, labels in specs
    }
    # A counter (exposed as ..._total): it only grows while the server watches the kernel, so
    # rate() and increase() give the waste over any window; it starts again with the server.
    families[IDLE_MEMORY_TIME] = CounterMetricFamily(
        IDLE_MEMORY_TIME,
        "GPU memory a Jupyter kernel held with its processes at 0% GPU utilization, in byte-seconds "
        "(the driver's bytes times the seconds between the server's readings), since the server began "
        "watching it",
        labels=_KERNEL,
    )
    return families


def families(
    reply: Mapping[str, Any], version: str, user: str | None = None, per_kernel: bool = True
) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """The metric families of one inventory reply (pure: no reading, no clock).  ``user`` names the
    server's user in ``tfgpu_server_info`` (default: the reply's, the operating system's user);
    ``per_kernel`` False leaves out every series labelled with a kernel's id and notebook path."""
    gauges = _gauges()
    read_at = float(reply.get("generated_at") or 0.0)
    gauges["tfgpu_reading_timestamp_seconds"].add_metric([], read_at)
    gauges["tfgpu_driver_available"].add_metric(
        [], 1.0 if (reply.get("driver") or {}).get("available") else 0.0
    )
    gauges["tfgpu_server_info"].add_metric([_text(user or reply.get("user")), version], 1.0)
    uuids = {}
    for gpu in reply.get("gpus", []):
        labels = [str(gpu["index"]), _text(gpu.get("uuid")), _text(gpu.get("name"))]
        uuids[str(gpu["index"])] = labels[1]
        _add(gauges["tfgpu_gpu_memory_used_bytes"], labels, gpu.get("memory_used_bytes"))
        _add(gauges["tfgpu_gpu_memory_total_bytes"], labels, gpu.get("memory_total_bytes"))
        share = gpu.get("share")
        if share:
            enforcement = "hard" if share.get("hard") else "soft"
            _add(
                gauges["tfgpu_gpu_share_bytes"],
                [*labels[:2], _text(share.get("source")), enforcement],
                share.get("bytes"),
            )
        utilization = gpu.get("utilization_percent")
        _add(
            gauges["tfgpu_gpu_utilization_ratio"], labels, None if utilization is None else utilization / 100
        )
        if reply.get("pids_visible") is not False:  # in another pid namespace nothing is known to be others'
            _add(
                gauges["tfgpu_other_users_gpu_memory_bytes"],
                labels[:2],
                (gpu.get("split") or {}).get("others_bytes"),
            )
    for kernel in reply.get("kernels", []) if per_kernel else []:
        labels = [_text(kernel.get("id")), _text(kernel.get("name")), _text(kernel.get("path"))]
        for gpu, size in sorted((kernel.get("gpu_memory_bytes") or {}).items()):
            _add(gauges["tfgpu_kernel_gpu_memory_bytes"], [*labels, gpu, uuids.get(gpu, "")], size)
        if kernel.get("total_gpu_memory_bytes"):
            _add(gauges["tfgpu_kernel_idle_seconds"], labels, _idle_seconds(kernel, read_at))
        _add(
            gauges["tfgpu_kernel_cull_due_timestamp_seconds"],
            labels,
            parse_iso_utc(kernel.get("cull_due_at")),
        )
        for gpu, figure in sorted((kernel.get("gpu_utilization") or {}).items()):
            percent = figure.get("percent") if isinstance(figure, Mapping) else None
            scope = _text(figure.get("scope")) if isinstance(figure, Mapping) else ""
            _add(
                gauges["tfgpu_kernel_gpu_utilization_ratio"],
                [*labels, gpu, uuids.get(gpu, ""), scope],
                None if percent is None else percent / 100,
            )
        _add(gauges[IDLE_MEMORY_TIME], labels, kernel.get("idle_gpu_memory_byte_seconds"))
    return list(gauges.values())


def _idle_seconds(kernel: Mapping[str, Any], read_at: float) -> float | None:
    state = kernel.get("execution_state")
    if state == "busy":
        return 0.0
    last_activity = parse_iso_utc(kernel.get("last_activity"))
    if state != "idle" or last_activity is None:
        return None  # starting, dead or unknown: no honest figure
    return max(read_at - last_activity, 0.0)


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    """A sample, or none at all: an unknown reading is absent, never 0."""
    if value is not None:
        family.add_metric(labels, float(value))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class GpuMetrics(Collector):
    """The collector: the latest reading's families, and a refresh kept warm while scrapes come.

    ``latest`` returns the latest reply (None before the first reading); ``refresh`` is the
    shared refresh's coroutine (one reading per interval for everyone).
    """

    def __init__(
        self,
        latest: Callable[[], Mapping[str, Any] | None],
        refresh: Callable[[], Any],
        interval: float,
        version: str,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        user: str | None = None,
        per_kernel: bool = True,
    ) -> None:
        self._latest = latest
        self._user = user
        self._per_kernel = per_kernel
        self._refresh = refresh
        self._interval = max(interval, 0.5)  # 0 means "on every request" for the panel, not a busy loop here
        self._version = version
        self._log = log
        self._clock = clock
        self._last_scrape: float | None = None
        self._warmer: asyncio.Task[None] | None = None

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return list(_gauges().values())  # the names, without reading anything (registration calls this)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        self._last_scrape = self._clock()
        self._keep_warm()
        reply = self._latest()
        if reply is not None:
            yield from families(
                reply, self._version, self._user, self._per_kernel and PER_KERNEL_ALLOWED.get()
            )

    def _keep_warm(self) -> None:
        """Start the refresh task, from the server's loop only (a scrape from another thread just reads)."""
        if self._warmer is not None and not self._warmer.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._warmer = loop.create_task(self._warm())

    def stop(self) -> list[asyncio.Future[Any]]:
        """Stop keeping the reading warm (the server is stopping); returns the task cancelled, to be waited out."""
        self._last_scrape = None
        if self._warmer is None or self._warmer.done():
            return []
        self._warmer.cancel()
        return [self._warmer]

    async def _warm(self) -> None:
        while self._last_scrape is not None and self._clock() - self._last_scrape < KEEP_WARM_S:
            try:
                await self._refresh()
            except (
                Exception
            ):  # the reading says its own failures; this is a bug, logged, and the loop goes on
                self._log.exception("tfgpu_magic: refreshing the GPU metrics failed")
            await asyncio.sleep(self._interval)


_installed: GpuMetrics | None = None


def install(collector: GpuMetrics) -> None:
    """Register ``collector`` in the registry ``/metrics`` serves, replacing one a previous server
    of this process registered (tests run several; jupyter_server has no unload hook)."""
    global _installed
    if _installed is not None:
        try:
            REGISTRY.unregister(_installed)
        except KeyError:
            pass
    REGISTRY.register(collector)
    _installed = collector
