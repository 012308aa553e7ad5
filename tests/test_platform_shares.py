"""Issue 31, item 1: the platform's share of each GPU is read from what the kernel inherited,
shown with its source, and respected: a limit above it is refused in one line naming it, and a
framework started with no limit of its own gets the share less a CUDA context.

Through the real entry points: ``%load_ext`` on a real IPython shell with the process's session
on the simulated server, the ``%gpu`` magic, and a CUDA build of PyTorch stood in for.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import tfgpu_magic
from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus import platform
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.platform import GpuFacts, parse_amount, read_shares
from tfgpu_magic.gpus.simulated import mig_server, shared_server
from tfgpu_magic.kernel import session as session_module
from tfgpu_magic.kernel.session import Session, SessionError
from tfgpu_magic.server import kernel_inventory, metrics

from support.fakes import FakeTensorFlow
from support.stand_ins import GIB, cuda_torch, torch_session

MIB = 1 << 20
SCHEMA = Path(tfgpu_magic.__file__).parent / "server" / "schema" / "status-reply.v1.json"
FOUR = [GpuFacts(i, f"GPU-{i}", 16 * GIB) for i in range(4)]

SHARES = {
    "HAMi": ({"CUDA_DEVICE_MEMORY_LIMIT": "4g"}, "CUDA_DEVICE_MEMORY_LIMIT=4g", 4 * GIB),
    "MPS": ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6G"}, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6G", 6 * GIB),
    "Alibaba gpushare": (
        {"ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_MEM_DEV": "80"},
        "ALIYUN_COM_GPU_MEM_CONTAINER=4",
        4 * GIB,
    ),
}


def loaded(shell, monkeypatch, env: dict, server=None) -> tuple[Session, str]:
    """`%load_ext tfgpu_magic` in a kernel that inherited ``env``; returns the session and what it said."""
    session = Session(
        nvml=Nvml(lib=server or shared_server(os.getpid())),
        env=dict(env),
        frameworks=adapters(tensorflow=FakeTensorFlow()),
    )
    monkeypatch.setattr(session_module, "_SESSION", session)
    with capture_output() as captured:
        tfgpu_magic.load_ipython_extension(shell)
    return session, captured.stdout


def gpu(shell, line: str) -> str:
    """`%gpu LINE`: what it printed (text and displayed plain text), or the one-line UsageError."""
    with capture_output() as captured:
        try:
            shell.run_line_magic("gpu", line)
        except UsageError as err:
            return f"UsageError: {err}"
    return captured.stdout + "".join(o.data.get("text/plain", "") for o in captured.outputs)


# -- reading ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [("4g", 4 * GIB), ("4096m", 4 * GIB), ("6G", 6 * GIB), ("1.5GiB", 3 * GIB // 2), ("512MB", 512 * MIB)],
)
def test_amounts_in_the_platforms_units(text, expected):
    assert parse_amount(text) == expected


@given(st.text(max_size=30) | st.just("1" * 5000) | st.just("0=" + "9" * 5000))
def test_any_inherited_value_is_read_or_ignored_never_raises(text):
    for name in (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "ALIYUN_COM_GPU_MEM_CONTAINER",
        "SLURM_JOB_GPUS",
        "CUDA_DEVICE_MEMORY_LIMIT_1",
    ):
        shares = read_shares({name: text}, FOUR, ask_mps_daemon=False)
        assert all(s.bytes > 0 and s.gpu in range(4) for s in shares.values())
        assert all(len(s.evidence) < 100 and s.evidence.isprintable() for s in shares.values())


def test_mps_per_device_values_are_cudas_numbers_under_the_inherited_visible_devices():
    shares = read_shares({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6G,1=4G"}, FOUR, cuda_map=[2, 3])
    assert {i: (s.bytes, s.label) for i, s in shares.items()} == {
        2: (6 * GIB, "hard (MPS)"),
        3: (4 * GIB, "hard (MPS)"),
    }


def test_hami_per_device_variable_overrides_the_common_one_and_is_labelled_soft():
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "8g", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"}
    shares = read_shares(env, FOUR)
    assert shares[0].bytes == 8 * GIB and shares[1].bytes == 2 * GIB
    assert shares[1].evidence == "CUDA_DEVICE_MEMORY_LIMIT_1=2048m" and shares[1].label == "soft (HAMi)"


def test_a_share_above_the_gpus_memory_is_the_whole_gpu_not_a_planted_figure():
    shares = read_shares({"CUDA_DEVICE_MEMORY_LIMIT": "99999999999999T"}, FOUR)
    assert all(share.bytes == gpu.total_bytes for gpu, share in zip(FOUR, shares.values(), strict=True))


def test_alibaba_unit_is_told_apart_by_the_devices_memory():
    mib = read_shares({"ALIYUN_COM_GPU_MEM_CONTAINER": "4096", "ALIYUN_COM_GPU_MEM_DEV": "16384"}, FOUR)
    gib = read_shares({"ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_MEM_DEV": "16"}, FOUR)
    assert mib[0].bytes == gib[0].bytes == 4 * GIB and not gib[0].hard


def test_slurm_under_a_cgroup_matches_the_jobs_gpus_to_the_renumbered_ones_by_uuid():
    job = [GpuFacts(0, "GPU-b", 24 * GIB), GpuFacts(1, "GPU-c", 16 * GIB)]  # the node's 5 and 7
    shares = read_shares({"SLURM_JOB_GPUS": "5,7"}, job)
    assert {s.uuid: (s.bytes, s.label) for s in shares.values()} == {
        "GPU-b": (24 * GIB, "hard (Slurm)"),
        "GPU-c": (16 * GIB, "hard (Slurm)"),
    }
    whole_node = read_shares({"SLURM_JOB_GPUS": "1,2", "SLURM_STEP_GPUS": "2"}, FOUR)
    assert list(whole_node) == [2] and whole_node[2].label == "soft (Slurm)"  # the step's, no cgroup


def test_the_tightest_share_wins():
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "8g", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "6G"}
    assert {s.source for s in read_shares(env, FOUR).values()} == {"MPS"}


# -- the MPS pipe directory: checked without opening the FIFO, links not followed -----------------------
def fake_control(tmp_path, answer: str) -> str:
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\ncat > /dev/null\necho '{answer}'\n")
    binary.chmod(0o755)
    return str(binary.parent)


def test_the_daemons_default_is_asked_only_where_its_pipe_directory_holds_a_fifo(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_control(tmp_path, "4096M") + os.pathsep + os.environ["PATH"])
    pipes = tmp_path / "mps"
    pipes.mkdir()
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    assert read_shares(env, FOUR[:1]) == {}  # no control FIFO: no daemon
    os.mkfifo(pipes / "control")
    share = read_shares(env, FOUR[:1])[0]
    assert (share.bytes, share.label) == (4 * GIB, "hard (MPS)") and "default" in share.evidence
    assert stat.S_ISFIFO(os.lstat(pipes / "control").st_mode)  # still there, never opened


def test_a_control_binary_that_hangs_costs_one_timeout_not_one_per_gpu(tmp_path, monkeypatch):
    """The daemon's default is asked per CUDA device; one that does not answer within the timeout
    will not answer the next either: the reading (on the kernel's thread) stops asking, so eight
    GPUs cost one timeout, not eight."""
    calls = tmp_path / "calls"
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(f"#!/bin/sh\necho asked >> {calls}\nexec sleep 30\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(binary.parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(platform, "MPS_CONTROL_TIMEOUT_S", 0.5)
    pipes = tmp_path / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")
    eight = [GpuFacts(i, f"GPU-{i}", 16 * GIB) for i in range(8)]
    assert read_shares({"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}, eight) == {}
    assert calls.read_text().splitlines() == ["asked"]


def test_a_linked_pipe_directory_is_not_followed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_control(tmp_path, "4096M") + os.pathsep + os.environ["PATH"])
    real = tmp_path / "real"
    real.mkdir()
    os.mkfifo(real / "control")
    (tmp_path / "planted").symlink_to(real)
    assert platform.mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "planted")}) is None
    assert platform.mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(real)}) == str(real)


# -- respected and shown, through %gpu ---------------------------------------------------------------
@pytest.mark.parametrize("source", list(SHARES))
def test_a_limit_above_the_share_is_one_line_naming_it_and_status_carries_it(shell, monkeypatch, source):
    env, evidence, size = SHARES[source]
    session, _ = loaded(shell, monkeypatch, env)
    refused = gpu(shell, "limit 70G")
    assert refused.startswith("UsageError: ") and "\n" not in refused.strip()
    assert f"share of GPU 0 ({size // GIB} GiB, set by {source}: {evidence})" in refused
    assert session.requested.limits is None  # nothing changed
    within = session.resolved().gpu(0)
    assert within is not None and within.cap_mib == size // MIB - 300 and within.within_share


def test_the_record_is_what_the_kernel_inherited_not_what_is_set_later(shell, monkeypatch):
    session, _ = loaded(shell, monkeypatch, {"CUDA_DEVICE_MEMORY_LIMIT": "4g"})
    session.env["CUDA_DEVICE_MEMORY_LIMIT"] = "40g"
    assert session.machine.platform_shares()[0].bytes == 4 * GIB


def test_a_framework_started_with_no_limit_gets_the_share_less_a_cuda_context():
    session = torch_session({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "6G"})
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    assert torch.cuda.fractions[0] == pytest.approx((6 * 1024 - 300) / (80 * 1024))
    assert session.limit_bytes_by_gpu()[0] == (6 * 1024 - 300) * MIB


def test_limit_off_under_a_share_returns_to_the_share_not_the_whole_gpu():
    session = torch_session({"CUDA_DEVICE_MEMORY_LIMIT": "4g"})
    session.configure(grammar.parse("limit 2G"))
    session.configure(grammar.parse("limit off"))
    assert session.resolved().gpu(0).cap_mib == 4096 - 300
    with pytest.raises(SessionError, match="set by HAMi"):
        session.configure(grammar.parse("split 3G,3G"))


@pytest.mark.parametrize("source", list(SHARES))
def test_gpu_names_the_share_its_source_and_who_enforces_it_and_json_carries_it(shell, monkeypatch, source):
    env, evidence, size = SHARES[source]
    loaded(shell, monkeypatch, env)
    text = gpu(shell, "")
    share_line = next(line for line in text.splitlines() if line.startswith("Share:"))
    assert f"GPU 0{',1,2,3' if source != 'MPS' else ''}: {size // MIB} MiB" in share_line
    assert f"set by {source}: {evidence}" in share_line
    assert "no limit asked, so" in share_line and "the share less a CUDA context" in share_line
    report = json.loads(gpu(shell, "status --json"))
    share = next(s for s in report["platform_shares"] if s["gpu"] == 0)
    assert (share["bytes"], share["source"], share["evidence"]) == (size, source, evidence)
    assert share["label"] in ("hard (MPS)", "soft (HAMi)", "soft (Alibaba gpushare)")
    assert report["gpus"][0]["share"] == share
    assert report["resolved"]["gpus"][0]["within_share"].startswith(f"{size // GIB} GiB, set by {source}")


def test_a_slurm_allocation_is_named_with_its_gpus_keyed_by_uuid(shell, monkeypatch):
    loaded(shell, monkeypatch, {"SLURM_JOB_GPUS": "1,2"})
    report = json.loads(gpu(shell, "status --json"))
    assert [(s["gpu"], s["source"]) for s in report["platform_shares"]] == [(1, "Slurm"), (2, "Slurm")]
    assert all(s["uuid"] == report["gpus"][s["gpu"]]["uuid"] for s in report["platform_shares"])
    assert "set by Slurm: SLURM_JOB_GPUS=1,2" in gpu(shell, "")


# -- the server's reply and /metrics -----------------------------------------------------------------
def server_reply(env: dict) -> dict:
    """The inventory of the simulated server as a Jupyter server that inherited ``env`` replies."""
    record = platform.ShareRecord(env)
    return kernel_inventory.inventory(
        Nvml(lib=shared_server(os.getpid())), [], shares=record, clock=lambda: 1.0
    )


def test_the_servers_reply_carries_each_gpus_share_and_the_schema_allows_it():
    reply = server_reply({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6G,1=4G"})
    assert [g["share"] and (g["share"]["bytes"], g["share"]["label"]) for g in reply["gpus"]] == [
        (6 * GIB, "hard (MPS)"),
        (4 * GIB, "hard (MPS)"),
        None,
        None,
    ]
    jsonschema.validate(reply, json.loads(SCHEMA.read_text()))


def test_the_servers_reply_numbers_the_shares_as_cuda_under_its_inherited_visible_devices():
    """MPS's and HAMi's device numbers are CUDA's: a server started with CUDA_VISIBLE_DEVICES=2,3
    (its kernels inherit it) has MPS's device 0 on GPU 2, as the kernel's own record says, and no
    share on GPUs 0 and 1 its kernels cannot see."""
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6G,1=4G"}
    reply = server_reply(env)
    assert [g["share"] and g["share"]["bytes"] for g in reply["gpus"]] == [None, None, 6 * GIB, 4 * GIB]
    hami = server_reply({"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_MEMORY_LIMIT": "2g"})
    assert [g["share"] and g["share"]["bytes"] for g in hami["gpus"]] == [None, None, None, 2 * GIB]


def test_metrics_expose_the_share_with_its_source_and_enforcement():
    reply = server_reply({"CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"})
    found = [
        (sample.labels, sample.value)
        for family in metrics.families(reply, "0")
        for sample in family.samples
        if sample.name == "tfgpu_gpu_share_bytes"
    ]
    assert found == [
        (
            {"gpu": "1", "gpu_uuid": reply["gpus"][1]["uuid"], "source": "HAMi", "enforcement": "soft"},
            2 * GIB,
        )
    ]


# -- hard or soft (issue 31, item 2) ---------------------------------------------------------------------
def test_hard_without_mps_or_mig_is_one_line_naming_both_and_changes_nothing(shell, monkeypatch, tmp_path):
    session, _ = loaded(shell, monkeypatch, {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")})
    refused = gpu(shell, "limit 2G --hard")
    assert refused.startswith("UsageError: ") and "\n" not in refused.strip()
    assert "no MPS control daemon" in refused and "not on a MIG instance" in refused
    assert "nvidia-cuda-mps-control -d" in refused and "nvidia-smi mig" in refused
    assert session.requested.limits is None and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in session.env


def mps_running(tmp_path) -> str:
    pipes = tmp_path / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")
    return str(pipes)


def test_hard_with_mps_sets_the_limit_before_cuda_starts_and_is_labelled_hard(shell, monkeypatch, tmp_path):
    session, _ = loaded(shell, monkeypatch, {"CUDA_MPS_PIPE_DIRECTORY": mps_running(tmp_path)})
    gpu(shell, "use 1,2")
    gpu(shell, "limit 2G --hard")
    assert session.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M,1=2048M"  # CUDA's numbers: GPU 1 is 0
    text = gpu(shell, "")
    assert "Limit:      hard (MPS):" in text and "limit 2048MiB --hard" in text
    report = json.loads(gpu(shell, "status --json"))
    assert report["limit_enforcement"] == "hard (MPS)"
    assert {g["enforcement"] for g in report["resolved"]["gpus"]} == {"hard (MPS)"}
    gpu(shell, "limit 2G")  # soft again: MPS's variable goes back to what the kernel inherited
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in session.env
    soft = json.loads(gpu(shell, "status --json"))["limit_enforcement"]
    assert soft.startswith("soft (") and soft.endswith("'s allocator)")  # the frameworks taking it


def test_a_neighbours_fifo_in_the_mps_pipe_directory_makes_no_limit_hard(shell, monkeypatch, tmp_path):
    """Anyone may create /tmp/nvidia-mps: a pipe another user owns proves no MPS daemon."""
    pipes = mps_running(tmp_path)
    neighbour = os.getuid() + 4242
    real_lstat = os.lstat
    monkeypatch.setattr(
        os,
        "lstat",
        lambda path, *a, **k: (
            _owned_by(real_lstat(path, *a, **k), neighbour)
            if str(path).startswith(pipes)
            else real_lstat(path, *a, **k)
        ),
    )
    session, _ = loaded(shell, monkeypatch, {"CUDA_MPS_PIPE_DIRECTORY": pipes})
    refused = gpu(shell, "limit 2G --hard")
    assert refused.startswith("UsageError: ") and "no MPS control daemon" in refused
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in session.env


def _owned_by(result: os.stat_result, uid: int) -> os.stat_result:
    fields = list(result)
    fields[4] = uid  # st_uid
    return os.stat_result(fields)


def test_hard_after_cuda_started_is_too_late_under_mps():
    session = torch_session({"CUDA_MPS_PIPE_DIRECTORY": "/nonexistent"})
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    with pytest.raises(SessionError, match="no MPS control daemon"):
        session.configure(grammar.parse("limit 2G --hard"))


def test_hard_after_cuda_started_with_mps_says_too_late(tmp_path):
    session = torch_session({"CUDA_MPS_PIPE_DIRECTORY": mps_running(tmp_path)})
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    with pytest.raises(SessionError, match="too late for `--hard`"):
        session.configure(grammar.parse("limit 2G --hard"))
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in session.env


def test_every_limit_shown_says_soft_or_hard(shell, monkeypatch):
    loaded(shell, monkeypatch, {"CUDA_DEVICE_MEMORY_LIMIT": "4g"})  # a cap no one asked for
    report = json.loads(gpu(shell, "status --json"))
    assert report["limit_enforcement"].startswith("soft (")
    assert all(g["enforcement"] == report["limit_enforcement"] for g in report["resolved"]["gpus"])
    assert "Limit:      soft (" in gpu(shell, "")


def test_on_a_mig_instance_the_instance_is_the_share_and_a_hard_limit_is_labelled_so(shell, monkeypatch):
    server = mig_server(os.getpid())
    instance = server.gpus[3].mig_instances[0]
    session, _ = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": instance.uuid}, server)
    report = json.loads(gpu(shell, "status --json"))
    [share] = report["platform_shares"]
    assert (share["gpu"], share["source"], share["label"]) == (3, "MIG", "hard (MIG)")
    gpu(shell, f"limit {instance.total_mib}M --hard")  # the instance's whole memory
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in session.env  # the instance holds it, not MPS
    assert json.loads(gpu(shell, "status --json"))["limit_enforcement"] == "hard (MIG)"
    assert "Limit:      hard (MIG):" in gpu(shell, "")


def test_after_cuda_started_under_a_hard_mps_limit_other_commands_still_work_and_it_stays_hard(tmp_path):
    session = torch_session({"CUDA_MPS_PIPE_DIRECTORY": mps_running(tmp_path)})
    session.configure(grammar.parse("limit 2G --hard"))
    assert session.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].startswith("0=2048M")
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    session.configure(grammar.parse("limit 1G"))  # PyTorch's cap changes; MPS's, read at CUDA's start, holds
    assert session.limit_label() == "hard (MPS)"


@pytest.mark.slow
def test_in_a_fresh_kernel_jax_imported_with_no_limit_starts_within_the_share():
    """The light `%load_ext` (no session until the import), then `import jax` with no `%gpu` line:
    JAX is given the share less a CUDA context as its memory fraction of GPU 1, before it starts."""
    code = (
        "import os, sys\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython(); ip.run_line_magic('load_ext', 'tfgpu_magic')\n"
        "built = 'tfgpu_magic.kernel.session' in sys.modules\n"
        "import jax\n"
        "print(built, os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION'))\n"
    )
    kept = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TFGPU_MAGIC_NOTEBOOK_SETTINGS", "JPY_SESSION_NAME")
    env = {k: v for k, v in os.environ.items() if k not in kept and not k.startswith("XLA_PYTHON_CLIENT")}
    env.update({"TFGPU_MAGIC_SIMULATED_SOURCE": "kernels_server", "CUDA_DEVICE_MEMORY_LIMIT_1": "4g"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    built, fraction = out.stdout.strip().splitlines()[-1].split()
    assert built == "False"  # the light load: the share is met when the session is built, at the import
    assert float(fraction) == pytest.approx((4096 - 300) / 81920, abs=0.001)  # GPU 1 has 80 GiB


@pytest.mark.parametrize("line", ["limit 4G", "limit off", "limit 4G,4G,4G,4G"])
def test_after_cuda_started_under_a_hard_mps_limit_nothing_above_it_is_claimed(tmp_path, line):
    """MPS read 2048M as CUDA started and holds the process to it: a larger limit (or none) cannot
    be in force, so it is refused in one line naming MPS's figure, and the 2 GiB stays shown."""
    session = torch_session({"CUDA_MPS_PIPE_DIRECTORY": mps_running(tmp_path)})
    session.configure(grammar.parse("limit 2G --hard"))
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    with pytest.raises(SessionError) as refused:
        session.configure(grammar.parse(line))
    message = str(refused.value)
    assert "\n" not in message and "2048 MiB" in message and "MPS" in message and "restart" in message
    assert session.requested.limits is not None and session.limit_label() == "hard (MPS)"
    assert all(g.cap_mib == 2048 for g in session.resolved().gpus)


def test_a_hard_limit_below_a_mig_instance_is_not_called_hard_by_mig(shell, monkeypatch):
    """The instance holds the process to its own memory (9984 MiB), not to 2 GiB: only TensorFlow's
    allocator would hold 2 GiB, so `--hard` is refused in one line naming the instance's size."""
    server = mig_server(os.getpid())
    instance = server.gpus[3].mig_instances[0]
    session, _ = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": instance.uuid}, server)
    refused = gpu(shell, "limit 2G --hard")
    assert refused.startswith("UsageError: ") and "\n" not in refused.strip()
    assert "9984 MiB" in refused and "MIG" in refused
    assert session.requested.limits is None
    gpu(shell, f"limit {instance.total_mib}M --hard")  # the instance's whole memory: that the GPU holds
    assert json.loads(gpu(shell, "status --json"))["limit_enforcement"] == "hard (MIG)"


def test_a_share_smaller_than_a_cuda_context_gets_no_self_contradicting_advice(shell, monkeypatch):
    """A 200 MiB share leaves no room for a CUDA context: the refusal said `%gpu limit 1M` as "the
    share less a CUDA context" (and at most 0 MiB with `=6`, bytes, then advised 1M above it)."""
    loaded(shell, monkeypatch, {"CUDA_DEVICE_MEMORY_LIMIT": "200m"})
    refused = gpu(shell, "limit 1G")
    assert refused.startswith("UsageError: ") and "\n" not in refused.strip()
    assert "at most 200 MiB" in refused and "%gpu limit 1M" not in refused
    assert "no room for a CUDA context" in refused


def test_reset_after_cuda_started_under_a_hard_mps_limit_keeps_it_and_says_so(tmp_path):
    session = torch_session({"CUDA_MPS_PIPE_DIRECTORY": mps_running(tmp_path)})
    session.configure(grammar.parse("limit 2G --hard"))
    session.configure(grammar.parse("grow on"))
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    said = session.reset()
    assert "cannot undo: the hard limit" in said and "until the kernel restarts" in said
    assert session.limit_label() == "hard (MPS)" and all(g.cap_mib == 2048 for g in session.resolved().gpus)
    assert session.requested.growth is None  # the rest went back to the defaults


def test_with_nothing_inherited_that_could_grant_a_share_nvml_is_not_started_for_it(tmp_path):
    """A framework's import asks for the shares: where no variable, MIG instance or MPS pipe could
    grant one, that costs no NVML start (issue 32's import-hook budget)."""
    from tfgpu_magic.kernel.machine import Machine

    asked = []

    class Untouchable:
        def __getattr__(self, name):
            asked.append(name)
            raise AttributeError(name)

    nowhere = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")}
    assert Machine(nvml=Nvml(lib=Untouchable()), env=dict(nowhere)).platform_shares() == {}
    assert asked == []
    assert not platform.may_grant_a_share(nowhere, "0,1")
    assert platform.may_grant_a_share({**nowhere, "CUDA_DEVICE_MEMORY_LIMIT": "4g"}, None)
    assert platform.may_grant_a_share(nowhere, "MIG-4f2c0a1e-0000-0000-0000-000000000000")
    assert platform.may_grant_a_share({"CUDA_MPS_PIPE_DIRECTORY": mps_running(tmp_path)}, None)
