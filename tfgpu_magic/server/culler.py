"""The GPU-aware idle culler: shut down kernels that hold GPU memory and have been idle too long.

jupyter_server's own culler treats every kernel alike: it cannot tell a forgotten kernel that
holds 20 GiB of a shared GPU from a notebook left open to read.  This one looks only at kernels
the inventory says hold GPU memory, and is off unless ``TfgpuMagic.cull_idle_gpu_kernels_after``
is set.

One rule, :meth:`CullPolicy.due_at`, answers "when is this kernel due?" for everything that
asks: the reply's ``cull_due_at`` (the panel's "culled at ..."), the ``/metrics`` series, and
the culler itself.  "Busy" and "idle" are :mod:`.activity`'s: what the kernel is doing (an
``execute_request`` it started and has not finished), not the last status message it sent, and
idle time that the ``%gpu monitor`` panel's own messages do not reset.

A pass (:meth:`Culler.check`): the shared reading (the panel's) says which kernels look due;
if any, a reading made after that moment decides (the kernel must still hold at least the
minimum there, in the driver's reading, and still be due by it); then, just before each
shutdown, the kernel's live state must agree (idle, no activity since that reading).  Every
reading and every shutdown has a timeout: a hung one is a logged note, and the pass goes on.
After the shutdowns, a third reading says what the driver shows: memory came back only where
it shows less in use than the reading before, and it says whether the culled kernels'
processes are still listed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..command.units import format_size
from .kernel_inventory import iso_utc

__all__ = ["CullPolicy", "Culler", "LiveState", "StaleReading", "epoch", "parse_iso_utc"]

# The last moment a due time can be written (9999-12-31T23:59:59Z): a limit that reaches past it
# means "never" (no date is due then), instead of an error in every reading.
LAST_DUE_S = 253_402_300_799.0


@dataclass(frozen=True)
class CullPolicy:
    """The culler's settings, as the server was configured (``after_s`` 0: off)."""

    after_s: float = 0.0  # idle seconds before a kernel holding GPU memory is shut down
    min_memory_bytes: int = 1  # a kernel holding less is never culled (1: any GPU memory at all)
    free_below_bytes: int | None = None  # cull only while a GPU the kernel holds memory on has less free

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def describe(self) -> dict[str, Any] | None:
        """The reply's ``culler`` key: the settings in force, or None when off."""
        if not self.enabled:
            return None
        return {
            "idle_after_s": self.after_s,
            "min_memory_bytes": self.min_memory_bytes,
            "free_below_bytes": self.free_below_bytes,
        }

    def due_at(self, kernel: Mapping[str, Any], free_by_gpu: Mapping[str, int | None]) -> float | None:
        """When ``kernel`` (an inventory reply's entry) is due, in epoch seconds, if it stays idle;
        None when it is not a candidate: the culler is off, the kernel is busy or starting, holds
        too little GPU memory (or an unknown amount), or no GPU it holds memory on is short."""
        if not self.enabled or kernel.get("execution_state") != "idle":
            return None
        held = kernel.get("total_gpu_memory_bytes")
        if held is None or held < max(self.min_memory_bytes, 1):
            return None
        if self.free_below_bytes is not None and not self._short(kernel, free_by_gpu, self.free_below_bytes):
            return None
        last_activity = parse_iso_utc(kernel.get("last_activity"))
        if last_activity is None:
            return None
        due = last_activity + self.after_s
        return due if due <= LAST_DUE_S else None  # past any date: never

    def _short(self, kernel: Mapping[str, Any], free_by_gpu: Mapping[str, int | None], below: int) -> bool:
        """Whether a GPU the kernel holds memory on has less free than ``below`` (unknown: no)."""
        for gpu, held in (kernel.get("gpu_memory_bytes") or {}).items():
            free = free_by_gpu.get(gpu)
            if held and free is not None and free < below:
                return True
        return False

    def annotate(
        self, reply: dict[str, Any], cullable: Callable[[str], bool] | None = None
    ) -> dict[str, Any]:
        """Add the policy (``culler``) and each kernel's ``cull_due_at`` (ISO 8601, or None) to a reply.

        ``cullable(kernel_id)`` False: the culler will never shut that kernel down (it was not
        watched from its start), so no due time is shown for it either."""
        reply["culler"] = self.describe()
        free = free_by_gpu(reply)
        for kernel in reply.get("kernels", []):
            due = self.due_at(kernel, free) if cullable is None or cullable(kernel["id"]) else None
            kernel["cull_due_at"] = None if due is None else _iso(due)
        return reply


