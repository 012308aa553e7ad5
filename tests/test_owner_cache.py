"""The psutil process table remembers owners between refreshes, and never answers wrongly from memory.

Real child processes (sleepers this test starts and ends) stand for the GPU processes; where
the operating system cannot be made to do something (reuse a pid, refuse a read to root), the
table's identity read or psutil is monkeypatched.  No timing assertions.
"""

from __future__ import annotations

import getpass
import os
import pwd
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tfgpu_magic.gpus import owners
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.owners import EXITED, ProcessDetails, PsutilProcessTable
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


def fresh_table(**options) -> PsutilProcessTable:
    """A table that remembers even the sleepers started a moment ago (see the start-up test below)."""
    return PsutilProcessTable(min_age_s=0, **options)


def counting_reads(table: PsutilProcessTable, monkeypatch) -> list[int]:
    """Record every uncached look-up the table makes (by pid)."""
    reads: list[int] = []
    real = table._read

    def read(pid: int) -> ProcessDetails:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(table, "_read", read)
    return reads


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2 :].split()[0].decode()


# -- answers come from memory only for the same process -------------------------------------------
def test_a_live_process_is_read_once_then_remembered(children, monkeypatch):
    (child,) = children(1, "remembered")
    table = fresh_table()
    reads = counting_reads(table, monkeypatch)
    first = table.lookup(child.pid)
    assert (first.user, first.alive, first.note) == (ME, True, None)
    assert "remembered-0" in first.command
    for _ in range(3):
        assert table.lookup(child.pid) == first
    assert reads == [child.pid]
    assert table.cache_size() == 1


def test_a_reused_pid_gets_the_new_processes_owner_and_command(children, monkeypatch):
    (child,) = children(1, "old")
    table = fresh_table()
    old = table.lookup(child.pid)
    assert old.user == ME and "old-0" in old.command
    real_identity = table._identity(child.pid)
    if LINUX_PROC:
        start, name = real_identity
        reused = (start + b"1", name)  # the same pid, started later: a new process
    else:
        reused = real_identity + 1.0
    new = ProcessDetails("newcomer", "python someone_elses_job.py", True)
    reads: list[int] = []
    monkeypatch.setattr(table, "_identity", lambda pid: reused if pid == child.pid else real_identity)
    monkeypatch.setattr(table, "_read", lambda pid: reads.append(pid) or new)
    assert table.lookup(child.pid) == new
    assert table.lookup(child.pid) == new  # and the new answer is the one remembered
    assert reads == [child.pid]


@pytest.mark.skipif(not LINUX_PROC, reason="the process name is part of the identity only with /proc")
def test_a_process_that_execs_another_program_is_read_again(children, monkeypatch):
    (child,) = children(1, "before-exec")
    table = fresh_table()
    assert "before-exec" in table.lookup(child.pid).command
    start, _name = table._identity(child.pid)
    after = ProcessDetails(ME, "bash run.sh", True)
    monkeypatch.setattr(table, "_identity", lambda pid: (start, b"bash"))  # same start time, new program
    monkeypatch.setattr(table, "_read", lambda pid: after)
    assert table.lookup(child.pid) == after


def test_a_process_still_starting_is_read_every_time_until_it_is_a_second_old(children, monkeypatch):
    (child,) = children(1, "young")
    table = PsutilProcessTable()  # the default: remember processes a second old or older
    assert 0 <= table._age_s(table._identity(child.pid)) < 30
    assert table._age_s(table._identity(os.getpid())) >= 0
    reads = counting_reads(table, monkeypatch)
    monkeypatch.setattr(table, "_age_s", lambda identity: 0.2)  # as if fork or exec just happened
    table.lookup(child.pid), table.lookup(child.pid)
    assert reads == [child.pid, child.pid] and table.cache_size() == 0
    monkeypatch.setattr(table, "_age_s", lambda identity: owners.MIN_AGE_S)
    table.lookup(child.pid), table.lookup(child.pid)
    assert reads == [child.pid] * 3 and table.cache_size() == 1


def test_an_exited_process_is_reported_exited_and_forgotten(children, monkeypatch):
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


