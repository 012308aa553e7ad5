"""Which processes are running, as the kernel's ``/proc`` says: facts no other user can forge.

A process is named by its pid and its start time (field 22 of ``/proc/<pid>/stat``, clock ticks
since boot): a pid is reused, the pair is not.  Its uids come from ``/proc/<pid>/status`` (the
directory's owner is root for a process that changed uid, so it is not used).  Linux only; no
psutil, so the claim directory can be read in a few milliseconds.

Every read goes through a :class:`ProcReader` (the real ``/proc`` unless one is given), the one
place the process tables (this module's, and :class:`~tfgpu_magic.gpus.owners.PsutilProcessTable`)
touch ``/proc``: a test passes its own to show them a process that exited, was reused, or refuses
to be read.  What the files say is parsed here (:func:`parse_stat`, :func:`parse_status`), whoever read them.

Several files of one process are read under one descriptor of its directory
(:meth:`ProcReader.read_files`): such a descriptor keeps naming the process it was opened for (the
kernel ties it to that process, not to its number; ``pidfd_send_signal(2)`` takes one as a pidfd), so
the files are all that process's or an error, even if the pid is reused between two of the reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from ..records import Record

__all__ = [
    "PROC",
    "Proc",
    "ProcReader",
    "Process",
    "ProcessTable",
    "Stat",
    "Status",
    "own_start",
    "parse_stat",
    "parse_status",
]

STAT_BYTES = 4096  # /proc/<pid>/stat: a few hundred bytes (the name is at most 16)
STATUS_BYTES = 8192  # /proc/<pid>/status: about 1.5 KiB


class ProcReader(Protocol):
    """The reads of ``/proc`` the process tables make."""

    def pids(self) -> set[int]:
        """The pids ``/proc`` lists.  Raises OSError."""
        ...

    def read(self, pid: int, name: str, limit: int) -> bytes:
        """At most ``limit`` bytes of ``/proc/<pid>/<name>``.  Raises OSError: FileNotFoundError or
        ProcessLookupError when there is no such process (or ``/proc`` hides it)."""
        ...

    def read_files(self, pid: int, wanted: Sequence[tuple[str, int]]) -> list[bytes | Exception]:
        """Each ``(name, limit)`` of ``wanted``: at most ``limit`` bytes of ``/proc/<pid>/<name>``, all
        of one process (see the module's docstring), or the error that reading it raised
        (FileNotFoundError or ProcessLookupError: the process ended meanwhile).  Raises OSError
        (FileNotFoundError: no such process, or ``/proc`` hides it) when the process is not there."""
        ...

    def since_boot_s(self) -> float:
        """Seconds since boot: the clock of the start times in ``stat``."""
        ...

    def ticks_per_s(self) -> int:
        """The unit of the start times in ``stat`` (``SC_CLK_TCK``)."""
        ...


_BOOT_CLOCK: int = getattr(time, "CLOCK_BOOTTIME", getattr(time, "CLOCK_MONOTONIC", 1))


class Proc:
    """The real ``/proc`` (or a ``proc`` file system mounted at ``root``)."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root

    def pids(self) -> set[int]:
        return {int(name) for name in os.listdir(self.root) if name.isascii() and name.isdigit()}

    def read(self, pid: int, name: str, limit: int) -> bytes:
        return _read_upto(os.open(f"{self.root}/{pid}/{name}", _FILE_FLAGS), limit)

    def read_files(self, pid: int, wanted: Sequence[tuple[str, int]]) -> list[bytes | Exception]:
        directory = self.open_process(pid)
        try:
            found: list[bytes | Exception] = []
            for name, limit in wanted:
                try:
                    found.append(self.read_in(directory, name, limit))
                except OSError as err:
                    found.append(err)
            return found
        finally:
            os.close(directory)

    def open_process(self, pid: int) -> int:
        """A descriptor of ``/proc/<pid>`` (the caller closes it).  It holds the process, not the
        number: files opened under it are that process's, or fail (ENOENT, ESRCH) once it has
        ended, whoever has the pid by then."""
        return os.open(f"{self.root}/{pid}", _DIRECTORY_FLAGS)

    def read_in(self, directory: int, name: str, limit: int) -> bytes:
        """At most ``limit`` bytes of the file ``name`` of the process ``directory`` holds (:meth:`open_process`)."""
        return _read_upto(os.open(name, _FILE_FLAGS, dir_fd=directory), limit)

    def since_boot_s(self) -> float:
        return time.clock_gettime(_BOOT_CLOCK)

    def ticks_per_s(self) -> int:
        return os.sysconf("SC_CLK_TCK")


# O_NOFOLLOW: a file of /proc/<pid>/ is never a link, and /proc/<pid> itself is a directory (only
# /proc/self and /proc/thread-self are links, and they are never asked for by number).
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_DIRECTORY_FLAGS = _FILE_FLAGS | os.O_DIRECTORY


def _read_upto(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of an open file, which is closed (:func:`_read_rest`)."""
    try:
        return _read_rest(fd, os.read(fd, limit), limit)
    finally:
        os.close(fd)


_PAGE = 4096  # the most an older kernel hands out of a /proc file in one read (cmdline, environ)


def _read_rest(fd: int, data: bytes, limit: int, read: Callable[[int, int], bytes] = os.read) -> bytes:
    """``data``, the first read of a /proc file, and what follows it up to ``limit`` bytes in all:
    read until the end or the limit, so the cost is bounded whatever the file holds.

    A read shorter than asked and not a whole number of pages ended the file: /proc writes a
    file like ``stat`` or ``status`` whole (seq_file), and ``cmdline`` as far as asked or to its
    end, older kernels a page at a time.  Only a read of whole pages asks again (a third of the
    reads of a cold status were the empty one that says "end")."""
    while len(data) < limit and data and not len(data) % _PAGE:
        chunk = read(fd, limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


PROC = Proc()


class Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` the tables use.  (A named tuple, not a record: one is
    made for every process of a cold status, and a tuple costs half as much to make.)"""

    state: bytes  # field 3: R, S, D, Z (zombie), X (dead), ...
    ppid: int  # field 4
    start: int  # field 22: clock ticks since boot
    name: bytes  # field 2, "comm" (at most 15 bytes, any bytes but NUL)


def parse_stat(data: bytes) -> Stat | None:
    """``/proc/<pid>/stat``'s fields; None for what is not that format."""
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so it ends at the last ')'.
    opening, close = data.find(b"("), data.rfind(b")")
    if opening < 0 or close < opening:
        return None
    fields = data[close + 1 :].split(None, 20)
    if len(fields) < 20:
        return None
    try:
        return Stat(fields[0], int(fields[1]), int(fields[19]), data[opening + 1 : close])
    except ValueError:
        return None


class Status(NamedTuple):
    """The lines of ``/proc/<pid>/status`` the tables use; None where a line is missing or odd.
    (A named tuple, as :class:`Stat` is.)"""

    name: bytes | None  # "Name:" (comm, escaped by the kernel)
    state: bytes | None  # the letter of "State:"
    uids: tuple[int, ...] | None  # "Uid:": real, effective, saved, file system


def parse_status(data: bytes) -> Status:
    """``/proc/<pid>/status``'s Name, State and Uid lines (the first of each); None for a line that is
    missing or odd.

    Found by searching for each line's start rather than splitting the file (some sixty lines, read
    for every process of a cold status).  Lines end with a newline: the kernel escapes one in a
    process name ("\\n"), so what a process names itself cannot start a line of its own.
    """
    name = _status_line(data, b"Name:")
    state = _status_line(data, b"State:")
    uid_line = _status_line(data, b"Uid:")
    uids: tuple[int, ...] | None = None
    if uid_line is not None:
        try:
            uids = tuple(map(int, uid_line.split()[:4])) or None
        except ValueError:
            uids = None
    words = state.split(None, 1) if state is not None else None
    return Status(None if name is None else name.strip(), words[0] if words else None, uids)


def _status_line(data: bytes, key: bytes) -> bytes | None:
    """What follows ``key`` on the first line of ``data`` that starts with it; None when no line does."""
    if data.startswith(key):
        start = len(key)
    else:
        found = data.find(b"\n" + key)
        if found < 0:
            return None
        start = found + 1 + len(key)
    end = data.find(b"\n", start)
    return data[start:] if end < 0 else data[start:end]


class Process(Record):
    """A process as /proc gave it: pid, start time (ticks) and user ids."""

    pid: int
    start: int
    uids: tuple[int, ...]  # real, effective, saved, file system


def _stat(proc: ProcReader, pid: int) -> Stat | None:
    try:
        return parse_stat(proc.read(pid, "stat", STAT_BYTES))
    except OSError:
        return None


def own_start(proc: ProcReader = PROC) -> int:
    """This process's start time; 0 where ``/proc`` cannot tell (then no claim ever matches it)."""
    stat = _stat(proc, os.getpid())
    return 0 if stat is None else stat.start


class ProcessTable:
    """One look at the running processes, taken at the first question (a claim directory with no
    claim on the GPUs asked about asks none: no listing of /proc); each pid's details are read
    once, when first asked for."""

    def __init__(self, proc: ProcReader = PROC) -> None:
        self._proc = proc
        self._listed: set[int] | None = None
        self._seen: dict[int, Process | None] = {}

    @property
    def _pids(self) -> set[int]:
        if self._listed is None:
            try:
                self._listed = self._proc.pids()
            except OSError:
                self._listed = set()
        return self._listed

    @property
    def hides_others(self) -> bool:
        """hidepid: other users' processes are missing from /proc, so their absence proves nothing."""
        return os.geteuid() != 0 and 1 not in self._pids

    def may_run(self, pid: int) -> bool:
        """False only when ``pid`` is surely not running (absent from a /proc that shows everyone)."""
        return pid in self._pids or self.hides_others

    def running(self, pid: int) -> Process | None:
        """The running process ``pid``, or None if there is none (or it cannot be read)."""
        if pid not in self._pids:
            return None
        if pid not in self._seen:
            stat, uids = _stat(self._proc, pid), self._uids(pid)
            self._seen[pid] = Process(pid, stat.start, uids) if stat is not None and uids else None
        return self._seen[pid]

    def _uids(self, pid: int) -> tuple[int, ...] | None:
        try:
            return parse_status(self._proc.read(pid, "status", STATUS_BYTES)).uids
        except OSError:
            return None

    def is_alive(self, pid: int, start: int, uid: int) -> bool | None:
        """Whether process ``pid`` started at ``start`` runs now as ``uid``; None when /proc cannot say."""
        if pid not in self._pids:
            return None if self.hides_others else False
        process = self.running(pid)
        if process is None:  # listed but unreadable (hidepid=1), or it ended just now
            return None
        return process.start == start and uid in process.uids[:2]
