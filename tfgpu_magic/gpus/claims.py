"""Advisory per-GPU claims: which live kernel has taken which GPU (``%gpu use auto``).

A claim is a file of the claimant's own in a directory shared by every user of the machine,
named for the GPU and for the claiming process: ``<gpu key>.<uid>.<pid>.<start>.lock``, where
``start`` is the process's start time (``/proc/<pid>/stat``, clock ticks since boot).  The
claimant holds an exclusive ``flock`` on it for as long as it keeps the claim.

A claim is alive only while three facts no neighbour can forge agree: the file belongs to the
uid in its name (only that user can create a file owned by it; the directory is sticky, so only
its owner can rename or delete it), the process named by pid and start time is running now with
that uid (the live process table), and its lock is held.  A lock alone proves nothing: anyone who
can read a dead kernel's left-over file can lock it.  Claims are advisory: tfgpu_magic honours
them, CUDA does not.

A claim is written whole, then made visible: the file is created under a temporary name, locked,
its record (pid and GPU key) written and made readable (0644), and only then linked under its
claim name, so no reader ever sees a half-made claim.  Then the GPU's entries are listed; if any
other live claim is there, the claimant gives up.  Two claimants racing each see the other (each
looks only after its own file is visible), so at most one wins, with or without the
directory-wide lock (:func:`choosing`), which only keeps simultaneous choosers from both backing
off.  Anybody can hold that lock, so choosers wait for it a bounded time and readers never do.
An owner's left-overs (files of its dead processes, temporary files of claims cut short by
``kill -9``) are removed by that owner's next claim.

Reading costs one directory listing and a few string operations per entry; files are opened only
for names that match a running process of the uid in the name, so entries planted by others (any
number of them) cost no system call each.  Readers (``%gpu status``, ``tfgpu``) open files with
``O_NOFOLLOW|O_NONBLOCK``, check them with ``fstat``, and skip anything that is not a regular file
owned by the uid in its name, with a note; nothing read from a file reaches the screen unescaped.

Where ``/proc`` hides other users' processes (``hidepid``), their claims cannot be checked against
the process table; their locks decide, as a note says.  Kernels in different pid namespaces (two
containers sharing ``/tmp``) do not see each other's claims.

The directory is ``/tmp`` itself, or ``$TFGPU_MAGIC_CLAIM_DIR``.  It must belong to root or to
the user, and be sticky if others may write to it: whoever owns it could delete everybody's
claims.  ``/tmp`` is root's and sticky everywhere; a directory of our own inside it would belong
to whichever user's kernel made it first, and every other user would then have to refuse it.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import pwd
import re
import stat
import threading
import time
from collections.abc import Iterator
from typing import Literal, overload

from ..records import Record
from ..safe_text import safe
from .process_table import ProcessTable, own_start

__all__ = [
    "DEFAULT_DIR",
    "ENV_DIR",
    "Choice",
    "ClaimError",
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

DEFAULT_DIR = "/tmp"  # root's and sticky (see the docstring)
ENV_DIR = "TFGPU_MAGIC_CLAIM_DIR"
CHOOSE_LOCK = "tfgpu_magic-choose.lock"
# A chooser holds the directory lock for milliseconds; any user can hold it forever, so nobody
# waits longer than this: choosing without it is still safe (see the module's docstring).
LOCK_TIMEOUT_S = 2.0
MAX_NOTES = 8
_READ_LIMIT = 256  # a claim record is ~60 bytes
# The names, as patterns for re.fullmatch, compiled at their first use (re's own cache): a status
# with no claim to read never pays for them.  A claim's name: GPU key, owner's uid, claiming
# process's pid and start time.
_NAME = (
    r"(?P<key>[A-Za-z0-9_-]+)\.(?P<uid>[0-9]{1,10})\.(?P<pid>[1-9][0-9]{0,6})\.(?P<start>[0-9]{1,20})\.lock"
)
# Names of older versions (a random token where the pid and start time are): their owner removes them.
_OLD_NAME = r"(?P<key>[A-Za-z0-9_-]+)\.(?P<uid>[0-9]{1,10})\.[0-9a-f]{16}\.lock"
# A claim being written: invisible to readers until linked under its claim name.
_NEW_PREFIX = "tfgpu_magic-new."
_NEW_NAME = (
    r"tfgpu_magic-new\.(?P<uid>[0-9]{1,10})\.(?P<pid>[1-9][0-9]{0,6})\.(?P<start>[0-9]{1,20})\.[0-9a-f]{8}"
)
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class ClaimError(RuntimeError):
    """The claim directory cannot be used; the one-line message says which path, why, and what to do."""


class Holder(Record):
    """Who holds a claim.

    ``uid`` is the claim file's owner, from the file system: the identity that counts.
    ``user`` is that uid's name in the user database (``"uid N"`` without one).  ``pid`` is what
    the owner's file says (only the owner can write it): the owner's own statement, None when
    missing or malformed.  ``since`` is the file's modification time.
    """

    pid: int | None
    user: str | None
    since: float | None
    this_process: bool
    uid: int | None = None

    def describe(self) -> str:
        if self.this_process:
            return "this kernel"
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        name = self.user or (f"uid {self.uid}" if self.uid is not None else None)
        return f"{who} ({name})" if name else who


class Choice:
    """What :func:`choosing` yields: whether the directory lock is held, and why not."""

    __slots__ = ("locked", "notes")

    def __init__(self) -> None:
        self.locked = False
        self.notes: list[str] = []


class _Mine(Record):
    fd: int
    name: str
    dev: int
    ino: int
    since: float


class _Entry(Record):
    name: str
    holder: Holder
    ctime: float


# (directory, key) -> this process's locked claim file.  Forked children drop their copies.
_held: dict[tuple[str, str], _Mine] = {}
_lock = threading.Lock()
_choosing_depth = 0  # choosing() blocks this process is inside; nested ones don't lock again
_identity: tuple[int, int] | None = None  # (pid, start time) of this process, for claim names


def claim_dir() -> str:
    return os.environ.get(ENV_DIR) or DEFAULT_DIR


# -- what may be shown ----------------------------------------------------------------------------
def _shown(text: str, limit: int = 80) -> str:
    """``text`` safe for a terminal (:func:`tfgpu_magic.safe_text.safe`), cut to ``limit`` characters."""
    return safe(text[:limit]) + ("..." if len(text) > limit else "")


def _user(uid: int) -> str:
    try:
        return _shown(pwd.getpwuid(uid).pw_name, 32)
    except (KeyError, OSError):
        return f"uid {uid}"


def _who(uid: int) -> str:
    name = _user(uid)
    return name if name.startswith("uid ") else f"{name} (uid {uid})"


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "file" if stat.S_ISREG(mode) else "special file"


def _why(err: OSError) -> str:
    return err.strerror or str(err)


_KEY_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _safe_key(key: str) -> str:
    """A safe file-name part for a GPU key (its UUID): letters, digits, ``_`` and ``-`` only."""
    return "".join(c if c in _KEY_CHARACTERS else "_" for c in key)


# -- the directory --------------------------------------------------------------------------------
def _unsafe(info: os.stat_result, directory: str) -> str | None:
    """Why a directory's owner or mode would let someone else delete claims in it, or None."""
    shown = _shown(directory, 200)
    if info.st_uid not in (0, os.geteuid()):
        return (
            f"the claim directory {shown} belongs to {_who(info.st_uid)}, who could delete other users' "
            f"claims; ask an administrator to make it root's (mode 1777), or set ${ENV_DIR} to a directory you own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return (
            f"the claim directory {shown} is writable by others without the sticky bit "
            f"(mode {stat.S_IMODE(info.st_mode):04o}), so anyone could delete claims in it; "
            f"its owner can run `chmod +t {shown}`, or set ${ENV_DIR} to a directory you own"
        )
    return None