# -- failures stay notes, asked again next time -------------------------------------------------
def test_access_denied_is_a_note_and_never_remembered(children, monkeypatch):
    (child,) = children(1, "secret")
    table = fresh_table()
    reads = counting_reads(table, monkeypatch)

    def refuse(*args):
        raise psutil.AccessDenied(child.pid)

    with monkeypatch.context() as patch:
        patch.setattr(table, "_user_of", refuse)  # psutil refuses the owner (uids, username)
        for _ in range(2):
            denied = table.lookup(child.pid)
            assert (denied.user, denied.alive) == (None, True)
            assert denied.note == "owned by a user whose details this account may not read"
    with monkeypatch.context() as patch:
        patch.setattr(psutil.Process, "cmdline", refuse)  # the owner is read, the command refused:
        patch.setattr(
            owners, "_read_cmdline", refuse
        )  # by psutil, or by the table's own bounded read (Linux)
        half = table.lookup(child.pid)
        assert (half.user, half.command, half.note) == (
            ME,
            None,
            "owned by a user whose details this account may not read",
        )
    assert table.cache_size() == 0
    allowed = table.lookup(child.pid)  # the refusal ends: read now, not the old note
    assert (allowed.user, allowed.note) == (ME, None) and "secret-0" in allowed.command
    assert table.lookup(child.pid) == allowed
    assert reads == [child.pid] * 4


def test_an_unreadable_identity_is_never_cached(children, monkeypatch):
    (child,) = children(1, "hidden")
    table = fresh_table()
    reads = counting_reads(table, monkeypatch)
    monkeypatch.setattr(table, "_identity", lambda pid: owners._UNKNOWN)  # hidepid, no /proc, ...
    for _ in range(2):
        assert table.lookup(child.pid).user == ME
    assert reads == [child.pid, child.pid] and table.cache_size() == 0


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
def test_the_cache_is_bounded_least_recently_looked_up_first(children, monkeypatch):
    procs = children(5, "bounded")
    table = fresh_table(max_processes=3)
    reads = counting_reads(table, monkeypatch)
    for p in procs:
        table.lookup(p.pid)
    assert table.cache_size() == 3
    reads.clear()
    for p in procs[2:]:  # the three most recent are remembered
        table.lookup(p.pid)
    assert reads == []
    table.lookup(procs[0].pid)  # forgotten: read again, and the least recent of the rest goes
    assert reads == [procs[0].pid] and table.cache_size() == 3


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


def test_status_refreshes_share_the_psutil_cache(children, monkeypatch):
    procs = children(6, "status")
    gone = children(1, "gone")[0]
    gone.kill()
    gone.wait(timeout=10)
    server = real_pid_server([p.pid for p in procs], gone.pid)
    session = Session(nvml=Nvml(lib=server), env={})
    shared = owners.shared_psutil_table()
    monkeypatch.setattr(shared, "_min_age_s", 0)  # the sleepers are young
    reads = counting_reads(shared, monkeypatch)
    first = status.build_report(session)
    assert reads  # the first refresh reads the new processes
    reads.clear()
    second = status.build_report(session)
    assert reads == []  # the second: all from the shared table
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
        identity = owners._stat_identity(proc.pid)
        assert identity[1] == b"a) b (c"
        assert int(identity[0]) == int(owners._stat_identity(proc.pid)[0])
        assert fresh_table().lookup(proc.pid).alive
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


@pytest.mark.parametrize(
    "error", ODD_ERRORS, ids=lambda e: type(e).__name__ + str(getattr(e, "errno", "") or "")
)
@pytest.mark.parametrize("where", ["Process", "cmdline", "uids", "oneshot"])
def test_an_error_psutil_does_not_translate_is_a_note_on_that_process(children, monkeypatch, where, error):
    [child] = children(1)
    real_process = psutil.Process

    def odd_process(pid):
        if where == "Process" and pid == child.pid:
            raise error
        proc = real_process(pid)
        return _OddProcess(proc, where, error) if pid == child.pid else proc

    monkeypatch.setattr(psutil, "Process", odd_process)
    if where == "cmdline":  # on Linux the table reads /proc/PID/cmdline itself (a bounded read), not psutil
        real_read = owners._read_cmdline

        def odd_read(pid):
            if pid == child.pid:
                raise error
            return real_read(pid)

        monkeypatch.setattr(owners, "_read_cmdline", odd_read)
    details = fresh_table().lookup(child.pid)
    assert details.alive and details.note, details
    assert "\x1b" not in details.note and "\n" not in details.note
    other = fresh_table().lookup(os.getpid())  # one odd process does not spoil the others
    assert other.user is not None and other.note is None


# -- an unchanged listing is answered without reading /proc (issue: 37% of a warm refresh) -----------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counting_identities(table: PsutilProcessTable, monkeypatch) -> list[int]:
    """Record every identity read (one small read of /proc/<pid>/stat on Linux) by pid."""
    reads: list[int] = []
    real = table._identity

    def identity(pid: int) -> object:
        reads.append(pid)
        return real(pid)

    monkeypatch.setattr(table, "_identity", identity)
    return reads


