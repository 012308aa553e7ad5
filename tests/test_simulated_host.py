"""``host_kernels_server``: simulated GPUs holding every IPython kernel of the machine, any user's.

What JupyterHub's single-user servers need (tests/test_jupyterhub.py): alice's server and bob's
read the same figures, each sees its own kernels as kernels and the other's as another user's
process.  Here without JupyterHub: kernel-like processes (a ``kernel-<id>.json`` connection file
after ``-f``), one of them another user's when the tests run as root.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time

import pytest

from tfgpu_magic.gpus import owners, simulated
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import (
    HOST_KERNEL_MIB,
    KERNEL_CHILD_MIB,
    MIB,
    HostKernelsNvml,
    SimulatedGpu,
    host_kernels_server,
    is_ipython_kernel,
)
from tfgpu_magic.server.kernel_inventory import KernelDescription, inventory

# A process that looks like a kernel to the rule and has a child: `sleep 60; :` keeps the shell
# (no exec of the last command) with sleep below it.
SHELL_KERNEL = ["/bin/sh", "-c", "sleep 60; :", "sh", "-f"]


@pytest.mark.parametrize(
    "argv",
    [
        [
            "/usr/bin/python3",
            "-m",
            "ipykernel_launcher",
            "-f",
            "/run/user/1000/jupyter/runtime/kernel-3f2a.json",
        ],
        [
            "python",
            "-Xfrozen_modules=off",
            "-m",
            "ipykernel_launcher",
            "-f",
            "/tmp/tmpab12.json",
        ],  # nbclient's name
        ["python", "-m", "ipykernel", "-f", "x.json"],
        [
            "/opt/conda/bin/python",
            "/opt/conda/lib/python3.11/site-packages/ipykernel_launcher.py",
            "-f",
            "c.json",
        ],
        ["/bin/sh", "-c", "sleep 60", "sh", "-f", "/tmp/kernel-0.json"],
        ["python", "--f=/root/.local/share/jupyter/runtime/kernel-9.json"],
    ],
)
def test_a_kernels_command_line_is_a_kernel(argv):
    assert is_ipython_kernel(argv)


@pytest.mark.parametrize(
    "argv",
    [
        # A server started with this very device source mentions "kernel" (LiveKernelsNvml's looser rule would take it).
        [
            "/venv/bin/python",
            "/venv/bin/jupyterhub-singleuser",
            "--TfgpuMagic.device_source=tfgpu_magic.simulated:host_kernels_server",
        ],
        ["jupyter", "lab", "--KernelManager.shutdown_wait_time=1"],
        ["vim", "kernel-notes.json"],  # a connection file's name, but not after -f
        ["python", "-m", "pytest", "tests/test_simulated_host.py"],
        ["python", "-c", "import ipykernel"],
        ["python", "-m", "ipykernel", "install", "--user"],  # installs a kernel spec, runs none
        [],
    ],
)
def test_other_command_lines_are_not(argv):
    assert not is_ipython_kernel(argv)


def _shell_kernel(name: str, user: str | None = None) -> subprocess.Popen:
    def become():
        entry = pwd.getpwnam(user)
        os.setgid(entry.pw_gid)
        os.setgroups([])
        os.setuid(entry.pw_uid)

    return subprocess.Popen([*SHELL_KERNEL, f"/tmp/kernel-{name}.json"], preexec_fn=become if user else None)


def _children(pid: int) -> list[int]:
    """The process's children once each has exec'd its own program: just after the fork a child
    still has its parent's command line, a kernel's, and would be read (and remembered) as one."""
    import psutil

    children = psutil.Process(pid).children()
    try:
        if any(child.cmdline() == psutil.Process(pid).cmdline() for child in children):
            return []
    except psutil.Error:
        return []
    return [p.pid for p in children]


def children_soon(pid: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while not (found := _children(pid)):
        assert time.monotonic() < deadline, f"process {pid} started no child"
        time.sleep(0.01)
    return found


def stop(proc: subprocess.Popen, below: list[int]) -> None:
    """The shell we started, and the sleep below it (by pid: it would outlive the shell)."""
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()


@pytest.fixture
def kernels():
    """Two kernel-like processes of ours, each with a ``sleep`` below it; and a bystander (no kernel)."""
    started = [_shell_kernel("host-a"), _shell_kernel("host-b")]
    bystander = subprocess.Popen(["sleep", "60"])
    held: dict[int, list[int]] = {}
    try:
        for proc in started:
            held[proc.pid] = children_soon(proc.pid)
        yield held, bystander.pid
    finally:
        for proc in [*started, bystander]:
            stop(proc, held.get(proc.pid, []))


def expected_on(gpu: int, held: dict[int, list[int]], kernel_gpus: int = 2) -> set[tuple[int, int]]:
    return {
        (pid, mib)
        for kernel, below in held.items()
        if kernel % kernel_gpus == gpu
        for pid, mib in [
            (kernel, HOST_KERNEL_MIB[kernel % 4]),
            *((child, KERNEL_CHILD_MIB) for child in below),
        ]
    }


def test_every_kernel_holds_what_its_pid_says_whoever_reads(kernels):
    """GPU pid % 2, 1-4 GiB by pid % 4, 256 MiB per process below; two readers agree; others hold nothing."""
    held, bystander = kernels
    first, second = HostKernelsNvml([SimulatedGpu() for _ in range(3)], scan_ttl_s=0.0), host_kernels_server()
    ours_all = {*held, *(child for below in held.values() for child in below)}
    for server in (first, second):
        live = server.live_processes()
        for gpu in (0, 1):
            ours = {(p.pid, p.used_mib) for p in live.get(gpu, []) if p.pid in ours_all}
            assert ours == expected_on(gpu, held)
        assert 2 not in live  # kernel_gpus=2: GPUs 2 and 3 hold no kernel
        assert bystander not in {p.pid for procs in live.values() for p in procs}
    assert {g: [(p.pid, p.used_mib) for p in ps] for g, ps in first.live_processes().items()} == {
        g: [(p.pid, p.used_mib) for p in ps] for g, ps in second.live_processes().items()
    }
    # Through the Nvml wrapper, as the server extension and %gpu read it.
    nvml = Nvml(lib=first)
    kernel = next(iter(held))
    listed = {p.pid: p.used_memory_bytes for p in nvml.processes(kernel % 2)}
    assert listed[kernel] == HOST_KERNEL_MIB[kernel % 4] * MIB
    assert first.owner_of(kernel).user == owners.PsutilProcessTable().current_user()


def test_a_command_line_is_read_once_per_process(kernels, monkeypatch):
    held, _ = kernels
    server = HostKernelsNvml([SimulatedGpu(), SimulatedGpu()], scan_ttl_s=0.0)
    read: list[int] = []
    real = simulated._host_kernel
    monkeypatch.setattr(simulated, "_host_kernel", lambda pid: read.append(pid) or real(pid))
    server.live_processes()
    assert set(held) <= set(read)
    read.clear()
    again = server.live_processes()
    assert not set(held) & set(read)  # remembered: only processes started since are read
    assert set(held) <= {p.pid for procs in again.values() for p in procs}


def test_at_most_max_host_kernels_the_lowest_pids(kernels, monkeypatch):
    held, _ = kernels
    monkeypatch.setattr(simulated, "MAX_HOST_KERNELS", 1)
    live = HostKernelsNvml([SimulatedGpu(), SimulatedGpu()], scan_ttl_s=0.0).live_processes()
    kernel_pids = [p.pid for procs in live.values() for p in procs if p.used_mib != KERNEL_CHILD_MIB]
    assert len(kernel_pids) == 1 and kernel_pids[0] <= min(held)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting another user's process needs root")
def test_another_users_kernel_is_another_users_process_and_mine_is_my_kernel(kernels):
    """The single-user server's view: its kernel is a kernel, another user's kernel is 'other users'."""
    held, _ = kernels
    theirs = _shell_kernel("host-nobody", user="nobody")
    below: list[int] = []
    try:
        below = children_soon(theirs.pid)
        nvml = Nvml(lib=host_kernels_server())
        mine = next(iter(held))
        reply = inventory(
            nvml,
            [KernelDescription(id="mine", name="python3", path="a.ipynb", pid=mine)],
            owners.process_table_for(nvml, os.getpid()),
        )
        assert reply["user"] == owners.PsutilProcessTable().current_user()
        (kernel,) = reply["kernels"]
        assert kernel["gpu_memory_bytes"] == {
            str(mine % 2): (HOST_KERNEL_MIB[mine % 4] + KERNEL_CHILD_MIB) * MIB
        }
        others = {p["pid"]: p for p in reply["other_users"]}
        assert others[theirs.pid]["user"] == "nobody"
        assert others[theirs.pid]["used_memory_bytes"] == HOST_KERNEL_MIB[theirs.pid % 4] * MIB
        assert others[below[0]]["used_memory_bytes"] == KERNEL_CHILD_MIB * MIB
        assert others[theirs.pid]["gpu"] == theirs.pid % 2
    finally:
        stop(theirs, below)


def test_named_users_only_place_their_kernels_whatever_else_runs(kernels, monkeypatch):
    """TFGPU_MAGIC_SIMULATED_USERS (a test's own rule): only those users' kernels hold memory, so a
    reading does not depend on the other kernels of the machine (issue 29)."""
    held, _ = kernels
    me = owners.PsutilProcessTable().current_user()

    def placed() -> set[int]:
        return {p.pid for procs in host_kernels_server().live_processes().values() for p in procs}

    monkeypatch.setenv(simulated.USERS_ENV, "tfgpu-no-such-user")
    assert not placed() & set(held)  # these kernels are mine, not that user's
    monkeypatch.setenv(simulated.USERS_ENV, f"tfgpu-no-such-user, {me}")
    assert set(held) <= placed()


def test_the_documented_name_is_there():
    import tfgpu_magic.simulated as documented

    assert documented.host_kernels_server is host_kernels_server
    assert [gpu.name for gpu in host_kernels_server().gpus] == [
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA RTX A5000",
        "Tesla T4",
    ]


def test_a_young_process_found_not_to_be_a_kernel_is_looked_at_again():
    """A kernel seen between its fork and its exec has its start time and its parent's command
    line: while it is young, "not a kernel" is not kept, so the next scan sees what it became."""
    server = simulated.LiveKernelsNvml([simulated.SimulatedGpu(name="GPU", total_mib=1024)])
    child = subprocess.Popen(["sleep", "30"])
    try:
        answers = iter([None, 3])
        assert server._remember(child.pid, lambda pid: next(answers)) is None
        assert server._remember(child.pid, lambda pid: next(answers)) == 3  # read again, then kept
        assert server._remember(child.pid, lambda pid: 99) == 3
    finally:
        child.kill()
        child.wait()


def test_a_kernel_started_just_after_a_reading_is_in_the_next_one_however_soon():
    """A reading is never older than the process table: a kernel that started after the last scan
    is found by the next reading, even within ``scan_ttl_s`` (as a driver lists a process at once).
    ``tfgpu run``'s last look at a short notebook came less than 0.5 s after its look before the
    kernel started, and found no kernel (the papermill test of test_runner.py, in CI)."""
    server = simulated.LiveKernelsNvml([SimulatedGpu(), SimulatedGpu()], scan_ttl_s=3600.0)
    assert server.live_processes() == {}
    kernel, below = _shell_kernel("just-started"), []
    try:
        below = children_soon(kernel.pid)
        held = {p.pid for procs in server.live_processes().values() for p in procs}
        assert held == {kernel.pid, *below}
    finally:
        stop(kernel, below)
