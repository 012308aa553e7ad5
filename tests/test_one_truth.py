"""Issue 9: one resolution, facts captured when they became true, the environment's allocation.

Each test here reproduces a defect that was seen: what `%gpu` said differed from what
TensorFlow did (or would do).  TensorFlow is the shared fake adapter (tests/fakes.py) on the
simulated four-GPU server; the stages that need the real TensorFlow run in fresh processes
(test_one_truth_tensorflow.py).
"""

from __future__ import annotations

import os

import pytest
from IPython.core.error import UsageError

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks.tensorflow import AllocatorStats, Capture, Stage
from tfgpu_magic.gpus import claims
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, shared_server
from tfgpu_magic.kernel import allocator_figures, magics, status
from tfgpu_magic.kernel.magics import GpuMagics
from tfgpu_magic.kernel.monitor import Sampler
from tfgpu_magic.kernel.session import Session, SessionError

from support.fakes import FakeTensorFlow

MIB = 1024 * 1024
ME = os.getpid()


def session_with(env: dict | None = None, server: SimulatedNvml | None = None, **tf) -> Session:
    return Session(
        nvml=Nvml(lib=server or shared_server(ME)),
        env=dict(env or {}),
        frameworks=adapters(tensorflow=FakeTensorFlow(**tf)),
    )


def said(session: Session, line: str) -> str:
    try:
        return magics.use(session, grammar.parse(line), progress=lambda _: None)
    except (grammar.GrammarError, SessionError) as err:  # what the magic turns into a one-line UsageError
        return f"{type(err).__name__}: {err}"  # anything else is a crash, and fails the test


# -- 3. the environment's allocation ----------------------------------------------------------------
@pytest.mark.parametrize(
    "inherited, allocated",
    [
        ("2,3", (2, 3)),
        ("GPU-00000002-fake-0000-0000-000000000002", (2,)),  # a UUID (a unique prefix would do)
        ("GPU-00000003", (3,)),
        # legacy MIG form: GPU 1 is not in MIG mode, so it has no instance 1/0 (issue 17; see test_allocation_input.py)
        ("MIG-GPU-00000001-fake-0000-0000-000000000001/1/0", ()),
        ("0,x,2", (0,)),  # CUDA reads up to the first invalid entry
        ("²", ()),  # not an ASCII digit: CUDA sees nothing
        ("-1", ()),
    ],
)
def test_an_inherited_cuda_visible_devices_is_the_allocation(inherited, allocated):
    session = session_with({"CUDA_VISIBLE_DEVICES": inherited})
    assert session.machine.allocation().gpus == allocated
    report = status.build_report(session)
    shown = "GPU " + ", ".join(map(str, allocated)) if allocated else "no GPU"
    assert f"allocated by the environment: {shown}" in report["in_force"]
    assert report["allocation"]["cuda_visible_devices"] == inherited


def test_a_malformed_allocation_is_reported_never_a_traceback():
    session = session_with({"CUDA_VISIBLE_DEVICES": "0,x"})
    text = status.render_text(status.build_report(session))
    assert "allocated by the environment: GPU 0" in text
    assert session.machine.allocation().note == (  # which entry, and what CUDA does with it (issue 17)
        "CUDA_VISIBLE_DEVICES was set before the kernel started, and its entry 2 ('x') is not a GPU index, "
        "GPU UUID or MIG instance UUID, so CUDA uses GPU 0: it uses the entries before the first invalid one "
        "and ignores that entry and everything after it"
    )
    assert f"Note: {session.machine.allocation().note}" in text.splitlines()


def test_mig_instances_without_their_gpu_are_named_not_numbered():
    server = shared_server(ME)
    server.gpus[1].faults["mig"] = RuntimeError("no MIG readings")  # which GPU holds the instance is unknown
    session = session_with({"CUDA_VISIBLE_DEVICES": "MIG-4a2e3f1c-aaaa-bbbb-cccc-000000000000"}, server)
    assert session.machine.allocation().gpus is None
    # No numbers to check against, so a number could leave the allocation (issue 17): refused.
    assert said(session, "use 1").startswith(
        "SessionError: GPU 1 cannot be checked against this kernel's allocation"
    )
    assert "cannot rank them: use `%gpu use all`" in said(session, "use auto")


