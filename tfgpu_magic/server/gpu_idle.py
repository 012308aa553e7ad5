"""GPU memory nobody uses: each kernel's time at 0% while holding memory, from the server's readings.

:class:`IdleTracker` is fed every fresh reply of the status source (in its worker thread, one
reading at a time) and adds to each kernel:

- ``gpu_idle_since``: since when every GPU it holds memory on has shown its processes at 0% (the
  driver's samples, ``gpu_utilization``), as this server's readings saw it; null while a GPU is
  busy, its utilization is unknown there, or it holds no memory.  An unknown figure ends an idle
  stretch: only what the driver shows as 0 counts.
- ``idle_gpu_memory_byte_seconds``: memory held at 0% times the time it was held so, summed
  since the server began watching the kernel: between two readings that both found it idle, the
  bytes of the later reading (the driver's) times the seconds between them.  A team sums it
  (``/metrics``) to see its waste.
- ``gpu_idle_notice``: one line for its notebook (the panel, the status bar) once it has held at
  least ``min_bytes`` at 0% for at least ``after_s``: what it holds, for how long, what to do.

What the server restarts without is lost: the figures start again (a Prometheus counter's reset).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..gpus.utilization import idle_line, span_text
from .kernel_inventory import iso_utc

__all__ = [
    "DEFAULT_AFTER_S",
    "DEFAULT_MIN_BYTES",
    "IdleTracker",
    "add_cull_deadline",
    "idle_line",
    "span_text",
]

DEFAULT_AFTER_S = 600.0  # 10 minutes at 0%
DEFAULT_MIN_BYTES = 1024**3  # holding at least 1 GiB


@dataclass
class _Idle:
    since: float | None  # the reading that first found it idle (epoch seconds); None: not idle now
    byte_seconds: float
    last_at: float  # the time of the last reading that saw it


class IdleTracker:
    """Each kernel's idle GPU memory, across the server's readings (see the module's doc)."""

    def __init__(self, after_s: float = DEFAULT_AFTER_S, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        self.after_s = after_s
        self.min_bytes = min_bytes
        self._kernels: dict[str, _Idle] = {}
        self._lock = threading.Lock()  # guards only the dict; nothing under it calls out

    def annotate(self, reply: dict[str, Any]) -> None:
        """Add the idle keys to each kernel of a fresh reply (one with ``generated_at``)."""
        now = reply.get("generated_at")
        kernels = reply.get("kernels", [])
        if not isinstance(now, (int, float)):  # no time of reading: nothing can be measured
            for kernel in kernels:
                kernel.update(gpu_idle_since=None, idle_gpu_memory_byte_seconds=0.0, gpu_idle_notice=None)
            return
        with self._lock:
            seen = {}
            for kernel in kernels:
                state = self._step(self._kernels.get(kernel["id"]), kernel, float(now))
                seen[kernel["id"]] = state
                self._describe(kernel, state, float(now))
            self._kernels = seen  # a kernel no longer listed is forgotten

    def _step(self, state: _Idle | None, kernel: Mapping[str, Any], now: float) -> _Idle:
        held = kernel.get("total_gpu_memory_bytes") or 0
        idle = held > 0 and _all_at_zero(kernel.get("gpu_utilization") or {})
        if state is None:
            return _Idle(now if idle else None, 0.0, now)
        if idle and state.since is not None and now > state.last_at:
            state.byte_seconds += held * (now - state.last_at)
        if not idle:
            state.since = None
        elif state.since is None:
            state.since = now
        state.last_at = max(state.last_at, now)
        return state

    def _describe(self, kernel: dict[str, Any], state: _Idle, now: float) -> None:
        since = state.since
        kernel["gpu_idle_since"] = (
            None if since is None else iso_utc(datetime.fromtimestamp(since, tz=timezone.utc))
        )
        kernel["idle_gpu_memory_byte_seconds"] = state.byte_seconds
        held = kernel.get("total_gpu_memory_bytes") or 0
        due = since is not None and now - since >= self.after_s and held >= self.min_bytes
        kernel["gpu_idle_notice"] = idle_line(held, now - since) if due and since is not None else None


def add_cull_deadline(reply: Mapping[str, Any]) -> None:
    """Say in each notice when the idle culler acts, where it is due (``cull_due_at``, added after)."""
    for kernel in reply.get("kernels", []):
        notice, due = kernel.get("gpu_idle_notice"), kernel.get("cull_due_at")
        if notice and due:
            kernel["gpu_idle_notice"] = (
                f"{notice}; the idle culler shuts it down at {due[11:16]} UTC if it stays idle"
            )


def _all_at_zero(utilization: Mapping[str, Any]) -> bool:
    """Every GPU it holds memory on read, and at 0% (an unknown one is not idle)."""
    return bool(utilization) and all(
        isinstance(u, Mapping) and u.get("percent") == 0 for u in utilization.values()
    )
