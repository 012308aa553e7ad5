"""`%gpu` with JAX (issue 18, item 4).

The fresh-process tests run real JAX (the CPU build): it imports, starts its backends at the first
operation and reads its variables through ``jaxlib.xla_client.generate_pjrt_gpu_plugin_options``,
the function its CUDA plugin uses; the tests call that function themselves.  What only a GPU
backend does (start with a GPU, report memory per device) is checked against a stand-in JAX that
keeps JAX's rules: the backends start once, at the first device query, reading the environment.
"""

from __future__ import annotations

import os

import pytest

from tfgpu_magic.command import grammar
from tfgpu_magic.frameworks.base import PeakReading, Stage
from tfgpu_magic.frameworks.jax import Jax, mem_fraction_name
from tfgpu_magic.kernel import cells, oom, trace
from tfgpu_magic.kernel.session import Session, SessionError

from support.processes import run_scenario
from support.stand_ins import GIB, StandInJax, jax_session


# -- real JAX, fresh process ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jax_kernel():
    pytest.importorskip("jax")
    return run_scenario("jax_scenario")


@pytest.mark.slow
def test_settings_asked_before_import_are_what_jax_itself_reads_at_its_start(jax_kernel):
    r = jax_kernel
    assert r["jax_imported_by_magic"] is False  # the magic never imports jax
    assert r["env_before_import"] == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
        "XLA_CLIENT_MEM_FRACTION": None,  # never both names: JAX's CUDA plugin refuses that
        "XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert r["started_by_import"] is False and r["started"] is True  # the backends start at the first op
    read = r["jax_read"]  # JAX's own function, called by the test after the start
    start = r["frameworks"]["jax"]["started_with"]
    assert (
        (start["preallocate"], start["memory_fraction"], start["allocator"])
        == (read["preallocate"], read["memory_fraction"], read["allocator"])
        == (False, 0.1, "platform")
    )
    assert start["cuda_visible_devices"] == "0,1"


