"""Claims between real users: every attack a neighbour can try on another user's live claim.

User A (uid 54321) holds a claim in a child process; user B (uid 54322) attacks it; user C
(uid 54323) and root look.  The uids need no passwd entry: forked children of this (root)
process drop to them.  Every attack must end with no hang, no traceback (only ClaimError
one-liners or notes), A still holding its GPU, B unable to take it, A's uid shown as the
holder and no escape sequence shown raw; each test asserts that.  The table of attacks tried
and survived is written to test-artifacts/claims-attack-table.txt when the module ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import inspect
import os
import pickle
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tfgpu_magic.gpus import claims

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root, to run children as other uids"
)

A, B, C = 54321, 54322, 54323
KEY = "GPU-7f1c0de0-aaaa-bbbb-cccc-000000000001"
KEY2 = "GPU-7f1c0de0-aaaa-bbbb-cccc-000000000002"
SAFE = KEY  # the key is already made of safe characters
TABLE: list[tuple[str, str, str]] = []  # (attack, by whom, result) for the summary


# -- users ----------------------------------------------------------------------------------------
class Child:
    """A forked child running as ``uid``: its result comes back through a pipe; it may stay alive."""

    def __init__(
        self,
        uid: int | None,
        fn: Callable[..., Any],
        *args: Any,
        hold: bool = False,
        timeout: float = 15.0,
        before: Callable[[], None] | None = None,
    ):
        result_r, result_w = os.pipe()
        hold_r, hold_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            try:
                os.close(result_r)
                os.close(hold_w)
                if uid is not None:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                os.umask(0o022)
                if before:
                    before()
                try:
                    value: Any = ("ok", fn(*args))
                except claims.ClaimError as err:
                    value = ("ClaimError", str(err))
                except BaseException:
                    value = ("traceback", traceback.format_exc())
                try:
                    data = pickle.dumps(value)
                except Exception:
                    data = pickle.dumps(("traceback", "unpicklable result " + repr(value)))
                os.write(result_w, data)
                os.close(result_w)
                if hold:
                    os.read(hold_r, 1)  # until the parent closes its end (or dies)
            finally:
                os._exit(0)
        os.close(result_w)
        os.close(hold_r)
        self.pid, self._hold = pid, hold_w
        self.result = self._read(result_r, timeout)

    def _read(self, fd: int, timeout: float) -> Any:
        data, deadline = b"", time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self.kill()
                    return ("hung", f"no answer within {timeout:g} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        return pickle.loads(data) if data else ("traceback", "the child died without an answer")

    def stop(self) -> None:
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def as_user(uid: int | None, fn: Callable[..., Any], *args: Any, timeout: float = 15.0, **kw: Any) -> Any:
    child = Child(uid, fn, *args, timeout=timeout, **kw)
    child.stop()
    return child.result


# What the users do.  Each runs inside a child, as that user.
def take(key: str) -> bool:
    with claims.choosing():
        return claims.claim(key)


def take_raw(key: str) -> bool:
    """Claim without the directory lock (the lock is what a hostile user can hold)."""
    return claims.claim(key)


def look(keys: list[str]) -> dict[str, Any]:
    """What `%gpu status` / `tfgpu` would show: holders (uid, pid, text) and the notes."""
    notes: list[str] = []
    if "notes" in inspect.signature(claims.holders).parameters:
        found = claims.holders(keys, notes=notes)
    else:  # the API before notes
        found = claims.holders(keys)
    return {
        "holders": {
            k: None
            if h is None
            else {
                "uid": getattr(h, "uid", "no uid field"),
                "pid": h.pid,
                "text": h.describe(),
                "user": h.user,
            }
            for k, h in found.items()
        },
        "notes": notes,
    }


def my_files(directory: str, key: str = KEY) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(key.replace(":", "_")))


def owned_by(directory: str, uid: int, key: str = KEY) -> list[str]:
    return [n for n in my_files(directory, key) if os.lstat(os.path.join(directory, n)).st_uid == uid]


def start_of(pid: int) -> int:
    """A process's start time, as claim names carry it (field 22 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 1 :].split()[19])


def errno_of(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))
    return "done"


