"""`%gpu` with PyTorch (issue 18, item 3).

The fresh-process tests run real PyTorch (the CPU build: it imports, parses its allocator
settings and reports them, and never starts CUDA).  What only a CUDA build does (start CUDA,
take a memory fraction) is checked against a stand-in for ``torch.cuda`` that keeps PyTorch's
own rules: calls queued with ``_lazy_call`` run when CUDA starts, and a fraction is set per device.
"""

from __future__ import annotations

import types

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks.base import Stage
from tfgpu_magic.frameworks.pytorch import PyTorch, alloc_conf_with_backend
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import cells, oom, status, trace
from tfgpu_magic.kernel.session import Session, SessionError

from support.fakes import FakeTensorFlow
from support.processes import run_scenario
from support.stand_ins import GIB, OutOfMemoryError, StandInCuda, cuda_torch, torch_session


# -- real PyTorch, fresh process -------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_kernel():
    pytest.importorskip("torch")
    return run_scenario("torch_scenario", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


@pytest.mark.slow
def test_allocator_async_reaches_what_torch_parses_at_import_keeping_the_users_options(torch_kernel):
    r = torch_kernel
    assert r["torch_imported_by_magic"] is False  # the magic never imports torch
    assert r["env_before_import"] == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,backend:cudaMallocAsync",
        "PYTORCH_ALLOC_CONF": None,
    }
    assert r["torch_read"] == "expandable_segments:True,backend:cudaMallocAsync"  # torch's own reading
    assert r["frameworks"]["pytorch"]["allocator"] == "async"


@pytest.mark.slow
def test_after_import_a_different_allocator_is_too_late_with_the_line_to_put_first(torch_kernel):
    r = torch_kernel
    if not r["frameworks"]["pytorch"]["cuda_build"]:  # no CUDA allocator to choose: nothing to restart for
        assert r["allocator_after"].endswith(
            ": PyTorch: a CPU build (torch.version.cuda is None) has no CUDA allocator to choose"
        )
        return
    assert r["allocator_after"] == (
        "UsageError: PyTorch loaded with the async allocator and reads it only at `import torch`. Put "
        "`%gpu allocator default` at the top of the notebook, before `import torch`, and restart the kernel"
    )
    assert r["allocator_same"].endswith(": PyTorch: already loaded with the async allocator")


@pytest.mark.slow
def test_grow_says_pytorch_already_allocates_on_demand_and_free_says_nothing_was_held(torch_kernel):
    r = torch_kernel
    assert r["grow"].endswith(": PyTorch: allocates on demand already, so `grow` changes nothing for it")
    assert "PyTorch has not started CUDA, so it holds no GPU memory to free." in r["free"]
    assert r["cuda_initialized"] is False


@pytest.mark.slow
def test_status_json_keeps_every_key_and_adds_frameworks(torch_kernel):
    r = torch_kernel
    assert r["status_keys"] == sorted(
        [
            "allocation",
            "defaults",
            "display",
            "frameworks",
            "gpus",
            "in_force",
            "limit_enforcement",
            "me",
            "notebook_settings",
            "notes",
            "nvml_error",
            "platform_shares",
            "requested",
            "resolved",
            "tensorflow",
            "visible_gpus",
        ]
    )
    torch = r["frameworks"]["pytorch"]
    assert r["frameworks"]["tensorflow"]["stage"] == "not_imported"
    # Either build of torch 2.13.0: `make setup` takes the CPU build from a local wheel folder where
    # there is one, and the package index's CUDA build elsewhere, which runs here with no GPU.
    cuda_build = r["torch_version_cuda"] is not None
    assert torch["stage"] == "imported" and torch["cuda_build"] is cuda_build
    if cuda_build:  # the limit reached PyTorch, queued until CUDA starts (it never does here)
        assert "limit 4096MiB" in torch["applied"] and torch["cuda_started"] is False
        assert "PyTorch:    imported, CUDA not started; the async allocator" in r["text"]
        assert not any("PyTorch is a CPU build" in e for e in r["hook_errors"])
    else:
        assert torch["applied"] is None
        assert "PyTorch:    imported; a CPU build (torch.version.cuda is None): it uses no GPU" in r["text"]
        assert any("PyTorch is a CPU build" in e and "limit 4096MiB" in e for e in r["hook_errors"])