@pytest.mark.slow
def test_limits_that_are_different_shares_leave_jax_uncapped_and_say_so(jax_kernel):
    """Before JAX starts they are accepted for the other frameworks (TensorFlow 2.21 imports jax
    itself where it is installed: refusing would refuse TensorFlow users), JAX's variable is left
    unset, and both the reply and `%gpu` say why."""
    r = jax_kernel
    problem = (
        "JAX takes one memory fraction for all its GPUs, and these limits are 20% of GPU 0, 10% of GPU 1; "
        "for JAX, give one percentage for all (`%gpu limit 50%`) or sizes that are the same share of each GPU"
    )
    assert r["limit_differing"].endswith(f": JAX gets no memory fraction from it: {problem}")
    assert r["fraction_differing"] is None
    assert f"  no memory fraction for JAX: {problem}" in r["status_differing"]
    assert (
        r["limit_same_share"]
        == "limit 4096MiB,8192MiB: JAX: takes effect when its backends start (its first operation)"
    )
    assert r["frameworks"]["jax"]["environment_at_start"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"


@pytest.mark.slow
def test_the_cpu_build_is_said_to_take_no_gpu_setting_and_free_keeps_the_users_arrays(jax_kernel):
    r = jax_kernel
    assert r["grow_off_after"].endswith(
        ": JAX: started without a GPU backend, so GPU settings do not reach it"
    )
    assert "Ran jax.clear_caches(): compiled functions are dropped. JAX's arrays are yours" in r["free"]
    assert r["x_still_there"] is True
    assert "JAX:        started on cpu: no GPU backend, so GPU settings do not reach it" in r["text"]
    assert r["status_imported"]["stage"] == "imported" and r["status_imported"]["started_with"] is None
    assert r["frameworks"]["jax"]["platforms"] == ["cpu"]
    assert r["hook_errors"] == []


# -- a GPU backend's rules, with JAX stood in for ---------------------------------------------------
def started_jax(session: Session, *commands: str) -> StandInJax:
    for command in commands:
        session.configure(grammar.parse(command))
    jax = StandInJax()
    session._on_import(session.adapter("jax"), jax)
    jax.devices()
    return jax


def test_the_start_is_recorded_as_jax_reads_it_and_a_different_setting_is_then_too_late():
    session = jax_session()
    jax = started_jax(session, "use 0,1", "grow", "limit 25%")
    start = session.adapter("jax").start()
    assert (start.preallocate, start.memory_fraction, start.gpu) == (False, 0.25, True)
    assert jax.read_env["memory_fraction"] == start.memory_fraction  # the stand-in's reading agrees
    with pytest.raises(SessionError) as err:
        session.configure(grammar.parse("limit 50%"))
    assert str(err.value) == (
        "JAX has already started with a memory fraction of 0.25, and cannot change it in a running kernel. "
        "Put `%gpu limit 50%` at the top of the notebook, before `import jax`, and restart the kernel"
    )
    assert session.requested.limits == (grammar.Percent(25),)  # nothing changed
    with pytest.raises(
        SessionError, match=r"^JAX has already started with preallocation off.*`%gpu grow off`"
    ):
        session.configure(grammar.parse("grow off"))
    with pytest.raises(
        SessionError, match=r"^JAX has already started with CUDA_VISIBLE_DEVICES=0,1.*`%gpu use 2`"
    ):
        session.configure(grammar.parse("use 2"))
    assert (
        session.configure(grammar.parse("grow")) == "grow: JAX: already started with it"
    )  # JAX alone is imported: its part is the reply
    with pytest.raises(
        SessionError,
        match=r"^JAX takes one memory fraction for all its GPUs, and these limits "
        r"are 20% of GPU 0, 10% of GPU 1",
    ):
        session.configure(grammar.parse("limit 8G,8G"))


def test_settings_change_nothing_in_jax_after_its_start_and_the_variables_it_read_stay_recorded():
    session = jax_session()
    started_jax(session, "limit 25%")
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.9"  # a later change JAX never reads
    assert session.adapter("jax").start().memory_fraction == 0.25


def test_a_users_new_fraction_name_is_the_one_edited_never_both():
    os.environ["XLA_CLIENT_MEM_FRACTION"] = "0.3"
    assert mem_fraction_name(os.environ) == "XLA_CLIENT_MEM_FRACTION"
    session = jax_session()
    session.configure(grammar.parse("limit 50%"))
    assert os.environ["XLA_CLIENT_MEM_FRACTION"] == "0.5"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ


def test_allocator_words_map_to_jaxs_allocators():
    session = jax_session()
    session.configure(grammar.parse("allocator platform"))
    assert os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
    assert "TF_GPU_ALLOCATOR" not in os.environ  # platform is JAX's only
    session.configure(grammar.parse("allocator async"))
    assert os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] == "cuda_async"
    session.configure(grammar.parse("allocator default"))
    assert "XLA_PYTHON_CLIENT_ALLOCATOR" not in os.environ


def test_trace_reports_jax_peaks_honestly_when_they_cannot_be_reset():
    session = jax_session()
    jax = started_jax(session)
    gpu = jax.gpus[0]
    gpu.stats.update(bytes_in_use=GIB, peak_bytes_in_use=4 * GIB)  # a peak from an earlier cell
    window = session.adapter("jax").open_peak_window()
    gpu.stats.update(bytes_in_use=2 * GIB)  # this cell: the peak did not rise, so it is unknown
    reading = window.peaks()["gpu:0"]
    assert reading == PeakReading(GIB, 2 * GIB, 4 * GIB, exact=False)
    jax = session.adapter("jax")
    label = jax.trace_label("gpu:0", session.machine.cuda_map()[0])
    assert label == "GPU 0 (JAX gpu:0)"
    assert trace.format_reading(label, reading, 0.5, jax.name) == (
        "[gpu trace] GPU 0 (JAX gpu:0): peak at most 4,096 MiB (JAX cannot reset its peak: the highest since it "
        "started), retained +1,024 MiB, 0.50 s"
    )
    gpu.stats.update(peak_bytes_in_use=6 * GIB)  # the peak rose in the window: it is the cell's
    assert window.peaks()["gpu:0"] == PeakReading(GIB, 2 * GIB, 6 * GIB, exact=True)