# -- fixtures and checks ---------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def attack_table():
    """The attacks tried and survived, for docs/claims.md's threat model: a record, not a test."""
    yield
    if TABLE:
        width = max(len(a) for a, _, _ in TABLE)
        lines = [f"{len(TABLE)} attacks tried, {len(TABLE)} survived"]
        lines += [f"  {attack:<{width}}  {who:<6}  {outcome}" for attack, who, outcome in TABLE]
        out = Path(__file__).resolve().parent.parent / "test-artifacts"
        out.mkdir(exist_ok=True)
        (out / "claims-attack-table.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def shared(monkeypatch):
    """A claim directory like the real one (root's, mode 1777) that the test uids can reach."""
    base = tempfile.mkdtemp(dir="/tmp", prefix="tfgpu-claims-users-")
    os.chmod(base, 0o755)
    directory = os.path.join(base, "claims")
    os.mkdir(directory)
    os.chmod(directory, 0o1777)
    monkeypatch.setenv(claims.ENV_DIR, directory)
    children: list[Child] = []
    yield Path(directory), children
    for child in children:
        child.kill()
    claims.release_all()
    subprocess.run(["umount", "-l", directory], stderr=subprocess.DEVNULL, check=False)
    shutil.rmtree(base, ignore_errors=True)


def start(uid: int, fn: Callable[..., Any], *args: Any, children: list, **kw: Any) -> Child:
    child = Child(uid, fn, *args, hold=True, **kw)
    children.append(child)
    return child


def clean(result: Any) -> None:
    """No hang and no traceback; only values or one-line ClaimErrors."""
    assert result[0] in ("ok", "ClaimError"), result[1]
    if result[0] == "ClaimError":
        assert "\n" not in result[1] and "Traceback" not in result[1], result[1]
    assert "\x1b" not in str(result[1]), result[1]


def no_raw_escapes(view: dict) -> None:
    shown = [h["text"] for h in view["holders"].values() if h] + [
        str(h["user"]) for h in view["holders"].values() if h
    ]
    for text in shown + list(view["notes"]):
        assert not any(ord(ch) < 32 or ord(ch) == 127 or 0x80 <= ord(ch) < 0xA0 for ch in text), repr(text)


def a_still_holds(key: str = KEY, attack: str = "", by: str = "B") -> None:
    """Everyone sees A holding ``key``, and B cannot take it."""
    for uid in (C, None):  # another user, and root
        result = as_user(uid, look, [key])
        clean(result)
        view = result[1]
        no_raw_escapes(view)
        found = view["holders"][key]
        assert found is not None, f"A's claim is not seen by uid {uid}: {view}"
        assert found["uid"] == A, found
        assert str(A) in found["text"], found
    result = as_user(B, take, key, timeout=20)
    clean(result)
    assert result == ("ok", False), result
    if attack:
        TABLE.append((attack, by, "survived: A keeps the GPU, B refused, holder shown as uid 54321"))


def a_holds(children: list, key: str = KEY) -> Child:
    child = start(A, take, key, children=children)
    assert child.result == ("ok", True), child.result
    return child


# -- the attacks -----------------------------------------------------------------------------------
def test_a_fifo_under_any_claim_name_hangs_nobody(shared):
    directory, children = shared
    for name in (f"{SAFE}.lock", f"{SAFE}.{B}.0000000000000000.lock", f"{SAFE}.{A}.0000000000000001.lock"):
        as_user(B, os.mkfifo, str(directory / name))
    a_kernel = a_holds(children)
    # After A's claim, B knows A's kernel (pid and start time are in /proc): a FIFO under the name
    # A's kernel would claim another GPU with is looked at, and reported.
    as_user(B, os.mkfifo, str(directory / f"{KEY2}.{A}.{a_kernel.pid}.{start_of(a_kernel.pid)}.lock"))
    for name in (f"{SAFE}.{B}.0000000000000002.lock", f"{KEY2}.lock", f"{KEY2}.{B}.0000000000000003.lock"):
        as_user(B, os.mkfifo, str(directory / name))
    result = as_user(C, look, [KEY, KEY2], timeout=10)
    clean(result)
    assert any("FIFO" in n for n in result[1]["notes"]), result
    a_still_holds(attack="FIFO planted under claim-file names (before and after A's claim)")


def test_a_fifo_in_place_of_the_choose_lock_hangs_nobody(shared):
    directory, children = shared
    as_user(B, os.mkfifo, str(directory / "tfgpu_magic-choose.lock"))
    a_holds(children)
    a_still_holds(attack="FIFO planted as choose.lock before anyone chose")


def test_another_users_claim_record_cannot_be_rewritten(shared):
    directory, children = shared
    a_holds(children)
    mine = owned_by(str(directory), A)
    assert mine, my_files(str(directory))

    def forge(path: str) -> str:
        return errno_of(lambda: Path(path).write_text("pid=\u00b2\nuser=alice\x1b]0;owned\x07\n"))

    for name in mine:
        assert as_user(B, forge, str(directory / name)) == ("ok", "EACCES")
    a_still_holds(attack="rewrite A's claim record (pid=², escape sequences)")


def hold_forged(path: str) -> bool:
    """B's own file with forged content, locked outside the protocol (B ignores claims)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"pid=\xc2\xb2\nkey=" + KEY.encode() + b"\nuser=alice\x1b[2J\x1b]0;pwned\x07\n")
    fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def test_forged_records_of_bs_own_are_shown_as_b_and_harmless(shared):
    directory, children = shared
    a_holds(children)
    start(B, hold_forged, str(directory / f"{SAFE}.{B}.00000000000000aa.lock"), children=children)
    start(
        B, hold_forged, str(directory / f"{SAFE}.{A}.00000000000000bb.lock"), children=children
    )  # named as A
    result = as_user(C, look, [KEY])
    clean(result)
    no_raw_escapes(result[1])
    assert "alice" not in repr(result[1]["holders"])
    a_still_holds(attack="forged pid=²/pid=4242 user=alice with escape sequences in B's own files")


def hold_forged_pid(directory: str, key: str) -> int:
    """B's own claim, under B's real identity, with a record that says pid 4242 and alice."""
    pid = os.getpid()
    fd = os.open(
        os.path.join(directory, f"{key}.{B}.{pid}.{start_of(pid)}.lock"),
        os.O_RDWR | os.O_CREAT | os.O_EXCL,
        0o644,
    )
    os.write(fd, f"pid=4242\nkey={key}\nuser=alice\n".encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    return pid


def test_a_forged_pid_and_user_name_are_attributed_to_their_real_owner(shared):
    directory, children = shared
    b_kernel = start(B, hold_forged_pid, str(directory), KEY2, children=children)
    assert b_kernel.result == ("ok", b_kernel.pid)
    # A claim name for a process that does not run (pid 4242 of B, say): no claim at all.
    as_user(B, lambda: Path(directory, f"{KEY}.{B}.4242.1.lock").write_text(f"pid=4242\nkey={KEY}\n"))
    result = as_user(C, look, [KEY, KEY2])
    clean(result)
    assert result[1]["holders"][KEY] is None, result
    found = result[1]["holders"][KEY2]
    assert found is not None and found["uid"] == B and "alice" not in found["text"], found
    assert found["text"] == f"pid {b_kernel.pid} (uid {B})"  # the process table's pid, not the record's
    TABLE.append(
        (
            "forged `pid=4242 user=alice` in B's own claim",
            "B",
            "shown as B's real pid and uid: the record is not believed",
        )
    )


def test_a_claim_cannot_be_deleted_or_replaced_by_another_user(shared):
    directory, children = shared
    assert as_user(B, take, KEY) == ("ok", True)  # B claimed it earlier and exited: B's files may remain
    a_holds(children)
    names = my_files(str(directory))

    def delete_all(directory: str, names: list[str]) -> list[str]:
        out = []
        for name in names:
            path = os.path.join(directory, name)
            out.append(errno_of(lambda path=path: os.unlink(path)))
            out.append(errno_of(lambda path=path: os.rename(path, path + ".x")))
            out.append(errno_of(lambda path=path: os.symlink("/etc/passwd", path)))
        return out

    result = as_user(B, delete_all, str(directory), names)
    clean(result)
    for name in owned_by(str(directory), A):
        assert (directory / name).exists()
    a_still_holds(attack="delete / rename / replace-by-symlink A's claim file")


def test_running_the_reader_first_gives_nobody_the_directory(monkeypatch, shared):
    directory, _children = shared
    fresh = directory.parent / "fresh"
    os.chmod(directory.parent, 0o1777)  # like /tmp: anyone can create the claim directory
    monkeypatch.setenv(claims.ENV_DIR, str(fresh))
    clean(as_user(B, look, [KEY]))  # B runs `tfgpu` first
    assert not fresh.exists() or fresh.stat().st_uid != B
    result = as_user(A, take, KEY)
    clean(result)
    assert result == ("ok", True) and fresh.stat().st_uid == A
    TABLE.append(("run `tfgpu` first to own the directory", "B", "the reader creates nothing"))


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o1777, 0o777])
def test_a_directory_made_by_another_user_is_refused_in_one_line(monkeypatch, shared, mode):
    directory, _children = shared
    theirs = directory.parent / f"theirs-{mode:o}"
    theirs.mkdir()
    os.chown(theirs, B, B)
    os.chmod(theirs, mode)
    monkeypatch.setenv(claims.ENV_DIR, str(theirs))
    result = as_user(A, take, KEY)
    clean(result)
    assert result[0] == "ClaimError" and "TFGPU_MAGIC_CLAIM_DIR" in result[1], result
    clean(as_user(A, look, [KEY]))
    clean(as_user(C, look, [KEY]))
    TABLE.append((f"claim directory created by B, mode {mode:04o}", "B", "refused: " + result[1]))


def test_a_root_directory_writable_by_all_without_the_sticky_bit_is_refused(shared):
    directory, _children = shared
    os.chmod(directory, 0o777)
    result = as_user(A, take, KEY)
    clean(result)
    assert result[0] == "ClaimError" and "sticky" in result[1], result
    TABLE.append(("root's claim directory mode 0777 (no sticky bit)", "admin", "refused: " + result[1]))


def test_a_symlink_in_place_of_the_directory_is_refused(monkeypatch, shared):
    directory, _children = shared
    os.chmod(directory.parent, 0o1777)
    target = directory.parent / "b-dir"
    as_user(B, os.mkdir, str(target), 0o777)
    link = directory.parent / "link"
    as_user(B, os.symlink, str(target), str(link))
    monkeypatch.setenv(claims.ENV_DIR, str(link))
    result = as_user(A, take, KEY)
    clean(result)
    assert result[0] == "ClaimError", result
    TABLE.append(("symlink planted at the claim directory's path", "B", "refused: " + result[1]))


def test_symlinks_0600_files_and_directories_under_claim_names_are_skipped(shared):
    directory, children = shared

    def plant(directory: str) -> None:
        d = Path(directory)
        os.symlink("/etc/passwd", d / f"{SAFE}.lock")
        os.symlink("/etc/passwd", d / f"{KEY2}.lock")
        os.symlink("/etc/passwd", d / f"{SAFE}.{B}.00000000000000dd.lock")
        fd = os.open(d / f"{SAFE}.{B}.00000000000000ee.lock", os.O_CREAT | os.O_WRONLY, 0o600)
        os.fchmod(fd, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.mkdir(d / f"{SAFE}.{B}.00000000000000ff.lock")
        os.mkdir(d / f"{KEY2}.{B}.00000000000000ff.lock")
        sock = __import__("socket").socket(__import__("socket").AF_UNIX)
        sock.bind(str(d / f"{SAFE}.{B}.0000000000000abc.lock"))
        os.symlink(d / f"{SAFE}.{B}.00000000000000ee.lock", d / f"{SAFE}.{A}.0000000000000abd.lock")

    # B plants everything before A claims, and holds the 0600 file's lock
    start(B, plant, str(directory), children=children)
    a_holds(children)
    a_kernel_2 = start(A, take, KEY2, children=children)
    assert a_kernel_2.result == ("ok", True)
    result = as_user(C, look, [KEY, KEY2])
    clean(result)
    view = result[1]
    assert view["holders"][KEY2] is not None and view["holders"][KEY2]["uid"] == A, (
        view
    )  # one bad entry hides nothing
    assert any("that are not claim files" in note for note in view["notes"]), view  # counted, never opened
    a_still_holds(attack="symlink, 0600 file, directory and socket under claim names")


def test_a_read_only_claim_directory_gives_one_line(shared):
    directory, _children = shared
    os.chmod(directory, 0o555)
    result = as_user(A, take, KEY)
    clean(result)
    assert result[0] == "ClaimError", result
    clean(as_user(A, look, [KEY]))
    TABLE.append(("claim directory read-only (mode 0555)", "admin", result[1]))


def _mount_tmpfs(directory: Path, options: str) -> bool:
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return done.returncode == 0


def test_a_read_only_file_system_gives_one_line(shared):
    directory, _children = shared
    if not _mount_tmpfs(directory, "size=256k,mode=1777"):
        pytest.skip("cannot mount a tmpfs here")
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
    result = as_user(A, take, KEY)
    clean(result)
    assert result[0] == "ClaimError" and "Read-only" in result[1], result
    clean(as_user(C, look, [KEY]))
    TABLE.append(("read-only file system", "admin", result[1]))


def test_a_full_file_system_gives_one_line(shared):
    directory, _children = shared
    if not _mount_tmpfs(directory, "size=64k,mode=1777"):
        pytest.skip("cannot mount a tmpfs here")
    with contextlib.suppress(OSError), open(directory / "filler", "wb") as f:
        while True:
            f.write(b"x" * 4096)
            f.flush()
    with contextlib.suppress(OSError):  # and no inodes: fill them with empty files
        for i in range(100000):
            (directory / f"i{i}").touch()
    result = as_user(A, take, KEY)
    clean(result)
    assert result[0] == "ClaimError" and "space" in result[1], result
    clean(as_user(C, look, [KEY]))
    TABLE.append(("full file system", "admin", result[1]))


def test_a_file_size_limit_on_the_record_gives_one_line(shared):
    directory, _children = shared

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    result = as_user(A, take, KEY, before=limit)
    clean(result)
    assert result[0] == "ClaimError", result
    assert as_user(C, look, [KEY])[1]["holders"][KEY] is None
    assert owned_by(str(directory), A) == []  # nothing left behind
    TABLE.append(
        ("claim record cannot be written (RLIMIT_FSIZE 0)", "A's own limit", result[1] + " (nothing left)")
    )


def hold_choose_lock(directory: str) -> bool:
    path = os.path.join(directory, "tfgpu_magic-choose.lock")
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def test_a_hostile_holder_of_the_choose_lock_stalls_nobody_for_long(shared):
    directory, children = shared
    as_user(A, take, KEY2)  # choose.lock exists, A's (it exits)
    start(B, hold_choose_lock, str(directory), children=children)
    began = time.monotonic()
    a_holds(children)
    took = time.monotonic() - began
    assert took < 5, took
    began = time.monotonic()
    result = as_user(C, look, [KEY])
    assert time.monotonic() - began < 5
    clean(result)
    assert result[1]["holders"][KEY]["uid"] == A
    a_still_holds(attack=f"hold choose.lock forever (A's choice took {took:.1f} s)")


def test_a_hostile_owner_of_the_choose_lock_stalls_nobody_for_long(shared):
    directory, children = shared
    start(B, hold_choose_lock, str(directory), children=children)  # B creates it and holds it
    began = time.monotonic()
    a_holds(children)
    assert time.monotonic() - began < 5
    a_still_holds(attack="create choose.lock first and hold it forever")


def in_proc_locks(path: Path) -> bool:
    info = path.stat()
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        return any(line.split()[5:6] == [wanted] for line in Path("/proc/locks").read_text().splitlines())
    except OSError:
        return False


def squat(path: str) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def test_locking_a_dead_kernels_leftover_file_neither_blocks_nor_impersonates(shared):
    directory, children = shared
    first = a_holds(children)
    first.kill()  # SIGKILL: no clean-up, the file stays
    leftovers = owned_by(str(directory), A)
    if not leftovers:
        pytest.skip("no leftover file to squat")
    for name in leftovers:
        start(B, squat, str(directory / name), children=children)
    if not all(in_proc_locks(directory / name) for name in leftovers):
        pytest.skip("/proc/locks does not name these files by the device and inode stat() gives (overlayfs?)")
    result = as_user(C, look, [KEY])
    clean(result)
    found = result[1]["holders"][KEY]
    assert found is None or found["uid"] != A, found  # B's lock is not A's claim
    a_holds(children)  # A can take its GPU again
    a_still_holds(attack="lock A's leftover file after A's kernel was killed (impersonation)")


def lock_and_leave(path: str, how: str) -> bool:
    """Lock ``path`` in a child that outlives the process that took the lock (issue 17, item 1):
    /proc/locks then names a pid that no longer exists."""
    if how == "flock(1)":
        subprocess.run(
            ["flock", "-x", "-n", path, "sh", "-c", "sleep 300 >/dev/null 2>&1 &"], check=True, timeout=10
        )
        return True
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if os.fork() == 0:  # the child keeps the lock (and sleeps); the locker returns and exits
        os.setsid()
        os.closerange(3, fd)  # not the result pipe: the test reads it to its end
        os.closerange(fd + 1, 4096)
        time.sleep(300)
        os._exit(0)
    return True


@pytest.mark.parametrize("how", ["flock(1)", "python fork"])
def test_a_lock_left_by_a_dead_locker_on_a_dead_kernels_file_keeps_no_claim_alive(shared, how):
    directory, children = shared
    first = a_holds(children)
    first.kill()  # kill -9: A's file stays behind
    leftovers = owned_by(str(directory), A)
    assert leftovers
    for name in leftovers:
        assert as_user(B, lock_and_leave, str(directory / name), how) == ("ok", True)
    try:
        result = as_user(C, look, [KEY])
        clean(result)
        assert result[1]["holders"][KEY] is None, result  # C sees the GPU free
        assert as_user(C, take, KEY) == ("ok", True)  # and C's `use auto` could take it
        assert as_user(A, take, KEY) == ("ok", True)  # as can A's own new kernel
        assert not any((directory / name).exists() for name in leftovers)  # which removed its left-over
    finally:
        subprocess.run(
            ["pkill", "-KILL", "-u", str(B)], check=False
        )  # the lockers' children (B runs nothing else)
    TABLE.append(
        (
            f"lock a dead kernel's left-over, then let the locker exit ({how})",
            "B",
            "no claim: A, C take the GPU",
        )
    )


def claim_and_release_forever(key: str) -> bool:
    while True:
        with claims.choosing():
            claims.claim(key)
        claims.release(key)


def test_kernels_killed_while_claiming_leave_nothing_that_lasts(shared):
    """300 kill -9 at random moments of A's claims (issue 17, item 4): A's next claim removes every
    left-over, and nobody ever sees a half-made claim."""
    directory, children = shared
    rng = __import__("random").Random(17)
    for _ in range(300):
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(A)
                os.setuid(A)
                claim_and_release_forever(KEY)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0, 0.004))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    seen = as_user(C, look, [KEY])
    clean(seen)
    assert seen[1]["holders"][KEY] is None and seen[1]["notes"] == [], seen  # nothing half made, no notes
    a_holds(children)
    left = sorted(n for n in os.listdir(directory) if n != "tfgpu_magic-choose.lock")
    assert len(left) == 1 and left[0].startswith(f"{SAFE}.{A}."), left  # only A's live claim
    TABLE.append(
        ("300 kill -9 during A's claims", "A's own bad luck", "no note for anyone; A's next claim cleans up")
    )


def plant_flood(directory: str, count: int) -> int:
    """Entries named like claims: older names, claim names of no process, of live processes not B's."""
    live = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    for i in range(count):
        kind = i % 3
        if kind == 0:
            name = f"{SAFE}.{B}.{i:016x}.lock"
        elif kind == 1:
            name = f"{SAFE}.{A}.{100000 + i}.{i}.lock"
        else:
            name = f"{SAFE}.{A}.{live[i % len(live)]}.{i}.lock"
        os.close(os.open(os.path.join(directory, name), os.O_CREAT | os.O_WRONLY, 0o644))
    return count


def count_file_calls(keys: list[str]) -> dict:
    """How many files ``holders`` opens or stats (besides /proc): a reader's cost per planted entry."""
    calls = {"open": 0, "stat": 0}
    real_open, real_stat = os.open, os.stat

    def counting_open(path, *args, **kw):
        if not str(path).startswith("/proc"):
            calls["open"] += 1
        return real_open(path, *args, **kw)

    def counting_stat(path, *args, **kw):
        if not str(path).startswith("/proc"):
            calls["stat"] += 1
        return real_stat(path, *args, **kw)

    os.open, os.stat = counting_open, counting_stat
    try:
        view = look(keys)
    finally:
        os.open, os.stat = real_open, real_stat
    return {"calls": calls, "view": view}


def test_a_flooded_claim_directory_costs_readers_nothing_per_entry(shared):
    """20,000 planted entries named like claims (issue 17, item 3): readers open and stat a few files
    whatever their number, and still see A's claim."""
    directory, children = shared
    a_holds(children)
    assert as_user(B, plant_flood, str(directory), 20_000, timeout=120) == ("ok", 20_000)
    result = as_user(C, count_file_calls, [KEY], timeout=60)
    clean(result)
    calls, view = result[1]["calls"], result[1]["view"]
    assert view["holders"][KEY]["uid"] == A, view
    assert calls["open"] + calls["stat"] < 20, calls
    assert any("that are not claim files" in note for note in view["notes"]), view
    a_still_holds(
        attack=f"20,000 entries named like claims (a reader made {calls['open'] + calls['stat']} file calls)"
    )


def test_a_hard_link_to_a_claim_does_not_claim_another_gpu(shared):
    directory, children = shared
    a_holds(children)
    name = owned_by(str(directory), A)[0]
    token = name.split(".")[2] if name.count(".") == 3 else "0000000000000123"
    link = str(directory / f"{KEY2}.{A}.{token}.lock")
    got = as_user(B, errno_of, lambda: os.link(str(directory / name), link))
    assert got[0] == "ok"
    if got[1] != "done":  # fs.protected_hardlinks stopped B; root makes the link B could make without it
        os.link(str(directory / name), link)
    result = as_user(C, look, [KEY2])
    clean(result)
    assert result[1]["holders"][KEY2] is None, result
    assert as_user(C, take, KEY2) == ("ok", True)
    a_still_holds(attack=f"hard link of A's claim under another GPU's name (B's own link: {got[1]})")


def test_escape_sequences_in_entry_names_are_neutralised(shared):
    directory, children = shared

    def plant(directory: str) -> None:
        for name in (
            f"{SAFE}.\x1b[2J\x1b]0;pwn\x07.x.lock",
            f"{SAFE}.{B}.\x9b31m.lock",
            f"{SAFE}.{B}.\u202e.lock",
        ):
            Path(directory, name).write_text("")
        Path(directory, f"{SAFE}.{A}.0000000000000fed.lock").write_text("")

    as_user(B, plant, str(directory))
    a_holds(children)
    result = as_user(C, look, [KEY])
    clean(result)
    no_raw_escapes(result[1])
    a_still_holds(attack="escape sequences / bidi controls in entry names; file named for A's uid")


def racer(key: str, go: int) -> bool:
    os.read(go, 1)
    return claims.claim(key)  # no directory lock: as when a hostile user holds it


def test_racing_users_without_the_directory_lock_never_share_a_gpu(shared):
    _directory, _children = shared
    rounds_won = 0
    for round_ in range(8):
        go_r, go_w = os.pipe()
        started = []
        results_r = []
        for uid in (A, B, C):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                    ok = racer(f"GPU-race-{round_}", go_r)
                    os.write(w, b"1" if ok else b"0")
                    time.sleep(2)  # hold while the others look
                finally:
                    os._exit(0)
            os.close(w)
            started.append(pid)
            results_r.append(r)
        os.write(go_w, b"xxx")
        won = []
        for r in results_r:
            select.select([r], [], [], 15)
            won.append(os.read(r, 1))
            os.close(r)
        for pid in started:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(go_r)
        os.close(go_w)
        assert set(won) <= {b"0", b"1"} and won.count(b"1") <= 1, (
            round_,
            won,
        )  # no error, one winner at most
        rounds_won += won.count(b"1")
    assert rounds_won >= 1  # racing does not simply make everyone lose
    TABLE.append(
        (
            "three users claim one GPU at the same instant, no directory lock",
            "A, B, C",
            "never two winners (8 rounds)",
        )
    )
