"""The psutil process table remembers owners between refreshes, and never answers wrongly from memory.

Real child processes (sleepers this test starts and ends) stand for the GPU processes; where
the operating system cannot be made to do something (reuse a pid, exec another program, refuse a
read to root, make a process young), the table is given a ``/proc`` reader the test controls
(:class:`ShownProc`: the real ``/proc`` with some of its files replaced), and off ``/proc`` psutil
is monkeypatched.  No timing assertions.
"""

from __future__ import annotations

import getpass
import os
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfgpu_magic.gpus import owners, process_table
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.owners import EXITED, ProcessDetails, PsutilProcessTable
from tfgpu_magic.gpus.process_table import (
    PROC,
    STAT_BYTES,
    STATUS_BYTES,
    Stat,
    Status,
    parse_stat,
    parse_status,
)
from tfgpu_magic.gpus.simulated import busy_server
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.session import Session

LINUX_PROC = os.path.exists("/proc/self/stat")
ME = getpass.getuser()


def sleeper(tag: str) -> subprocess.Popen:
    """A sleeping Python, returned once its command line is readable (Popen returns mid-exec)."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(30)  # {tag}"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(tag in arg for arg in psutil.Process(proc.pid).cmdline()):
        time.sleep(0.001)
    return proc


@pytest.fixture
def children():
    """Start sleepers on demand; every one is killed and reaped at teardown."""
    started: list[subprocess.Popen] = []

    def start(count: int = 1, tag: str = "sleeper") -> list[subprocess.Popen]:
        new = [sleeper(f"{tag}-{i}") for i in range(count)]
        started.extend(new)
        return new

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


class ShownProc:
    """The real ``/proc`` as a :class:`~tfgpu_magic.gpus.process_table.ProcReader`, every read
    recorded, with the files a test replaces (bytes, or an error to raise) and its boot clock."""

    def __init__(self) -> None:
        self.files: dict[tuple[int, str], bytes | BaseException] = {}
        self.reads: list[tuple[int, str]] = []
        self.looks: list[int] = []  # pids looked at whole (read_files), there or not
        self.boot_s: float | None = None  # seconds since boot, None: the real clock
        self.before_read: Callable[[int, str], None] | None = None

    def pids(self) -> set[int]:
        return PROC.pids()

    def read(self, pid: int, name: str, limit: int) -> bytes:
        if self.before_read is not None:
            self.before_read(pid, name)
        self.reads.append((pid, name))
        shown = self.files.get((pid, name))
        if isinstance(shown, BaseException):
            raise shown
        return PROC.read(pid, name, limit) if shown is None else shown[:limit]

    def read_files(self, pid: int, wanted) -> list[bytes | Exception]:
        """As the real ``/proc`` (one look at the process: nothing read when it is not there), each
        file read as :meth:`read` reads it."""
        self.looks.append(pid)
        os.stat(f"/proc/{pid}")  # raises FileNotFoundError for a process that has gone, as PROC does
        found: list[bytes | Exception] = []
        for name, limit in wanted:
            try:
                found.append(self.read(pid, name, limit))
            except Exception as err:
                found.append(err)
        return found

    def since_boot_s(self) -> float:
        return PROC.since_boot_s() if self.boot_s is None else self.boot_s

    def ticks_per_s(self) -> int:
        return PROC.ticks_per_s()

    # what the table read: identities (stat alone, or a look at the whole process, which reads it
    # with the rest), uncached look-ups (status, then cmdline)
    def identities(self) -> list[int]:
        looked = list(self.looks)
        return [pid for pid, name in self.reads if name == "stat" and not _drop(looked, pid)] + self.looks

    def lookups(self) -> list[int]:
        return [pid for pid, name in self.reads if name == "status"]

    def forget_reads(self) -> None:
        self.reads.clear()
        self.looks.clear()

    def start_of(self, pid: int) -> int:
        stat = parse_stat(PROC.read(pid, "stat", 4096))
        assert stat is not None
        return stat.start

    def show(self, pid: int, start: int, name: bytes, uid: int, command: bytes) -> None:
        """Another process behind ``pid``: its start time, name, real uid and command line."""
        self.files[(pid, "stat")] = stat_line(pid, name, start)
        self.files[(pid, "status")] = b"Name:\t%s\nState:\tS (sleeping)\nUid:\t%d\t%d\t%d\t%d\n" % (
            name,
            *[uid] * 4,
        )
        self.files[(pid, "cmdline")] = command.replace(b" ", b"\0") + b"\0"

    def make_young(self, pid: int, age_s: float) -> None:
        """The boot clock set so that process ``pid`` started ``age_s`` ago."""
        self.boot_s = self.start_of(pid) / self.ticks_per_s() + age_s


def _drop(items: list[int], item: int) -> bool:
    """Remove one ``item`` from ``items``; whether there was one."""
    if item in items:
        items.remove(item)
        return True
    return False


def stat_line(pid: int, name: bytes, start: int, state: bytes = b"S") -> bytes:
    """A ``/proc/<pid>/stat`` line: state, parent 1, start time ``start`` (field 22), zeros elsewhere."""
    return b"%d (%s) %s 1 %s %d %s\n" % (
        pid,
        name,
        state,
        b" ".join([b"0"] * 17),
        start,
        b" ".join([b"0"] * 30),
    )


@pytest.fixture
def shown() -> ShownProc:
    if not LINUX_PROC:
        pytest.skip("shows the table processes through /proc (Linux)")
    return ShownProc()


def fresh_table(proc: ShownProc | None = None, **options) -> PsutilProcessTable:
    """A table that remembers even the sleepers started a moment ago (see the start-up test below)."""
    options.setdefault("min_age_s", 0)
    return PsutilProcessTable(**options) if proc is None else PsutilProcessTable(proc=proc, **options)


ROOT_NAME = pwd.getpwuid(0).pw_name
SOMEONE_ELSES_JOB = ProcessDetails(ROOT_NAME, "python someone_elses_job.py", True)


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


# -- answers come from memory only for the same process -------------------------------------------
def test_a_live_process_is_read_once_then_remembered(children, shown):
    (child,) = children(1, "remembered")
    table = fresh_table(shown)
    first = table.lookup(child.pid)
    assert (first.user, first.alive, first.note) == (ME, True, None)
    assert "remembered-0" in first.command
    for _ in range(3):
        assert table.lookup(child.pid) == first
    assert shown.lookups() == [child.pid]
    assert table.cache_size() == 1


@pytest.mark.skipif(not LINUX_PROC, reason="shows the table another process through /proc")
def test_a_reused_pid_gets_the_new_processes_owner_and_command(children, shown):
    (child,) = children(1, "old")
    table = fresh_table(shown)
    old = table.lookup(child.pid)
    assert old.user == ME and "old-0" in old.command
    # the same pid, started later, root's: a new process
    shown.show(child.pid, shown.start_of(child.pid) + 1, b"python", 0, b"python someone_elses_job.py")
    shown.forget_reads()
    assert table.lookup(child.pid) == SOMEONE_ELSES_JOB
    assert table.lookup(child.pid) == SOMEONE_ELSES_JOB  # and the new answer is the one remembered
    assert shown.lookups() == [child.pid]


@pytest.mark.skipif(not LINUX_PROC, reason="the process name is part of the identity only with /proc")
def test_a_process_that_execs_another_program_is_read_again(children, shown):
    (child,) = children(1, "before-exec")
    table = fresh_table(shown)
    assert "before-exec" in table.lookup(child.pid).command
    shown.show(child.pid, shown.start_of(child.pid), b"bash", os.getuid(), b"bash run.sh")  # same start
    assert table.lookup(child.pid) == ProcessDetails(ME, "bash run.sh", True)


@pytest.mark.skipif(not LINUX_PROC, reason="sets the clock of /proc's start times")
def test_a_process_still_starting_is_read_every_time_until_it_is_a_second_old(children, shown):
    (child,) = children(1, "young")
    assert 0 <= PROC.since_boot_s() - shown.start_of(child.pid) / PROC.ticks_per_s() < 30
    table = PsutilProcessTable(proc=shown)  # the default: remember processes a second old or older
    shown.make_young(child.pid, 0.2)  # as if fork or exec just happened
    table.lookup(child.pid), table.lookup(child.pid)
    assert shown.lookups() == [child.pid, child.pid] and table.cache_size() == 0
    shown.make_young(child.pid, owners.MIN_AGE_S)
    table.lookup(child.pid), table.lookup(child.pid)
    assert shown.lookups() == [child.pid] * 3 and table.cache_size() == 1


def test_an_exited_process_is_reported_exited_and_forgotten(children):
    (child,) = children(1, "exits")
    table = fresh_table()
    assert table.lookup(child.pid).alive and table.cache_size() == 1
    child.kill()
    child.wait(timeout=10)
    assert table.lookup(child.pid) == EXITED
    assert table.cache_size() == 0


@pytest.mark.skipif(not LINUX_PROC, reason="reads the process state from /proc")
def test_a_zombie_is_reported_exited_not_from_memory(children):
    (child,) = children(1, "zombie")
    table = fresh_table()
    assert table.lookup(child.pid).alive
    os.kill(child.pid, signal.SIGKILL)  # not reaped: it stays a zombie until teardown waits for it
    deadline = time.monotonic() + 10
    while state_of(child.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state_of(child.pid) == "Z"
    assert table.lookup(child.pid) == EXITED
    assert table.cache_size() == 0


@pytest.mark.skipif(not LINUX_PROC, reason="shows the table a zombie through /proc")
def test_a_process_that_becomes_a_zombie_while_it_is_read_is_exited(children, shown):
    (child,) = children(1, "dying")
    table = fresh_table(shown)
    status = re.sub(rb"\nState:\t\S", b"\nState:\tZ", PROC.read(child.pid, "status", 8192))
    assert b"\nState:\tZ" in status
    shown.files[(child.pid, "status")] = status  # its stat, read first, still says it runs
    assert table.lookup(child.pid) == EXITED
    assert table.cache_size() == 0


# -- failures stay notes, asked again next time -------------------------------------------------
@pytest.mark.skipif(not LINUX_PROC, reason="refuses reads of /proc")
def test_access_denied_is_a_note_and_never_remembered(children, shown):
    (child,) = children(1, "secret")
    table = fresh_table(shown)
    refused = PermissionError(13, "Permission denied")
    shown.files[(child.pid, "status")] = refused  # the owner refused (hidepid=1 refuses every file)
    for _ in range(2):
        denied = table.lookup(child.pid)
        assert (denied.user, denied.alive) == (None, True)
        assert denied.note == "owned by a user whose details this account may not read"
    del shown.files[(child.pid, "status")]
    shown.files[(child.pid, "cmdline")] = refused  # the owner is read, the command refused
    half = table.lookup(child.pid)
    assert (half.user, half.command, half.note) == (
        ME,
        None,
        "owned by a user whose details this account may not read",
    )
    assert table.cache_size() == 0
    del shown.files[(child.pid, "cmdline")]
    allowed = table.lookup(child.pid)  # the refusal ends: read now, not the old note
    assert (allowed.user, allowed.note) == (ME, None) and "secret-0" in allowed.command
    assert table.lookup(child.pid) == allowed
    assert shown.lookups() == [child.pid] * 4


@pytest.mark.skipif(not LINUX_PROC, reason="refuses reads of /proc")
def test_an_unreadable_identity_is_never_cached(children, shown):
    (child,) = children(1, "hidden")
    table = fresh_table(shown)
    shown.files[(child.pid, "stat")] = PermissionError(13, "Permission denied")  # hidepid, ...
    for _ in range(2):
        assert table.lookup(child.pid).user == ME
    assert shown.lookups() == [child.pid, child.pid] and table.cache_size() == 0


# -- user names --------------------------------------------------------------------------------
def counting_pwd(monkeypatch) -> list[int]:
    asked: list[int] = []
    real = pwd.getpwuid

    def getpwuid(uid):
        asked.append(uid)
        return real(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    return asked


def test_user_names_are_asked_once_per_uid(children, monkeypatch):
    asked = counting_pwd(monkeypatch)
    table = fresh_table()
    procs = children(3, "named")
    for _ in range(2):
        assert table.current_user() == ME
        assert [table.lookup(p.pid).user for p in procs] == [ME] * 3
    assert asked == [os.getuid()]


def test_a_uid_without_a_name_shows_its_number_and_is_asked_again_later(monkeypatch):
    asked = []

    def getpwuid(uid):
        asked.append(uid)
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    now = [100.0]
    names = owners._UserNames(clock=lambda: now[0])
    assert names.name(54321) == "54321"
    assert names.name(54321) == "54321" and asked == [54321]
    now[0] += owners.NAMELESS_RETRY_S
    assert names.name(54321) == "54321" and asked == [54321, 54321]


# -- bounded, shared, thread-safe --------------------------------------------------------------
def test_the_cache_is_bounded_least_recently_looked_up_first(children, shown):
    procs = children(5, "bounded")
    table = fresh_table(shown, max_processes=3)
    for p in procs:
        table.lookup(p.pid)
    assert table.cache_size() == 3
    shown.forget_reads()
    for p in procs[2:]:  # the three most recent are remembered
        table.lookup(p.pid)
    assert shown.lookups() == []
    table.lookup(procs[0].pid)  # forgotten: read again, and the least recent of the rest goes
    assert shown.lookups() == [procs[0].pid] and table.cache_size() == 3


def test_threads_looking_up_at_once_get_consistent_answers(children):
    procs = children(6, "threads")
    pids = [p.pid for p in procs] + [os.getpid()]
    table = fresh_table(max_processes=4)  # smaller than the pids: eviction races lookups
    expected = {pid: fresh_table().lookup(pid) for pid in pids}
    assert all(d.alive and d.user == ME for d in expected.values())
    wrong: list[tuple[int, ProcessDetails]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(offset: int) -> None:
        try:
            start.wait()
            for n in range(150):
                pid = pids[(n + offset) % len(pids)]
                found = table.lookup(pid)
                if found != expected[pid]:
                    wrong.append((pid, found))
                table.current_user()
        except BaseException as err:
            errors.append(err)

    run_in_threads(work, 8)
    assert not errors and not wrong
    assert table.cache_size() <= 4


def test_the_psutil_table_is_one_per_process():
    first = owners.process_table_for(Nvml())
    assert first is owners.process_table_for(Nvml()) is owners.shared_psutil_table()
    assert isinstance(first, PsutilProcessTable)


def real_pid_server(pids: list[int], gone: int):
    """The busy fake server, its processes replaced by real pids, owners left to psutil."""
    server = busy_server(os.getpid())
    listed = [p for gpu in server.gpus for p in gpu.processes if p.pid != os.getpid()]
    for proc, pid in zip(listed, [*pids, gone], strict=False):
        proc.pid = pid
    server.owner_of = None  # no simulated table: process_table_for falls back to psutil
    return server


def shared_table(monkeypatch, shown: ShownProc, **options) -> PsutilProcessTable:
    """The process-wide table replaced, for this test, by one that reads ``shown``."""
    table = fresh_table(shown, user_names=owners._USER_NAMES, **options)
    monkeypatch.setattr(owners, "_SHARED", table)
    assert owners.shared_psutil_table() is table
    return table


def test_status_refreshes_share_the_psutil_cache(children, monkeypatch, shown):
    procs = children(6, "status")
    gone = children(1, "gone")[0]
    gone.kill()
    gone.wait(timeout=10)
    server = real_pid_server([p.pid for p in procs], gone.pid)
    session = Session(nvml=Nvml(lib=server), env={})
    shared_table(monkeypatch, shown)  # remembers young processes: the sleepers are young
    first = status.build_report(session)
    assert shown.lookups()  # the first refresh reads the new processes
    shown.forget_reads()
    second = status.build_report(session)
    assert shown.lookups() == []  # the second: all from the shared table
    assert second["gpus"] == first["gpus"]
    rows = {p["pid"]: p for g in second["gpus"] for p in g["processes"]}
    assert all(
        rows[p.pid]["user"] == ME and f"status-{i}" in rows[p.pid]["command"] for i, p in enumerate(procs)
    )
    assert rows[gone.pid]["alive"] is False and rows[gone.pid]["whose"] == "unknown"
    assert rows[os.getpid()]["whose"] == "this kernel"


@pytest.mark.skipif(not LINUX_PROC, reason="a /proc detail")
def test_a_process_name_with_spaces_and_parentheses_is_parsed(children):
    script = (
        "import ctypes, sys, time; "
        "ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); "  # PR_SET_NAME
        "print('ready', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        stat = parse_stat(PROC.read(proc.pid, "stat", 4096))
        assert stat is not None and stat.name == b"a) b (c" and stat.state in (b"S", b"R")
        assert stat.ppid == os.getpid() and 0 < stat.start <= PROC.since_boot_s() * PROC.ticks_per_s()
        found = fresh_table().lookup(proc.pid)
        assert found.alive and found.user == ME and "prctl(15" in found.command
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


# -- errors psutil does not translate (issue 17, item 5) ---------------------------------------------
ODD_ERRORS = [
    OSError(5, "Input/output error"),
    OSError(22, "Invalid argument"),
    ValueError("invalid literal for int() with base 10: '\x1b[2J'"),
    RuntimeError("psutil internal error"),
    PermissionError(1, "Operation not permitted"),
]


class _OddProcess:
    """A psutil.Process whose ``where`` raises ``error``; everything else answers."""

    def __init__(self, real, where, error):
        self._real, self._where, self._error = real, where, error

    def __getattr__(self, name):
        if name == self._where:
            raise self._error
        return getattr(self._real, name)


def assert_a_note_on_that_process_only(details: ProcessDetails, table: PsutilProcessTable) -> None:
    assert details.alive and details.note, details
    assert "\x1b" not in details.note and "\n" not in details.note
    other = table.lookup(os.getpid())  # one odd process does not spoil the others
    assert other.user is not None and other.note is None


ERROR_IDS = {"ids": lambda e: type(e).__name__ + str(getattr(e, "errno", "") or "")}


@pytest.mark.parametrize("error", ODD_ERRORS, **ERROR_IDS)
@pytest.mark.parametrize("where", ["Process", "cmdline", "uids", "oneshot"])
def test_an_error_psutil_does_not_translate_is_a_note_on_that_process(children, monkeypatch, where, error):
    """Where there is no /proc (macOS, Windows, the BSDs: ``proc=None``), psutil reads everything."""
    [child] = children(1)
    real_process = psutil.Process

    def odd_process(pid):
        if where == "Process" and pid == child.pid:
            raise error
        proc = real_process(pid)
        return _OddProcess(proc, where, error) if pid == child.pid else proc

    monkeypatch.setattr(psutil, "Process", odd_process)
    table = PsutilProcessTable(min_age_s=0, proc=None)
    assert_a_note_on_that_process_only(table.lookup(child.pid), table)


@pytest.mark.skipif(not LINUX_PROC, reason="makes reads of /proc fail")
@pytest.mark.parametrize("error", ODD_ERRORS, **ERROR_IDS)
@pytest.mark.parametrize("where", ["status", "cmdline"])
def test_an_odd_error_reading_proc_is_a_note_on_that_process(children, shown, where, error):
    [child] = children(1)
    shown.files[(child.pid, where)] = error
    table = fresh_table(shown)
    details = table.lookup(child.pid)
    assert_a_note_on_that_process_only(details, table)
    assert (details.user is None) == (where == "status") and details.command is None


# -- an unchanged listing is answered without reading /proc (issue: 37% of a warm refresh) -----------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def listing_table(shown):
    """A fresh table on a fake clock, reading ``shown`` (its identity reads and look-ups counted)."""
    clock = FakeClock()
    return fresh_table(shown, clock=clock), clock


def test_an_unchanged_listing_is_answered_from_memory_without_reading_proc(children, shown, listing_table):
    table, _clock = listing_table
    pids = [p.pid for p in children(3, "listed")]
    first = table.lookup_listing(("gpu", 0), pids)
    assert [d.user for d in first] == [ME] * 3 and all(
        f"listed-{i}" in d.command for i, d in enumerate(first)
    )
    assert shown.lookups() == pids and set(shown.identities()) == set(pids)
    shown.forget_reads()
    for _ in range(3):
        assert table.lookup_listing(("gpu", 0), list(reversed(pids))) == list(
            reversed(first)
        )  # order: NVML's
    assert shown.reads == []  # no file of /proc opened


def test_a_changed_listing_is_validated(children, shown, listing_table):
    table, _clock = listing_table
    a, b, c = (p.pid for p in children(3, "changing"))
    table.lookup_listing(0, [a, b])
    shown.forget_reads()
    table.lookup_listing(0, [a, b, c])  # a pid added: every pid's identity read, only the new one looked up
    assert sorted(shown.identities()) == sorted([a, b, c]) and shown.lookups() == [c]
    assert shown.looks == [c]  # c: never remembered, so its identity is read in the one look at it
    shown.forget_reads()
    table.lookup_listing(0, [a, c])  # a pid gone
    assert sorted(shown.identities()) == sorted([a, c]) and shown.lookups() == []
    shown.forget_reads()
    table.lookup_listing(0, [a, c])  # unchanged again
    assert shown.identities() == []


def test_each_listing_is_compared_with_its_own_last(children, shown, listing_table):
    table, _clock = listing_table
    pids = [p.pid for p in children(2, "keys")]
    table.lookup_listing(("gpu", 0, "GPU-a"), pids)
    shown.forget_reads()
    table.lookup_listing(("gpu", 1, "GPU-b"), pids)  # the same pids, first seen on this GPU: validated
    assert sorted(shown.identities()) == sorted(pids)
    shown.forget_reads()
    table.lookup_listing(("gpu", 0, "GPU-a"), pids), table.lookup_listing(("gpu", 1, "GPU-b"), pids)
    assert shown.identities() == []


def test_an_unchanged_listing_is_validated_again_once_the_bound_passes(children, shown, listing_table):
    table, clock = listing_table
    pids = [p.pid for p in children(2, "bound")]
    table.lookup_listing(0, pids)
    shown.forget_reads()
    clock.now += owners.LISTING_TRUST_S - 0.5
    table.lookup_listing(0, pids)
    assert shown.identities() == []
    clock.now += 0.5  # LISTING_TRUST_S since the last read
    table.lookup_listing(0, pids)
    assert (
        sorted(shown.identities()) == sorted(pids) and shown.lookups() == []
    )  # the same processes: read, not looked up
    shown.forget_reads()
    clock.now += owners.LISTING_TRUST_S - 0.5  # trusted again, counted from this last read
    table.lookup_listing(0, pids)
    assert shown.identities() == []


def show_someone_elses_job(shown: ShownProc, pid: int) -> None:
    """``pid`` taken by a new process: a later start time, root's, another command line."""
    shown.show(pid, shown.start_of(pid) + 1, b"python", 0, b"python someone_elses_job.py")