@pytest.fixture
def listing_table(monkeypatch):
    """A fresh table on a fake clock, with its identity reads and uncached look-ups counted."""
    clock = FakeClock()
    table = fresh_table(clock=clock)
    return table, clock, counting_identities(table, monkeypatch), counting_reads(table, monkeypatch)


def test_an_unchanged_listing_is_answered_from_memory_without_reading_proc(children, listing_table):
    table, _clock, identities, reads = listing_table
    pids = [p.pid for p in children(3, "listed")]
    first = table.lookup_listing(("gpu", 0), pids)
    assert [d.user for d in first] == [ME] * 3 and all(
        f"listed-{i}" in d.command for i, d in enumerate(first)
    )
    assert reads == pids and set(identities) == set(pids)
    identities.clear(), reads.clear()
    for _ in range(3):
        assert table.lookup_listing(("gpu", 0), list(reversed(pids))) == list(
            reversed(first)
        )  # order: NVML's
    assert identities == [] and reads == []


@pytest.mark.skipif(not LINUX_PROC, reason="counts the reads of /proc/<pid>/stat")
def test_a_warm_unchanged_listing_opens_no_proc_file(children, monkeypatch):
    table = fresh_table(clock=FakeClock())
    pids = [p.pid for p in children(2, "opened")]
    table.lookup_listing(0, pids)
    opened: list[int] = []
    real = owners._read_stat
    monkeypatch.setattr(owners, "_read_stat", lambda pid: opened.append(pid) or real(pid))
    table.lookup_listing(0, pids)
    assert opened == []
    table.lookup_listing(0, pids[:1])  # changed: read again
    assert opened == pids[:1]


def test_a_changed_listing_is_validated(children, listing_table):
    table, _clock, identities, reads = listing_table
    a, b, c = (p.pid for p in children(3, "changing"))
    table.lookup_listing(0, [a, b])
    identities.clear(), reads.clear()
    table.lookup_listing(0, [a, b, c])  # a pid added: every pid's identity read, only the new one looked up
    assert sorted(identities) == sorted([a, b, c, c]) and reads == [c]  # c: before and after its look-up
    identities.clear(), reads.clear()
    table.lookup_listing(0, [a, c])  # a pid gone
    assert sorted(identities) == sorted([a, c]) and reads == []
    identities.clear()
    table.lookup_listing(0, [a, c])  # unchanged again
    assert identities == []


def test_each_listing_is_compared_with_its_own_last(children, listing_table):
    table, _clock, identities, _reads = listing_table
    pids = [p.pid for p in children(2, "keys")]
    table.lookup_listing(("gpu", 0, "GPU-a"), pids)
    identities.clear()
    table.lookup_listing(("gpu", 1, "GPU-b"), pids)  # the same pids, first seen on this GPU: validated
    assert sorted(identities) == sorted(pids)
    identities.clear()
    table.lookup_listing(("gpu", 0, "GPU-a"), pids), table.lookup_listing(("gpu", 1, "GPU-b"), pids)
    assert identities == []


def test_an_unchanged_listing_is_validated_again_once_the_bound_passes(children, listing_table):
    table, clock, identities, reads = listing_table
    pids = [p.pid for p in children(2, "bound")]
    table.lookup_listing(0, pids)
    identities.clear(), reads.clear()
    clock.now += owners.LISTING_TRUST_S - 0.5
    table.lookup_listing(0, pids)
    assert identities == []
    clock.now += 0.5  # LISTING_TRUST_S since the last read
    table.lookup_listing(0, pids)
    assert sorted(identities) == sorted(pids) and reads == []  # the same processes: read, not looked up
    identities.clear()
    clock.now += owners.LISTING_TRUST_S - 0.5  # trusted again, counted from this last read
    table.lookup_listing(0, pids)
    assert identities == []


def reused_identity(table: PsutilProcessTable, pid: int) -> object:
    """``pid``'s identity as if a new process had taken the pid."""
    real = table._identity(pid)
    if LINUX_PROC:
        return (real[0] + b"1", real[1])
    return real + 1.0


def test_a_reused_pid_in_a_changed_listing_is_read_again(children, listing_table, monkeypatch):
    table, _clock, _identities, _reads = listing_table
    old, other = (p.pid for p in children(2, "reused"))
    assert table.lookup_listing(0, [old])[0].user == ME
    reused = reused_identity(table, old)
    real = table._identity
    new = ProcessDetails("newcomer", "python someone_elses_job.py", True)
    monkeypatch.setattr(table, "_identity", lambda pid: reused if pid == old else real(pid))
    monkeypatch.setattr(table, "_read", lambda pid: new if pid == old else ProcessDetails(ME, "other", True))
    assert table.lookup_listing(0, [old, other])[0] == new  # the listing changed: the new process is seen


