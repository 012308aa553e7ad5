"""`%gpu doctor` (issue 31, item 3): each finding on a simulated scenario that produces it, with its
evidence and a fix that is the exact line to run; and a healthy kernel gets no finding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from IPython.utils.capture import capture_output

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks.base import CUDA_ENV, Stage, capture
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import (
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    mig_server,
    shared_server,
)
from tfgpu_magic.kernel import doctor
from tfgpu_magic.kernel.session import Session

from support.fakes import FakeTensorFlow
from support.stand_ins import StandInJax

ME = 4242  # this kernel's pid on the simulated servers (shared_server's GPU 1 holds 10 GiB of it)
GPU_LINE = re.compile(r"`(%gpu [^`]*)`")


@pytest.fixture(autouse=True)
def no_mps_here(tmp_path, monkeypatch):
    """The MPS pipe directory is the test's own (an empty one): a /tmp/nvidia-mps on the test machine
    must not change any result.  Tests that want a daemon make its FIFO there."""
    pipe = tmp_path / "mps"
    pipe.mkdir()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        monkeypatch.delenv(name, raising=False)
    return pipe


def session_on(server: SimulatedNvml, env: dict | None = None, frameworks=None) -> Session:
    base = {"CUDA_MPS_PIPE_DIRECTORY": os.environ["CUDA_MPS_PIPE_DIRECTORY"], **(env or {})}
    return Session(nvml=Nvml(lib=server), env=base, frameworks=frameworks)


def examine(session: Session, parents: dict | None = None) -> dict:
    return doctor.report(session, my_pid=ME, parents=lambda pids: dict(parents or {}))


def only(data: dict, key: str) -> dict:
    """The one finding ``key``; fails if there is another, so each scenario shows its own finding."""
    keys = [f["key"] for f in data["findings"]]
    assert keys == [key], keys
    finding = data["findings"][0]
    for line in GPU_LINE.findall(finding["fix"]):  # every `%gpu ...` in a fix is a line that parses
        grammar.parse(line[len("%gpu ") :])
    return finding


# -- a healthy kernel ------------------------------------------------------------------------------
def test_a_healthy_kernel_gets_no_findings_and_a_summary_of_how_it_shares():
    data = examine(session_on(shared_server(ME)))
    assert data["findings"] == []
    text = doctor.render_text(data)
    assert text.splitlines()[0] == "No findings."
    assert "  GPUs NVML lists: 4 (0,1,2,3)" in text
    assert "  allocation: no CUDA_VISIBLE_DEVICES inherited (every GPU listed)" in text
    assert "  sharing: compute mode Default, no MPS daemon, no MIG" in text
    assert "  frameworks with a GPU pool: none yet" in text


def test_the_summary_labels_the_limit_and_names_the_platforms_share():
    session = session_on(shared_server(ME), {"CUDA_DEVICE_MEMORY_LIMIT": "4g"})
    session.configure(grammar.parse("use 1"))
    session.configure(grammar.parse("limit 2G"))
    text = doctor.render_text(examine(session))
    assert "  limit: GPU 1 2,048 MiB, soft (" in text  # every limit shown says soft or hard
    assert (
        "  platform share of GPU 1: 4 GiB share, set by HAMi (CUDA_DEVICE_MEMORY_LIMIT=4g); soft (HAMi)"
        in text
    )
    assert "platform share of GPU 0" not in text  # a GPU the kernel does not use is not its concern


# -- (a) more GPUs than the scheduler allocated ------------------------------------------------------
def test_a_pod_granted_one_gpu_that_sees_four():
    server = shared_server(ME)
    granted = server.gpus[2].uuid
    finding = only(
        examine(session_on(server, {"NVIDIA_VISIBLE_DEVICES": granted})), "more_gpus_than_allocated"
    )
    assert finding["title"] == "This kernel can reach 4 GPUs but the scheduler granted 1"
    assert finding["evidence"][0] == f"NVIDIA_VISIBLE_DEVICES='{granted}': 1 GPU granted"
    assert finding["evidence"][1].startswith("NVML lists 4 GPUs: GPU 0 ")
    assert "`%gpu use 2`" in finding["fix"]  # the granted GPU's number here, found by its UUID
    assert "device-list-strategy = volume-mounts" in finding["fix"]
    session = session_on(server, {"NVIDIA_VISIBLE_DEVICES": granted})
    session.configure(grammar.parse("use 2"))  # the fix: the kernel stays inside the allocation
    assert examine(session)["findings"] == []


def test_a_slurm_job_without_a_device_cgroup_sees_the_whole_node():
    finding = only(
        examine(session_on(shared_server(ME), {"SLURM_JOB_GPUS": "2,3"})), "more_gpus_than_allocated"
    )
    assert finding["evidence"][0] == "SLURM_JOB_GPUS='2,3': 2 GPUs granted"
    assert "`%gpu use 2,3`" in finding["fix"]


def test_all_gpus_granted_is_no_finding():
    assert examine(session_on(shared_server(ME), {"NVIDIA_VISIBLE_DEVICES": "all"}))["findings"] == []


# -- (b) how the GPUs are shared: MIG, compute mode, time-slicing, MPS -------------------------------
def test_a_gpu_in_mig_mode_without_an_instance_allocated():
    finding = only(examine(session_on(mig_server(ME))), "mig_mode")
    assert "GPU 3 'NVIDIA A100-SXM4-40GB': MIG mode on (NVML)" in finding["evidence"]
    assert "CUDA_VISIBLE_DEVICES=MIG-<uuid>" in finding["fix"] and "`%gpu use 0,1,2`" in finding["fix"]


def test_a_kernel_in_a_mig_instance_is_told_its_memory_is_the_instances():
    server = mig_server(ME)
    instance = server.gpus[3].mig_instances[0].uuid
    finding = only(examine(session_on(server, {"CUDA_VISIBLE_DEVICES": instance})), "mig_mode")
    assert finding["title"].startswith("This kernel runs in a MIG instance")
    assert any(instance in line for line in finding["evidence"])
    assert "at most 9,984 MiB" in finding["fix"] and "`%gpu limit 90%`" in finding["fix"]


@pytest.mark.parametrize(
    "mode, title, fix",
    [
        (2, "no process may use it", "Leave GPU 2 out: `%gpu use 0,1,3`."),
        (3, "one process at a time may use it", "stop the other kernel or job on them first"),
    ],
)
def test_a_gpu_not_in_default_compute_mode(mode, title, fix):
    server = shared_server(ME)
    server.gpus[2].compute_mode = mode
    finding = only(examine(session_on(server)), "compute_mode")
    assert finding["title"].endswith(title)
    assert finding["evidence"][0].startswith(f"GPU 2: compute mode {doctor.COMPUTE_MODE_NAMES[mode]} (NVML)")
    assert fix in finding["fix"] and "`sudo nvidia-smi -i 2 -c DEFAULT`" in finding["fix"]
    session = session_on(server)
    session.configure(grammar.parse("use 1"))  # a GPU this kernel left out is not its concern
    assert examine(session)["findings"] == []


def test_memory_used_by_processes_this_container_cannot_see_is_time_slicing():
    server = SimulatedNvml(
        [
            SimulatedGpu(
                total_mib=40960,
                base_used_mib=300 + 20480,
                utilization=88,
                processes=[SimulatedProcess(ME, 2048, "me")],
            )
        ]
    )
    finding = only(examine(session_on(server)), "time_slicing")
    assert finding["evidence"] == [
        "GPU 0: 22.3 GiB used (driver), the 1 processes listed hold 2,048 MiB: 20.0 GiB belongs to "
        "processes this kernel cannot see; utilization 88%"
    ]
    free_for_me = (40960 - 300 - 20480 - 2048 + 2048 - 300) * 9 // 10
    assert f"`%gpu limit {free_for_me}`" in finding["fix"]


def test_an_mps_control_pipe_owned_by_root_or_me_is_found_by_lstat(no_mps_here):
    os.mkfifo(no_mps_here / "control")
    session = session_on(shared_server(ME), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    finding = only(examine(session), "mps")
    assert (
        finding["evidence"][0]
        == f"'{no_mps_here}/control' is a FIFO owned by uid {os.getuid()} (lstat; not opened)"
    )
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='50'" in finding["evidence"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8G" in finding["fix"]
    limited = session_on(shared_server(ME), {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4G"})
    assert only(examine(limited), "mps")["fix"].startswith("None needed for memory")


def test_a_planted_link_file_or_neighbours_fifo_is_not_an_mps_daemon(no_mps_here, tmp_path):
    elsewhere = tmp_path / "real-fifo"
    os.mkfifo(elsewhere)
    (no_mps_here / "control").symlink_to(elsewhere)  # never followed
    assert examine(session_on(shared_server(ME)))["findings"] == []
    (no_mps_here / "control").unlink()
    (no_mps_here / "control").write_text("")  # a regular file
    assert examine(session_on(shared_server(ME)))["findings"] == []
    (no_mps_here / "control").unlink()
    os.mkfifo(no_mps_here / "control")
    neighbour = 54321
    assert doctor.read_mps({"CUDA_MPS_PIPE_DIRECTORY": str(no_mps_here)}, me=os.getuid()) is not None
    if os.getuid() == 0:
        os.chown(no_mps_here / "control", neighbour, neighbour)  # a neighbour's FIFO in a shared place
        assert doctor.read_mps({"CUDA_MPS_PIPE_DIRECTORY": str(no_mps_here)}) is None
    else:  # the files are this user's: a reader of another uid does not trust them
        assert doctor.read_mps({"CUDA_MPS_PIPE_DIRECTORY": str(no_mps_here)}, me=neighbour) is None


# -- (c) renumbering by a cgroup --------------------------------------------------------------------
def test_slurm_node_indices_inside_a_device_cgroup_are_not_nvidia_smis():
    server = SimulatedNvml(
        [SimulatedGpu(), SimulatedGpu()]
    )  # the job's two GPUs, numbered 0 and 1 in the cgroup
    env = {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}  # a job script copied the node's numbers
    finding = only(examine(session_on(server, env)), "cgroup_renumbering")
    assert finding["evidence"][:2] == [
        "SLURM_JOB_GPUS='2,3': the node's numbers",
        "NVML inside the cgroup lists GPU 0,1",
    ]
    assert f"node 2 = GPU 0 '{server.gpus[0].uuid}'" in finding["evidence"][2]
    assert finding["evidence"][3] == (
        "CUDA_VISIBLE_DEVICES inherited: '2,3' (names a GPU this cgroup does not have: CUDA finds none)"
    )
    assert "`%gpu use 0,1`" in finding["fix"] and "keyed by UUID" in finding["fix"]


def test_a_step_inside_its_cgroup_numbered_from_zero_is_no_finding():
    server = SimulatedNvml([SimulatedGpu(), SimulatedGpu()])
    assert (
        examine(session_on(server, {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}))["findings"]
        == []
    )


# -- (d) a cooperative limit that the CUDA context and libraries exceed ------------------------------
def test_the_driver_figure_of_the_kernel_and_its_children_above_its_limit():
    session = session_on(shared_server(ME))
    session.configure(grammar.parse("use 1"))
    session.configure(grammar.parse("limit 12G"))
    assert examine(session)["findings"] == []  # 10 GiB held (pid 4242): within 12 GiB
    finding = only(examine(session, parents={41002: ME}), "limit_exceeded")  # its child holds 4 GiB more
    assert finding["evidence"] == [
        "GPU 1: this kernel's processes hold 14.0 GiB per the driver (NVML), its limit is 12.0 GiB (the session's record)"
    ]
    assert f"`%gpu limit {(12 - 2) * 1024 * 9 // 10}`" in finding["fix"]


def test_a_limit_plus_a_context_above_the_free_memory():
    session = session_on(shared_server(ME))
    session.configure(grammar.parse("use 0"))  # alice holds 30 GiB of its 40: 9.7 GiB free
    session.configure(grammar.parse("limit 9.6G"))
    finding = only(examine(session), "limit_exceeded")
    assert finding["evidence"][0].startswith("GPU 0: limit 9,830 MiB + about 300 MiB of CUDA context")
    free_mib = 40960 - 30720 - 300
    assert f"`%gpu limit {(free_mib - 300) * 9 // 10}`" in finding["fix"]


def test_when_more_than_the_limit_itself_is_held_outside_it_no_tiny_limit_is_advised():
    """10 GiB held by the driver's figure against a 4 GiB limit: no lower limit makes room (the old
    advice was `%gpu limit 1`, one MiB); the fix says so and names what to look at instead."""
    session = session_on(shared_server(ME))
    session.configure(grammar.parse("use 1"))
    session.configure(grammar.parse("limit 4G"))
    finding = only(examine(session), "limit_exceeded")
    assert not GPU_LINE.search(finding["fix"]).group(1).startswith("%gpu limit")
    assert "no lower limit makes room" in finding["fix"].lower() and "\n" not in finding["fix"]


# -- (e) CUDA_VISIBLE_DEVICES set by hand against the claims ---------------------------------------
def test_visible_devices_set_by_hand_after_gpu_use():
    session = session_on(shared_server(ME))
    session.configure(grammar.parse("use 1"))
    assert examine(session)["findings"] == []  # what %gpu wrote is not "by hand"
    session.claimed = (1,)
    session.env["CUDA_VISIBLE_DEVICES"] = "0"
    finding = only(examine(session), "visible_devices_by_hand")
    assert finding["evidence"][0] == "os.environ['CUDA_VISIBLE_DEVICES'] = '0', set by hand in this kernel"
    assert "`%gpu use 1` applied GPU 1" in finding["evidence"]
    assert "this kernel claimed GPU 1, which the value leaves out" in finding["evidence"]
    assert "`os.environ.pop('CUDA_VISIBLE_DEVICES', None)`, then `%gpu use 1`" in finding["fix"]


# A kernel of another process that claims a GPU (by its UUID), says so, and holds it until stdin closes.
HOLDER = """
import sys
from tfgpu_magic.gpus import claims
with claims.choosing():
    print("claimed" if claims.claim(sys.argv[1]) else "refused", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def gpu_0_claimed_elsewhere():
    """GPU 0 of shared_server claimed by another live process (a neighbour's kernel)."""
    server = shared_server(ME)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, server.gpus[0].uuid],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        assert holder.stdout.readline().strip() == "claimed"
        yield server, holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()


