"""Advisory per-GPU claims: which live kernel has taken which GPU (``%gpu use auto``).

A claim is an exclusive ``flock`` on one file per GPU (named after its UUID) in a directory
shared by every user of the machine.  The open file descriptor is kept for the life of the
process, and the kernel drops the lock when the process ends, however it ends (SIGKILL
included): a dead kernel's claim vanishes by itself, with no pid files to clean up and no pid
reuse to fool us.  Claims are advisory: tfgpu_magic honours them, CUDA does not.

Choosing and claiming run under one directory-wide lock (:func:`choosing`), so two kernels
started at the same moment see each other's claims and take different GPUs.  Readers
(``%gpu status``) take that lock shared, so their probes never make a claim fail.

The directory is ``/tmp/tfgpu_magic-claims`` (mode 1777, like ``/tmp``), or
``$TFGPU_MAGIC_CLAIM_DIR``.  Files are created 0666 so every user can lock them; existing
files are opened without ``O_CREAT``, which ``fs.protected_regular`` would refuse for another
user's file in a sticky directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional

__all__ = [
    "ClaimError",
    "DEFAULT_DIR",
    "ENV_DIR",
    "Holder",
    "choosing",
    "claim",
    "claim_dir",
    "held",
    "holder",
    "holders",
    "release",
    "release_all",
]

DEFAULT_DIR = "/tmp/tfgpu_magic-claims"
ENV_DIR = "TFGPU_MAGIC_CLAIM_DIR"
CHOOSE_LOCK = "choose.lock"
LOCK_TIMEOUT_S = 10.0  # a chooser holds the lock for milliseconds; 10 s means something is stuck


class ClaimError(RuntimeError):
    """The claim directory cannot be used; the message says which path and why."""


@dataclass(frozen=True)
class Holder:
    """Who holds a claim.  ``pid``/``user`` are None when the holder could not record them."""

    pid: Optional[int]
    user: Optional[str]
    since: Optional[float]  # time.time() when claimed
    this_process: bool

    def describe(self) -> str:
        if self.this_process:
            return "this kernel"
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        return f"{who} ({self.user})" if self.user else who


# (directory, key) -> open descriptor holding the lock.  Forked children drop their copies.
_held: dict[tuple[str, str], int] = {}
_lock = threading.Lock()


def claim_dir() -> str:
    return os.environ.get(ENV_DIR) or DEFAULT_DIR


def _file_name(key: str) -> str:
    """A safe file name for a GPU key (its UUID): no slashes, no dots at the start."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", key) + ".lock"


def _ensure_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o1777)
        os.chmod(path, 0o1777)  # mkdir's mode is cut by the umask; others must create files here
    except FileExistsError:
        pass
    except OSError as err:
        raise ClaimError(f"cannot create the claim directory {path} ({err.strerror})") from err
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ClaimError(f"the claim path {path} is not a directory (set ${ENV_DIR} to another)")


def _open(path: str) -> int:
    """Open (or create, 0666) a lock file; never follows a symbolic link."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        except PermissionError:  # made by another user without write permission: lock read-only
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # another process created it between our two opens
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # past the umask: every user's kernel must lock this file
        return fd
    raise ClaimError(f"cannot open the claim file {path}")


def _path(key: str, directory: Optional[str] = None) -> str:
    return os.path.join(directory or claim_dir(), _file_name(key))


@contextlib.contextmanager
def choosing(shared: bool = False, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """The directory-wide lock: exclusive around choose-and-claim, shared around reading."""
    directory = claim_dir()
    _ensure_dir(directory)
    fd = _open(os.path.join(directory, CHOOSE_LOCK))
    try:
        _flock_within(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, timeout, directory)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _flock_within(fd: int, mode: int, timeout: float, directory: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ClaimError(
                    f"another process has held the claim lock in {directory} for {timeout:g} s; "
                    "try again, or name the GPUs yourself (e.g. `%gpu use 0`)"
                ) from None
            time.sleep(0.005)


def claim(key: str) -> bool:
    """Take the claim on ``key`` for this process's lifetime; False if a live process holds it.

    Call inside :func:`choosing` so the choice and the claim are one step for other kernels.
    """
    directory = claim_dir()
    with _lock:
        if (directory, key) in _held:
            return True
        _ensure_dir(directory)
        fd = _open(_path(key, directory))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        _record(fd)
        _held[(directory, key)] = fd
        return True


def _record(fd: int) -> None:
    """Write who holds the claim into the file, for other users' ``%gpu status``."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers): the uid still says something
        user = str(os.getuid())
    text = f"pid={os.getpid()}\nuser={user}\nsince={time.time():.0f}\n".encode()
    with contextlib.suppress(OSError):  # a read-only file still locks; the holder shows as unknown
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)


def release(key: str) -> None:
    """Give up this process's claim on ``key`` (nothing happens if it holds none)."""
    with _lock:
        fd = _held.pop((claim_dir(), key), None)
    if fd is not None:
        os.close(fd)


def release_all() -> None:
    with _lock:
        fds = list(_held.values())
        _held.clear()
    for fd in fds:
        os.close(fd)


def held() -> set[str]:
    """Keys this process holds in the current claim directory."""
    directory = claim_dir()
    with _lock:
        return {key for (d, key) in _held if d == directory}


def holder(key: str) -> Optional[Holder]:
    """Who holds ``key``, or None when nobody alive does.  Call inside :func:`choosing`."""
    if key in held():
        return Holder(os.getpid(), None, None, this_process=True)
    path = _path(key)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # succeeds only if nobody holds it
        except BlockingIOError:
            return _read_holder(fd)
        return None
    finally:
        os.close(fd)


def holders(keys: list[str]) -> dict[str, Optional[Holder]]:
    """Holders of several claims, read under the shared directory lock."""
    with choosing(shared=True):
        return {key: holder(key) for key in keys}


def _read_holder(fd: int) -> Holder:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        text = ""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    pid = fields.get("pid", "")
    since = fields.get("since", "")
    return Holder(
        pid=int(pid) if pid.isdigit() else None,
        user=fields.get("user") or None,
        since=float(since) if since.isdigit() else None,
        this_process=False,
    )


def _forget_in_child() -> None:
    """A forked child shares the parent's locks; closing its copies leaves the parent's claims intact."""
    global _lock
    _lock = threading.Lock()  # the parent may have held it while forking
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
