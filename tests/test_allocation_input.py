"""Issue 17: an inherited CUDA_VISIBLE_DEVICES read as CUDA reads it, whatever it holds.

Every test goes through the real entry points: ``%load_ext`` (``load_ipython_extension`` on a
real IPython shell, with the process's session replaced by one on the simulated server), the
``%gpu`` magic, and ``tfgpu``'s ``main``.  The inherited value is hostile input: a scheduler
or a neighbour's spawner may have written anything into it.
"""

from __future__ import annotations

import json
import os

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import tfgpu_magic
from tfgpu_magic.__main__ import main
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import (
    NVML_ERROR_NO_PERMISSION,
    NVMLError,
    SimulatedNvml,
    mig_server,
    shared_server,
)
from tfgpu_magic.kernel import session as session_module
from tfgpu_magic.kernel.session import Session

from support.fakes import FakeTensorFlow

ME = os.getpid()
LONG = "1" * 4301  # int() refuses over 4,300 digits with a ValueError


def loaded(shell, monkeypatch, env: dict, server: SimulatedNvml | None = None) -> tuple[Session, str]:
    """`%load_ext tfgpu_magic` in a kernel that inherited ``env``; returns the session and what it said."""
    session = Session(
        nvml=Nvml(lib=server or shared_server(ME)),
        env=dict(env),
        frameworks=adapters(tensorflow=FakeTensorFlow()),
    )
    monkeypatch.setattr(session_module, "_SESSION", session)
    with capture_output() as captured:
        tfgpu_magic.load_ipython_extension(shell)  # what `%load_ext tfgpu_magic` runs
    return session, captured.stdout


def gpu(shell, line: str) -> str:
    """`%gpu LINE`: what it printed (text and displayed plain text), or the one-line UsageError."""
    with capture_output() as captured:
        try:
            shell.run_line_magic("gpu", line)
        except UsageError as err:
            return f"UsageError: {err}"
    shown = [o.data.get("text/plain", "") for o in captured.outputs]
    return captured.stdout + "".join(shown)


def status_json(shell) -> dict:
    return json.loads(gpu(shell, "status --json"))


# -- (2) a 4,301-digit entry ------------------------------------------------------------------------
def test_a_4301_digit_entry_is_an_invalid_entry_not_a_traceback(shell, monkeypatch):
    session, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": LONG})
    assert "ValueError" not in said
    report = status_json(shell)
    assert report["allocation"]["gpus"] == []  # CUDA stops at the first entry: no GPU
    assert "allocated by the environment: no GPU" in report["in_force"]
    text = gpu(shell, "status")
    assert "allocated by the environment: no GPU" in text and "Traceback" not in text
    refused = gpu(shell, "use 0")
    assert refused.startswith("UsageError: GPU 0 is outside this kernel's allocation") and "\n" not in refused
    assert session.env["CUDA_VISIBLE_DEVICES"] == LONG and session.requested.visible is None
    assert gpu(shell, "use all").startswith("use all: ")
    assert session.env["CUDA_VISIBLE_DEVICES"] == "-1"  # all of nothing: CUDA still shows no GPU


def test_a_long_index_with_leading_zeros_is_read_as_cuda_reads_it(shell, monkeypatch):
    loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": "0" * 5000 + "2"})
    assert status_json(shell)["allocation"]["gpus"] == [2]


