"""Advisory per-GPU claims: which live kernel has taken which GPU (``%gpu use auto``).

A claim is an exclusive ``flock`` on a file of the claimant's own in a directory shared by
every user of the machine.  The open file descriptor is kept for the life of the process, and
the kernel drops the lock when the process ends, however it ends (SIGKILL included): a dead
kernel's claim vanishes by itself, and no pid is trusted to say whether it lives.  Claims are
advisory: tfgpu_magic honours them, CUDA does not.

Every claimant makes its own file, ``<gpu key>.<uid>.<random>.lock``, with ``O_CREAT|O_EXCL``
(mode 0600 until it is locked and its record written, then 0644): only its owner can write,
rename or delete it (the directory is sticky), so identity comes from the file system, never
from what a file says.  A claim is taken in two steps: lock a fresh file of one's own, then
list the GPU's entries; if any other entry is held, give up.  Two claimants racing each see
the other (each looks only after its own lock is visible), so at most one wins, with or
without the directory-wide lock (:func:`choosing`), which only keeps simultaneous choosers
from both backing off.  Anybody can hold that lock, so it is waited for a bounded time only.

Readers (``%gpu status``, ``tfgpu``) open each entry with ``O_NOFOLLOW|O_NONBLOCK``, check it
with ``fstat``, and skip anything that is not a regular file owned by the uid in its name,
with a note; nothing read from a file reaches the screen unescaped.  A claim counts only while
its locked file is still the one at its path.

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
import secrets
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Optional

from .safe_text import safe

__all__ = [
    "Choice",
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

DEFAULT_DIR = "/tmp"  # root's and sticky (see the docstring)
ENV_DIR = "TFGPU_MAGIC_CLAIM_DIR"
CHOOSE_LOCK = "tfgpu_magic-choose.lock"
# A chooser holds the directory lock for milliseconds; any user can hold it forever, so nobody
# waits longer than this: choosing without it is still safe (see the module's docstring).
LOCK_TIMEOUT_S = 2.0
MAX_NOTES = 8
_READ_LIMIT = 256  # a claim record is ~60 bytes
_PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT
_NAME = re.compile(r"(?P<key>[A-Za-z0-9_-]+)\.(?P<uid>[0-9]{1,10})\.(?P<token>[0-9a-f]{16})\.lock")
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class ClaimError(RuntimeError):
    """The claim directory cannot be used; the one-line message says which path, why, and what to do."""


@dataclass(frozen=True)
class Holder:
    """Who holds a claim.

    ``uid`` is the claim file's owner, from the file system: the identity that counts.
    ``user`` is that uid's name in the user database (``"uid N"`` without one).  ``pid`` is what
    the owner's file says (only the owner can write it): the owner's own statement, None when
    missing or malformed.  ``since`` is the file's modification time.
    """

    pid: Optional[int]
    user: Optional[str]
    since: Optional[float]
    this_process: bool
    uid: Optional[int] = None

    def describe(self) -> str:
        if self.this_process:
            return "this kernel"
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        name = self.user or (f"uid {self.uid}" if self.uid is not None else None)
        return f"{who} ({name})" if name else who


@dataclass
class Choice:
    """What :func:`choosing` yields: whether the directory lock is held, and why not."""

    locked: bool = False
    notes: list[str] = field(default_factory=list)


class _Mine(NamedTuple):
    fd: int
    name: str
    dev: int
    ino: int
    since: float


class _Entry(NamedTuple):
    name: str
    holder: Holder
    ctime: float


# (directory, key) -> this process's locked claim file.  Forked children drop their copies.
_held: dict[tuple[str, str], _Mine] = {}
_lock = threading.Lock()
_choosing_depth = 0  # choosing() blocks this process is inside; nested ones don't lock again


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
        (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "file" if stat.S_ISREG(mode) else "special file"


def _why(err: OSError) -> str:
    return err.strerror or str(err)


def _safe_key(key: str) -> str:
    """A safe file-name part for a GPU key (its UUID): letters, digits, ``_`` and ``-`` only."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", key)


# -- the directory --------------------------------------------------------------------------------
def _unsafe(info: os.stat_result, directory: str) -> Optional[str]:
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


def _open_dir(directory: str, create: bool, notes: Optional[list[str]] = None) -> Optional[int]:
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