def test_a_reused_pid_in_a_changed_listing_is_read_again(children, shown, listing_table):
    table, _clock = listing_table
    old, other = (p.pid for p in children(2, "reused"))
    assert table.lookup_listing(0, [old])[0].user == ME
    show_someone_elses_job(shown, old)
    found = table.lookup_listing(0, [old, other])  # the listing changed: the new process is seen
    assert found[0] == SOMEONE_ELSES_JOB and found[1].user == ME


def test_a_reused_pid_in_an_unchanged_listing_is_trusted_at_most_the_bound(children, shown, listing_table):
    """The accepted risk, bounded: exit, pid reuse and a new GPU context between two refreshes."""
    table, clock = listing_table
    (pid,) = (p.pid for p in children(1, "bounded-risk"))
    first = table.lookup_listing(0, [pid])[0]
    show_someone_elses_job(shown, pid)
    assert table.lookup_listing(0, [pid]) == [first]
    clock.now += owners.LISTING_TRUST_S
    assert table.lookup_listing(0, [pid]) == [SOMEONE_ELSES_JOB]
    shown.files[(pid, "stat")] = stat_line(pid, b"python", shown.start_of(pid) + 2)  # a third process
    assert table.lookup(pid) == SOMEONE_ELSES_JOB  # a single look-up always reads the identity
    assert shown.lookups()[-1] == pid  # and read the new process's details