@overload
def _open_dir(directory: str, create: Literal[True], notes: list[str] | None = None) -> int: ...
@overload
def _open_dir(directory: str, create: bool, notes: list[str] | None = None) -> int | None: ...
def _open_dir(directory: str, create: bool, notes: list[str] | None = None) -> int | None:
    """A descriptor on the claim directory, checked; every later step works relative to it.

    ``create`` (claiming): make it if missing (mode 1777), and refuse an unsafe one.  Otherwise
    (reading): None if it is missing, a note if it is unsafe.  ClaimError if it is unusable.
    """
    shown = _shown(directory, 200)
    made = False
    if create:
        try:
            os.mkdir(directory, 0o700)
            made = True
        except FileExistsError:
            pass
        except OSError as err:
            raise ClaimError(
                f"cannot create the claim directory {shown} ({_why(err)}); set ${ENV_DIR} to a directory you own"
            ) from None
    try:
        info = os.stat(directory, follow_symlinks=False)
    except FileNotFoundError:
        if create:
            raise ClaimError(f"the claim directory {shown} vanished while being created; try again") from None
        return None
    except OSError as err:
        raise ClaimError(f"cannot reach the claim directory {shown} ({_why(err)})") from None
    if not stat.S_ISDIR(info.st_mode):
        what = "a symbolic link, not a directory" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise ClaimError(f"the claim path {shown} is {what} (set ${ENV_DIR} to another)")
    unsafe = _unsafe(info, directory)
    if unsafe and create:
        raise ClaimError(unsafe)
    if unsafe and notes is not None:
        notes.append("claims may be missing: " + unsafe)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise ClaimError(
            f"cannot read the claim directory {shown} ({_why(err)}); set ${ENV_DIR} to a directory you own"
        ) from None
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        os.close(fd)
        raise ClaimError(f"the claim directory {shown} was replaced while being opened; try again")
    if made:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o1777)  # past the umask: every user's kernels claim here
    return fd


