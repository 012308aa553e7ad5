"""The GPU-aware idle culler: shut down kernels that hold GPU memory and have been idle too long.

jupyter_server's own culler treats every kernel alike: it cannot tell a forgotten kernel that
holds 20 GiB of a shared GPU from a notebook left open to read.  This one looks only at kernels
the inventory says hold GPU memory, and is off unless ``TfgpuMagic.cull_idle_gpu_kernels_after``
is set.

One rule, :meth:`CullPolicy.due_at`, answers "when is this kernel due?" for everything that
asks: the reply's ``cull_due_at`` (the panel's "culled at ..."), the ``/metrics`` series, and
the culler itself.  The culler acts on the same shared reading as the panel, then checks the
kernel's live state once more just before shutting it down (the reading may be a refresh
interval old, and a cell started since then makes the kernel busy, not idle).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping, Optional

from ..command.units import format_size
from .kernel_inventory import iso_utc

__all__ = ["CullPolicy", "Culler", "epoch", "parse_iso_utc"]


@dataclass(frozen=True)
class CullPolicy:
    """The culler's settings, as the server was configured (``after_s`` 0: off)."""

    after_s: float = 0.0  # idle seconds before a kernel holding GPU memory is shut down
    min_memory_bytes: int = 1  # a kernel holding less is never culled (1: any GPU memory at all)
    free_below_bytes: Optional[int] = None  # cull only while a GPU the kernel holds memory on has less free

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def describe(self) -> Optional[dict[str, Any]]:
        """The reply's ``culler`` key: the settings in force, or None when off."""
        if not self.enabled:
            return None
        return {
            "idle_after_s": self.after_s,
            "min_memory_bytes": self.min_memory_bytes,
            "free_below_bytes": self.free_below_bytes,
        }

    def due_at(self, kernel: Mapping[str, Any], free_by_gpu: Mapping[str, Optional[int]]) -> Optional[float]:
        """When ``kernel`` (an inventory reply's entry) is due, in epoch seconds, if it stays idle;
        None when it is not a candidate: the culler is off, the kernel is busy or starting, holds
        too little GPU memory (or an unknown amount), or no GPU it holds memory on is short."""
        if not self.enabled or kernel.get("execution_state") != "idle":
            return None
        held = kernel.get("total_gpu_memory_bytes")
        if held is None or held < max(self.min_memory_bytes, 1):
            return None
        if self.free_below_bytes is not None and not self._short(kernel, free_by_gpu):
            return None
        last_activity = parse_iso_utc(kernel.get("last_activity"))
        return None if last_activity is None else last_activity + self.after_s

    def _short(self, kernel: Mapping[str, Any], free_by_gpu: Mapping[str, Optional[int]]) -> bool:
        """Whether a GPU the kernel holds memory on has less free than the threshold (unknown: no)."""
        for gpu, held in (kernel.get("gpu_memory_bytes") or {}).items():
            free = free_by_gpu.get(gpu)
            if held and free is not None and free < self.free_below_bytes:  # type: ignore[operator]
                return True
        return False

    def annotate(self, reply: dict[str, Any]) -> dict[str, Any]:
        """Add the policy (``culler``) and each kernel's ``cull_due_at`` (ISO 8601, or None) to a reply."""
        reply["culler"] = self.describe()
        free = free_by_gpu(reply)
        for kernel in reply.get("kernels", []):
            due = self.due_at(kernel, free)
            kernel["cull_due_at"] = None if due is None else _iso(due)
        return reply


def free_by_gpu(reply: Mapping[str, Any]) -> dict[str, Optional[int]]:
    """``{"1": free bytes}`` per GPU of a reply, keyed as the kernels' ``gpu_memory_bytes`` are."""
    return {str(gpu["index"]): (gpu.get("split") or {}).get("free_bytes") for gpu in reply.get("gpus", [])}


def parse_iso_utc(text: Optional[str]) -> Optional[float]:
    """The epoch seconds of ``kernel_inventory.iso_utc``'s text (None stays None, as does nonsense)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def epoch(moment: Optional[datetime]) -> Optional[float]:
    """Unix seconds of a kernel manager's time; a naive one is UTC, as ``iso_utc`` takes it (not local time)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)).timestamp()


def _iso(seconds: float) -> str:
    return iso_utc(datetime.fromtimestamp(seconds, tz=timezone.utc))  # type: ignore[return-value]