def test_use_outside_the_allocation_is_one_line_naming_it_and_changes_nothing():
    session = session_with({"CUDA_VISIBLE_DEVICES": "2,3"})
    assert said(session, "use 0") == (
        "SessionError: GPU 0 is outside this kernel's allocation: the environment allocated GPU 2, 3 "
        "(CUDA_VISIBLE_DEVICES was set before the kernel started); valid: %gpu use 1 | %gpu use 0,2 | "
        "%gpu use all | %gpu use none | %gpu use auto | %gpu use auto:2 --min-free 10G --wait 10m | %gpu use auto --min-cc 8.0"
    )
    assert session.env["CUDA_VISIBLE_DEVICES"] == "2,3" and session.requested.visible is None


def test_use_all_means_all_allocated_gpus():
    session = session_with({"CUDA_VISIBLE_DEVICES": "2,3"})
    said(session, "use 3")
    assert session.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert said(session, "use all").startswith("use all: ")
    assert session.env["CUDA_VISIBLE_DEVICES"] == "2,3"  # not removed: that would escape the allocation
    assert session.visible_gpus() == [2, 3]


def test_use_auto_ranks_only_the_allocated_gpus():
    session = session_with({"CUDA_VISIBLE_DEVICES": "2,3"})  # GPU 1 has the most free memory, but is not ours
    assert said(session, "use auto").startswith("Chose GPU 2: ")
    assert session.env["CUDA_VISIBLE_DEVICES"] == "2"
    assert "but the environment allocated GPU 2, 3" in said(session, "use auto:3")


# -- 5. percentages resolved for the user --------------------------------------------------------------
def test_a_percentage_is_shown_resolved_per_gpu():
    session = session_with()
    said(session, "use 3")
    assert said(session, "limit 50%") == (
        "limit 50% (per GPU: GPU 3: 7,680 MiB): takes effect when TensorFlow, PyTorch or JAX starts in this kernel"
    )
    assert status.render_text(status.build_report(session)).splitlines()[0] == (
        "Requested:  use 3; limit 50%; per GPU: GPU 3: 7,680 MiB"
    )
    assert said(session, "split 2").startswith("split 2 (per GPU: GPU 3: 2 x 3,840 MiB): ")


# -- 6. reset returns to the configured defaults -------------------------------------------------------
def test_reset_returns_to_the_defaults_and_says_what_is_requested_now(shell, capsys):
    session = session_with()
    magic = GpuMagics(shell, session=session)
    magic.defaults = ["grow"]
    magic.apply_defaults()
    said(session, "limit 4G")
    said(session, "use 1")
    assert session.reset() == "forgot: use 1; limit 4096MiB\nrequested now: grow"
    assert session.requested.describe() == ["grow"]
    assert session.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" and "CUDA_VISIBLE_DEVICES" not in session.env
    magic.defaults = ["grow", "allocator async"]  # %config in a running kernel: the new defaults apply
    assert session.defaults.describe() == ["grow", "allocator async"]