def test_tfgpu_demo_reads_a_4301_digit_value(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", LONG)
    assert main(["--demo"]) == 0
    assert main(["--demo", "--json"]) == 0
    assert "GPU 3  Tesla T4" in capsys.readouterr().out


def test_an_absurd_cpu_limit_is_read_as_no_limit_of_its_own(monkeypatch):
    from tfgpu_magic.frameworks import tensorflow as tf_runtime

    monkeypatch.setenv(tf_runtime.CPU_STATS_ENV, "true")
    monkeypatch.setenv(tf_runtime.CPU_LIMIT_ENV, LONG)
    assert "TensorFlow's default for the CPU BFC allocator" in tf_runtime.TensorFlow().cpu_limit_text()


# -- (9) a malformed value is explained ----------------------------------------------------------------
NOT_AN_ENTRY = "not a GPU index, GPU UUID or MIG instance UUID"


@pytest.mark.parametrize(
    "inherited, gpus, explanation",
    [
        (
            "²",
            [],
            f"entry 1 ('²') is {NOT_AN_ENTRY}, so CUDA uses no GPU: it uses the entries before the "
            "first invalid one and ignores that entry and everything after it",
        ),
        (
            "0,x",
            [0],
            f"entry 2 ('x') is {NOT_AN_ENTRY}, so CUDA uses GPU 0: it uses the entries before the "
            "first invalid one and ignores that entry and everything after it",
        ),
        (
            "2,7,3",
            [2],
            "entry 2 ('7') names no GPU (this machine has 4, numbers 0-3), so CUDA uses GPU 2: "
            "it uses the entries before the first invalid one and ignores that entry and everything after it",
        ),
        (
            "1,1",
            [1],
            "entry 2 ('1') repeats GPU 1, so CUDA uses GPU 1: it uses the entries before the "
            "first invalid one and ignores that entry and everything after it",
        ),
        (
            "GPU-0000000,0",
            [],
            "entry 1 ('GPU-0000000') is the start of several GPUs' UUIDs, so CUDA uses no GPU: "
            "it uses the entries before the first invalid one and ignores that entry and everything after it",
        ),
        (
            LONG,
            [],
            f"entry 1 ('{'1' * 37}...') names no GPU (this machine has 4, numbers 0-3), so CUDA uses no GPU: "
            "it uses the entries before the first invalid one and ignores that entry and everything after it",
        ),
    ],
)
def test_a_malformed_value_says_which_entry_is_invalid_and_what_cuda_does(
    shell, monkeypatch, inherited, gpus, explanation
):
    note = f"CUDA_VISIBLE_DEVICES was set before the kernel started, and its {explanation}"
    _, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": inherited})
    assert said == f"tfgpu_magic: {note}\n"  # %load_ext says it once, in one line
    report = status_json(shell)
    assert report["allocation"]["gpus"] == gpus
    assert report["allocation"]["note"] == note
    position = int(explanation.split()[1])
    assert report["allocation"]["invalid_entry"]["position"] == position
    assert note in report["notes"]
    assert f"Note: {note}" in gpu(shell, "status").splitlines()


def test_a_value_with_nothing_odd_says_nothing(shell, monkeypatch):
    _, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert said == ""
    report = status_json(shell)
    assert report["allocation"]["invalid_entry"] is None and report["allocation"]["note"] is None


def test_the_echoed_entry_is_neutralised_and_capped(shell, monkeypatch):
    hostile = "0,\x1b]0;pwned\x07\u202e" + "y" * 5000
    _, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": hostile})
    assert said.startswith(
        "tfgpu_magic: CUDA_VISIBLE_DEVICES was set before the kernel started, and its "
        "entry 2 ('\\x1b]0;pwned\\x07\\u202eyyyyyyyyyyyyyyyyyyyyyyyyyy...') is "
    )
    assert len(said) < 400 and "\x1b" not in said and "\u202e" not in said
    report = status_json(shell)
    assert report["allocation"]["invalid_entry"]["entry"] == "\\x1b]0;pwned\\x07\\u202e" + "y" * 26 + "..."
    text = gpu(shell, "status")
    assert "\x1b" not in text and "y" * 100 not in text


# -- (8) a MIG instance allocation ---------------------------------------------------------------------
MIB = 1024 * 1024


def mig_kernel(shell, monkeypatch, legacy: bool = False):
    """A kernel a scheduler started on MIG instance 1/0 of GPU 3 (mig_server)."""
    server = mig_server(ME)
    instance = server.gpus[3].mig_instances[0]
    entry = f"MIG-{server.gpus[3].uuid}/1/0" if legacy else instance.uuid
    session, said = loaded(shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": entry}, server)
    return session, instance.uuid, entry, said


@pytest.mark.parametrize("legacy", [False, True], ids=["MIG-uuid", "MIG-GPU-uuid/gi/ci"])
def test_a_mig_instance_allocation_is_that_instance(shell, monkeypatch, legacy):
    session, uuid, entry, said = mig_kernel(shell, monkeypatch, legacy)
    assert said == ""
    report = status_json(shell)
    shown = f"GPU 3, MIG instance 1/0 ({uuid}, 9,984 MiB)"
    assert f"allocated by the environment: {shown}" in report["in_force"]
    assert report["allocation"]["gpus"] == [3] and report["allocation"]["note"] is None
    assert report["allocation"]["mig_instances"] == [
        {
            "uuid": uuid,
            "gpu": 3,
            "gpu_instance_id": 1,
            "compute_instance_id": 0,
            "memory_total_bytes": 9984 * MIB,
        }
    ]
    refused = gpu(shell, "use 0")
    assert refused.startswith(
        f"UsageError: GPU 0 is outside this kernel's allocation: the environment allocated {shown} "
    )
    assert (
        "\n" not in refused
        and session.env["CUDA_VISIBLE_DEVICES"] == entry
        and session.requested.visible is None
    )
    assert gpu(shell, "use all").startswith("use all: ")
    assert (
        session.env["CUDA_VISIBLE_DEVICES"] == uuid
    )  # the instance, never `3` (the whole GPU, other tenants included)
    assert gpu(shell, "use 3").startswith("use 3: ")
    assert session.env["CUDA_VISIBLE_DEVICES"] == uuid
    assert session.machine.cuda_map() == [3]  # CUDA's device 0 is the instance, on GPU 3
    assert gpu(shell, "limit 50%").startswith("limit 50% (per GPU: GPU 3: 4,992 MiB): ")  # half the instance
    auto = gpu(shell, "use auto")
    assert (
        auto.startswith("UsageError: the environment allocated GPU 3, MIG instance 1/0")
        and "`%gpu use all`" in auto
    )
    assert gpu(shell, "use none").startswith("use none: ") and session.env["CUDA_VISIBLE_DEVICES"] == "-1"


def test_an_allocation_that_cannot_be_numbered_refuses_gpu_numbers(shell, monkeypatch):
    server = mig_server(ME)
    server.gpus[3].faults["mig_devices"] = NVMLError(
        NVML_ERROR_NO_PERMISSION
    )  # instances unknown: GPUs unknown
    session, _ = loaded(
        shell, monkeypatch, {"CUDA_VISIBLE_DEVICES": "MIG-4a2e3f1c-aaaa-bbbb-cccc-000000000000"}, server
    )
    refused = gpu(shell, "use 1")
    assert (
        refused.startswith("UsageError: GPU 1 cannot be checked against this kernel's allocation")
        and "\n" not in refused
    )
    assert session.env["CUDA_VISIBLE_DEVICES"] == "MIG-4a2e3f1c-aaaa-bbbb-cccc-000000000000"
    assert gpu(shell, "use all").startswith("use all: ")
    assert session.env["CUDA_VISIBLE_DEVICES"] == "MIG-4a2e3f1c-aaaa-bbbb-cccc-000000000000"
    report = status_json(shell)
    assert report["allocation"]["gpus"] is None
    assert report["gpus"][3]["mig_instances"] == [
        {"mig_index": None, "notes": ["the MIG instances could not be listed (Insufficient Permissions)"]}
    ]
    assert "  MIG 3:?  instances unknown" in gpu(shell, "status").splitlines()


def test_a_mig_uuid_no_instance_has_is_an_invalid_entry(shell, monkeypatch):
    _, said = loaded(
        shell,
        monkeypatch,
        {"CUDA_VISIBLE_DEVICES": "2,MIG-00000003-ffff-fake-0000-000000000009"},
        mig_server(ME),
    )
    assert (
        "entry 2 ('MIG-00000003-ffff-fake-0000-000000000009') names no MIG instance on this machine, so CUDA uses GPU 2"
        in said
    )


def test_status_shows_a_mig_gpus_instances_as_rows(shell, monkeypatch):
    _session, uuid, _, _ = mig_kernel(shell, monkeypatch)
    report = status_json(shell)
    assert report["gpus"][0]["mig_instances"] is None  # not in MIG mode
    gpu3 = report["gpus"][3]
    assert gpu3["mig_enabled"] is True and gpu3["memory_used_bytes"] == (3072 + 6144 + 3 * 13) * MIB
    rows = gpu3["mig_instances"]
    assert [(r["mig_index"], r["gpu_instance_id"], r["compute_instance_id"]) for r in rows] == [
        (0, 1, 0),
        (1, 2, 0),
        (2, 5, 0),
    ]
    assert rows[0]["uuid"] == uuid and rows[0]["name"] == "NVIDIA A100-SXM4-40GB MIG 2g.10gb"
    assert (rows[0]["memory_total_bytes"], rows[0]["memory_used_bytes"]) == (9984 * MIB, 3085 * MIB)
    assert [r["allocated"] for r in rows] == [True, False, False]
    assert [[(p["pid"], p["user"], p["whose"]) for p in r["processes"]] for r in rows] == [
        [(41005, "bob", "others")],
        [(41006, "alice", "others")],
        [],
    ]
    text = gpu(shell, "status").splitlines()
    row = text.index(f"  MIG 3:0  instance 1/0  {uuid}  3.0 / 9.8 GiB used  allocated to this kernel")
    assert text[row + 1].startswith("    pid 41005    bob") and "python sweep.py" in text[row + 1]
    assert (
        f"  MIG 3:2  instance 5/0  {server_uuid(report, 3, 2)}  0.013 / 4.8 GiB used" in text
    )  # the context
    with capture_output() as captured:
        shell.run_line_magic("gpu", "status")
    assert "MIG 3:0" in captured.outputs[0].data["text/html"]


def server_uuid(report: dict, gpu_index: int, mig_index: int) -> str:
    return report["gpus"][gpu_index]["mig_instances"][mig_index]["uuid"]