def test_visible_devices_set_by_hand_onto_a_gpu_another_kernel_claimed(gpu_0_claimed_elsewhere):
    server, pid = gpu_0_claimed_elsewhere
    session = session_on(server)
    session.configure(grammar.parse("use 1"))
    session.env["CUDA_VISIBLE_DEVICES"] = "0"
    finding = only(examine(session), "visible_devices_by_hand")
    assert any(line.startswith(f"GPU 0 is claimed by pid {pid} (") for line in finding["evidence"])


def test_an_inherited_value_naming_a_claimed_gpu_outside_any_scheduler(gpu_0_claimed_elsewhere):
    server, pid = gpu_0_claimed_elsewhere
    finding = only(examine(session_on(server, {"CUDA_VISIBLE_DEVICES": "0"})), "visible_devices_by_hand")
    assert finding["evidence"][0] == "CUDA_VISIBLE_DEVICES inherited: '0', not a scheduler's allocation"
    assert finding["evidence"][1].startswith(f"GPU 0 is claimed by pid {pid} (")
    assert "`%gpu use auto`" in finding["fix"]
    # The same value from a scheduler (Slurm granted GPU 0) is the kernel's allocation: respected.
    env = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "0"}
    assert "visible_devices_by_hand" not in [f["key"] for f in examine(session_on(server, env))["findings"]]


