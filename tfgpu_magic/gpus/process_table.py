"""Which processes are running, as the kernel's ``/proc`` says: facts no other user can forge.

A process is named by its pid and its start time (field 22 of ``/proc/<pid>/stat``, clock ticks
since boot): a pid is reused, the pair is not.  Its uids come from ``/proc/<pid>/status`` (the
directory's owner is root for a process that changed uid, so it is not used).  Linux only; no
psutil, so the claim directory can be read in a few milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Process", "ProcessTable", "own_start"]

_PROC = "/proc"


@dataclass(frozen=True)
class Process:
    pid: int
    start: int
    uids: tuple[int, ...]  # real, effective, saved, file system


def _read(path: str, limit: int = 4096) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _start(pid: int) -> int | None:
    text = _read(f"{_PROC}/{pid}/stat")
    if not text:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    fields = text[text.rfind(b")") + 1 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def _uids(pid: int) -> tuple[int, ...] | None:
    text = _read(f"{_PROC}/{pid}/status", 8192)
    for line in (text or b"").splitlines():
        if line.startswith(b"Uid:"):
            try:
                return tuple(int(u) for u in line.split()[1:5])
            except ValueError:
                return None
    return None


def own_start() -> int:
    """This process's start time; 0 where ``/proc`` cannot tell (then no claim ever matches it)."""
    return _start(os.getpid()) or 0


class ProcessTable:
    """One look at the running processes; each pid's details are read once, when first asked for."""

    def __init__(self) -> None:
        try:
            self._pids = {int(name) for name in os.listdir(_PROC) if name.isascii() and name.isdigit()}
        except OSError:
            self._pids = set()
        self._seen: dict[int, Process | None] = {}
        # hidepid: other users' processes are missing from /proc, so their absence proves nothing.
        self.hides_others = os.geteuid() != 0 and 1 not in self._pids

    def may_run(self, pid: int) -> bool:
        """False only when ``pid`` is surely not running (absent from a /proc that shows everyone)."""
        return pid in self._pids or self.hides_others

    def running(self, pid: int) -> Process | None:
        """The running process ``pid``, or None if there is none (or it cannot be read)."""
        if pid not in self._pids:
            return None
        if pid not in self._seen:
            start, uids = _start(pid), _uids(pid)
            self._seen[pid] = Process(pid, start, uids) if start is not None and uids else None
        return self._seen[pid]

    def is_alive(self, pid: int, start: int, uid: int) -> bool | None:
        """Whether process ``pid`` started at ``start`` runs now as ``uid``; None when /proc cannot say."""
        if pid not in self._pids:
            return None if self.hides_others else False
        process = self.running(pid)
        if process is None:  # listed but unreadable (hidepid=1), or it ended just now
            return None
        return process.start == start and uid in process.uids[:2]