def _choose_lock(directory: str, shared: bool, notes: list[str]) -> Optional[int]:
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
                    fd = os.open(CHOOSE_LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o644, dir_fd=dfd)
                except FileExistsError:
                    continue
                with contextlib.suppress(OSError):
                    os.fchmod(fd, 0o644)  # past the umask: every user locks it (read access is enough)
                return fd
            if not stat.S_ISREG(info.st_mode):
                notes.append(f"{path} is a {_kind(info.st_mode)}, not a regular file; went on without the claim lock")
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
        # Our lock is visible now; any other live claim on this GPU (another user's or another
        # kernel of ours) means we lose.  Own entries nobody holds are left-overs: remove them.
        others, stale = _scan(dfd, directory, safe, own=name)
        for old in stale:
            with contextlib.suppress(OSError):
                _unlink_if_same(dfd, old[0], old[1], old[2])
    except BaseException as err:
        _let_go(dfd, name, fd, os.fstat(fd))
        if isinstance(err, OSError):
            raise ClaimError(f"cannot read the claim directory {_shown(directory, 200)} ({_why(err)})") from None
        raise
    if others or not _at_path(dfd, name, info):
        _let_go(dfd, name, fd, info)
        return False
    _held[(directory, key)] = _Mine(fd, name, info.st_dev, info.st_ino, info.st_mtime)
    return True