def test_free_clears_caches_keeps_arrays_and_says_the_pool_keeps_its_memory():
    session = jax_session()
    jax = started_jax(session)
    said = session.free()
    assert jax.cleared == 1
    assert "JAX's pool keeps what it took (the default allocator) until the kernel restarts" in said


def test_out_of_memory_is_explained_with_jaxs_figures_and_fraction():
    session = jax_session()
    jax = started_jax(session, "use 1", "limit 50%")
    jax.gpus[0].stats.update(bytes_in_use=39 * GIB, bytes_limit=40 * GIB)
    error = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes."
    )
    assert oom.is_out_of_memory(session.adapter("jax"), error)
    assert not oom.is_out_of_memory(
        session.adapter("jax"), jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes")
    )
    text = oom.explain(session, error)
    assert text.startswith(
        "tfgpu_magic: JAX ran out of memory on GPU 1 (JAX gpu:0, NVIDIA A100-SXM4-80GB).\n"
    )
    assert "  Failed request: 4,096 MiB\n" in text
    assert (
        "  JAX's allocator: 39.0 GiB in use, 0 B reserved; limit: 40.0 GiB, memory fraction 0.5 (read when JAX started)"
        in text
    )
    assert "pid 41003: 8,192 MiB (bob, python finetune.py)" in text


def test_on_runs_the_cell_on_jaxs_device_for_that_gpu():
    session = jax_session()
    jax = started_jax(session, "use 1,2", "limit 10%")
    with cells._gpu_scope(session, 2):
        pass
    assert jax.default is jax.gpus[1]  # GPU 2 is JAX's second device
    with pytest.raises(SessionError, match=r"GPU 3 is not visible to JAX \(visible: GPU 1, 2"):
        with cells._gpu_scope(session, 3):
            pass


def test_the_stage_follows_jax():
    adapter = Jax()
    assert adapter.stage() is Stage.NOT_IMPORTED
    jax = StandInJax()
    adapter.on_import(jax)
    assert adapter.stage() is Stage.IMPORTED and adapter.started_with is None
    jax.devices()
    assert (
        adapter.stage() is Stage.STARTED
        and adapter.started_with is not None
        and not adapter.started_with.late
    )


def test_out_of_memory_names_the_device_ordinal_xla_gives():
    session = jax_session()
    jax = started_jax(session, "use 1,2", "limit 10%")
    error = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Failed to allocate request for 1.00GiB (1073741824B) on device ordinal 1"
    )
    text = oom.explain(session, error)
    assert text.startswith("tfgpu_magic: JAX ran out of memory on GPU 2 (JAX gpu:1, NVIDIA RTX A5000).\n")
    assert "  Failed request: 1 GiB\n" in text or "  Failed request: 1,024 MiB\n" in text


def test_on_with_jax_imported_but_not_started_is_one_line():
    session = jax_session()
    session._on_import(session.adapter("jax"), StandInJax())
    with pytest.raises(SessionError, match=r"^`%%gpu on` runs the cell under TensorFlow's tf.device"):
        with cells._gpu_scope(session, 0):
            pass


def test_a_jax_whose_backends_were_cleared_stays_started():
    """JAX's CUDA plugin read its options once, at discovery: clear_backends() does not make it
    read them again, so settings stay too late."""
    session = jax_session()
    jax = started_jax(session, "use 0,1", "grow")
    jax.started = False  # what jax.clear_backends() does to backends_are_initialized()
    assert session.adapter("jax").stage() is Stage.STARTED
    with pytest.raises(SessionError, match=r"^JAX has already started with preallocation off"):
        session.configure(grammar.parse("grow off"))