def test_reset_after_enumeration_says_what_cuda_already_read():
    session = session_with(stage=Stage.ENUMERATED, found=[])
    session.adapter("tensorflow").cuda_seen = Capture(
        {"CUDA_VISIBLE_DEVICES": "-1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
    session.requested = session.requested.with_command(grammar.Use("none"))
    assert session.reset() == (
        "forgot: use none\nrequested now: nothing (each framework's defaults)\n"
        "cannot undo: CUDA_VISIBLE_DEVICES=-1 was read by CUDA when TensorFlow listed its devices; "
        "GPUs hidden then stay hidden until the kernel restarts"
    )


# -- 7. bad defaults are one line each; the rest apply ---------------------------------------------------
def test_bad_defaults_are_skipped_one_line_each_and_use_auto_works(shell, capsys):
    session = session_with()
    magic = GpuMagics(shell, session=session)
    magic.defaults = ["grow", "use auto", "limit 4G", "split ²", "limit 99999999999999999999999G", "free"]
    magic.apply_defaults()
    printed = capsys.readouterr().out.splitlines()
    ignored = [line for line in printed if line.startswith("tfgpu_magic: ignored default")]
    assert [line.split(":", 2)[1].strip() for line in ignored] == [
        "ignored default 'split ²'",
        "ignored default 'limit 99999999999999999999999G'",
        "ignored default 'free'",
    ]
    assert session.requested.describe() == ["use 1", "grow", "limit 4096MiB"]
    assert claims.held() == {session.nvml.uuid(1)}
    assert session.defaults.describe() == ["use 1", "grow", "limit 4096MiB"]


# -- 8. what is claimed is what is requested -----------------------------------------------------------
def test_claims_follow_the_request():
    session = session_with()
    said(session, "use auto")
    gpu1 = session.nvml.uuid(1)
    assert claims.held() == {gpu1}
    assert said(session, "use auto --min-free 70G").startswith(
        "SessionError: no unclaimed GPU has 70.0 GiB free"
    )
    assert said(session, "use 9").startswith("SessionError: no GPU 9")
    assert claims.held() == {gpu1}  # refused commands change nothing, claims included
    said(session, "use 0")
    assert claims.held() == set() and session.claimed == ()


# -- 9. messages that say the right thing ----------------------------------------------------------------
def test_free_says_why_the_driver_lists_nothing_for_this_kernel():
    idle = SimulatedNvml([SimulatedGpu()])  # NVML answers; this pid holds nothing
    cpu_only = session_with(server=idle, stage=Stage.STARTED, found=[])
    assert "The driver lists no GPU memory for this kernel, which uses no GPU:" in cpu_only.free()
    elsewhere = session_with(server=idle, stage=Stage.STARTED, found=[0])
    assert f"lists no GPU memory for this kernel's pid {ME}" in elsewhere.free()
    assert "NVML unavailable" not in elsewhere.free()


def test_precision_works_at_any_stage_even_where_tensorflow_sees_no_gpu():
    session = session_with(stage=Stage.ENUMERATED, found=[])
    session.requested = session.requested.with_command(grammar.Use((1,)))
    assert said(session, "precision mixed_float16") == "precision mixed_float16: set when Keras is imported"


# -- 10. one number for TensorFlow's share of a split GPU --------------------------------------------------
def test_panel_and_status_sum_the_logical_gpus_of_a_split_gpu():
    stats = {"GPU:0": AllocatorStats(100 * MIB, 150 * MIB), "GPU:1": AllocatorStats(300 * MIB, 320 * MIB)}
    session = session_with(stage=Stage.STARTED, gpus={"GPU:0": 1, "GPU:1": 1}, stats=stats, found=[1])
    gpu1 = status.build_report(session)["gpus"][1]
    allocator_figures.publish(session)  # on this (the user's) thread, as after each cell
    sampler = Sampler(session.nvml, ME, figures=allocator_figures.board_of(session).latest)
    panel = next(d for d in sampler.read().devices if d.key == "gpu1")
    assert gpu1["tensorflow_in_use_bytes"] == panel.tf_in_use_bytes == 400 * MIB
    assert gpu1["tensorflow_peak_bytes"] == panel.tf_peak_bytes == 470 * MIB


# -- the magic: one line for all of it ----------------------------------------------------------------------
def test_the_magic_turns_an_allocation_error_into_one_usage_line(shell):
    session = session_with({"CUDA_VISIBLE_DEVICES": "2,3"})
    shell.register_magics(GpuMagics(shell, session=session))
    with pytest.raises(UsageError, match="outside this kernel's allocation"):
        shell.run_line_magic("gpu", "use 1")