# -- a CUDA build's rules, with torch.cuda stood in for ----------------------------------------------
def test_a_limit_asked_before_import_is_set_when_cuda_starts_not_at_import():
    session = torch_session()
    session.configure(grammar.parse("use 1"))
    session.configure(grammar.parse("limit 8G"))
    torch = cuda_torch([80 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    assert torch.cuda.fractions == {}  # importing torch starts no CUDA context
    assert session.adapter("pytorch").stage() is Stage.IMPORTED and session.adapter("pytorch").caps_bytes == {
        0: 8 * GIB
    }
    torch.cuda.start()
    assert torch.cuda.fractions == {0: 0.1}  # 8 GiB of the 80 GiB torch reports for cuda:0 (GPU 1)
    assert (
        session.adapter("pytorch").cuda_seen is not None
    )  # the environment CUDA read, recorded as it started
    assert session.applied["pytorch"] is session.resolved()


def test_a_limit_after_cuda_started_is_set_at_once():
    session = torch_session()
    torch = cuda_torch([80 * GIB, 80 * GIB, 24 * GIB, 16 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    said = session.configure(grammar.parse("limit 50%"))
    assert said.endswith(": PyTorch: capped now")  # PyTorch alone is imported: its part is the reply
    assert torch.cuda.fractions[1] == pytest.approx(0.5)


def test_use_after_pytorch_started_cuda_is_too_late_for_every_framework():
    session = torch_session()
    torch = cuda_torch([80 * GIB] * 4)
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    with pytest.raises(
        SessionError,
        match=r"PyTorch has already started CUDA with every GPU visible.*"
        r"Put `%gpu use 1` at the top of the notebook, before `import torch`",
    ):
        session.configure(grammar.parse("use 1"))
    assert session.requested.visible is None  # nothing changed


def test_allocator_platform_with_pytorch_imported_names_pytorch_once():
    session = torch_session()
    session._on_import(session.adapter("pytorch"), cuda_torch([80 * GIB] * 4))
    said = session.configure(grammar.parse("allocator platform"))
    assert said.count("PyTorch") == 1 and said.endswith("; PyTorch keeps its allocator")


def test_a_users_pytorch_alloc_conf_is_the_variable_edited():
    """Torch 2.13 reads both names and, when both are set, only PYTORCH_CUDA_ALLOC_CONF: setting the
    old name beside a user's new one would silently drop the user's options."""
    session = torch_session({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    session.configure(grammar.parse("allocator async"))
    assert session.env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True,backend:cudaMallocAsync"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in session.env
    session.configure(grammar.parse("allocator default"))
    assert session.env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


def test_reset_takes_back_the_backend_it_added():
    session = torch_session({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    session.configure(grammar.parse("allocator async"))
    assert session.env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,backend:cudaMallocAsync"
    session.reset()
    assert session.env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


@pytest.mark.parametrize(
    ("current", "backend", "expected"),
    [
        (None, "cudaMallocAsync", "backend:cudaMallocAsync"),
        ("backend:native", "cudaMallocAsync", "backend:cudaMallocAsync"),
        ("a:1, backend:cudaMallocAsync ,b:2", None, "a:1,b:2"),
        ("backend:cudaMallocAsync", None, None),
    ],
)
def test_the_backend_option_is_replaced_and_nothing_else(current, backend, expected):
    assert alloc_conf_with_backend(current, backend) == expected


def test_the_adapter_reads_nothing_before_the_import():
    torch = PyTorch()
    assert torch.stage() is Stage.NOT_IMPORTED and torch.memory() == {} and torch.empty_cache() is False


def test_with_both_names_set_the_one_torch_reads_is_edited():
    """Torch 2.13 reads only PYTORCH_CUDA_ALLOC_CONF when both are set (measured in this suite's torch)."""
    session = torch_session({"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"})
    session.configure(grammar.parse("allocator async"))
    assert session.env == {
        **session.env,
        "PYTORCH_CUDA_ALLOC_CONF": "a:1,backend:cudaMallocAsync",
        "PYTORCH_ALLOC_CONF": "b:2",
    }


def test_use_after_tensorflow_listed_its_gpus_says_pytorch_sees_what_cuda_read_then():
    session = Session(
        nvml=Nvml(lib=shared_server()),
        env={},
        frameworks=adapters(
            tensorflow=FakeTensorFlow(
                stage=Stage.ENUMERATED, gpus={f"GPU:{i}": i for i in range(4)}, found=[0, 1, 2, 3]
            )
        ),
    )
    session._on_import(session.adapter("pytorch"), cuda_torch([80 * GIB] * 4))
    said = session.configure(grammar.parse("use 1"))
    assert said.endswith(
        "; PyTorch: sees the GPUs CUDA showed when TensorFlow listed its devices (`use` cannot change them)"
    )


def started_torch(*commands: str, totals: list[int] | None = None) -> tuple[Session, StandInCuda]:
    session = torch_session()
    for command in commands:
        session.configure(grammar.parse(command))
    torch = cuda_torch(totals or [80 * GIB, 80 * GIB])
    session._on_import(session.adapter("pytorch"), torch)
    torch.cuda.start()
    return session, torch.cuda


def test_trace_shows_pytorchs_peak_in_the_cell_with_nvidia_smi_numbers():
    session, cuda = started_torch("use 1,2", totals=[80 * GIB, 24 * GIB])
    cuda.allocate(0, GIB)  # held before the cell, with an old peak the cell must not report
    cuda.peak[0] = 5 * GIB
    tracer = trace.Tracer(shell=None, session=session)
    tracer.pre_run_cell(None)
    cuda.allocate(0, 3 * GIB)
    cuda.allocated[0] -= 2 * GIB  # a temporary freed before the cell ended
    assert tracer.lines(0.25) == [
        "[gpu trace] GPU 1 (PyTorch cuda:0): peak 4,096 MiB (+3,072 MiB in this cell), retained +1,024 MiB, 0.25 s",
        "[gpu trace] GPU 2 (PyTorch cuda:1): peak 0 B (+0 B in this cell), retained unchanged, 0.25 s",
    ]


def test_nested_windows_keep_each_others_peaks():
    session, cuda = started_torch()
    outer = session.adapter("pytorch").open_peak_window()
    cuda.allocate(0, 4 * GIB)
    cuda.allocated[0] = 0
    inner = session.adapter(
        "pytorch"
    ).open_peak_window()  # resets torch's peak: the outer window keeps its 4 GiB
    cuda.allocate(0, GIB)
    assert inner.peaks()["cuda:0"].peak_bytes == GIB
    assert outer.peaks()["cuda:0"].peak_bytes == 4 * GIB


def test_a_budget_is_checked_against_pytorchs_peak(shell):
    session, cuda = started_torch()
    shell.user_ns["allocate"] = cuda.allocate
    with pytest.raises(cells.BudgetExceeded) as exceeded:
        cells.run_cell_magic(shell, session, "budget 2G", "allocate(0, 3 << 30)")
    assert str(exceeded.value) == (
        "GPU 0 (PyTorch cuda:0): the cell's peak was 3,072 MiB, over its budget of 2,048 MiB "
        "(PyTorch's allocator held 0 B when the cell started and 3,072 MiB at the peak)"
    )
    assert cells.run_cell_magic(shell, session, "budget 2G", "allocate(1, 1 << 30); 7") == 7


def test_on_runs_the_cell_under_torch_cuda_device(shell):
    session, cuda = started_torch("use 1,2", totals=[80 * GIB, 24 * GIB])
    shell.user_ns["cuda"] = cuda
    assert cells.run_cell_magic(shell, session, "on 2", "cuda.current_device") == 1  # GPU 2 is cuda:1
    with pytest.raises(SessionError, match=r"^GPU 3 is not visible to PyTorch \(visible: GPU 1, 2, "):
        cells.run_cell_magic(shell, session, "on 3", "1")


def test_pytorchs_out_of_memory_is_explained_with_its_cap_and_neighbours():
    session, cuda = started_torch("use 1", "limit 8G")
    cuda.allocate(0, 7 * GIB)
    error = OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
        "60.00 GiB is free. Of the allocated memory 7.00 GiB is allocated by PyTorch"
    )
    text = oom.explain(session, error)
    assert text.startswith(
        "tfgpu_magic: PyTorch ran out of memory on GPU 1 (PyTorch cuda:0, NVIDIA A100-SXM4-80GB).\n"
    )
    assert "  Failed request: 2.00 GiB\n" in text
    assert "limit: 8,192 MiB (`%gpu limit`, set as fraction 0.1000)" in text
    assert "pid 41003: 8,192 MiB (bob, python finetune.py)" in text
    assert "torch.autocast" in text and "Keras" not in text


def test_precision_tells_plain_pytorch_code_to_use_autocast():
    session, _ = started_torch()
    said = session.configure(grammar.parse("precision mixed_float16"))
    assert said.endswith(
        "; PyTorch: the Keras policy does not reach plain PyTorch code: wrap the forward pass in "
        '`torch.autocast("cuda", dtype=torch.float16)`'
    )
    assert "PyTorch" not in session.configure(grammar.parse("precision float32"))


def test_tracing_names_pytorch_once_it_is_imported(shell):
    session, _ = started_torch()
    try:
        said = trace.set_tracing(shell, session, True)
    finally:
        trace.set_tracing(shell, session, False)
    # PyTorch alone is imported: the reply is about it, and names no TensorFlow.
    assert said.split(": ", 1)[1] == (  # "tracing on" or, after another test's shell, "tracing is already on"
        "after each cell, the allocator peak and retained change of PyTorch on each GPU, once started"
    )


def test_the_gpu_pytorch_started_cuda_on_is_named_after_the_variable_is_changed_by_hand():
    """Issue 27: PyTorch started CUDA with CUDA_VISIBLE_DEVICES=1, the variable was then set to 3 by
    hand: the out-of-memory text said GPU 3 and advised `%gpu use 1`, the GPU it was running on.
    CUDA read the variable once, at its start in the process: that record is what every report reads."""
    session, cuda = started_torch("use 1", "limit 8G")
    session.env["CUDA_VISIBLE_DEVICES"] = "3"  # by hand, after CUDA started
    cuda.allocate(0, 7 * GIB)
    error = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    text = oom.explain(session, error)
    assert text.startswith("tfgpu_magic: PyTorch ran out of memory on GPU 1 (PyTorch cuda:0, ")
    assert "%gpu use 1" not in text
    assert session.machine.cuda_env()["CUDA_VISIBLE_DEVICES"] == "1"
    assert session.machine.cuda_record.by == "PyTorch"
    tracer = trace.Tracer(shell=None, session=session)
    tracer.pre_run_cell(None)
    assert tracer.lines(0.1)[0].startswith("[gpu trace] GPU 1 (PyTorch cuda:0)")


def test_status_reads_what_pytorch_and_cuda_read_not_what_the_environment_says_now():
    """After PyTorch started CUDA with every GPU and the default allocator, variables changed by hand
    made `%gpu` show the new allocator variable and 'sees GPU 3' (review)."""
    session, _ = started_torch()
    session.env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    session.env["CUDA_VISIBLE_DEVICES"] = "3"
    text = status.render_text(status.build_report(session))
    assert "cudaMallocAsync" not in text and "sees GPU 0,1,2,3" in text
    assert "the default allocator" in text


# -- what a setting silently breaks is said (issue 27) ------------------------------------------------
def cpu_torch() -> types.SimpleNamespace:
    """A CPU build of torch as the adapter sees it: torch.version.cuda is None."""
    module = cuda_torch([80 * GIB])
    module.version = types.SimpleNamespace(cuda=None)
    return module


def test_a_cpu_build_names_only_the_gpu_settings_it_misses_at_import(capsys):
    session = torch_session()
    for command in ("grow", "precision mixed_float16", "limit 4G", "use 1"):
        session.configure(grammar.parse(command))
    session._on_import(session.adapter("pytorch"), cpu_torch())
    said = capsys.readouterr().err
    assert "cannot take effect for it: use 1; limit 4096MiB." in said
    assert "grow" not in said and "precision" not in said  # growth and the Keras policy were never PyTorch's


def test_allocator_default_on_a_cpu_build_is_no_restart():
    session = torch_session({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    session._on_import(session.adapter("pytorch"), cpu_torch())
    said = session.configure(grammar.parse("allocator default"))
    assert said.endswith("PyTorch: a CPU build (torch.version.cuda is None) has no CUDA allocator to choose")
    assert "restart" not in said


def test_allocator_async_names_the_users_options_it_ignores():
    session = torch_session(
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,garbage_collection_threshold:0.8"}
    )
    said = session.configure(grammar.parse("allocator async"))
    assert (
        "PyTorch: cudaMallocAsync ignores your PYTORCH_CUDA_ALLOC_CONF options max_split_size_mb:128, "
        "garbage_collection_threshold:0.8"
    ) in said