def test_once_cuda_read_the_hand_made_value_the_fix_is_a_restart():
    session = session_on(shared_server(ME))
    session.configure(grammar.parse("use 1"))
    session.env["CUDA_VISIBLE_DEVICES"] = "0"
    session.machine.cuda_record.note(capture(CUDA_ENV, env=session.env), by="PyTorch")  # then CUDA started
    finding = only(examine(session), "visible_devices_by_hand")
    assert "CUDA read CUDA_VISIBLE_DEVICES='0' when PyTorch started it" in finding["evidence"]
    assert finding["fix"].startswith("Restart the kernel")


def test_a_value_set_by_hand_against_nothing_is_the_users_choice():
    session = session_on(shared_server(ME))
    session.env["CUDA_VISIBLE_DEVICES"] = "2"  # no `%gpu use`, no claim: the kernel follows it
    assert examine(session)["findings"] == []


def test_a_scheduler_allocation_inherited_is_not_by_hand():
    assert examine(session_on(shared_server(ME), {"CUDA_VISIBLE_DEVICES": "1"}))["findings"] == []


# -- (f) frameworks that each take their own pool -----------------------------------------------------
@pytest.fixture
def two_frameworks(monkeypatch):
    for name in (
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_ALLOCATOR",
    ):
        monkeypatch.delenv(name, raising=False)
    tf = FakeTensorFlow(stage=Stage.ENUMERATED, gpus={"GPU:0": 1}, found=[1])
    session = Session(nvml=Nvml(lib=shared_server(ME)), env=os.environ, frameworks=adapters(tensorflow=tf))
    session.configure(grammar.parse("use 1"))
    session._on_import(session.adapter("jax"), StandInJax())  # the notebook imports jax itself
    return session