def test_an_exited_process_in_an_unchanged_listing_is_reported_exited_every_time(
    children, shown, listing_table
):
    table, _clock = listing_table
    alive, gone = children(2, "exiting")
    gone.kill()
    gone.wait(timeout=10)
    pids = [alive.pid, gone.pid]
    for _ in range(3):
        shown.forget_reads()
        found = table.lookup_listing(0, pids)
        assert found[0].alive and found[1] == EXITED
    assert shown.identities() == [gone.pid]  # never remembered: read every time


def test_a_process_that_exits_is_seen_once_its_listing_changes(children, listing_table):
    table, _clock = listing_table
    stays, leaves = children(2, "leaves")
    table.lookup_listing(0, [stays.pid, leaves.pid])
    leaves.kill()
    leaves.wait(timeout=10)
    assert table.lookup_listing(0, [stays.pid, leaves.pid])[1].alive  # NVML lists it still: trusted, bounded
    assert table.lookup_listing(0, [stays.pid])[0].alive  # NVML dropped it
    assert table.lookup_listing(0, [stays.pid, leaves.pid])[1] == EXITED  # listed again: read, and exited
    assert table.cache_size() == 1


def test_a_process_never_remembered_is_looked_up_in_an_unchanged_listing(children, shown):
    table = fresh_table(shown, clock=FakeClock(), min_age_s=30.0)
    (child,) = children(1, "young-listed")  # still starting: never remembered
    for _ in range(3):
        assert table.lookup_listing(0, [child.pid])[0].user == ME
    assert shown.lookups() == [child.pid] * 3 and table.cache_size() == 0


