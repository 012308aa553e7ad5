"""The per-kernel inventory behind ``GET tfgpu/api/status``, without a Jupyter server.

Kernels are described directly; NVML is the simulated server; the process tree is either given
(a parent map) or read from real processes this test starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from tfgpu_magic.gpus import owners
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import (
    NVML_ERROR_NO_PERMISSION,
    LiveKernelsNvml,
    NVMLError,
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    mig_server,
)
from tfgpu_magic.gpus.utilization import UtilizationReader
from tfgpu_magic.server import kernel_inventory
from tfgpu_magic.server.kernel_inventory import (
    FOREIGN_PIDS_NOTE,
    REMOTE_NOTE,
    KernelDescription,
    children_of,
    descendants,
    inventory,
    iso_utc,
    read_ancestry,
    read_parent_map,
    unavailable,
)

from support.fakes import GPU_ALLOCATOR_SCRIPT, fake_process_table, wait_for
from support.reply_schema import replies_follow_the_schema

MIB = 1024**2
GIB = 1024**3
SERVER = 500  # the Jupyter server's pid in the given process trees
NOW = 1763800000.123


@pytest.fixture(autouse=True)
def _replies_follow_the_schema(monkeypatch):
    """Every reply built here is checked against the shipped schema (tfgpu_magic/server/schema)."""
    yield from replies_follow_the_schema(monkeypatch)


def small_server() -> SimulatedNvml:
    """GPU 0: a kernel (1001) and its busy child (1002), my other process, bob's (busier), an exited
    one; GPU 1 idle."""
    return SimulatedNvml(
        [
            SimulatedGpu(
                name="NVIDIA A100-SXM4-80GB",
                total_mib=81920,
                utilization=35,
                processes=[
                    SimulatedProcess(1001, 4096, "alice", "python -m ipykernel_launcher -f kernel-a.json"),
                    SimulatedProcess(1002, 1024, "alice", "python worker.py", sm_percent=60),
                    SimulatedProcess(2001, 2048, "alice", "python train.py"),
                    SimulatedProcess(3001, 8192, "bob", "python finetune.py", sm_percent=90),
                    SimulatedProcess(4001, 512, "carol", "python old.py", alive=False),
                ],
            ),
            SimulatedGpu(name="Tesla T4", total_mib=15360, unsupported={"utilization"}),
        ]
    )


KERNEL_A = KernelDescription(
    id="a",
    name="python3",
    path="work/a.ipynb",
    session_name="a.ipynb",
    session_type="notebook",
    execution_state="idle",
    last_activity="2026-11-22T10:00:00.000000Z",
    pid=1001,
)
REMOTE = KernelDescription(id="r", name="python3", path="remote.ipynb", execution_state="busy")
TREE = {SERVER: 1, 1001: SERVER, 1002: 1001, 2001: 1}


def read(server, kernels, parents=TREE, me="alice"):
    table = fake_process_table(server, me=me, my_pid=SERVER)
    return inventory(Nvml(lib=server), kernels, table, parents, clock=lambda: NOW)


# -- the reply, whole -------------------------------------------------------------------------
def test_the_reply_for_a_small_server_exactly():
    assert read(small_server(), [REMOTE, KERNEL_A]) == {
        "version": 1,
        "generated_at": NOW,
        "refresh_interval_s": 2.0,
        "driver": {"available": True, "reason": None},
        "user": "alice",
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA A100-SXM4-80GB",
                "uuid": "GPU-00000000-fake-0000-0000-000000000000",
                "memory_used_bytes": (300 + 4096 + 1024 + 2048 + 8192 + 512) * MIB,
                "memory_total_bytes": 80 * GIB,
                "utilization_percent": 35,
                "lost": False,
                "notes": [
                    "pid 4001: exited, but NVML still lists it (or it lives in another pid namespace); "
                    "counted as unattributed"
                ],
                "split": {
                    "kernels_bytes": 5 * GIB,
                    "my_other_bytes": 2 * GIB,
                    "others_bytes": 8 * GIB,
                    "unattributed_bytes": (300 + 512) * MIB,
                    "free_bytes": (81920 - 16172) * MIB,
                },
                "mig_instances": None,  # not in MIG mode
                "share": None,  # no platform share inherited
            },
            {
                "index": 1,
                "name": "Tesla T4",
                "uuid": "GPU-00000001-fake-0000-0000-000000000001",
                "memory_used_bytes": 300 * MIB,
                "memory_total_bytes": 15 * GIB,
                "utilization_percent": None,
                "lost": False,
                "notes": ["utilization: Not Supported"],
                "split": {
                    "kernels_bytes": 0,
                    "my_other_bytes": 0,
                    "others_bytes": 0,
                    "unattributed_bytes": 300 * MIB,
                    "free_bytes": (15360 - 300) * MIB,
                },
                "mig_instances": None,
                "share": None,
            },
        ],
        "kernels": [
            {
                "id": "a",
                "name": "python3",
                "path": "work/a.ipynb",
                "session_name": "a.ipynb",
                "session_type": "notebook",
                "execution_state": "idle",
                "last_activity": "2026-11-22T10:00:00.000000Z",
                "pid": 1001,
                "child_pids": [1002],
                "gpu_memory_bytes": {"0": 5 * GIB},
                "total_gpu_memory_bytes": 5 * GIB,
                "note": None,
                # the busiest of its processes there (its worker), not bob's
                "gpu_utilization": {"0": {"percent": 60, "scope": "process", "note": None}},
            },
            {
                "id": "r",
                "name": "python3",
                "path": "remote.ipynb",
                "session_name": None,
                "session_type": None,
                "execution_state": "busy",
                "last_activity": None,
                "pid": None,
                "child_pids": [],
                "gpu_memory_bytes": {},
                "total_gpu_memory_bytes": None,
                "note": REMOTE_NOTE,
                "gpu_utilization": {},
            },
        ],
        "my_other_processes": [
            {"gpu": 0, "pid": 2001, "used_memory_bytes": 2 * GIB, "command": "python train.py"}
        ],
        "other_users": [
            {
                "gpu": 0,
                "pid": 3001,
                "used_memory_bytes": 8 * GIB,
                "user": "bob",
                "command": "python finetune.py",
            }
        ],
        "unattributed": [{"gpu": 0, "pid": 4001, "used_memory_bytes": 512 * MIB, "note": owners.EXITED_NOTE}],
        "hidden_processes": [],  # /proc hides nothing here (no hidepid)
        "notes": [],
        "pids_visible": True,
    }


def test_kernels_come_most_memory_first_then_by_path():
    server = small_server()
    server.gpus[1].processes.append(SimulatedProcess(1101, 9000, "alice", "python -m ipykernel_launcher"))
    kernels = [
        KernelDescription("idle", path="z.ipynb", pid=1201),
        KernelDescription("b", path="b.ipynb", pid=1101),
        KERNEL_A,
        KernelDescription("also-idle", path="c.ipynb", pid=1202),
    ]
    tree = {**TREE, 1101: SERVER, 1201: SERVER, 1202: SERVER}
    assert [k["id"] for k in read(server, kernels, tree)["kernels"]] == ["b", "a", "also-idle", "idle"]


def test_a_kernel_on_two_gpus_has_one_figure_per_gpu_and_their_total():
    server = small_server()
    server.gpus[1].processes.append(SimulatedProcess(1003, 3072, "alice", "python -c 'import cupy'"))
    [kernel] = read(server, [KERNEL_A], {**TREE, 1003: 1002})["kernels"]  # a grandchild
    assert kernel["gpu_memory_bytes"] == {"0": 5 * GIB, "1": 3 * GIB}
    assert (kernel["total_gpu_memory_bytes"], kernel["child_pids"]) == (8 * GIB, [1002, 1003])


def test_a_figure_nvml_cannot_give_is_null_not_zero():
    server = small_server()
    server.gpus[0].processes[0].used_mib = None
    server.gpus[0].processes[1].used_mib = None
    [kernel] = read(server, [KERNEL_A])["kernels"]
    assert (kernel["gpu_memory_bytes"], kernel["total_gpu_memory_bytes"]) == ({"0": None}, None)


# -- what cannot be attributed ----------------------------------------------------------------
def test_when_no_listed_pid_is_a_process_we_can_see_kernels_get_a_note_not_a_zero():
    server = small_server()
    for proc in server.gpus[0].processes:
        proc.alive = False  # the server's pid namespace is not the GPU processes' one
    reply = read(server, [KERNEL_A])
    [kernel] = reply["kernels"]
    assert (kernel["gpu_memory_bytes"], kernel["total_gpu_memory_bytes"], kernel["note"]) == (
        {},
        None,
        FOREIGN_PIDS_NOTE,
    )
    assert reply["pids_visible"] is False
    assert reply["notes"] == [
        "NVML lists pid 1001, 1002, 2001, 3001, 4001, none of them a process this server can see: the server "
        "probably runs in another pid namespace than the GPU's processes (a container without the host's), "
        "so no memory can be attributed to kernels"
    ]


def test_an_idle_machine_is_not_taken_for_another_pid_namespace():
    server = SimulatedNvml([SimulatedGpu()])
    [kernel] = read(server, [KERNEL_A])["kernels"]
    assert (kernel["total_gpu_memory_bytes"], kernel["note"]) == (0, None)


def test_a_kernel_whose_process_has_died_holds_nothing_and_says_so():
    server = small_server()
    server.gpus[0].processes[0].alive = False  # NVML still lists the dead kernel for a moment
    tree = {SERVER: 1, 1002: 1, 2001: 1}  # its child was handed to init
    reply = read(server, [KERNEL_A], tree)
    [kernel] = reply["kernels"]
    assert (kernel["total_gpu_memory_bytes"], kernel["note"]) == (0, "its process 1001 is not running")
    assert [p["pid"] for p in reply["unattributed"]] == [1001, 4001]
    assert 1002 in [p["pid"] for p in reply["my_other_processes"]]  # orphaned: no kernel's any more


def test_a_gpu_whose_processes_cannot_be_listed_leaves_the_kernels_figures_open():
    server = small_server()
    server.gpus[1].faults["compute_processes"] = NVMLError(NVML_ERROR_NO_PERMISSION)
    reply = read(server, [KERNEL_A])
    assert reply["gpus"][1]["split"]["kernels_bytes"] is None
    assert reply["kernels"][0]["note"] == (
        "GPU 1: NVML could not list the processes, so the kernel's memory there is unknown"
    )


def test_a_lost_gpu_is_lost_with_nulls_and_the_others_are_read():
    server = small_server()
    server.gpus[1].lost = True
    reply = read(server, [KERNEL_A])
    lost = reply["gpus"][1]
    assert (lost["lost"], lost["name"], lost["memory_used_bytes"], lost["utilization_percent"]) == (
        True,
        None,
        None,
        None,
    )
    assert set(lost["split"].values()) == {None}
    assert lost["notes"] == ["memory: GPU is lost", "the GPU stopped answering"]  # as %gpu says it
    assert reply["kernels"][0]["total_gpu_memory_bytes"] == 5 * GIB and reply["kernels"][0]["note"] is None


def test_without_a_driver_the_kernels_are_listed_without_memory():
    reply = read(SimulatedNvml([SimulatedGpu()], driver=False), [KERNEL_A, REMOTE])
    assert reply["driver"] == {
        "available": False,
        "reason": "no NVIDIA driver could be reached through NVML (Driver Not Loaded); GPU readings are "
        "unavailable (HINT: check `nvidia-smi` on this machine)",
    }
    assert reply["gpus"] == [] and reply["user"] == "alice" and reply["generated_at"] == NOW
    assert [(k["id"], k["gpu_memory_bytes"], k["total_gpu_memory_bytes"]) for k in reply["kernels"]] == [
        ("r", {}, None),
        ("a", {}, None),  # no memory known: by path
    ]


def test_unavailable_says_the_reason_in_the_contracts_shape():
    reply = unavailable(
        [KERNEL_A], "no GPU\x1b[2J here", refresh_interval_s=5.0, generated_at=NOW, notes=["n"]
    )
    assert reply["driver"] == {"available": False, "reason": "no GPU\\x1b[2J here"}
    assert (reply["version"], reply["refresh_interval_s"], reply["notes"], reply["user"]) == (
        1,
        5.0,
        ["n"],
        None,
    )
    assert [reply[k] for k in ("gpus", "my_other_processes", "other_users", "unattributed")] == [
        [],
        [],
        [],
        [],
    ]


def test_every_string_from_elsewhere_comes_out_escaped():
    server = small_server()
    server.gpus[0].name = "A100\x1b]0;x\x07"
    server.gpus[0].processes[3].user = "b\u202eob"
    server.gpus[0].processes[3].command = "python x.py\r\n[tfgpu] fine"
    server.gpus[0].processes[2].command = "\x9b2Jtrain"
    kernel = KernelDescription("a\n", name="py\x00", path="a\x1b.ipynb", session_name="\u2028", pid=1001)
    reply = read(server, [kernel])
    assert reply["gpus"][0]["name"] == "A100\\x1b]0;x\\x07"
    assert reply["other_users"][0]["user"] == "b\\u202eob"
    assert reply["other_users"][0]["command"] == "python x.py\\r\\n[tfgpu] fine"
    assert reply["my_other_processes"][0]["command"] == "\\x9b2Jtrain"
    k = reply["kernels"][0]
    assert (k["id"], k["name"], k["path"], k["session_name"]) == (
        "a\\n",
        "py\\x00",
        "a\\x1b.ipynb",
        "\\u2028",
    )


# -- real processes ---------------------------------------------------------------------------
@pytest.fixture
def fake_kernel():
    """A process with a child of its own, started by this test and killed at its end."""
    parent = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    children = []
    wait_for(lambda: children.extend(_children(parent.pid)) or children)
    yield parent.pid, children[0]
    parent.kill()
    parent.wait()
    for child in children:
        os.kill(child, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children()]


def test_a_real_kernels_child_is_found_by_walking_up_from_the_gpu_process(fake_kernel, monkeypatch):
    kernel_pid, child_pid = fake_kernel
    me = owners.PsutilProcessTable().current_user()
    server = SimulatedNvml([SimulatedGpu(processes=[SimulatedProcess(child_pid, 2048)])])
    kernel = KernelDescription("k", pid=kernel_pid)
    monkeypatch.setattr(
        kernel_inventory, "read_parent_map", None
    )  # no whole-table scan: a server runs thousands
    reply = inventory(
        Nvml(lib=server), [kernel], owners.PsutilProcessTable(), clock=lambda: NOW
    )  # real owners
    [found] = reply["kernels"]
    assert (found["child_pids"], found["gpu_memory_bytes"], found["note"]) == (
        [child_pid],
        {"0": 2 * GIB},
        None,
    )
    assert reply["user"] == me and reply["gpus"][0]["split"]["kernels_bytes"] == 2 * GIB


def test_the_parent_map_holds_real_processes_and_their_descendants(fake_kernel):
    kernel_pid, child_pid = fake_kernel
    parents, note = read_parent_map()
    assert note is None and parents[kernel_pid] == os.getpid() and parents[child_pid] == kernel_pid
    assert descendants(kernel_pid, children_of(parents)) == [child_pid]


def test_the_ancestry_of_a_pid_reaches_init_and_leaves_out_the_dead(fake_kernel):
    kernel_pid, child_pid = fake_kernel
    gone = subprocess.Popen(["true"])
    gone.wait()
    parents = read_ancestry([child_pid, gone.pid])
    assert parents[child_pid] == kernel_pid and parents[kernel_pid] == os.getpid()
    assert parents[os.getpid()] == os.getppid() and gone.pid not in parents
    assert 1 not in parents  # init's parent is nobody to attribute to


def test_a_zombie_has_no_ancestry():
    zombie = subprocess.Popen(["true"])
    wait_for(lambda: owners.parent_of(zombie.pid) is None, timeout=10)  # exited, not yet collected
    assert read_ancestry([zombie.pid]) == {}
    zombie.wait()


def test_descendants_survive_a_cycle_of_reused_pids():
    assert descendants(1, children_of({2: 1, 3: 2, 1: 3})) == [2, 3]


def test_live_kernels_nvml_follows_its_documented_rule():
    """Children of this process named like kernels hold (n + 1) GiB on GPU n % 2 (by pid); theirs 256 MiB."""
    script = "import subprocess, sys, time; sys.argv[-1] == 'kernel-0.json' and subprocess.Popen(['sleep', '60']); time.sleep(60)"
    kernels = [subprocess.Popen([sys.executable, "-c", script, "-f", f"kernel-{n}.json"]) for n in range(3)]
    bystander = subprocess.Popen(["sleep", "60"])  # a child of ours, but not a kernel
    grandchildren: list[int] = []
    try:
        wait_for(lambda: grandchildren.extend(_children(kernels[0].pid)) or grandchildren, timeout=30)
        expected: dict[int, list[tuple[int, int]]] = {}
        for n, pid in enumerate(sorted(p.pid for p in kernels)):
            expected.setdefault(n % 2, []).append((pid, (n + 1) * 1024))
            if pid == kernels[0].pid:
                expected[n % 2].append((grandchildren[0], 256))
        server = LiveKernelsNvml([SimulatedGpu(), SimulatedGpu(), SimulatedGpu()], scan_ttl_s=0.0)
        held = {gpu: [(p.pid, p.used_mib) for p in procs] for gpu, procs in server.live_processes().items()}
        assert held == expected  # the bystander holds nothing
        nvml = Nvml(lib=server)
        assert [nvml.memory(i).used_bytes for i in range(3)] == [
            (300 + sum(mib for _, mib in expected.get(i, []))) * MIB for i in range(3)
        ]
        assert {p.pid for p in nvml.processes(0)} == {pid for pid, _ in expected[0]}
        assert server.owner_of(kernels[0].pid).user == owners.PsutilProcessTable().current_user()
    finally:
        for proc in [*kernels, bystander]:
            proc.kill()
            proc.wait()
        for pid in grandchildren:
            os.kill(pid, signal.SIGKILL)


# -- small parts ------------------------------------------------------------------------------
def test_iso_utc_always_writes_microseconds_and_z():
    moment = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    assert iso_utc(moment) == "2026-11-22T10:00:00.000000Z"
    assert iso_utc(moment.astimezone(timezone(timedelta(hours=2)))) == "2026-11-22T10:00:00.000000Z"
    assert iso_utc(datetime(2026, 11, 22, 10, 0, 0, 5)) == "2026-11-22T10:00:00.000005Z"
    assert iso_utc(None) is None


def test_generated_at_is_the_time_of_the_reading():
    before = time.time()
    reply = inventory(Nvml(lib=small_server()), [], fake_process_table(small_server(), me="alice"), TREE)
    assert before <= reply["generated_at"] <= time.time()


def test_the_inventory_runs_where_there_is_no_jupyter_server():
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tfgpu_magic.server.kernel_inventory, tfgpu_magic.gpus.simulated; "
            "print(sorted(m for m in ('jupyter_server', 'jupyter_client', 'tornado', 'pynvml') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        timeout=60,
    )
    assert probe.stdout.strip() == "[]", probe.stderr


# -- a real NVIDIA machine --------------------------------------------------------------------
KERNEL_STARTING_A_CHILD = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])"


@pytest.mark.gpu
def test_on_a_real_gpu_a_kernels_child_holds_memory_for_the_kernel():
    nvml = Nvml()
    if not nvml.available():
        pytest.skip("no NVIDIA driver reachable through NVML")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL_STARTING_A_CHILD, GPU_ALLOCATOR_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        if kernel.stdout.readline().strip() != "allocated":
            pytest.skip("neither CuPy nor PyTorch could allocate on the GPU")
        [child] = _children(kernel.pid)
        found: dict = {}
        for _ in range(50):  # NVML lists a new context within moments
            reply = inventory(nvml, [KernelDescription("k", pid=kernel.pid)], owners.PsutilProcessTable())
            found = reply["kernels"][0]
            if found["child_pids"]:
                break
            time.sleep(0.1)
        assert found["note"] is None, found["note"]  # a note here: NVML lists pids of another namespace
        assert found["child_pids"] == [child]
        assert found["gpu_memory_bytes"]["0"] is None or found["gpu_memory_bytes"]["0"] >= 256 * MIB
        assert reply["gpus"][0]["split"]["kernels_bytes"] == found["gpu_memory_bytes"]["0"]
    finally:
        kernel.stdin.close()
        kernel.wait(timeout=60)
        kernel.stdout.close()


# -- MIG (issue 17, item 8) ----------------------------------------------------------------------------
def test_a_mig_gpu_lists_its_instances_with_their_memory_and_kernels():
    server = mig_server(my_pid=SERVER, me="bob")
    kernel = KernelDescription("k", path="sweep.ipynb", session_type="notebook", pid=41005)
    reply = read(server, [kernel], {SERVER: 1, 41005: SERVER}, me="bob")
    gpus = reply["gpus"]
    assert [g["mig_instances"] is None for g in gpus] == [True, True, True, False]
    rows = gpus[3]["mig_instances"]
    assert [(r["gpu_instance_id"], r["compute_instance_id"]) for r in rows] == [(1, 0), (2, 0), (5, 0)]
    assert [r["memory_total_bytes"] for r in rows] == [9984 * MIB, 9984 * MIB, 4864 * MIB]
    assert [r["kernel_ids"] for r in rows] == [["k"], [], []]  # the kernel runs on instance 1/0
    assert [r["process_count"] for r in rows] == [1, 1, 0]
    assert rows[0]["uuid"] == server.gpus[3].mig_instances[0].uuid


def test_instances_that_cannot_be_listed_are_a_note_not_a_failure():
    server = mig_server(my_pid=SERVER)
    server.gpus[3].faults["mig_devices"] = NVMLError(999)
    reply = read(server, [], {SERVER: 1})
    [row] = reply["gpus"][3]["mig_instances"]
    assert row["mig_index"] is None and "could not be listed" in row["notes"][0]


# -- utilization ------------------------------------------------------------------------------
def test_a_kernels_utilization_is_read_since_the_readers_previous_reading():
    server = small_server()
    clock = [NOW]
    server.clock = lambda: clock[0]
    nvml = Nvml(lib=server)
    reader = UtilizationReader(nvml)
    table = fake_process_table(server, me="alice", my_pid=SERVER)

    def kernel_a():
        reply = inventory(nvml, [KERNEL_A], table, TREE, clock=lambda: NOW, utilization=reader)
        return reply["kernels"][0]["gpu_utilization"]["0"]["percent"]

    assert kernel_a() == 60
    server.gpus[0].processes[1].sm_percent = 0  # its worker stops: no sample since the last reading
    clock[0] += 10
    assert kernel_a() == 0


def test_a_kernel_on_a_gpu_without_per_process_samples_gets_the_gpu_figure_said_per_device():
    server = small_server()
    server.gpus[0].unsupported.add("process_utilization")
    figure = read(server, [KERNEL_A])["kernels"][0]["gpu_utilization"]["0"]
    assert figure["percent"] == 35 and figure["scope"] == "device"
    assert figure["note"].startswith("per device")


def test_a_failed_utilization_reading_is_a_note_and_the_memory_stays():
    server = small_server()
    server.gpus[0].faults["process_utilization"] = NVMLError(NVML_ERROR_NO_PERMISSION)
    kernel = read(server, [KERNEL_A])["kernels"][0]
    assert kernel["total_gpu_memory_bytes"] == 5 * GIB
    assert kernel["gpu_utilization"]["0"]["percent"] is None
    assert "Insufficient Permissions" in kernel["gpu_utilization"]["0"]["note"]


def test_utilization_is_read_only_on_the_gpus_kernels_hold_memory_on():
    server = small_server()
    server.gpus[1].faults["process_utilization"] = RuntimeError("GPU 1 must not be asked")
    read(server, [KERNEL_A])
    assert server.faults_raised == 0