def _create_own(dfd: int, directory: str, safe: str, uid: int) -> tuple[str, int]:
    """A new file of ours for ``safe``, locked, with its record; mode 0600 until then, so no one
    else can open (and lock) it first."""
    shown = _shown(directory, 200)
    for _ in range(5):
        name = f"{safe}.{uid}.{secrets.token_hex(8)}.lock"
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
        except OSError as err:
            raise ClaimError(f"cannot create a claim file in {shown} ({_why(err)}); {_advice(err)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            record = f"pid={os.getpid()}\nkey={safe}\n".encode()
            if os.write(fd, record) != len(record):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fchmod(fd, 0o644)  # readable now: others can see that it is held
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
            os.close(fd)
            if isinstance(err, BlockingIOError):
                continue
            raise ClaimError(f"cannot write a claim file in {shown} ({_why(err)}); {_advice(err)}") from None
        return name, fd
    raise ClaimError(f"cannot create a claim file in {shown}: the names keep being taken; try again")


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
def holder(key: str, notes: Optional[list[str]] = None) -> Optional[Holder]:
    """Who holds ``key``, or None when nobody alive does.  Call inside :func:`choosing`.

    Entries that cannot be read are skipped; ``notes`` (if given) gets a line for each.
    ClaimError only when the directory itself is unusable.
    """
    return holders([key], notes=notes, lock=False)[key]


def holders(
    keys: list[str], notes: Optional[list[str]] = None, lock: bool = True
) -> dict[str, Optional[Holder]]:
    """Holders of several claims, read under the shared directory lock (``lock=False``: without).

    Never raises for a bad entry: it is skipped, and ``notes`` (if given) gets one line about it
    (at most :data:`MAX_NOTES` lines in all).  ClaimError only when the directory is unusable.
    """
    found: dict[str, Optional[Holder]] = {}
    mine = held()
    directory = claim_dir()
    said: list[str] = []
    with choosing(shared=True) if lock else contextlib.nullcontext(Choice(locked=True)) as choice:
        said.extend(choice.notes)
        dfd = _open_dir(directory, create=False, notes=said)
        try:
            names = os.listdir(dfd) if dfd is not None else []
            for key in keys:
                own = _held.get((directory, key)) if key in mine else None
                entries = _held_entries(dfd, directory, _safe_key(key), said, names, own) if dfd is not None else []
                if own is not None:
                    found[key] = _this_process(directory, key)
                else:
                    found[key], entries = (entries[0].holder if entries else None), entries[1:]
                for extra in entries:
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
    return unique[: MAX_NOTES - 1] + [f"... and {len(unique) - MAX_NOTES + 1} more notes about claim files"]


def _held_entries(
    dfd: int, directory: str, safe: str, notes: list[str], names: list[str], own: Optional[_Mine]
) -> list[_Entry]:
    entries, _ = _scan(dfd, directory, safe, own=own.name if own else None, notes=notes, names=names)
    return sorted(entries, key=lambda e: (e.ctime, e.name))


def _scan(
    dfd: int,
    directory: str,
    safe: str,
    own: Optional[str] = None,
    notes: Optional[list[str]] = None,
    names: Optional[list[str]] = None,
) -> tuple[list[_Entry], list[tuple[str, int, int]]]:
    """The held claim entries for ``safe``, and our own entries nobody holds (left-overs).

    ``own`` (our new file) is left out.  Whatever is not a regular file owned by the uid in its
    name, readable, and at its path, is skipped with a note.
    """
    notes = notes if notes is not None else []
    found: list[_Entry] = []
    stale: list[tuple[str, int, int]] = []
    table: Optional[dict] = None
    me = os.geteuid()
    prefix = safe + "."
    for name in names if names is not None else os.listdir(dfd):
        if not name.startswith(prefix) or name == own or name == safe + ".lock":  # `<key>.lock`: older versions
            continue
        shown = "claim file " + _shown(os.path.join(directory, name), 200)
        match = _NAME.fullmatch(name)
        if not match or match["key"] != safe:
            notes.append(f"skipped {shown}: not a claim file's name")
            continue
        named = int(match["uid"])
        try:
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as err:
            notes.append(f"skipped {shown}: {_why(err)}")
            continue
        if not stat.S_ISREG(info.st_mode):
            notes.append(f"skipped {shown}: a {_kind(info.st_mode)}, not a regular file")
            continue
        if info.st_uid != named:
            notes.append(f"skipped {shown}: named for uid {named} but owned by {_who(info.st_uid)}")
            continue
        if stat.S_IMODE(info.st_mode) & 0o066 != 0o044:  # each user must see the same claims, written by the owner only
            notes.append(f"skipped {shown} ({_who(named)}'s): mode {stat.S_IMODE(info.st_mode):04o}, not 0644")
            continue
        state = _probe(dfd, name, info, safe, shown, notes)
        if state is None:
            continue
        if state == "free":
            if named == me:
                stale.append((name, info.st_dev, info.st_ino))
            continue
        if table is None:
            table = _flock_holders()
        intruder = _locked_by_another_user(table, info)
        if intruder is not None:
            notes.append(
                f"ignored {shown}: its lock is held by a process of {_who(intruder)}, not by its owner {_who(named)}"
            )
            if named == me:
                stale.append((name, info.st_dev, info.st_ino))
            continue
        pid, ctime, since = state
        found.append(_Entry(name, Holder(pid, _user(named), since, False, uid=named), ctime))
    return found, stale


def _probe(dfd: int, name: str, info: os.stat_result, safe: str, shown: str, notes: list[str]):
    """"free" if nobody holds ``name``, (pid, ctime, mtime) if someone does, None to skip it."""
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
    if fields.get(b"key", safe.encode()) != safe.encode():
        notes.append(f"skipped {shown}: its record is for another GPU (a hard link?)")
        return None
    raw = fields.get(b"pid", b"")
    pid = int(raw) if re.fullmatch(rb"[1-9][0-9]{0,6}", raw) and int(raw) < _PID_MAX else None
    return pid, now.st_ctime, now.st_mtime


def _flock_holders() -> Optional[dict[tuple[int, int, int], list[int]]]:
    """(major, minor, inode) -> pids holding an exclusive flock, from ``/proc/locks``; None if unreadable."""
    try:
        with open("/proc/locks", "rb") as f:
            text = f.read(4 << 20)
    except OSError:
        return None
    table: dict[tuple[int, int, int], list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        # b"1: FLOCK  ADVISORY  WRITE 6466 fe:00:2146625 0 EOF" (waiters have "->" after the number)
        if len(parts) < 6 or parts[1] != b"FLOCK" or parts[3] != b"WRITE":
            continue
        try:
            pid = int(parts[4])
            major, minor, ino = parts[5].split(b":")
            table.setdefault((int(major, 16), int(minor, 16), int(ino)), []).append(pid)
        except ValueError:
            continue
    return table


def _locked_by_another_user(table: Optional[dict], info: os.stat_result) -> Optional[int]:
    """The uid holding the lock on a claim file, when the kernel shows it is not the file's owner.

    Anyone who can read a left-over claim file can lock it; ``/proc/locks`` names the locking
    pid, and ``/proc/<pid>/status`` its uids.  Anything unclear (no entry, a pid not visible
    here, a process running as root or with the owner's uid) counts as the owner's own lock.
    """
    if not table or info.st_uid == 0:  # root's own process may have changed uid since
        return None
    pids = table.get((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino))
    if not pids:
        return None
    others = set()
    for pid in pids:
        uids = _uids(pid) if pid > 0 else None
        if not uids or info.st_uid in uids or 0 in uids:
            return None
        others.add(uids[1])  # the effective uid
    return min(others)


def _uids(pid: int) -> Optional[list[int]]:
    """Real, effective, saved and file-system uids of ``pid``, or None if not visible."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f.read(8192).splitlines():
                if line.startswith(b"Uid:"):
                    return [int(u) for u in line.split()[1:5]]
    except (OSError, ValueError):
        return None
    return None


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
