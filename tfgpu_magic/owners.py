"""Who owns a process: user names and command lines from the operating system.

NVML lists the processes on a GPU by pid only; a :class:`ProcessTable` says whose they are
(psutil on a real machine, the simulated server's own table in tests and ``tfgpu --demo``).
Every failure becomes a missing field and a note.  psutil is not touched at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from .nvml import Nvml

__all__ = [
    "EXITED_NOTE",
    "OwnerLookupTable",
    "ProcessDetails",
    "ProcessTable",
    "PsutilProcessTable",
    "process_table_for",
]


@dataclass(frozen=True)
class ProcessDetails:
    """What the operating system says about a pid.  None: not known or not allowed to see."""

    user: Optional[str]
    command: Optional[str]
    alive: bool
    note: Optional[str] = None


class ProcessTable(Protocol):
    def lookup(self, pid: int) -> ProcessDetails: ...

    def current_user(self) -> Optional[str]: ...


EXITED_NOTE = "exited, but NVML still lists it (or it lives in another pid namespace)"


class PsutilProcessTable:
    """Owners and commands from psutil.  Every failure becomes a missing field and a note."""

    def lookup(self, pid: int) -> ProcessDetails:
        try:
            import psutil  # not at import: `import tfgpu_magic` stays light
        except ImportError:  # a declared dependency, but a bare GPU box may lack it
            return _proc_lookup(pid)
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                user, user_note = _guarded_read(proc.username, psutil)
                command, command_note = _guarded_read(lambda: " ".join(proc.cmdline()) or proc.name(), psutil)
        except (psutil.NoSuchProcess, ProcessLookupError):  # ZombieProcess is a NoSuchProcess
            return ProcessDetails(None, None, False, EXITED_NOTE)
        if user_note == "exited" or command_note == "exited":
            return ProcessDetails(None, None, False, EXITED_NOTE)
        note = user_note or command_note
        return ProcessDetails(user, command, True, note)

    def current_user(self) -> Optional[str]:
        return _user_name(os.getuid())


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (containers): the number still says who
        return str(uid)


def _proc_lookup(pid: int) -> ProcessDetails:
    """Owner and command from /proc, for machines without psutil (Linux only)."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return ProcessDetails(None, None, False, EXITED_NOTE)
    except OSError:
        return ProcessDetails(None, None, True, "psutil is not installed and /proc cannot be read")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip() or None
    except OSError:
        command = None
    return ProcessDetails(_user_name(uid), command, True)


def _guarded_read(read: Callable[[], Any], psutil: Any) -> tuple[Optional[str], Optional[str]]:
    try:
        return str(read()), None
    except psutil.AccessDenied:
        return None, "owned by a user whose details this account may not read"
    except psutil.NoSuchProcess:
        return None, "exited"
    except KeyError:  # uid with no name: psutil cannot map it
        return None, "owner has no user name on this machine"


class OwnerLookupTable:
    """A process table from a lookup function returning objects with ``user`` and ``command``.

    ``SimulatedNvml.owner_of`` is such a function: a device source may bring its own process
    table, so a simulated server answers with simulated owners.
    """

    def __init__(self, owner_of: Callable[[int], Any], me: Optional[str] = None, my_pid: Optional[int] = None):
        self._owner_of = owner_of
        self._me = me
        self._my_pid = os.getpid() if my_pid is None else my_pid

    def lookup(self, pid: int) -> ProcessDetails:
        found = self._owner_of(pid)
        if found is None:
            return ProcessDetails(None, None, False, EXITED_NOTE)
        return ProcessDetails(getattr(found, "user", None), getattr(found, "command", None), True)

    def current_user(self) -> Optional[str]:
        if self._me is not None:
            return self._me
        found = self._owner_of(self._my_pid)
        return getattr(found, "user", None)


def process_table_for(nvml: Nvml, my_pid: Optional[int] = None) -> ProcessTable:
    """The device source's own table when it has one (the fake's ``owner_of``), else psutil."""
    lib = nvml.lib  # the injected device source; None until real NVML starts
    owner_of = getattr(lib, "owner_of", None)
    if callable(owner_of):
        return OwnerLookupTable(owner_of, my_pid=my_pid)
    return PsutilProcessTable()