def test_a_reused_pid_in_an_unchanged_listing_is_trusted_at_most_the_bound(
    children, listing_table, monkeypatch
):
    """The accepted risk, bounded: exit, pid reuse and a new GPU context between two refreshes."""
    table, clock, _identities, _reads = listing_table
    (pid,) = (p.pid for p in children(1, "bounded-risk"))
    first = table.lookup_listing(0, [pid])[0]
    reused = reused_identity(table, pid)
    new = ProcessDetails("newcomer", "python someone_elses_job.py", True)
    monkeypatch.setattr(table, "_identity", lambda p: reused)
    monkeypatch.setattr(table, "_read", lambda p: new)
    assert table.lookup_listing(0, [pid]) == [first]
    clock.now += owners.LISTING_TRUST_S
    assert table.lookup_listing(0, [pid]) == [new]
    assert table.lookup(pid) == new  # a single look-up always reads the identity


def test_an_exited_process_in_an_unchanged_listing_is_reported_exited_every_time(children, listing_table):
    table, _clock, identities, _reads = listing_table
    alive, gone = children(2, "exiting")
    gone.kill()
    gone.wait(timeout=10)
    pids = [alive.pid, gone.pid]
    for _ in range(3):
        identities.clear()
        found = table.lookup_listing(0, pids)
        assert found[0].alive and found[1] == EXITED
    assert identities == [gone.pid]  # never remembered: read every time


def test_a_process_that_exits_is_seen_once_its_listing_changes(children, listing_table):
    table, _clock, _identities, _reads = listing_table
    stays, leaves = children(2, "leaves")
    table.lookup_listing(0, [stays.pid, leaves.pid])
    leaves.kill()
    leaves.wait(timeout=10)
    assert table.lookup_listing(0, [stays.pid, leaves.pid])[1].alive  # NVML lists it still: trusted, bounded
    assert table.lookup_listing(0, [stays.pid])[0].alive  # NVML dropped it
    assert table.lookup_listing(0, [stays.pid, leaves.pid])[1] == EXITED  # listed again: read, and exited
    assert table.cache_size() == 1


def test_a_process_never_remembered_is_looked_up_in_an_unchanged_listing(
    children, listing_table, monkeypatch
):
    table, _clock, _identities, reads = listing_table
    (child,) = children(1, "young-listed")
    monkeypatch.setattr(table, "_min_age_s", 30.0)  # still starting: never remembered
    for _ in range(3):
        assert table.lookup_listing(0, [child.pid])[0].user == ME
    assert reads == [child.pid] * 3 and table.cache_size() == 0


def test_a_listing_stored_by_another_thread_meanwhile_is_not_trusted(children, listing_table, monkeypatch):
    table, _clock, identities, _reads = listing_table
    a, b = (p.pid for p in children(2, "racing"))
    table.lookup_listing(0, [a, b])
    counted = table._identity
    raced: list[bool] = []

    def identity(pid: int) -> object:  # while this call validates [a], another thread lists [a, b]
        if not raced:
            raced.append(True)
            table.lookup_listing(0, [a, b])
        return counted(pid)

    monkeypatch.setattr(table, "_identity", identity)
    table.lookup_listing(0, [a])
    assert raced
    monkeypatch.setattr(table, "_identity", counted)
    identities.clear()
    table.lookup_listing(0, [a])  # which of the two listings is newer is unknown: validated
    assert identities == [a]


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


def test_warm_status_refreshes_read_proc_only_for_what_is_never_remembered(children, monkeypatch):
    procs = children(6, "warm")
    gone = children(1, "warm-gone")[0]
    gone.kill()
    gone.wait(timeout=10)
    server = real_pid_server([p.pid for p in procs], gone.pid)
    session = Session(nvml=Nvml(lib=server), env={})
    shared = owners.shared_psutil_table()
    monkeypatch.setattr(shared, "_min_age_s", 0)  # the sleepers are young
    monkeypatch.setattr(shared, "_clock", FakeClock())  # no real time passes between the refreshes
    first = status.build_report(session)
    identities = counting_identities(shared, monkeypatch)
    reads = counting_reads(shared, monkeypatch)
    second = status.build_report(session)
    assert second["gpus"] == first["gpus"]
    rows = [p for g in second["gpus"] for p in g["processes"]]
    exited = sorted(p["pid"] for p in rows if not p["alive"])  # gone, and the busy server's made-up pids
    assert gone.pid in exited and len(exited) < len(rows)
    assert sorted(identities) == exited and reads == []  # only what is never remembered is read again


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