def free_by_gpu(reply: Mapping[str, Any]) -> dict[str, int | None]:
    """``{"1": free bytes}`` per GPU of a reply, keyed as the kernels' ``gpu_memory_bytes`` are."""
    return {str(gpu["index"]): (gpu.get("split") or {}).get("free_bytes") for gpu in reply.get("gpus", [])}


def parse_iso_utc(text: str | None) -> float | None:
    """The epoch seconds of ``kernel_inventory.iso_utc``'s text (None stays None, as does nonsense)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None


def epoch(moment: datetime | None) -> float | None:
    """Unix seconds of a kernel manager's time; a naive one is UTC, as ``iso_utc`` takes it (not local time)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)).timestamp()


def _iso(seconds: float) -> str:
    return iso_utc(datetime.fromtimestamp(seconds, tz=timezone.utc))


class StaleReading(Exception):
    """A reading that is not a fresh one of the driver (it timed out, and the reply repeats the last)."""


@dataclass(frozen=True)
class LiveState:
    """A kernel as the server sees it now: its state (busy while an execution is under way), its
    last activity (epoch seconds), and whether it has been watched since it started."""

    execution_state: str | None
    last_activity: float | None
    watched: bool = True


class Culler:
    """One pass of culling; the extension runs :meth:`check` periodically.

    ``reading`` returns the shared inventory reply (the panel's) and ``fresh_reading`` one made
    after the call; either raises (``StaleReading``) when the driver gave no fresh reading.
    ``live`` returns a kernel's :class:`LiveState` now, or None once it is gone; ``shutdown``
    shuts a kernel down.  Readings wait at most ``reading_timeout_s``, a shutdown at most
    ``shutdown_timeout_s``.
    """

    def __init__(
        self,
        policy: CullPolicy,
        reading: Callable[[], Awaitable[dict[str, Any]]],
        fresh_reading: Callable[[], Awaitable[dict[str, Any]]],
        live: Callable[[str], LiveState | None],
        shutdown: Callable[[str], Awaitable[None]],
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
        reading_timeout_s: float = 30.0,
        shutdown_timeout_s: float = 30.0,
    ) -> None:
        self.policy = policy
        self._reading = reading
        self._fresh_reading = fresh_reading
        self._live = live
        self._shutdown = shutdown
        self._log = log
        self._clock = clock
        self.reading_timeout_s = reading_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.culled: list[str] = []  # kernel ids, in order (for tests and the log)
        self._shutting_down: dict[str, asyncio.Future[Any]] = {}  # shutdowns past their timeout
        self._failures: dict[str, int] = {}  # failed shutdowns per kernel (the first is a warning)
        self._noted: set[str] = set()  # reading faults already logged as warnings
        self._checking = False

    async def check(self) -> list[str]:
        """Shut down every kernel due now; returns their ids.  Never raises, never waits past its timeouts."""
        if self._checking:  # the last pass is still under way: one at a time
            return []
        self._checking = True
        try:
            return await self._check()
        except Exception:  # a bug of ours: logged, and the next pass runs
            self._log.exception("tfgpu_magic: the GPU culler's pass failed")
            return []
        finally:
            self._checking = False

    async def _check(self) -> list[str]:
        reply = await self._read(self._reading, "read the GPUs")
        if reply is None:
            return []
        looks_due = [
            k
            for k in reply.get("kernels", [])
            if k.get("id") not in self._shutting_down and self._due(k, reply)
        ]
        if not looks_due:
            return []
        before = await self._read(self._fresh_reading, "read the GPUs afresh before culling")
        if before is None:
            return []
        now_read = {k.get("id"): k for k in before.get("kernels", [])}
        culled = []
        for seen in looks_due:
            kernel = now_read.get(seen["id"])
            if kernel is None or not self._due(kernel, before) or not self._still_idle(kernel):
                continue
            if await self._shut(kernel):
                self._log.warning("%s", shutdown_line(kernel, self._clock()))
                culled.append(kernel)
        self.culled.extend(k["id"] for k in culled)
        if culled:
            await self._log_memory_after(before, culled)
        return [k["id"] for k in culled]

    def _due(self, kernel: Mapping[str, Any], reply: Mapping[str, Any]) -> bool:
        due = self.policy.due_at(kernel, free_by_gpu(reply))
        return due is not None and due <= self._clock()

    async def _read(self, read: Callable[[], Awaitable[dict[str, Any]]], what: str) -> dict[str, Any] | None:
        """A reading within the timeout, or None and a note (a warning the first time, then debug)."""
        try:
            reply = await asyncio.wait_for(read(), self.reading_timeout_s)
        except asyncio.TimeoutError:
            self._note(what, f"no reading within {self.reading_timeout_s:g} s")
        except StaleReading as err:
            self._note(what, str(err))
        except Exception as err:
            self._note(what, _reason(err))
        else:
            self._noted.discard(what)
            return reply
        return None

    def _note(self, what: str, why: str) -> None:
        level = logging.DEBUG if what in self._noted else logging.WARNING
        self._noted.add(what)
        self._log.log(
            level, "tfgpu_magic: the GPU culler could not %s (%s); no kernel is culled without one", what, why
        )

    async def _shut(self, kernel: Mapping[str, Any]) -> bool:
        """Shut ``kernel`` down within the timeout; a hung or failed shutdown is a note, and False."""
        kernel_id = kernel["id"]
        task = asyncio.ensure_future(self._shutdown(kernel_id))
        try:
            await asyncio.wait_for(asyncio.shield(task), self.shutdown_timeout_s)
        except asyncio.TimeoutError:
            self._shutting_down[kernel_id] = task
            task.add_done_callback(lambda done: self._finished_late(kernel, done))
            self._log.warning(
                "tfgpu_magic: shutting down kernel %s (%s) did not finish in %s s; the GPU culler goes on with "
                "the other kernels and leaves this one to that shutdown",
                kernel_id,
                _where(kernel),
                f"{self.shutdown_timeout_s:g}",
            )
            return False
        except Exception as err:
            self._failed(kernel, err)
            return False
        self._failures.pop(kernel_id, None)
        return True

    def _finished_late(self, kernel: Mapping[str, Any], task: asyncio.Future[Any]) -> None:
        self._shutting_down.pop(kernel["id"], None)
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            self._failed(kernel, err)
        else:
            self._log.warning("tfgpu_magic: kernel %s (%s) is shut down, late", kernel["id"], _where(kernel))

    def _failed(self, kernel: Mapping[str, Any], err: BaseException) -> None:
        """One warning per kernel; its later failures only at debug level."""
        kernel_id = kernel["id"]
        self._failures[kernel_id] = self._failures.get(kernel_id, 0) + 1
        if self._failures[kernel_id] == 1:
            self._log.warning(
                "tfgpu_magic: the GPU culler could not shut down kernel %s (%s): %s; it tries again each pass, "
                "logging further failures at debug level",
                kernel_id,
                _where(kernel),
                _reason(err),
            )
        else:
            self._log.debug("tfgpu_magic: shutting down kernel %s failed again: %s", kernel_id, _reason(err))

    def stop(self) -> list[asyncio.Future[Any]]:
        """Stop waiting for shutdowns past their timeout (the server is stopping); returns them, cancelled."""
        tasks = list(self._shutting_down.values())
        for task in tasks:
            task.cancel()
        self._shutting_down.clear()
        return tasks

    async def _log_memory_after(self, before: Mapping[str, Any], culled: list[Mapping[str, Any]]) -> None:
        """What the driver reads now: memory came back only if this shows it."""
        after = await self._read(self._fresh_reading, "read the GPUs after culling")
        if after is None:
            self._log.warning("tfgpu_magic: no driver reading after the culling shows what it gave back")
            return
        for line in memory_change_lines(before, after, culled):
            self._log.warning("%s", line)

    def _still_idle(self, kernel: Mapping[str, Any]) -> bool:
        """The kernel's live state agrees with the reading: watched since it started, idle (no
        execution under way), with no activity since the reading."""
        live = self._live(kernel["id"])
        if live is None or not live.watched:
            return False  # gone already, or not watched since its start (a cell of before may run)
        read = parse_iso_utc(kernel.get("last_activity"))
        return (
            live.execution_state == "idle"
            and live.last_activity is not None
            and read is not None
            and live.last_activity <= read + 1e-3
        )