def test_two_frameworks_each_with_a_pool_of_their_own(two_frameworks):
    session = two_frameworks
    finding = only(examine(session), "several_pools")
    assert finding["title"] == "2 frameworks in this kernel each keep a memory pool of their own"
    assert finding["evidence"][:2] == [
        "TensorFlow: devices enumerated, runtime not started, able to use a GPU (its adapter)",
        "JAX: imported, devices not yet enumerated, able to use a GPU (its adapter)",
    ]
    assert re.search(r"`%gpu limit \d+M tensorflow, \d+M jax`", finding["fix"])
    session.configure(grammar.parse("limit 12G tensorflow, 4G jax"))  # this kernel holds 10 GiB
    assert examine(session)["findings"] == []  # each pool sized: nothing to fix
    assert "  frameworks with a GPU pool: TensorFlow, JAX" in doctor.render_text(examine(session))


# -- the magic, the JSON, hostile values -------------------------------------------------------------
def test_the_magic_prints_the_report_and_its_json(gpu):
    with capture_output() as out:
        gpu("doctor")
    assert out.stdout.startswith("No findings.\nHow this kernel shares:\n")
    with capture_output() as out:
        gpu("doctor --json")
    data = json.loads(out.stdout)
    assert set(data) == {"findings", "summary", "notes"} and data["findings"] == []