class Culler:
    """One pass of culling over a reading; the extension runs :meth:`check` periodically.

    ``reading`` returns the shared inventory reply (the panel's) and ``fresh_reading`` one made
    after the call (to say what the driver read once the kernels were gone); ``live`` returns a
    kernel's current ``(execution_state, last_activity epoch)`` from the kernel manager, or None
    once it is gone; ``shutdown`` shuts a kernel down.
    """

    def __init__(
        self,
        policy: CullPolicy,
        reading: Callable[[], Awaitable[dict[str, Any]]],
        fresh_reading: Callable[[], Awaitable[dict[str, Any]]],
        live: Callable[[str], Optional[tuple[Optional[str], Optional[float]]]],
        shutdown: Callable[[str], Awaitable[None]],
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self._reading = reading
        self._fresh_reading = fresh_reading
        self._live = live
        self._shutdown = shutdown
        self._log = log
        self._clock = clock
        self.culled: list[str] = []  # kernel ids, in order (for tests and the log)

    async def check(self) -> list[str]:
        """Shut down every kernel due now; returns their ids.  Never raises: a failure is logged."""
        try:
            reply = await self._reading()
        except Exception:
            self._log.exception("tfgpu_magic: the GPU culler could not read the GPUs")
            return []
        free = free_by_gpu(reply)
        culled = []
        for kernel in reply.get("kernels", []):
            due = self.policy.due_at(kernel, free)
            if due is None or due > self._clock() or not self._still_idle(kernel):
                continue
            try:
                await self._shutdown(kernel["id"])
            except Exception:
                self._log.exception("tfgpu_magic: the GPU culler could not shut down kernel %s", kernel["id"])
                continue
            self._log.warning("%s", shutdown_line(kernel, self._clock()))
            culled.append(kernel["id"])
        self.culled.extend(culled)
        if culled:
            await self._log_memory_after(reply, [k for k in reply["kernels"] if k["id"] in culled])
        return culled

    async def _log_memory_after(self, before: Mapping[str, Any], culled: list[Mapping[str, Any]]) -> None:
        """What the driver reads on the culled kernels' GPUs now: memory came back only if this shows it."""
        try:
            after = await self._fresh_reading()
        except Exception:
            self._log.exception("tfgpu_magic: the GPU culler could not read the GPUs after culling")
            return
        gpus = sorted({gpu for k in culled for gpu, size in (k.get("gpu_memory_bytes") or {}).items() if size}, key=int)
        for line in memory_change_lines(before, after, gpus):
            self._log.warning("%s", line)

    def _still_idle(self, kernel: Mapping[str, Any]) -> bool:
        """The kernel's live state agrees with the reading: idle, with no activity since it was made."""
        live = self._live(kernel["id"])
        if live is None:
            return False  # gone already
        state, last_activity = live
        read = parse_iso_utc(kernel.get("last_activity"))
        return state == "idle" and last_activity is not None and read is not None and last_activity <= read + 1e-3


def memory_change_lines(before: Mapping[str, Any], after: Mapping[str, Any], gpus: list[str]) -> list[str]:
    """Per GPU, the driver's memory in use before the culling and after it (whatever else changed too)."""
    used_before, used_after = _used_by_gpu(before), _used_by_gpu(after)
    lines = []
    for gpu in gpus:
        was, now = used_before.get(gpu), used_after.get(gpu)
        if was is None or now is None:
            lines.append(f"tfgpu_magic: GPU {gpu}: no driver reading to show what the culling gave back")
        else:
            lines.append(
                f"tfgpu_magic: GPU {gpu}: {format_size(was)} in use before the culling, {format_size(now)} after "
                f"({format_size(max(was - now, 0))} back, the driver's reading)"
            )
    return lines


def _used_by_gpu(reply: Mapping[str, Any]) -> dict[str, Optional[int]]:
    return {str(gpu["index"]): gpu.get("memory_used_bytes") for gpu in reply.get("gpus", [])}


def shutdown_line(kernel: Mapping[str, Any], now: float) -> str:
    """The log line of one shutdown: which notebook, how long idle, what it held where (the driver's reading)."""
    idle = now - (parse_iso_utc(kernel.get("last_activity")) or now)
    held = ", ".join(
        f"GPU {gpu}: {format_size(size)}" for gpu, size in sorted((kernel.get("gpu_memory_bytes") or {}).items()) if size
    )
    where = kernel.get("path") or "no notebook"
    return (
        f"tfgpu_magic: shut down kernel {kernel['id']} ({where}, {kernel.get('name') or 'unknown kernel'}): "
        f"idle {idle / 60:.0f} min while holding GPU memory ({held}, the driver's reading before the shutdown)"
    )