def memory_change_lines(
    before: Mapping[str, Any], after: Mapping[str, Any], culled: list[Mapping[str, Any]]
) -> list[str]:
    """Per GPU the culled kernels held memory on, the driver's memory in use in the reading just
    before the shutdowns and after them ("back" only where the driver shows less); then whether
    the driver still lists the culled kernels' processes."""
    gpus = sorted(
        {gpu for k in culled for gpu, size in (k.get("gpu_memory_bytes") or {}).items() if size}, key=int
    )
    used_before, used_after = _used_by_gpu(before), _used_by_gpu(after)
    lines = []
    for gpu in gpus:
        was, now = used_before.get(gpu), used_after.get(gpu)
        if was is None or now is None:
            lines.append(f"tfgpu_magic: GPU {gpu}: no driver reading to show what the culling gave back")
        elif now < was:
            lines.append(
                f"tfgpu_magic: GPU {gpu}: {format_size(was)} in use before the culling, {format_size(now)} after "
                f"({format_size(was - now)} back, the driver's reading)"
            )
        else:
            lines.append(
                f"tfgpu_magic: GPU {gpu}: {format_size(was)} in use before the culling, {format_size(now)} after: "
                "the driver shows no memory freed yet"
            )
    pids = sorted(
        {p for k in culled for p in [k.get("pid"), *(k.get("child_pids") or [])] if isinstance(p, int)}
    )
    # The culled kernels' pids were matched to the driver's list in the reading before; after it,
    # their exited processes may be the only ones listed (and pids_visible then false).
    if before.get("pids_visible") and after.get("driver", {}).get("available", True) and pids:
        still = sorted(set(pids) & listed_pids(after))
        if still:
            lines.append(
                f"tfgpu_magic: the driver still lists pid {', '.join(map(str, still))} of the culled kernels"
            )
        else:
            lines.append(
                f"tfgpu_magic: the driver no longer lists the culled kernels' processes (pid {', '.join(map(str, pids))})"
            )
    return lines


