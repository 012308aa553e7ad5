"""Advisory per-GPU claims: flock files that live exactly as long as the claiming process."""

from __future__ import annotations

import getpass
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfgpu_magic import claims

ROOT = Path(__file__).resolve().parent.parent

# A separate process that claims KEY, says so, and holds the claim until stdin closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from tfgpu_magic import claims
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


def test_the_directory_is_shared_by_every_user(claim_dir):
    with claims.choosing():
        claims.claim("GPU-aaa")
    assert stat.S_IMODE(claim_dir.stat().st_mode) == 0o1777  # sticky and world-writable, like /tmp
    assert stat.S_IMODE((claim_dir / "GPU-aaa.lock").stat().st_mode) == 0o666
    assert (claim_dir / "GPU-aaa.lock").read_text().startswith(f"pid={os.getpid()}\nuser=")


def test_unsafe_characters_never_leave_the_directory(claim_dir):
    with claims.choosing():
        assert claims.claim("../../etc/x y")
    assert sorted(p.name for p in claim_dir.iterdir()) == ["______etc_x_y.lock", "choose.lock"]


def test_another_live_process_holds_its_claim_and_is_named():
    holder = start_holder("GPU-bbb")
    try:
        with claims.choosing():
            assert not claims.claim("GPU-bbb")
        found = claims.holders(["GPU-bbb"])["GPU-bbb"]
        assert (found.pid, found.user, found.this_process) == (holder.pid, getpass.getuser(), False)
        assert found.describe() == f"pid {holder.pid} ({getpass.getuser()})"
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


def test_a_stuck_chooser_gives_a_clear_error(claim_dir):
    script = textwrap.dedent(
        """
        import sys
        from tfgpu_magic import claims
        with claims.choosing():
            print("claimed", flush=True)
            sys.stdin.read()
        """
    )
    holder = start_holder("unused", script)
    try:
        with pytest.raises(claims.ClaimError) as info:
            with claims.choosing(timeout=0.05):
                pass
        assert str(info.value) == (
            f"another process has held the claim lock in {claim_dir} for 0.05 s; "
            "try again, or name the GPUs yourself (e.g. `%gpu use 0`)"
        )
    finally:
        stop(holder)


def test_a_file_in_place_of_the_directory_is_reported(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv(claims.ENV_DIR, str(blocker))
    with pytest.raises(claims.ClaimError) as info:
        with claims.choosing():
            pass
    assert str(info.value) == f"the claim path {blocker} is not a directory (set $TFGPU_MAGIC_CLAIM_DIR to another)"


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