def test_a_listing_stored_by_another_thread_meanwhile_is_not_trusted(children, shown, listing_table):
    table, _clock = listing_table
    a, b = (p.pid for p in children(2, "racing"))
    table.lookup_listing(0, [a, b])
    raced: list[bool] = []

    def race(pid: int, name: str) -> None:  # while this call validates [a], another thread lists [a, b]
        if name == "stat" and not raced:
            raced.append(True)
            table.lookup_listing(0, [a, b])

    shown.before_read = race
    table.lookup_listing(0, [a])
    assert raced
    shown.before_read = None
    shown.forget_reads()
    table.lookup_listing(0, [a])  # which of the two listings is newer is unknown: validated
    assert shown.identities() == [a]


def test_threads_listing_at_once_get_consistent_answers(children):
    procs = children(5, "threads-listing")
    pids = [p.pid for p in procs] + [os.getpid()]
    table = fresh_table(max_processes=4)  # smaller than the pids: eviction races listings
    expected = {pid: fresh_table().lookup(pid) for pid in pids}
    wrong: list[tuple[int, ProcessDetails]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def work(offset: int) -> None:
        try:
            start.wait()
            for n in range(150):
                listed = pids[: 2 + (n + offset) % (len(pids) - 1)]  # listings that grow and shrink
                for pid, found in zip(listed, table.lookup_listing(n % 2, listed), strict=False):
                    if found != expected[pid]:
                        wrong.append((pid, found))
        except BaseException as err:
            errors.append(err)

    run_in_threads(work, 6)
    assert not errors and not wrong
    assert table.cache_size() <= 4


def test_tables_without_lookup_listing_are_asked_per_pid():
    class Minimal:  # a table as the protocol's oldest form: lookup and current_user only
        def __init__(self) -> None:
            self.asked: list[int] = []

        def lookup(self, pid: int) -> ProcessDetails:
            self.asked.append(pid)
            return ProcessDetails("u", f"cmd {pid}", True)

        def current_user(self) -> str:
            return "u"

    table = Minimal()
    assert [d.command for d in owners.lookup_listing(table, 0, [5, 6])] == ["cmd 5", "cmd 6"]
    assert owners.lookup_listing(table, 0, [5, 6]) and table.asked == [5, 6, 5, 6]


def test_warm_status_refreshes_read_proc_only_for_what_is_never_remembered(children, monkeypatch, shown):
    procs = children(6, "warm")
    gone = children(1, "warm-gone")[0]
    gone.kill()
    gone.wait(timeout=10)
    server = real_pid_server([p.pid for p in procs], gone.pid)
    session = Session(nvml=Nvml(lib=server), env={})
    shared_table(monkeypatch, shown, clock=FakeClock())  # no real time passes between the refreshes
    first = status.build_report(session)
    shown.forget_reads()
    second = status.build_report(session)
    assert second["gpus"] == first["gpus"]
    rows = [p for g in second["gpus"] for p in g["processes"]]
    exited = sorted(p["pid"] for p in rows if not p["alive"])  # gone, and the busy server's made-up pids
    assert gone.pid in exited and len(exited) < len(rows)
    assert sorted(shown.identities()) == exited and shown.lookups() == []  # only what is never remembered


def test_the_forked_child_can_list_though_a_thread_held_the_lock_at_fork():
    shared = owners.shared_psutil_table()
    to_parent, from_child = os.pipe()
    with shared._lock:  # as if another thread were inside the table when the kernel forks
        pid = os.fork()
        if pid == 0:  # child: its at-fork hook gave the table a new lock
            try:
                found = shared.lookup_listing(("fork-test",), [os.getpid()])
                os.write(from_child, b"1" if found[0].alive else b"0")
            finally:
                os._exit(0)
    try:
        assert os.read(to_parent, 1) == b"1"
    finally:
        os.close(to_parent), os.close(from_child)
        os.waitpid(pid, 0)


def run_in_threads(work, count: int) -> None:
    """``work(i)`` on ``count`` threads at once; returns when all have ended (60 s at most each)."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


# -- what /proc says, parsed in one place --------------------------------------------------------------
def test_stat_and_status_lines_that_are_not_the_format_read_as_unknown():
    assert parse_stat(stat_line(7, b"x) (y", 1234, b"Z")) == Stat(b"Z", 1, 1234, b"x) (y")
    assert parse_stat(b"7 (python) S 1 2 3") is None  # fields missing
    assert parse_stat(stat_line(7, b"python", 1234).replace(b" 1234 ", b" 12x4 ")) is None
    assert parse_stat(b"7 python S " + b"0 " * 30) is None  # no name in parentheses
    assert parse_status(b"Name:\tpython\nState:\tS (sleeping)\nUid:\t1\t2\t3\t4\n") == Status(
        b"python", b"S", (1, 2, 3, 4)
    )
    assert parse_status(b"Uid:\t1\tx\t3\t4\nState:\n") == Status(None, None, None)
    assert parse_status(b"") == Status(None, None, None)
    # Read up to the last of the three lines, as the kernel orders them: what follows is not read.
    after = b"Name:\tpython\nState:\tS (sleeping)\nUid:\t1\t2\t3\t4\nName:\tother\nUid:\t0\t0\t0\t0\n"
    assert parse_status(after) == Status(b"python", b"S", (1, 2, 3, 4))


@pytest.mark.skipif(not LINUX_PROC, reason="shows the table a /proc file it cannot parse")
def test_a_stat_file_that_cannot_be_parsed_is_never_cached(children, shown):
    (child,) = children(1, "odd-stat")
    table = fresh_table(shown)
    shown.files[(child.pid, "stat")] = b"not a stat line"
    for _ in range(2):
        found = table.lookup(child.pid)
        assert found.alive and found.user == ME and "odd-stat-0" in found.command
    assert shown.lookups() == [child.pid] * 2 and table.cache_size() == 0


# A status file's lines as the kernel writes them: "Key:\tvalue", one per line; what a line holds
# after its key is any bytes but a newline (the kernel escapes one in a process name).
STATUS_KEYS = [b"Name", b"Umask", b"State", b"Tgid", b"Uid", b"Gid", b"VmRSS", b"Uid ", b" Uid", b"uid"]
status_values = st.one_of(
    st.binary(max_size=24),
    st.lists(
        st.sampled_from([b"0", b"1000", b"-1", b"x", b"4294967295", b"1_0", b"\xd9\xa1"]), max_size=5
    ).map(b"\t".join),
    st.sampled_from([b"\tS (sleeping)", b"\tZ (zombie)", b"\t", b"\tpython3", b"\t\x1b[2Jx) (y"]),
).map(lambda value: value.replace(b"\n", b" "))
status_files = st.lists(st.tuples(st.sampled_from(STATUS_KEYS), status_values), max_size=12).map(
    lambda lines: b"\n".join(key + b":" + value for key, value in lines)
)


def status_by_lines(data: bytes) -> Status:
    """What ``parse_status`` must say, the plain way: each key's first line, split at its colon."""
    first: dict[bytes, bytes] = {}
    for line in data.split(b"\n"):
        key, colon, value = line.partition(b":")
        if colon:
            first.setdefault(key, value)
    uids: tuple[int, ...] | None = None
    if b"Uid" in first:
        try:
            uids = tuple(int(u) for u in first[b"Uid"].split()[:4]) or None
        except ValueError:
            uids = None
    state = first.get(b"State", b"").split()
    name = first.get(b"Name")
    return Status(None if name is None else name.strip(), state[0] if state else None, uids)


@given(status_files)
def test_a_status_file_is_parsed_as_its_first_name_state_and_uid_lines(data):
    assert parse_status(data) == status_by_lines(data)
    assert parse_status(data + b"\n") == status_by_lines(data)  # the kernel ends the file with a newline


@given(st.binary(max_size=300))
def test_any_bytes_parse_as_a_status_or_nothing_without_an_error(data):
    found = parse_status(data)
    assert found.uids is None or all(isinstance(u, int) for u in found.uids)
    assert parse_status(b"Name:\tx\n" + data.replace(b"\n", b" ")).name == b"x"


def test_a_process_name_cannot_start_a_status_line_of_its_own(children):
    """The kernel escapes a newline in the name ("\\n"), so a name cannot forge the Uid line."""
    if not LINUX_PROC:
        pytest.skip("reads /proc")
    script = (
        "import ctypes, sys, time; "
        "ctypes.CDLL(None).prctl(15, b'x\\nUid:\\t4242', 0, 0, 0); "  # PR_SET_NAME
        "print('ready', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        found = parse_status(PROC.read(proc.pid, "status", STATUS_BYTES))
        assert found.uids is not None and found.uids[0] == os.getuid() != 4242
        assert found.name is not None and found.name.startswith(b"x\\nUid:")  # escaped, on its own line
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


# -- one look at a process: its files read under one descriptor of its directory ---------------------
LOOK = [("status", STATUS_BYTES), ("cmdline", owners.CMDLINE_READ_BYTES + 1), ("stat", STAT_BYTES)]


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_one_look_reads_what_separate_reads_read(children):
    (child,) = children(1, "looked-at")
    status_data, cmdline, stat = PROC.read_files(child.pid, LOOK)
    assert cmdline == PROC.read(child.pid, "cmdline", 4097) and b"looked-at-0" in cmdline
    assert parse_stat(stat) == parse_stat(PROC.read(child.pid, "stat", STAT_BYTES))
    assert parse_status(status_data).uids == parse_status(PROC.read(child.pid, "status", STATUS_BYTES)).uids
    assert isinstance(PROC.read_files(child.pid, [("no-such-file", 10)])[0], FileNotFoundError)
    child.kill()
    child.wait(timeout=10)
    with pytest.raises(FileNotFoundError):
        PROC.read_files(child.pid, LOOK)


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_a_descriptor_of_a_process_reads_nothing_once_that_process_has_ended(children):
    """The descriptor holds the process, not its number: after the process ends (here: reaped),
    nothing is read through it, whatever later has the pid."""
    (child,) = children(1, "held")
    directory = PROC.open_process(child.pid)
    try:
        assert b"held-0" in PROC.read_in(directory, "cmdline", 4097)
        child.kill()
        child.wait(timeout=10)
        for name in ("stat", "status", "cmdline"):
            with pytest.raises((ProcessLookupError, FileNotFoundError)):
                PROC.read_in(directory, name, 4096)
    finally:
        os.close(directory)


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_a_process_first_seen_as_a_zombie_is_exited(children):
    (child,) = children(1, "first-seen-dead")
    os.kill(child.pid, signal.SIGKILL)  # not reaped: a zombie until teardown waits for it
    deadline = time.monotonic() + 10
    while state_of(child.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    table = fresh_table()
    assert table.lookup(child.pid) == EXITED and table.cache_size() == 0


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_one_look_says_what_psutil_says(children):
    """Owner and command of a process never seen, as psutil (which nvitop and gpustat use) reads them."""
    procs = children(3, "as-psutil")
    for pid in [os.getpid(), *(p.pid for p in procs)]:
        identity, found = owners._proc_look(pid)
        real = psutil.Process(pid)
        assert found == ProcessDetails(pwd.getpwuid(real.uids().real).pw_name, " ".join(real.cmdline()), True)
        assert identity == owners.stat_identity(pid)


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc")
def test_a_process_without_a_command_line_shows_its_name():
    """A kernel thread has no command line: its name (from status) is its command, as psutil shows it."""
    threads = [pid for pid in PROC.pids() if pid != 1 and _cmdline_is_empty(pid)]
    if not threads:
        pytest.skip("no process without a command line here (no kernel threads in this pid namespace)")
    pid = threads[0]
    found = fresh_table().lookup(pid)
    name = parse_status(PROC.read(pid, "status", STATUS_BYTES)).name
    assert found.alive and found.command == os.fsdecode(name) and found.command == psutil.Process(pid).name()


def _cmdline_is_empty(pid: int) -> bool:
    try:
        return PROC.read(pid, "cmdline", 1) == b""
    except OSError:
        return False


class ChunkedFile:
    """A /proc file as ``os.read`` hands it out: whole (seq_file: ``stat``, ``status``), or a page
    at a time (``cmdline`` on older kernels); counts the reads."""

    def __init__(self, content: bytes, by_pages: bool) -> None:
        self.content, self.by_pages, self.at, self.reads = content, by_pages, 0, 0

    def read(self, _fd: int, asked: int) -> bytes:
        self.reads += 1
        size = min(asked, process_table._PAGE) if self.by_pages else asked
        chunk = self.content[self.at : self.at + size]
        self.at += len(chunk)
        return chunk


@given(
    st.integers(0, 3 * 4096 + 2),
    st.sampled_from([STAT_BYTES, owners.CMDLINE_READ_BYTES + 1, STATUS_BYTES]),
    st.booleans(),
)
def test_a_proc_file_is_read_whole_up_to_its_limit_with_no_read_past_its_end(length, limit, by_pages):
    file = ChunkedFile(bytes(range(256)) * (length // 256 + 1), by_pages)
    file.content = file.content[:length]
    read = process_table._read_rest(0, file.read(0, limit), limit, read=file.read)
    assert read == file.content[:limit]
    whole_pages = min(length, limit) // process_table._PAGE
    # One read per page handed out, and one more only where the last was a whole page short of the limit.
    assert file.reads <= whole_pages + 1 + (min(length, limit) % process_table._PAGE == 0)
    if not by_pages and 0 < length < limit and length % process_table._PAGE:
        assert file.reads == 1  # a file handed out whole is read once: no read to find its end