def listed_pids(reply: Mapping[str, Any]) -> set[int]:
    """Every pid the driver lists in a reply: kernels' processes holding memory, and everyone else's."""
    pids: set[int] = set()
    for kernel in reply.get("kernels", []):
        if kernel.get("total_gpu_memory_bytes"):
            pids.update(
                p for p in [kernel.get("pid"), *(kernel.get("child_pids") or [])] if isinstance(p, int)
            )
    for key in ("my_other_processes", "other_users", "unattributed"):
        pids.update(p["pid"] for p in reply.get(key, []) if isinstance(p.get("pid"), int))
    return pids


def _used_by_gpu(reply: Mapping[str, Any]) -> dict[str, int | None]:
    return {str(gpu["index"]): gpu.get("memory_used_bytes") for gpu in reply.get("gpus", [])}


def _where(kernel: Mapping[str, Any]) -> str:
    return str(kernel.get("path") or "no notebook")


def _reason(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def shutdown_line(kernel: Mapping[str, Any], now: float) -> str:
    """The log line of one shutdown: which notebook, how long idle, what it held where (the driver's reading)."""
    idle = now - (parse_iso_utc(kernel.get("last_activity")) or now)
    held = ", ".join(
        f"GPU {gpu}: {format_size(size)}"
        for gpu, size in sorted((kernel.get("gpu_memory_bytes") or {}).items())
        if size
    )
    return (
        f"tfgpu_magic: shut down kernel {kernel['id']} ({_where(kernel)}, {kernel.get('name') or 'unknown kernel'}): "
        f"idle {idle / 60:.0f} min while holding GPU memory ({held}, the driver's reading before the shutdown)"
    )
