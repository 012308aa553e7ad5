"""Owners, mine versus others, and `%gpu use auto` with claims, on the fake shared server.

Real processes race for GPUs through the same claim directory; `gpu`-marked tests check the
readings and the attribution against a real NVIDIA driver.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from tfgpu_magic.command import grammar
from tfgpu_magic.gpus import claims, holdings, owners
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess, shared_server
from tfgpu_magic.kernel import magics
from tfgpu_magic.kernel.choosing import ChoiceError, choose_gpus
from tfgpu_magic.kernel.session import Session

from support.fakes import GPU_ALLOCATOR_SCRIPT, fake_process_table

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
GIB = 1024 * MIB
ME = 4242  # this kernel's pid on the fake server, where the test does not need its own

CHOSE_1 = (
    "Chose GPU 1: the GPU with the most free memory not claimed by another kernel "
    "(GPU 1: 57.7 GiB free of 80.0 GiB, utilization 35%); claimed for this kernel's lifetime"
)


def choose(session, progress=None, **auto):
    said = []
    result = choose_gpus(session, grammar.Auto(**auto), progress or said.append, poll_s=0.01)
    return result if progress else (*result, said)


# -- the process table ------------------------------------------------------------------------
def test_psutil_table_reads_owner_and_command_of_a_live_process():
    table = owners.PsutilProcessTable()
    found = table.lookup(os.getpid())
    assert (found.user, found.alive, found.note) == (getpass.getuser(), True, None)
    assert "pytest" in found.command
    assert table.current_user() == getpass.getuser()


def test_psutil_table_says_a_vanished_pid_has_exited():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    found = owners.PsutilProcessTable().lookup(proc.pid)
    assert found == owners.ProcessDetails(None, None, False, owners.EXITED_NOTE)


def test_the_fake_servers_own_table_serves_the_device_source():
    server = shared_server(ME)
    table = owners.process_table_for(Nvml(lib=server))
    assert isinstance(table, owners.OwnerLookupTable)
    assert table.lookup(41003) == owners.ProcessDetails("bob", "python finetune.py", True)
    assert table.lookup(41004).alive is False  # carol's process has exited
    assert isinstance(owners.process_table_for(Nvml()), owners.PsutilProcessTable)


# -- attribution ------------------------------------------------------------------------------
def usage_of(server, index, tf_in_use=None, my_pid=ME):
    nvml = Nvml(lib=server)
    table = fake_process_table(server, my_pid=my_pid)
    allocator = None if tf_in_use is None else holdings.AllocatorShare(tf_in_use, "tensorflow", "TensorFlow")
    return holdings.attribute(nvml, nvml.gpu(index), table, my_pid, table.current_user(), allocator)


def test_memory_splits_into_this_kernel_my_other_processes_and_other_users():
    usage = usage_of(shared_server(ME), 1)
    assert (usage.this_kernel_bytes, usage.this_kernel_source) == (10240 * MIB, "nvml")
    assert usage.my_other_bytes == 4096 * MIB
    assert usage.others_bytes == 8192 * MIB
    assert usage.unattributed_bytes == 300 * MIB  # driver overhead nobody listed holds
    assert [(p.pid, p.user, p.whose) for p in usage.processes] == [
        (ME, "me", "this kernel"),
        (41002, "me", "mine"),
        (41003, "bob", "others"),
    ]
    assert usage.notes == ()


def test_an_exited_process_is_listed_but_counted_as_unattributed():
    usage = usage_of(shared_server(ME), 3)
    assert [(p.pid, p.alive, p.whose, p.user) for p in usage.processes] == [(41004, False, "unknown", None)]
    assert (usage.this_kernel_bytes, usage.my_other_bytes, usage.others_bytes) == (0, 0, 0)
    assert usage.unattributed_bytes == (300 + 2048) * MIB
    assert usage.notes == (f"pid 41004: {owners.EXITED_NOTE}; counted as unattributed",)


def test_memory_nvml_cannot_report_is_missing_not_zero():
    server = shared_server(ME)
    server.gpus[0].processes.append(SimulatedProcess(41005, None, "dave", "python secret.py"))
    server.gpus[2].processes.append(SimulatedProcess(41006, None, "erin", "python quiet.py"))
    busy = usage_of(server, 0)
    assert busy.others_bytes == 30720 * MIB  # alice's known figure; dave's is missing
    assert busy.notes == ("NVML gives no memory figure for pid 41005; sums count only the known figures",)
    idle = usage_of(server, 2)
    assert idle.others_bytes is None  # erin's is the only one, and unknown
    assert [p.used_memory_bytes for p in idle.processes] == [None]


def test_a_lost_gpu_has_no_usage_and_says_why():
    server = shared_server(ME)
    server.gpus[1].lost = True
    usage = usage_of(server, 1)
    assert usage.processes is None and usage.this_kernel_bytes is None and usage.others_bytes is None
    assert usage.notes == ("the GPU stopped answering",)


def test_process_listing_failure_is_a_note_not_an_empty_gpu():
    server = shared_server(ME)
    server.nvmlDeviceGetComputeRunningProcesses = _raise(
        SimulatedNvml.NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION)
    )
    usage = usage_of(server, 1)
    assert usage.processes is None and usage.this_kernel_bytes is None
    assert usage.notes == ("NVML could not list the processes (Insufficient Permissions)",)


def _raise(err):
    def call(*args):
        raise err

    return call


def test_without_our_pid_in_nvml_tensorflows_allocator_is_shown_and_named():
    # In a container without the host's pid namespace NVML lists host pids: ours is not among them.
    usage = usage_of(shared_server(ME), 1, tf_in_use=6 * GIB, my_pid=999)
    assert (usage.this_kernel_bytes, usage.this_kernel_source) == (6 * GIB, "tensorflow")
    assert usage.notes[0] == (
        "NVML does not list this kernel's pid 999 here (a container without the host's pid namespace?): "
        "showing TensorFlow's allocator in use, which leaves out CUDA's own overhead"
    )


# -- choosing ---------------------------------------------------------------------------------
@pytest.fixture
def fresh(server):
    return Session(nvml=Nvml(lib=server), env={})


def test_auto_takes_the_gpu_with_the_most_free_memory_and_claims_it(fresh, server):
    gpus, reason, said = choose(fresh)
    assert (gpus, reason, said) == ((1,), CHOSE_1, [])
    assert claims.held() == {server.gpus[1].uuid}


def test_auto_2_takes_the_two_freest(fresh):
    gpus, reason, _ = choose(fresh, count=2)
    assert gpus == (1, 2)
    assert reason == (
        "Chose GPU 1,2: the 2 GPUs with the most free memory not claimed by another kernel "
        "(GPU 1: 57.7 GiB free of 80.0 GiB, utilization 35%; GPU 2: 23.7 GiB free of 24.0 GiB, utilization 0%); "
        "claimed for this kernel's lifetime"
    )


def test_min_free_filters_and_is_named_in_the_reason(fresh):
    gpus, reason, _ = choose(fresh, min_free_bytes=20 * GIB)
    assert gpus == (1,)
    assert "the GPU with the most free memory with at least 20.0 GiB free not claimed" in reason


def test_ties_on_free_memory_go_to_the_less_busy_gpu():
    server = SimulatedNvml(
        [SimulatedGpu(utilization=u) for u in (90, 10, 50)] + [SimulatedGpu(unsupported={"utilization"})]
    )
    session = Session(nvml=Nvml(lib=server), env={})
    assert choose(session)[0] == (1,)
    claims.release_all()
    assert choose(session, count=3)[0] == (0, 1, 2)  # the GPU with no utilization reading ranks last


def test_lost_and_mig_gpus_are_never_chosen():
    server = SimulatedNvml(
        [
            SimulatedGpu(total_mib=80000, lost=True),
            SimulatedGpu(total_mib=80000, mig=True),
            SimulatedGpu(total_mib=1000),
        ]
    )
    assert choose(Session(nvml=Nvml(lib=server), env={}))[0] == (2,)


def test_choosing_again_moves_the_claim(fresh, server):
    magics.use(fresh, grammar.parse("use auto"))
    server.gpus[1].processes.append(SimulatedProcess(41009, 60000, "bob"))  # bob filled GPU 1
    magics.use(fresh, grammar.parse("use auto"))
    assert fresh.requested.visible == (2,)
    assert claims.held() == {server.gpus[2].uuid}


@pytest.mark.parametrize(
    "auto, message",
    [
        (
            {"min_free_bytes": 70 * GIB},
            "no unclaimed GPU has 70.0 GiB free now (the most free is 57.7 GiB, on GPU 1); "
            "try `%gpu use auto --min-free 70G --wait 10m`",
        ),
        (
            {"count": 3, "min_free_bytes": 20 * GIB},
            "fewer than 3 unclaimed GPUs have 20.0 GiB free now (the most free is 57.7 GiB, on GPU 1); "
            "try `%gpu use auto:3 --min-free 20G --wait 10m`",
        ),
        (
            {"count": 5},
            "`%gpu use auto:5` needs 5 GPUs but this machine has 4; use `%gpu use auto:4` or fewer",
        ),
    ],
)
def test_impossible_requests_say_what_to_try(fresh, auto, message):
    with pytest.raises(ChoiceError) as info:
        choose(fresh, **auto)
    assert str(info.value) == message
    assert claims.held() == set()


def test_without_a_driver_auto_says_to_name_gpus():
    session = Session(nvml=Nvml(lib=SimulatedNvml([], driver=False)), env={})
    with pytest.raises(ChoiceError) as info:
        choose(session)
    assert str(info.value) == (
        "`%gpu use auto` needs GPU readings, and no NVIDIA driver could be reached through NVML "
        "(Driver Not Loaded); GPU readings are unavailable (HINT: check `nvidia-smi` on this machine); "
        "name the GPUs instead, e.g. `%gpu use 0`"
    )


def test_wait_reports_progress_and_takes_the_gpu_once_it_frees(fresh, server):
    server.gpus[1].processes.append(SimulatedProcess(41009, 60000, "bob"))  # nothing has 40 GiB free
    timer = threading.Timer(0.2, server.gpus[1].processes.pop)  # bob finishes
    timer.start()
    try:
        gpus, _reason, said = choose(fresh, min_free_bytes=40 * GIB, wait_seconds=30)
    finally:
        timer.cancel()
    assert gpus == (1,)
    assert said == [
        "Waiting: no unclaimed GPU has 40.0 GiB free (the most free is 23.7 GiB, on GPU 2); "
        "30s left (interrupt the cell to stop)"
    ]


def test_wait_gives_up_at_its_deadline(fresh):
    with pytest.raises(ChoiceError) as info:
        choose(fresh, min_free_bytes=70 * GIB, wait_seconds=0.05)
    assert str(info.value) == (
        "no unclaimed GPU has 70.0 GiB free after waiting 0s (the most free is 57.7 GiB, on GPU 1); "
        "wait longer (e.g. `--wait 30m`) or ask for less free memory"
    )


def test_interrupting_the_wait_stops_cleanly(fresh):
    def interrupt(message):
        raise KeyboardInterrupt  # what Ctrl-C / the notebook's stop button raises in the cell

    with pytest.raises(ChoiceError) as info:
        choose(fresh, progress=interrupt, min_free_bytes=70 * GIB, wait_seconds=600)
    assert str(info.value) == "stopped waiting (interrupted); no GPU was chosen or claimed"
    assert claims.held() == set()
    with claims.choosing(timeout=0.1):  # and the directory lock was let go
        pass


# -- through the magic ------------------------------------------------------------------------
def test_magic_prints_the_reason_then_the_setting(gpu, capsys):
    gpu("use auto")
    assert capsys.readouterr().out == (
        f"{CHOSE_1}\nuse 1: takes effect when TensorFlow, PyTorch or JAX starts in this kernel\n"
    )
    assert gpu.session.env["CUDA_VISIBLE_DEVICES"] == "1"


def test_magic_turns_a_failed_choice_into_one_line(gpu, shell, capsys):
    with pytest.raises(UsageError) as info:
        gpu("use auto --min-free 70G")
    assert str(info.value) == (
        "no unclaimed GPU has 70.0 GiB free now (the most free is 57.7 GiB, on GPU 1); "
        "try `%gpu use auto --min-free 70G --wait 10m`"
    )
    shell.run_cell("%gpu use auto:2 --min-free 30G")
    captured = capsys.readouterr()
    assert (captured.out + captured.err).strip() == (
        "UsageError: fewer than 2 unclaimed GPUs have 30.0 GiB free now (the most free is 57.7 GiB, on GPU 1); "
        "try `%gpu use auto:2 --min-free 30G --wait 10m`"
    )


# -- several kernels at once (real processes) ---------------------------------------------------
KERNEL = textwrap.dedent(
    """
    import os, sys, time
    from IPython.core.interactiveshell import InteractiveShell
    import tfgpu_magic
    from tfgpu_magic.gpus.simulated import shared_server
    tfgpu_magic.set_device_source(shared_server())
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "tfgpu_magic")
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.0005)
    shell.run_line_magic("gpu", sys.argv[2])
    print("CHOSEN", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    sys.stdin.read()  # a kernel keeps its claim while it lives
    """
)


def start_kernel(go: Path, line: str = "use auto") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen(
        [sys.executable, "-W", "error", "-c", KERNEL, str(go), line],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def chosen(proc: subprocess.Popen) -> str:
    for line in proc.stdout:
        if line.startswith("CHOSEN"):
            return line.split()[1]
    raise AssertionError(f"kernel {proc.pid} chose nothing: {proc.stderr.read()[-3000:]}")


def end(proc: subprocess.Popen, kill: bool = False) -> None:
    if kill:
        proc.send_signal(signal.SIGKILL)
    proc.stdin.close()
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.slow
def test_kernels_started_at_the_same_moment_get_different_gpus(tmp_path):
    go = tmp_path / "go"
    kernels = [start_kernel(go) for _ in range(4)]
    try:
        for proc in kernels:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
        go.touch()  # all four choose now
        picks = [chosen(proc) for proc in kernels]
    finally:
        for proc in kernels:
            end(proc)
    assert sorted(picks) == ["0", "1", "2", "3"]  # four kernels, four GPUs, no double booking


@pytest.mark.slow
def test_a_killed_kernels_claim_does_not_block(tmp_path, fresh, server):
    go = tmp_path / "go"
    go.touch()
    first = start_kernel(go)
    assert chosen(first) == "1"
    try:
        assert choose(fresh)[0] == (2,)  # GPU 1 is taken by a live kernel
        holder = claims.holders([server.gpus[1].uuid])[server.gpus[1].uuid]
        assert (holder.pid, holder.this_process) == (first.pid, False)
    finally:
        end(first, kill=True)
    assert choose(fresh)[0] == (1,)  # killed: its claim went with it


# -- a real NVIDIA machine --------------------------------------------------------------------
def real_nvml() -> Nvml:
    nvml = Nvml()
    if not nvml.available():
        pytest.skip("no NVIDIA driver reachable through NVML")
    return nvml


@pytest.mark.gpu
def test_readings_agree_with_nvidia_smi():
    nvml = real_nvml()
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    out = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=index,uuid,name,memory.total,memory.used",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    assert len(rows) == nvml.device_count()
    for index, uuid, name, total_mib, used_mib in rows:
        gpu = nvml.gpu(int(index))
        assert (gpu.uuid, gpu.name) == (uuid, name)
        assert gpu.memory.total_bytes // MIB == int(total_mib)
        assert abs(gpu.memory.used_bytes // MIB - int(used_mib)) <= 64  # read a moment apart


@pytest.mark.gpu
def test_a_process_allocating_memory_is_found_with_its_pid_and_user():
    nvml = real_nvml()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = subprocess.Popen(
        [sys.executable, "-c", GPU_ALLOCATOR_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline().strip()
        if line != "allocated":
            pytest.skip("neither CuPy nor PyTorch could allocate on the GPU")
        table = owners.PsutilProcessTable()
        found = []
        for _ in range(50):  # NVML lists a new context within moments
            usage = holdings.attribute(nvml, nvml.gpu(0), table, os.getpid(), table.current_user())
            found = [p for p in usage.processes or [] if p.pid == proc.pid]
            if found:
                break
            time.sleep(0.1)
        assert found, "NVML did not list the allocating process (another pid namespace?)"
        entry = found[0]
        assert entry.user == getpass.getuser() and entry.whose == "mine" and entry.alive
        assert entry.used_memory_bytes is None or entry.used_memory_bytes >= 256 * MIB
        assert "python" in (entry.command or "")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()


def test_without_psutil_proc_gives_owner_and_command():
    found = owners._proc_lookup(os.getpid())
    assert (found.user, found.alive) == (getpass.getuser(), True) and "pytest" in found.command
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert owners._proc_lookup(proc.pid).alive is False


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "use auto --min-free 100G --wait 10m",
            "no GPU here has 100.0 GiB in all (the largest is GPU 1, 80.0 GiB), so no wait would help; "
            "ask for less (`--min-free`, `%gpu limit`)",
        ),
        (
            "use auto:2 --min-free 50G",
            "no GPU here has 50.0 GiB in all (the largest is GPU 1, 80.0 GiB), so no wait would help; "
            "ask for less (`--min-free`, `%gpu limit`)",
        ),
        ("use auto --min-cc 9.0", "1 GPU of compute capability 9.0 or above needed; the newest here is 8.6"),
    ],
)
def test_what_no_gpu_here_could_ever_give_is_refused_without_waiting(gpu, line, message):
    """Waiting ten minutes for a GPU larger than any on the machine helps nobody."""
    with pytest.raises(UsageError) as info:
        gpu(line)
    assert str(info.value) == message
    assert gpu.session.claimed == ()


def test_min_cc_skips_older_gpus(gpu, capsys):
    gpu("use auto --min-cc 8.6")
    assert capsys.readouterr().out.startswith("Chose GPU 2:")  # the A5000 (8.6); the A100s are 8.0
