"""Advisory per-GPU claims: flock files that live exactly as long as the claiming process."""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfgpu_magic.gpus import claims

ROOT = Path(__file__).resolve().parent.parent

# A separate process that claims KEY, says so, and holds the claim until stdin closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from tfgpu_magic.gpus import claims
    with claims.choosing():
        ok = claims.claim(sys.argv[1])
    print("claimed" if ok else "refused", flush=True)
    sys.stdin.read()
    """
)


def start_holder(key: str, script: str = HOLDER) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.readline().strip() == "claimed"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)
    proc.stdout.close()


def test_a_claim_is_held_once_and_released():
    with claims.choosing():
        assert claims.claim("GPU-aaa")
        assert claims.claim("GPU-aaa")  # again: still ours, no second lock
    assert claims.held() == {"GPU-aaa"}
    with claims.choosing(shared=True):
        found = claims.holder("GPU-aaa")
    assert found is not None and found.this_process and found.describe() == "this kernel"
    claims.release("GPU-aaa")
    assert claims.held() == set()
    assert claims.holders(["GPU-aaa"]) == {"GPU-aaa": None}


def my_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # no passwd entry (some containers)
        return f"uid {os.geteuid()}"


def claim_files(claim_dir: Path) -> list[Path]:
    return sorted(p for p in claim_dir.iterdir() if p.name != "tfgpu_magic-choose.lock")


def test_the_directory_is_shared_by_every_user_and_each_claim_file_by_its_owner(claim_dir):
    with claims.choosing():
        claims.claim("GPU-aaa")
    assert stat.S_IMODE(claim_dir.stat().st_mode) == 0o1777  # sticky and world-writable, like /tmp
    [mine] = claim_files(claim_dir)
    key, uid, pid, start, suffix = mine.name.split(".")  # named for the GPU and the claiming process
    assert (key, uid, pid, suffix) == ("GPU-aaa", str(os.geteuid()), str(os.getpid()), "lock")
    assert int(start) == process_start(os.getpid())
    info = mine.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o644)  # only its owner writes it
    assert mine.read_text() == f"pid={os.getpid()}\nkey=GPU-aaa\n"
    assert (
        stat.S_IMODE((claim_dir / "tfgpu_magic-choose.lock").stat().st_mode) == 0o644
    )  # flock needs no write access
    claims.release("GPU-aaa")
    assert claim_files(claim_dir) == []  # released: its file goes too


def process_start(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 1 :].split()[19])


def test_unsafe_characters_never_leave_the_directory(claim_dir):
    with claims.choosing():
        assert claims.claim("../../etc/x y")
    [mine] = claim_files(claim_dir)
    assert mine.name.startswith(f"______etc_x_y.{os.geteuid()}.")


def test_another_live_process_holds_its_claim_and_is_named():
    holder = start_holder("GPU-bbb")
    try:
        with claims.choosing():
            assert not claims.claim("GPU-bbb")
        found = claims.holders(["GPU-bbb"])["GPU-bbb"]
        me = my_name()
        assert (found.pid, found.uid, found.user, found.this_process) == (holder.pid, os.geteuid(), me, False)
        assert found.describe() == f"pid {holder.pid} ({me})"
    finally:
        stop(holder)
    with claims.choosing():
        assert claims.claim("GPU-bbb")  # its process ended: the claim went with it


def test_a_killed_process_leaves_no_claim_behind():
    holder = start_holder("GPU-ccc")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    holder.stdin.close()
    holder.stdout.close()
    assert claims.holders(["GPU-ccc"]) == {"GPU-ccc": None}
    with claims.choosing():
        assert claims.claim("GPU-ccc")


def test_a_stuck_chooser_stalls_others_only_briefly(claim_dir, monkeypatch):
    script = textwrap.dedent(
        """
        import sys
        from tfgpu_magic.gpus import claims
        with claims.choosing():
            print("claimed", flush=True)
            sys.stdin.read()
        """
    )
    holder = start_holder("unused", script)
    try:
        with claims.choosing(timeout=0.05) as choice:  # anybody can hold the lock: go on without it
            assert claims.claim("GPU-eee")
        assert not choice.locked
        assert choice.notes == [
            f"another process has held the claim lock in {claim_dir} for 0.05 s; went on without it"
        ]
        notes: list[str] = []
        with monkeypatch.context() as patched:  # readers never even try the lock (issue 17)
            patched.setattr(
                claims, "_flock_within", lambda *a: pytest.fail("a reader waited for the choose lock")
            )
            assert claims.holders(["GPU-eee"], notes=notes)["GPU-eee"].this_process
        assert notes == []
    finally:
        stop(holder)


def test_a_file_in_place_of_the_directory_is_reported(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv(claims.ENV_DIR, str(blocker))
    with pytest.raises(claims.ClaimError) as info:
        with claims.choosing():
            pass
    assert (
        str(info.value)
        == f"the claim path {blocker} is not a directory (set $TFGPU_MAGIC_CLAIM_DIR to another)"
    )


def test_a_forked_child_does_not_keep_the_parents_claim():
    with claims.choosing():
        claims.claim("GPU-ddd")
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: it owns nothing, and must not hold the lock once the parent lets go
        os.write(from_child, b"1" if claims.held() == set() else b"0")  # its at-fork hook has run
        os.read(to_child, 1)  # wait until the parent has released and looked
        os._exit(0)
    try:
        assert os.read(to_parent, 1) == b"1"
        claims.release("GPU-ddd")
        assert claims.holders(["GPU-ddd"]) == {"GPU-ddd": None}  # the child, still alive, holds nothing
    finally:
        os.write(from_parent, b"x")
        for fd in (to_parent, from_child, to_child, from_parent):
            os.close(fd)
        os.waitpid(pid, 0)


def test_a_kernel_that_ends_normally_leaves_no_file_behind(claim_dir):
    script = textwrap.dedent(
        """
        import sys
        from tfgpu_magic.gpus import claims
        with claims.choosing():
            claims.claim(sys.argv[1])
        print("claimed", flush=True)
        sys.stdin.read()
        """
    )
    holder = start_holder("GPU-fff", script)
    assert len(claim_files(claim_dir)) == 1
    stop(holder)
    assert claim_files(claim_dir) == []


def test_a_killed_kernels_leftover_file_is_cleared_by_its_owner(claim_dir):
    holder = start_holder("GPU-ggg")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    holder.stdin.close()
    holder.stdout.close()
    [leftover] = claim_files(claim_dir)
    with claims.choosing():
        assert claims.claim("GPU-ggg")
    assert not leftover.exists() and len(claim_files(claim_dir)) == 1


def test_readers_create_nothing(claim_dir):
    assert claims.holders(["GPU-hhh"]) == {"GPU-hhh": None}
    with claims.choosing(shared=True) as choice:
        assert claims.holder("GPU-hhh") is None
    assert not choice.locked and not claim_dir.exists()


def test_a_claim_whose_file_is_removed_is_void(claim_dir):
    with claims.choosing():
        assert claims.claim("GPU-iii")
    [mine] = claim_files(claim_dir)
    mine.unlink()  # only its owner (or root, or the directory's owner) can
    assert claims.held() == set()
    assert claims.holders(["GPU-iii"]) == {"GPU-iii": None}
    with claims.choosing():
        assert claims.claim("GPU-iii")  # taken again, with a new file


def test_bad_entries_are_notes_and_hide_nothing(claim_dir):
    with claims.choosing():
        assert claims.claim("GPU-jjj")
    uid, pid = os.geteuid(), os.getpid()
    # Under the name this process would claim GPU-kkk with: looked at, and found to be a FIFO.
    os.mkfifo(claim_dir / f"GPU-kkk.{uid}.{pid}.{process_start(pid)}.lock")
    # Named like claims but not claim names: counted in one note, never opened.
    (claim_dir / "GPU-kkk.\x1b[2J.lock").write_text("")
    (claim_dir / "GPU-kkk.12345.0000000000000001.lock").write_text("")  # an older version's name
    # A claim name of no running process (a killed kernel's left-over): not a claim, no note.
    (claim_dir / "GPU-kkk.12345.4194305.17.lock").write_text("")
    notes: list[str] = []
    found = claims.holders(["GPU-kkk", "GPU-jjj"], notes=notes)
    assert found["GPU-kkk"] is None and found["GPU-jjj"].this_process
    assert sorted(notes) == [
        f"skipped 2 entries in {claim_dir} named like claims on GPU-kkk that are not claim files",
        f"skipped claim file {claim_dir}/GPU-kkk.{uid}.{pid}.{process_start(pid)}.lock: a FIFO, not a regular file",
    ]


def test_an_unsafe_directory_is_refused_for_claims_and_noted_for_readers(claim_dir):
    claim_dir.mkdir()
    os.chmod(claim_dir, 0o777)
    with pytest.raises(claims.ClaimError) as info:
        with claims.choosing():
            pass
    assert str(info.value) == (
        f"the claim directory {claim_dir} is writable by others without the sticky bit (mode 0777), so anyone "
        f"could delete claims in it; its owner can run `chmod +t {claim_dir}`, or set $TFGPU_MAGIC_CLAIM_DIR "
        "to a directory you own"
    )
    notes: list[str] = []
    assert claims.holders(["GPU-lll"], notes=notes) == {"GPU-lll": None}
    assert notes == ["claims may be missing: " + str(info.value)]


def test_a_strict_umask_still_lets_others_see_and_lock(claim_dir):
    old = os.umask(0o077)
    try:
        with claims.choosing():
            assert claims.claim("GPU-mmm")
    finally:
        os.umask(old)
    [mine] = claim_files(claim_dir)
    assert stat.S_IMODE(claim_dir.stat().st_mode) == 0o1777
    assert (
        stat.S_IMODE(mine.stat().st_mode)
        == stat.S_IMODE((claim_dir / "tfgpu_magic-choose.lock").stat().st_mode)
        == 0o644
    )


def test_reading_claims_lists_proc_only_for_a_claim_on_a_gpu_asked_about(claim_dir, monkeypatch):
    from tfgpu_magic.gpus import process_table

    listed = []
    real = process_table.PROC.pids
    monkeypatch.setattr(process_table.PROC, "pids", lambda: listed.append(1) or real())
    claim_dir.mkdir(exist_ok=True)
    (claim_dir / "unrelated-file").write_text("")
    assert claims.holders(["gpu-0", "gpu-1"]) == {"gpu-0": None, "gpu-1": None}
    assert listed == []  # nothing there names these GPUs: no process is asked about
    (claim_dir / f"gpu-1.{os.geteuid()}.{os.getpid()}.1.lock").write_text("")  # a claim's name: is it alive?
    assert claims.holders(["gpu-1"]) == {"gpu-1": None}  # not with that start time
    assert listed == [1]
