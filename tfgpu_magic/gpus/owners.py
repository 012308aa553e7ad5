"""Who owns a process: user names and command lines from the operating system.

NVML lists the processes on a GPU by pid only; a :class:`ProcessTable` says whose they are
(``/proc`` on Linux and psutil elsewhere on a real machine, the simulated server's own table in
tests and ``tfgpu --demo``).  Every failure becomes a missing field and a note.  psutil is not
touched at import.

The psutil table (:class:`PsutilProcessTable`: on Linux it reads ``/proc`` through a
:class:`~tfgpu_magic.gpus.process_table.ProcReader`, as psutil would; psutil elsewhere) remembers
what it found, because the endpoint and ``%gpu`` refresh the same inventory again and again: a
process's owner and command are kept while its pid *and start time* stay the same (checked
with one small read of ``/proc/<pid>/stat`` on Linux, psutil's create time elsewhere), and user
names per uid.  On Linux a pid not remembered is read in one look: ``status``, ``cmdline`` and
``stat`` opened under one descriptor of ``/proc/<pid>``, which holds that process whatever
becomes of the pid, so its identity and details are one process's without reading ``stat`` twice.  A pid reused by a new process, an exited or zombie process, and any failure are
never answered from the cache, with one bounded exception:

A refresh looks up a whole listing at once (:func:`lookup_listing`: the pids NVML lists on one
GPU or MIG instance).  When a listing is the same set of pids as the last listing of that GPU
(or instance), a pid whose start time was read less than ``LISTING_TRUST_S`` ago is answered
from the cache without reading ``/proc`` again.  A pid is reused only after its process exits, and a process
that exits leaves NVML's list, so a different process behind a pid of an unchanged listing
needs an exit, the pid's reuse and a new GPU context on that same GPU, all between two
listings; ``LISTING_TRUST_S`` bounds how long even that could be answered wrongly, and how long
a process that exits while NVML still lists it can show as alive.  A changed listing, a pid
read longer ago, and a pid never remembered (exited, a note, too young, a failure) are read as
on every other lookup.

Other users choose their command lines and (through the administrator) their names, so both are
bounded where they are read, whichever table reads them: a :class:`ProcessDetails` holds at most
``MAX_COMMAND_CHARS`` characters of a command line and ``MAX_NAME_CHARS`` of a user name, control
characters escaped (:func:`tfgpu_magic.safe_text.bounded`), a cut one ending with "…".  On Linux a
command line is read from ``/proc/<pid>/cmdline`` with reads of at most ``CMDLINE_READ_BYTES`` in
all, so a 1 MiB command line costs what a short one does; elsewhere psutil reads it whole.

Where ``/proc`` hides other users' processes (mounted ``hidepid=1``/``2``, ``invisible``), a
listed pid that ``/proc`` does not show is :data:`HIDDEN`, not exited: nobody can tell whose it
is or whether it runs, so what it holds is unknown, never "exited" and never 0.  Whether
``/proc`` hides them is read once per effective uid from the mount options of ``/proc``
(``/proc/self/mountinfo``), and also assumed when pid 1 is not visible (:func:`_hides_others`).
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ..records import Record
from ..safe_text import bounded, safe
from .nvml import Nvml
from .process_table import PROC, STAT_BYTES, STATUS_BYTES, ProcReader, Stat, parse_stat, parse_status

if TYPE_CHECKING:
    import psutil

__all__ = [
    "CMDLINE_READ_BYTES",
    "EXITED_NOTE",
    "HIDDEN",
    "HIDDEN_NOTE",
    "LISTING_TRUST_S",
    "MAX_COMMAND_CHARS",
    "MAX_NAME_CHARS",
    "NoIdentity",
    "OwnerLookupTable",
    "ProcessDetails",
    "ProcessTable",
    "PsutilProcessTable",
    "lookup_listing",
    "parent_of",
    "process_table_for",
    "shared_psutil_table",
    "stat_identity",
]


MAX_COMMAND_CHARS = 1024  # characters of a command line kept, "…" included (escapes count as shown)
MAX_NAME_CHARS = 64  # characters of a user name kept
CMDLINE_READ_BYTES = (
    4 * MAX_COMMAND_CHARS
)  # bytes of /proc/<pid>/cmdline read: enough for the characters kept


class ProcessDetails(Record):
    """What the operating system says about a pid.  None: not known or not allowed to see.

    ``user`` and ``command`` are bounded here, whoever built the details (see the module's docstring).
    """

    user: str | None
    command: str | None
    alive: bool  # False: exited; True: running, or (hidden) may be running
    note: str | None = None
    hidden: bool = False  # /proc hides it (hidepid): whose it is and whether it runs are unknown

    def __post_init__(self) -> None:
        if self.user is not None:
            object.__setattr__(self, "user", bounded(str(self.user), MAX_NAME_CHARS))
        if self.command is not None:
            object.__setattr__(self, "command", bounded(str(self.command), MAX_COMMAND_CHARS))


class ProcessTable(Protocol):
    """Owners of pids.  A table may also answer a whole listing (``lookup_listing(key, pids)``,
    as :class:`PsutilProcessTable` does); :func:`lookup_listing` asks each pid of those that do not."""

    def lookup(self, pid: int) -> ProcessDetails: ...

    def current_user(self) -> str | None: ...


EXITED_NOTE = "exited, but NVML still lists it (or it lives in another pid namespace)"
EXITED = ProcessDetails(None, None, False, EXITED_NOTE)
HIDDEN_NOTE = "not visible: /proc hides other users' processes here (hidepid), so whose it is is unknown"
HIDDEN = ProcessDetails(None, None, True, HIDDEN_NOTE, hidden=True)

MAX_PROCESSES = 1024  # remembered processes per table (least recently looked up goes first)
MAX_USERS = 4096  # remembered uid -> name entries
NAMELESS_RETRY_S = 60.0  # a uid without a passwd entry is asked again after this long
# A process younger than this is read every time, never remembered: right after fork it still
# shows its parent's command line, and while it execs its command line is briefly empty (the
# start time does not change, the name may not).  A GPU process is far older by the time NVML lists it.
MIN_AGE_S = 1.0
# How long a remembered process listed again in an unchanged listing is trusted without reading
# /proc.  Safe because a pid is reused only after its process exits, and an exited process leaves
# NVML's list: the same pid in an unchanged listing would need an exit, a reuse of the pid and a
# new GPU context on the same GPU between two refreshes.  The bound limits how long even that
# could be wrong, and how long a process that exits while NVML still lists it shows as alive
# (a few of the server's 2 s refreshes).
LISTING_TRUST_S = 10.0
MAX_LISTINGS = 256  # remembered listings per table (GPUs and MIG instances: a few dozen on a real machine)


class _UserNames:
    """uid -> user name, remembered (``pwd`` may ask LDAP or sssd: milliseconds a call).

    A name found is kept; a uid with no entry shows as its number and is asked again after
    ``NAMELESS_RETRY_S``, so a user added later is named without a restart.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._names: dict[int, tuple[str, float | None]] = {}  # uid -> (name, retry at or None)

    def name(self, uid: int) -> str:
        found = self._names.get(uid)  # one dict read: atomic under the GIL, no lock needed
        if found is not None and (found[1] is None or self._clock() < found[1]):
            return found[0]
        import pwd

        try:
            entry: tuple[str, float | None] = (bounded(pwd.getpwuid(uid).pw_name, MAX_NAME_CHARS), None)
        except KeyError:  # a uid without a passwd entry (containers): the number still says who
            entry = (str(uid), self._clock() + NAMELESS_RETRY_S)
        with self._lock:
            if len(self._names) >= MAX_USERS:
                self._names.clear()
            self._names[uid] = entry
        return entry[0]

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


_USER_NAMES = _UserNames()  # the process-wide uid -> name cache


# What identifies a process beyond its pid: (start time, name) from /proc, or psutil's create time;
# or, instead, why there is none.
class NoIdentity(enum.Enum):
    GONE = "gone"  # the pid has no live process (exited, or a zombie)
    HIDDEN = "hidden"  # /proc does not show the pid, and it hides other users' processes (hidepid)
    UNKNOWN = "unknown"  # cannot tell (not allowed to read, no /proc and no psutil): never cached


_GONE, _HIDDEN, _UNKNOWN = NoIdentity.GONE, NoIdentity.HIDDEN, NoIdentity.UNKNOWN
Identity = tuple[int, bytes] | float | NoIdentity  # (start ticks, name) on Linux; create time elsewhere


def _read_stat(pid: int, proc: ProcReader = PROC) -> Stat | NoIdentity:
    """``/proc/<pid>/stat``, parsed (Linux): one open and read of a small file, about 4 µs.

    ``_GONE`` for an exited process or a zombie (``_HIDDEN`` for a pid /proc hides), ``_UNKNOWN``
    when it cannot be read or parsed.
    """
    try:
        data = proc.read(pid, "stat", STAT_BYTES)
    except (FileNotFoundError, ProcessLookupError):  # exited (also between open and read), or hidden
        return _HIDDEN if _hides_others() else _GONE
    except OSError:  # hidepid, or /proc misbehaving: let the details read say what it can
        return _UNKNOWN
    stat = parse_stat(data)
    if stat is None:  # not the format we know
        return _UNKNOWN
    if stat.state in (b"Z", b"X", b"x"):  # zombie or dead
        return _GONE
    return stat


def stat_identity(pid: int, proc: ProcReader = PROC) -> Identity:
    """(start time in clock ticks since boot, process name) from ``/proc/<pid>/stat``; a zombie is gone."""
    stat = _read_stat(pid, proc)
    return stat if isinstance(stat, NoIdentity) else (stat.start, stat.name)


def parent_of(pid: int) -> int | None:
    """The parent pid of a live process; None when it has exited, is a zombie, or cannot be read."""
    stat = _read_stat(pid) if _HAS_PROC else _UNKNOWN
    if stat is _GONE or stat is _HIDDEN:
        return None
    if isinstance(stat, Stat):
        return stat.ppid
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc.ppid()
    except Exception:  # NoSuchProcess, AccessDenied: no parent to report
        return None


_HAS_PROC = os.path.exists("/proc/self/stat")
_MOUNTINFO_BYTES = 1 << 20  # /proc/self/mountinfo read at most (a host with thousands of mounts)
_HIDES_OTHERS: dict[int, bool] = {}  # effective uid -> whether /proc hides other users' processes from it


def _hides_others() -> bool:
    """Whether ``/proc`` hides other users' processes from this process (``hidepid``), so that a
    pid it does not show may still run.  Read once per effective uid; root sees every process."""
    euid = os.geteuid() if hasattr(os, "geteuid") else 0
    found = _HIDES_OTHERS.get(euid)
    if found is None:
        found = euid != 0 and _HAS_PROC and (_hidepid_in(_mountinfo()) or not os.path.exists("/proc/1"))
        _HIDES_OTHERS[euid] = found
    return found


def _mountinfo() -> list[str]:
    try:
        data = PROC.read(os.getpid(), "mountinfo", _MOUNTINFO_BYTES)
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()


def _hidepid_in(lines: Sequence[str]) -> bool:
    """Whether the last ``proc`` mount on ``/proc`` in these ``mountinfo`` lines has ``hidepid`` set
    (``1``, ``2``, ``noaccess``, ``invisible``, ``ptraceable``; ``0`` and ``off`` hide nothing)."""
    hidepid = None
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, source = before.split(), after.split()
        if len(fields) < 5 or len(source) < 3 or fields[4] != "/proc" or source[0] != "proc":
            continue
        hidepid = None  # a later mount on /proc covers the earlier ones
        for option in source[2].split(","):
            if option.startswith("hidepid="):
                hidepid = option.partition("=")[2]
    return hidepid not in (None, "0", "off")


def _absent() -> ProcessDetails:
    """A pid /proc does not show: exited, or hidden where /proc hides other users' processes."""
    return HIDDEN if _hides_others() else EXITED


def _psutil_identity(pid: int) -> Identity:
    """psutil's create time (macOS, Windows, the BSDs)."""
    try:
        import psutil
    except ImportError:
        return _UNKNOWN
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:  # ZombieProcess is a NoSuchProcess
        return _GONE
    except Exception:  # AccessDenied, or anything odd: not known, so not cached
        return _UNKNOWN


_DEFAULT_PROC: ProcReader | None = PROC if _HAS_PROC else None


class PsutilProcessTable:
    """Owners and commands, remembered per process.  Every failure becomes a missing field and a note.

    On Linux they are read from ``proc`` (the real ``/proc`` unless a test gives its own reader):
    the real uid of ``status``, and at most ``CMDLINE_READ_BYTES`` of ``cmdline``; with
    ``proc=None`` (macOS, Windows, the BSDs) psutil reads them.

    A lookup of a remembered pid first reads its identity (start time, and on Linux its name,
    which changes when it execs another program); the remembered answer is used only when the
    identity is the same as when it was found.  Any other pid is read whole: on Linux its identity
    with its details, in one look at the process (:func:`_proc_look`); with psutil, the identity
    before and after the details, which are kept only when both are the same.  Only complete answers (alive, owner and command read, no note)
    about processes at least ``min_age_s`` old are remembered, so a refusal, a half-read answer
    or a process still starting is read again next time; an exited pid is reported exited and
    forgotten.  At most ``max_processes`` are kept (least recently looked up dropped first).
    :meth:`lookup_listing` skips the identity read for a listing that has not changed (see the
    module's docstring).  Safe to call from several threads: the slow look-ups run outside the
    lock, which guards only the dictionaries.
    """

    def __init__(
        self,
        max_processes: int = MAX_PROCESSES,
        user_names: _UserNames | None = None,
        min_age_s: float = MIN_AGE_S,
        listing_trust_s: float = LISTING_TRUST_S,
        clock: Callable[[], float] = time.monotonic,
        proc: ProcReader | None = _DEFAULT_PROC,
    ) -> None:
        self._max = max(1, max_processes)
        self._proc = proc  # None: no /proc (macOS, Windows, the BSDs), psutil reads everything
        self._names = user_names or _UserNames()
        self._min_age_s = min_age_s
        self._trust_s = listing_trust_s
        self._clock = clock
        self._lock = threading.Lock()
        # pid -> (identity, details, when the identity was last read and found the same)
        self._known: OrderedDict[int, tuple[object, ProcessDetails, float]] = OrderedDict()
        # listing key -> (its last pids,): a new tuple at each store, so `is` tells another thread's store
        self._listings: dict[Hashable, tuple[frozenset[int]]] = {}

    def lookup(self, pid: int) -> ProcessDetails:
        if self._proc is not None and pid not in self._known:  # one dict read: atomic under the GIL
            # Nothing to compare with: the identity and the details in one look at the process.
            return self._keep(pid, *_proc_look(pid, self._names, self._proc))
        identity = self._identity(pid)
        if identity is _GONE:
            self._forget(pid)
            return EXITED
        if identity is _HIDDEN:
            self._forget(pid)
            return HIDDEN
        if identity is not _UNKNOWN:
            read_at = self._clock()
            with self._lock:
                known = self._known.get(pid)
                if known is not None and known[0] == identity:
                    self._known[pid] = (identity, known[1], read_at)
                    self._known.move_to_end(pid)
                    return known[1]
        if self._proc is not None:  # another process behind the pid, or one that cannot say who it is
            return self._keep(pid, *_proc_look(pid, self._names, self._proc))
        details = self._read(pid)
        # psutil's reads are not tied to one process: kept only when the identity is the same after them
        if self._worth_keeping(identity, details) and self._identity(pid) != identity:
            identity = _UNKNOWN
        return self._keep(pid, identity, details)

    def _keep(self, pid: int, identity: Identity, details: ProcessDetails) -> ProcessDetails:
        """``details``, remembered under ``identity`` when worth keeping; an exited pid forgotten."""
        if not details.alive:
            self._forget(pid)
        elif self._worth_keeping(identity, details):
            read_at = self._clock()
            with self._lock:
                self._known[pid] = (identity, details, read_at)
                self._known.move_to_end(pid)
                while len(self._known) > self._max:
                    self._known.popitem(last=False)
        return details

    def lookup_listing(self, key: Hashable, pids: Sequence[int]) -> list[ProcessDetails]:
        """The details of each pid of one NVML listing (``key``: which GPU or MIG instance), in order.

        When ``pids`` are the same set as the last listing of ``key``, a remembered pid whose
        identity was read less than ``listing_trust_s`` ago is answered without reading it again;
        every other pid is looked up as :meth:`lookup` does.
        """
        listed = (frozenset(pids),)
        now = self._clock()
        trusted: dict[int, ProcessDetails] = {}
        with self._lock:
            before = self._listings.get(key)
            if before is not None and before[0] == listed[0]:
                for pid in listed[0]:
                    known = self._known.get(pid)
                    if known is not None and now - known[2] < self._trust_s:
                        self._known.move_to_end(pid)
                        trusted[pid] = known[1]
        found = [trusted[pid] if pid in trusted else self.lookup(pid) for pid in pids]
        with self._lock:
            if self._listings.get(key) is before:
                if len(self._listings) >= MAX_LISTINGS and key not in self._listings:
                    self._listings.clear()
                self._listings[key] = listed
            else:  # another thread listed the same key meanwhile: which listing is newer is unknown
                self._listings.pop(key, None)
        return found

    def current_user(self) -> str | None:
        return self._names.name(os.getuid())

    def _identity(self, pid: int) -> Identity:
        """What tells this pid's process from a later one with the same pid (see :data:`Identity`)."""
        return _psutil_identity(pid) if self._proc is None else stat_identity(pid, self._proc)

    def _worth_keeping(self, identity: Identity, details: ProcessDetails) -> bool:
        """A complete answer (alive, owner and command read, no note) about a process past its start."""
        if isinstance(identity, NoIdentity) or not details.alive or details.note is not None:
            return False
        if details.user is None or details.command is None:
            return False
        return self._min_age_s <= 0 or self._age_s(identity) >= self._min_age_s

    def _age_s(self, identity: tuple[int, bytes] | float) -> float:
        """Seconds since the process started, on the clock its identity was read with."""
        if isinstance(identity, tuple):
            proc = self._proc or PROC
            return proc.since_boot_s() - identity[0] / proc.ticks_per_s()
        return time.time() - identity

    def cache_size(self) -> int:
        """How many processes are remembered."""
        return len(self._known)

    def _forget(self, pid: int) -> None:
        with self._lock:
            self._known.pop(pid, None)

    def _read(self, pid: int) -> ProcessDetails:
        """The uncached look-up without /proc: psutil."""
        try:
            import psutil  # not at import: `import tfgpu_magic` stays light
        except ImportError:  # a declared dependency, but a bare GPU box may lack it
            return ProcessDetails(None, None, True, "neither psutil nor /proc is here to say whose it is")
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                user, user_note = _guarded_read(lambda: self._user_of(proc), psutil)
                command, command_note = _guarded_read(
                    lambda: bounded(" ".join(proc.cmdline()), MAX_COMMAND_CHARS) or proc.name(), psutil
                )
        except psutil.ZombieProcess:
            return EXITED
        except (psutil.NoSuchProcess, ProcessLookupError):  # exited, or hidden
            return _absent()
        except (
            Exception
        ) as err:  # AccessDenied, or what psutil does not translate (EIO, EINVAL, ValueError...)
            return ProcessDetails(None, None, True, _unreadable(err, psutil))
        if user_note == "exited" or command_note == "exited":
            return _absent()
        return ProcessDetails(user, command, True, user_note or command_note)

    def _user_of(self, proc: psutil.Process) -> str:
        if hasattr(proc, "uids"):  # POSIX: the real uid, as psutil's username() reads it, named once per uid
            return self._names.name(proc.uids().real)
        return str(proc.username())  # Windows

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at fork is never released here
        self._names._after_fork()


# What one look at a process reads, in one go under its directory (ProcReader.read_files): its
# owner and name, its command line (one byte past the bound says "more"), and its identity last,
# so that a process that ended while it was read is seen ended.
_LOOK = (("status", STATUS_BYTES), ("cmdline", CMDLINE_READ_BYTES + 1), ("stat", STAT_BYTES))


def _proc_lookup(pid: int, names: _UserNames | None = None, proc: ProcReader = PROC) -> ProcessDetails:
    """Owner and command from /proc (Linux), as psutil reads them (see :func:`_proc_look`)."""
    return _proc_look(pid, names, proc)[1]


def _proc_look(
    pid: int, names: _UserNames | None = None, proc: ProcReader = PROC
) -> tuple[Identity, ProcessDetails]:
    """One process's identity and details from /proc (Linux), all read under one descriptor of its
    directory, so both are one process's whoever has the pid by now.

    The details as psutil reads them: the real uid of ``status``, named, and ``cmdline`` (at most
    ``CMDLINE_READ_BYTES`` read), else the name (a kernel thread has no command line).  Each
    failure is a note on the process; the identity is ``_UNKNOWN`` where ``stat`` cannot say.
    """
    try:
        status_data, cmdline_data, stat_data = proc.read_files(pid, _LOOK)
    except (FileNotFoundError, ProcessLookupError):  # exited, or hidden (hidepid)
        return _UNKNOWN, _absent()
    except Exception as err:  # not allowed to look (hidepid=1), or /proc misbehaving
        return _UNKNOWN, ProcessDetails(None, None, True, _unreadable(err))
    identity = _identity_in(stat_data)
    if identity is _GONE or _ended(status_data) or _ended(cmdline_data):
        return _GONE, EXITED if identity is _GONE else _absent()
    if isinstance(status_data, Exception):  # not allowed to read (hidepid=1), or /proc misbehaving
        return identity, ProcessDetails(None, None, True, _unreadable(status_data))
    status = parse_status(status_data)
    if status.state in (b"Z", b"X", b"x"):  # a zombie: exited, its parent has not reaped it yet
        return _GONE, EXITED
    user: str | None
    user_note: str | None
    if status.uids is None:
        user, user_note = None, "its owner cannot be read (no Uid line in /proc)"
    else:
        uid = status.uids[0]
        user, user_note = _guarded_read(lambda: (names or _USER_NAMES).name(uid))
    if isinstance(cmdline_data, Exception):
        return identity, ProcessDetails(user, None, True, user_note or _unreadable(cmdline_data))
    command = _cmdline_text(cmdline_data[:CMDLINE_READ_BYTES], len(cmdline_data) > CMDLINE_READ_BYTES)
    if command is None and status.name is not None:
        command = os.fsdecode(status.name) or None
    return identity, ProcessDetails(user, command, True, user_note)


def _ended(data: bytes | Exception) -> bool:
    """A read that failed because the process is no longer there."""
    return isinstance(data, (FileNotFoundError, ProcessLookupError))


def _identity_in(data: bytes | Exception) -> Identity:
    """The identity a ``stat`` read says, as :func:`stat_identity` reads it."""
    if isinstance(data, Exception):
        return _GONE if _ended(data) else _UNKNOWN
    stat = parse_stat(data)
    if stat is None:
        return _UNKNOWN
    return _GONE if stat.state in (b"Z", b"X", b"x") else (stat.start, stat.name)


def _cmdline_text(data: bytes, more: bool) -> str | None:
    """A command line as psutil joins it (arguments separated by spaces), bounded; None when empty."""
    if not more and data.endswith(b"\0"):
        data = data[:-1]
    text = os.fsdecode(data.replace(b"\0", b" "))
    return bounded(text, MAX_COMMAND_CHARS, cut=more) if text else None


def _guarded_read(read: Callable[[], str], psutil: ModuleType | None = None) -> tuple[str | None, str | None]:
    """``read()``, or None and a note saying why not: one process's odd failure is a note on that
    process, never a traceback."""
    try:
        return str(read()), None
    except Exception as err:
        if psutil is not None and isinstance(err, psutil.NoSuchProcess):
            return None, "exited"
        if isinstance(err, KeyError):  # uid with no name: psutil cannot map it
            return None, "owner has no user name on this machine"
        return None, _unreadable(err, psutil)


def _unreadable(err: Exception, psutil: ModuleType | None = None) -> str:
    if isinstance(err, PermissionError) or (psutil is not None and isinstance(err, psutil.AccessDenied)):
        return "owned by a user whose details this account may not read"
    reason = getattr(err, "strerror", None) or type(err).__name__
    return f"its details cannot be read ({safe(str(reason)[:60])})"


class OwnerLookupTable:
    """A process table from a lookup function returning objects with ``user`` and ``command``.

    ``SimulatedNvml.owner_of`` is such a function: a device source may bring its own process
    table, so a simulated server answers with simulated owners.  ``hides_others``: the lookup's
    None means "not shown" (as a ``/proc`` mounted ``hidepid`` answers), not "exited".
    """

    def __init__(
        self,
        owner_of: Callable[[int], Any],
        me: str | None = None,
        my_pid: int | None = None,
        hides_others: bool = False,
    ):
        self._owner_of = owner_of
        self._me = me
        self._my_pid = os.getpid() if my_pid is None else my_pid
        self._hides_others = hides_others

    def lookup(self, pid: int) -> ProcessDetails:
        found = self._owner_of(pid)
        if found is None:
            return HIDDEN if self._hides_others else EXITED
        return ProcessDetails(getattr(found, "user", None), getattr(found, "command", None), True)

    def current_user(self) -> str | None:
        if self._me is not None:
            return bounded(
                self._me, MAX_NAME_CHARS
            )  # as the details' names are: the same name compares equal
        user = getattr(self._owner_of(self._my_pid), "user", None)
        return None if user is None else bounded(str(user), MAX_NAME_CHARS)


_SHARED = PsutilProcessTable(user_names=_USER_NAMES)  # cheap to build: psutil is imported on first lookup


def shared_psutil_table() -> PsutilProcessTable:
    """The process-wide psutil table: one cache for ``%gpu status``, the OOM help and the server."""
    return _SHARED


def _after_fork_in_child() -> None:
    _SHARED._after_fork()  # also renews _USER_NAMES's lock (the shared table uses it)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def lookup_listing(table: ProcessTable, key: Hashable, pids: Sequence[int]) -> list[ProcessDetails]:
    """The details of each pid NVML lists on one GPU or MIG instance (``key`` names which), in order.

    The table's own ``lookup_listing`` where it has one (the psutil table's skips re-reading an
    unchanged listing), else one ``lookup`` per pid.
    """
    by_listing = getattr(table, "lookup_listing", None)
    if by_listing is not None:
        return list(by_listing(key, pids))
    return [table.lookup(pid) for pid in pids]


def process_table_for(nvml: Nvml, my_pid: int | None = None) -> ProcessTable:
    """The device source's own table when it has one (the fake's ``owner_of``), else the shared psutil table."""
    lib = nvml.lib  # the injected device source; None until real NVML starts
    owner_of = getattr(lib, "owner_of", None)
    if callable(owner_of):
        return OwnerLookupTable(owner_of, my_pid=my_pid)
    return _SHARED