def test_the_users_own_variables_are_kept_until_asked_and_restored_by_reset():
    os.environ.update(XLA_CLIENT_MEM_FRACTION="0.3", XLA_PYTHON_CLIENT_ALLOCATOR="platform")
    session = jax_session()
    session.configure(grammar.parse("limit 50%"))
    assert (
        os.environ["XLA_CLIENT_MEM_FRACTION"] == "0.5" and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ
    )
    session.configure(grammar.parse("allocator default"))  # asked: JAX's default, the variable unset
    assert "XLA_PYTHON_CLIENT_ALLOCATOR" not in os.environ
    session.configure(grammar.parse("grow off"))  # asked: preallocate, said explicitly
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    session.reset()
    assert os.environ["XLA_CLIENT_MEM_FRACTION"] == "0.3"  # the user's value back
    assert os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ


def test_both_fraction_names_set_is_refused_with_what_to_do():
    os.environ.update(XLA_CLIENT_MEM_FRACTION="0.3", XLA_PYTHON_CLIENT_MEM_FRACTION="0.4")
    session = jax_session()
    with pytest.raises(
        SessionError,
        match=r"are both set, and JAX refuses to start its CUDA client with both: "
        r"remove one first \(`del os.environ\['XLA_PYTHON_CLIENT_MEM_FRACTION'\]`\)",
    ):
        session.configure(grammar.parse("limit 50%"))
    assert (os.environ["XLA_CLIENT_MEM_FRACTION"], os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == (
        "0.3",
        "0.4",
    )


def test_platform_is_jaxs_word_and_leaves_tensorflow_and_pytorch_as_they_were():
    os.environ.update(TF_GPU_ALLOCATOR="cuda_malloc_async", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    session = jax_session()
    said = session.configure(grammar.parse("allocator platform"))
    assert "JAX only" in said
    assert os.environ["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"


def test_a_memory_reading_that_fails_is_a_note():
    session = jax_session()
    jax = started_jax(session)

    def broken():
        raise RuntimeError("INTERNAL: CUDA error")

    jax.gpus[0].memory_stats = broken
    from tfgpu_magic.kernel import status

    report = status.build_report(session)
    assert report["frameworks"]["jax"]["memory_error"] == "gpu:0: RuntimeError: INTERNAL: CUDA error"
    assert "  note: no memory reading for gpu:0: RuntimeError: INTERNAL: CUDA error" in status.render_text(
        report
    )
    assert "Ran jax.clear_caches()" in session.free()


def test_a_limit_jax_cannot_take_is_said_when_jax_starts(capsys):
    session = jax_session()
    session.configure(grammar.parse("use 0,1"))
    session.configure(grammar.parse("limit 8G,8G"))  # 20% and 10%
    jax = StandInJax()
    session._on_import(session.adapter("jax"), jax)
    assert capsys.readouterr().err == ""  # imported (TensorFlow imports jax itself): nothing said
    jax.devices()
    assert (
        "tfgpu_magic: JAX starts without a memory fraction: JAX takes one memory fraction"
        in capsys.readouterr().err
    )


def test_a_jax_that_starts_on_the_cpu_hears_nothing_of_gpu_limits(capsys):
    session = jax_session()
    session.configure(grammar.parse("use 0,1"))
    session.configure(grammar.parse("limit 8G,8G"))
    jax = StandInJax(gpus=0)  # a CPU-only jaxlib: its backends start with no GPU
    session._on_import(session.adapter("jax"), jax)
    jax.devices()
    assert capsys.readouterr().err == ""


def test_a_plugin_that_refused_both_fraction_names_is_not_said_to_preallocate():
    """Both names inherited: JAX's CUDA plugin refuses them; what JAX started with is what its
    variables said (preallocation off here), never JAX's defaults in their place (issue 27)."""
    os.environ.update(
        {
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3",
            "XLA_CLIENT_MEM_FRACTION": "0.3",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        }
    )
    session = jax_session()
    jax = StandInJax()

    def refuses():
        raise ValueError("XLA_PYTHON_CLIENT_MEM_FRACTION and XLA_CLIENT_MEM_FRACTION are both set")

    jax._src.lib.xla_client.generate_pjrt_gpu_plugin_options = refuses
    session._on_import(session.adapter("jax"), jax)
    jax.devices()
    start = session.adapter("jax").start()
    assert (start.preallocate, start.memory_fraction) == (False, 0.3)
    assert "both set" in session.adapter("jax").plugin_error