# -- the directory-wide lock ----------------------------------------------------------------------
@contextlib.contextmanager
def choosing(shared: bool = False, timeout: float = LOCK_TIMEOUT_S) -> Iterator[Choice]:
    """The directory-wide lock: exclusive around choose-and-claim, shared around reading.

    Anybody can hold it, so it is waited for ``timeout`` seconds at most; then the block runs
    without it (``Choice.locked`` is False and a note says why), which claims survive.
    ClaimError (exclusive only) when the directory is unusable or unsafe.
    """
    global _choosing_depth
    choice = Choice()
    with _lock:
        nested = _choosing_depth > 0
        _choosing_depth += 1
    fd = None
    try:
        if nested:
            choice.locked = True
        else:
            fd = _choose_lock(claim_dir(), shared, choice.notes)
            if fd is not None:
                choice.locked = _flock_within(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, timeout)
                if not choice.locked:
                    choice.notes.append(
                        f"another process has held the claim lock in {_shown(claim_dir(), 200)} for {timeout:g} s; "
                        "went on without it"
                    )
        yield choice
    finally:
        if fd is not None:
            os.close(fd)  # closing drops the lock
        with _lock:
            _choosing_depth -= 1


def _choose_lock(directory: str, shared: bool, notes: list[str]) -> int | None:
    """An open descriptor on ``choose.lock`` (made 0644 if missing), or None with a note."""
    dfd = _open_dir(directory, create=not shared)
    if dfd is None:
        return None
    path = _shown(os.path.join(directory, CHOOSE_LOCK), 200)
    try:
        for _ in range(3):
            try:
                info = os.stat(CHOOSE_LOCK, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                if shared:
                    return None
                try:
                    fd = os.open(
                        CHOOSE_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o644, dir_fd=dfd
                    )
                except FileExistsError:
                    continue
                with contextlib.suppress(OSError):
                    os.fchmod(fd, 0o644)  # past the umask: every user locks it (read access is enough)
                return fd
            if not stat.S_ISREG(info.st_mode):
                notes.append(
                    f"{path} is a {_kind(info.st_mode)}, not a regular file; went on without the claim lock"
                )
                return None
            fd = os.open(CHOOSE_LOCK, os.O_RDONLY | _FILE_FLAGS, dir_fd=dfd)  # flock needs no write access
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                return fd
            os.close(fd)
        notes.append(f"{path} keeps changing; went on without the claim lock")
    except OSError as err:
        notes.append(f"cannot use {path} ({_why(err)}); went on without the claim lock")
    finally:
        os.close(dfd)
    return None


def _flock_within(fd: int, mode: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        except OSError:
            return False


# -- claiming -------------------------------------------------------------------------------------
def claim(key: str) -> bool:
    """Take the claim on ``key`` for this process's lifetime; False if a live process holds it.

    Call inside :func:`choosing` so the choice and the claim are one step for other kernels.
    ClaimError (one line) when the directory is unusable or unsafe, or the file system is
    read-only or full.
    """
    directory = claim_dir()
    with _lock:
        mine = _held.get((directory, key))
        if mine is not None:
            if _still_mine(directory, mine):
                return True
            _forget(directory, key)
        dfd = _open_dir(directory, create=True)
        try:
            return _claim_in(dfd, directory, key)
        finally:
            os.close(dfd)


def _claim_in(dfd: int, directory: str, key: str) -> bool:
    safe, uid = _safe_key(key), os.geteuid()
    name, fd = _create_own(dfd, directory, safe, uid)
    try:
        info = os.fstat(fd)
        # Our claim is visible now; any other live claim on this GPU (another user's or another
        # kernel of ours) means we lose.  Our own left-overs are removed on the way.
        names, table = os.listdir(dfd), ProcessTable()
        others, stale = _scan(dfd, directory, {safe}, names, table, own=name)
        for old in stale + _stale_new_files(dfd, names, uid, table):
            with contextlib.suppress(OSError):
                _unlink_if_same(dfd, *old)
    except BaseException as err:
        _let_go(dfd, name, fd, os.fstat(fd))
        if isinstance(err, OSError):
            raise ClaimError(
                f"cannot read the claim directory {_shown(directory, 200)} ({_why(err)})"
            ) from None
        raise
    if others[safe] or not _at_path(dfd, name, info):
        _let_go(dfd, name, fd, info)
        return False
    _held[(directory, key)] = _Mine(fd, name, info.st_dev, info.st_ino, info.st_mtime)
    return True


def _own_identity() -> tuple[int, int]:
    """(pid, start time) of this process, read again after a fork."""
    global _identity
    if _identity is None or _identity[0] != os.getpid():
        _identity = (os.getpid(), own_start())
    return _identity


def _create_own(dfd: int, directory: str, safe: str, uid: int) -> tuple[str, int]:
    """Our claim file for ``safe``: written whole under a temporary name, locked, then linked
    under its claim name, so no reader ever sees it half made."""
    shown = _shown(directory, 200)
    pid, start = _own_identity()
    name = f"{safe}.{uid}.{pid}.{start}.lock"
    import secrets  # here: a status reads claims and never writes one (hashlib, hmac, random: ~3 ms)

    temporary = f"{_NEW_PREFIX}{uid}.{pid}.{start}.{secrets.token_hex(4)}"
    try:
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=dfd)
    except OSError as err:
        raise ClaimError(f"cannot create a claim file in {shown} ({_why(err)}); {_advice(err)}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it open
            record = f"pid={pid}\nkey={safe}\n".encode()
            if os.write(fd, record) != len(record):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fchmod(fd, 0o644)  # readable: others can check its record
        except OSError as err:
            raise ClaimError(f"cannot write a claim file in {shown} ({_why(err)}); {_advice(err)}") from None
        try:
            os.link(temporary, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            raise ClaimError(_name_taken(dfd, directory, name)) from None
        except OSError as err:
            raise ClaimError(f"cannot create a claim file in {shown} ({_why(err)}); {_advice(err)}") from None
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dfd)
    return name, fd


def _name_taken(dfd: int, directory: str, name: str) -> str:
    """Our claim's name exists already: only another user can have put it there, to block us."""
    path = _shown(os.path.join(directory, name), 200)
    try:
        owner = _who(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_uid)
    except OSError:
        owner = "someone"
    return (
        f"cannot claim: {path} already exists, made by {owner} to block this kernel's claim; "
        "ask an administrator to remove it, or set $" + ENV_DIR + " to a directory you own"
    )


def _stale_new_files(dfd: int, names: list[str], uid: int, table: ProcessTable) -> list[tuple[str, int, int]]:
    """Our temporary files whose process has ended (killed while claiming): ours to remove."""
    stale = []
    for name in names:
        if not name.startswith(_NEW_PREFIX):
            continue
        match = re.fullmatch(_NEW_NAME, name)
        if not match or int(match["uid"]) != uid or _ours_alive(table, match, uid):
            continue
        with contextlib.suppress(OSError):
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if info.st_uid == uid and stat.S_ISREG(info.st_mode):
                stale.append((name, info.st_dev, info.st_ino))
    return stale


def _ours_alive(table: ProcessTable, match: re.Match[str], uid: int) -> bool:
    return table.is_alive(int(match["pid"]), int(match["start"]), uid) is not False


def _advice(err: OSError) -> str:
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "free some space there, or set $" + ENV_DIR + " to another directory"
    if err.errno == errno.EROFS:
        return f"set ${ENV_DIR} to a writable directory"
    return f"its owner can make it mode 1777, or set ${ENV_DIR} to a directory you own"


def _at_path(dfd: int, name: str, info: os.stat_result) -> bool:
    """Whether ``name`` is still the file ``info`` describes (not removed, not replaced)."""
    try:
        now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def _unlink_if_same(dfd: int, name: str, dev: int, ino: int) -> None:
    now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if (now.st_dev, now.st_ino) == (dev, ino):
        os.unlink(name, dir_fd=dfd)


def _let_go(dfd: int, name: str, fd: int, info: os.stat_result) -> None:
    with contextlib.suppress(OSError):
        _unlink_if_same(dfd, name, info.st_dev, info.st_ino)
    os.close(fd)


def _still_mine(directory: str, mine: _Mine) -> bool:
    try:
        now = os.stat(os.path.join(directory, mine.name), follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (mine.dev, mine.ino)


def _forget(directory: str, key: str) -> None:
    """Drop a claim whose file is gone from its path (only root or the directory's owner can do that)."""
    mine = _held.pop((directory, key), None)
    if mine is not None:
        with contextlib.suppress(OSError):
            os.close(mine.fd)


def release(key: str) -> None:
    """Give up this process's claim on ``key`` (nothing happens if it holds none)."""
    directory = claim_dir()
    with _lock:
        mine = _held.pop((directory, key), None)
    if mine is not None:
        _remove(directory, mine)


def release_all() -> None:
    with _lock:
        mine = list(_held.items())
        _held.clear()
    for (directory, _), one in mine:
        _remove(directory, one)


def _remove(directory: str, mine: _Mine) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            _unlink_if_same(dfd, mine.name, mine.dev, mine.ino)
        finally:
            os.close(dfd)
    with contextlib.suppress(OSError):
        os.close(mine.fd)


def held() -> set[str]:
    """Keys this process holds in the current claim directory (files still at their paths)."""
    directory = claim_dir()
    with _lock:
        for key in [k for (d, k), mine in _held.items() if d == directory and not _still_mine(d, mine)]:
            _forget(directory, key)
        return {key for (d, key) in _held if d == directory}


# -- reading --------------------------------------------------------------------------------------
def holder(key: str, notes: list[str] | None = None) -> Holder | None:
    """Who holds ``key``, or None when nobody alive does.  Call inside :func:`choosing`.

    Entries that cannot be read are skipped; ``notes`` (if given) gets a line for each.
    ClaimError only when the directory itself is unusable.
    """
    return holders([key], notes=notes)[key]


def holders(keys: list[str], notes: list[str] | None = None, lock: bool = False) -> dict[str, Holder | None]:
    """Holders of several claims.  Readers never wait for the directory lock (anyone can hold
    it); ``lock`` is accepted for older callers and ignored.

    Never raises for a bad entry: it is skipped, and ``notes`` (if given) gets one line about it
    (at most :data:`MAX_NOTES` lines in all).  ClaimError only when the directory is unusable.
    """
    del lock
    found: dict[str, Holder | None] = {}
    mine = held()
    directory = claim_dir()
    said: list[str] = []
    dfd = _open_dir(directory, create=False, notes=said)
    try:
        names = os.listdir(dfd) if dfd is not None else []
        safes = {_safe_key(key) for key in keys}
        own = {_held[(directory, key)].name for key in keys if key in mine}
        entries, _ = (
            _scan(dfd, directory, safes, names, ProcessTable(), notes=said) if dfd is not None else ({}, [])
        )
        for key in keys:
            listed = [e for e in entries.get(_safe_key(key), []) if e.name not in own]
            if key in mine:
                found[key] = _this_process(directory, key)
            else:
                found[key], listed = (listed[0].holder if listed else None), listed[1:]
            for extra in listed:
                said.append(
                    f"{_shown(key)} is also held by {extra.holder.describe()} through "
                    f"{_shown(os.path.join(directory, extra.name), 200)}, ignoring the claim before it"
                )
    except OSError as err:
        raise ClaimError(f"cannot read the claim directory {_shown(directory, 200)} ({_why(err)})") from None
    finally:
        if dfd is not None:
            os.close(dfd)
    if notes is not None:
        notes.extend(_capped(said))
    return found


def _this_process(directory: str, key: str) -> Holder:
    mine = _held.get((directory, key))
    return Holder(os.getpid(), _user(os.geteuid()), mine.since if mine else None, True, uid=os.geteuid())


def _capped(notes: list[str]) -> list[str]:
    unique = list(dict.fromkeys(notes))
    if len(unique) <= MAX_NOTES:
        return unique
    return [*unique[: MAX_NOTES - 1], f"... and {len(unique) - MAX_NOTES + 1} more notes about claim files"]


def _scan(
    dfd: int,
    directory: str,
    safes: set[str],
    names: list[str],
    table: ProcessTable,
    own: str | None = None,
    notes: list[str] | None = None,
) -> tuple[dict[str, list[_Entry]], list[tuple[str, int, int]]]:
    """The live claims on each of ``safes`` (oldest first), and our own left-overs.

    ``own`` (our new file) is left out.  A name is looked at only when it names a GPU asked for;
    a file is opened only when its name matches a running process of the uid in it, so planted
    entries cost a string test each.  Entries skipped by name are counted in one note per GPU.
    """
    notes = notes if notes is not None else []
    found: dict[str, list[_Entry]] = {safe: [] for safe in safes}
    stale: list[tuple[str, int, int]] = []
    not_claims: dict[str, int] = {}
    me = os.geteuid()
    mine = str(me)
    for name in names:
        # Cheapest tests first: a flood of planted names must cost a split and a set look-up each.
        parts = name.split(".")
        safe = parts[0]
        if safe not in found or name == own:
            continue
        if len(parts) != 5 or parts[4] != "lock" or not _is_number(parts[2]):
            if len(parts) == 4 and parts[1] == mine and re.fullmatch(_OLD_NAME, name):
                stale.extend(_if_mine(dfd, name, me, locked_is_stale=False))
            elif name != safe + ".lock":  # `<key>.lock`: an old version's, never anyone's claim now
                not_claims[safe] = not_claims.get(safe, 0) + 1
            continue
        pid = int(parts[2])
        if not table.may_run(pid):  # no such process: a dead kernel's left-over (ours to remove)
            if parts[1] == mine and re.fullmatch(_NAME, name):
                stale.extend(_if_mine(dfd, name, me, locked_is_stale=True))
            continue
        match = re.fullmatch(_NAME, name)
        if match is None:
            not_claims[safe] = not_claims.get(safe, 0) + 1
            continue
        named, start = int(match["uid"]), int(match["start"])
        alive = table.is_alive(pid, start, named)
        if alive is False:
            if named == me:  # a dead kernel of ours (kill -9): ours to remove, locked by anyone or not
                stale.extend(_if_mine(dfd, name, me, locked_is_stale=True))
            continue
        entry = _entry(dfd, directory, name, safe, named, pid, notes)
        if entry is not None:
            found[safe].append(entry)
    for safe, count in not_claims.items():
        notes.append(
            f"skipped {count} {'entry' if count == 1 else 'entries'} in {_shown(directory, 200)} named like claims on "
            f"{_shown(safe)} that are not claim files"
        )
    if table.hides_others and any(found.values()):
        notes.append(
            "this machine's /proc hides other users' processes: their claims are judged by their locks only"
        )
    return {safe: sorted(entries, key=lambda e: (e.ctime, e.name)) for safe, entries in found.items()}, stale


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 7


def _if_mine(dfd: int, name: str, me: int, locked_is_stale: bool) -> list[tuple[str, int, int]]:
    """``name`` as a left-over to remove, if it is a regular file of ours (and, unless its process
    is known dead, nobody holds its lock)."""
    try:
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return []
    if info.st_uid != me or not stat.S_ISREG(info.st_mode):
        return []
    if not locked_is_stale:
        try:
            fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=dfd)
        except OSError:
            return []
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return []  # held: a live kernel of an older version
        finally:
            os.close(fd)
    return [(name, info.st_dev, info.st_ino)]


def _entry(
    dfd: int, directory: str, name: str, safe: str, named: int, pid: int, notes: list[str]
) -> _Entry | None:
    """The claim ``name`` of a running process, if its file is what a claim must be and is locked."""
    shown = "claim file " + _shown(os.path.join(directory, name), 200)
    try:
        info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as err:
        notes.append(f"skipped {shown}: {_why(err)}")
        return None
    if not stat.S_ISREG(info.st_mode):
        notes.append(f"skipped {shown}: a {_kind(info.st_mode)}, not a regular file")
        return None
    if info.st_uid != named:
        notes.append(f"skipped {shown}: named for uid {named} but owned by {_who(info.st_uid)}")
        return None
    if (
        stat.S_IMODE(info.st_mode) & 0o066 != 0o044
    ):  # each user must see the same claims, written by the owner only
        notes.append(f"skipped {shown} ({_who(named)}'s): mode {stat.S_IMODE(info.st_mode):04o}, not 0644")
        return None
    state = _probe(dfd, name, info, safe, shown, notes)
    if state is None or state == "free":
        return None
    ctime, since = state
    return _Entry(name, Holder(pid, _user(named), since, False, uid=named), ctime)


def _probe(
    dfd: int, name: str, info: os.stat_result, safe: str, shown: str, notes: list[str]
) -> Literal["free"] | tuple[float, float] | None:
    """ "free" if nobody holds ``name``'s lock, (ctime, mtime) if someone does, None to skip it."""
    try:
        fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as err:
        notes.append(f"skipped {shown} ({_who(info.st_uid)}'s): {_why(err)}")
        return None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino) or not stat.S_ISREG(now.st_mode):
            notes.append(f"skipped {shown}: it changed while being read")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # succeeds only if nobody holds it
            return "free"
        except BlockingIOError:
            pass
        except OSError as err:
            notes.append(f"skipped {shown}: {_why(err)}")
            return None
        try:
            text = os.pread(fd, _READ_LIMIT, 0)
        except OSError:
            text = b""
        if not _at_path(dfd, name, now):
            return None  # removed or replaced by its owner since: that claim is void
    finally:
        os.close(fd)
    fields = dict(line.split(b"=", 1) for line in text.splitlines() if b"=" in line)
    if fields.get(b"key") != safe.encode():
        notes.append(f"skipped {shown}: its record is for another GPU (a hard link?)")
        return None
    return now.st_ctime, now.st_mtime


# -- process lifetime -----------------------------------------------------------------------------
def _forget_in_child() -> None:
    """A forked child shares the parent's locks; closing its copies leaves the parent's claims intact."""
    global _lock, _choosing_depth
    _lock = threading.Lock()  # the parent may have held it while forking
    _choosing_depth = 0
    for mine in _held.values():
        with contextlib.suppress(OSError):
            os.close(mine.fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(release_all)  # a kernel that ends normally leaves no file behind