def test_control_characters_in_what_others_chose_are_escaped():
    server = shared_server(ME)
    server.gpus[0].name = "evil\x1b]0;pwned\x07"
    env = {"NVIDIA_VISIBLE_DEVICES": "0\x1b[2J\u202e"}
    text = doctor.render_text(examine(session_on(server, env)))
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2J\\u202e" in text and "evil\\x1b]0;pwned\\x07" in text


def test_a_failing_finding_is_a_note_not_an_error(monkeypatch):
    def broken(facts):
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "FINDINGS", (broken, *doctor.FINDINGS))
    data = examine(session_on(shared_server(ME)))
    assert data["findings"] == [] and "broken could not be checked (RuntimeError)" in data["notes"]


def test_a_compute_mode_the_driver_cannot_read_and_no_driver_at_all_are_no_findings():
    server = shared_server(ME)
    server.gpus[2].unsupported.add("compute_mode")
    data = examine(session_on(server))
    assert data[
        "findings"
    ] == [] and "  sharing: compute mode Default, no MPS daemon, no MIG" in doctor.render_text(data)
    data = examine(session_on(SimulatedNvml([], driver=False)))
    assert data["findings"] == []
    assert doctor.render_text(data).splitlines()[2].startswith("  NVML: ")


def test_a_kernel_left_with_no_gpu_is_summarised_as_such():
    """An inherited CUDA_VISIBLE_DEVICES naming no GPU here: the summary said "this kernel: GPU "."""
    session = session_on(shared_server(ME), {"CUDA_VISIBLE_DEVICES": "GPU-not-here"})
    summary = examine(session)["summary"]
    assert "this kernel: no GPU (CUDA sees none)" in summary
