"""Issue 27, item 4: every framework's allocator figures, read on the user's thread and published
for the panel; the sampler thread reads only the snapshot (and NVML), never a framework."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from tfgpu_magic.frameworks.base import ChartedFigure, DeviceMemory, Framework, Stage
from tfgpu_magic.frameworks.jax import Jax
from tfgpu_magic.frameworks.pytorch import PyTorch
from tfgpu_magic.frameworks.tensorflow import AllocatorStats, TensorFlow
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel import allocator_figures, monitor, panels
from tfgpu_magic.kernel.allocator_figures import NOTHING_READ, Board, FigureSeries
from tfgpu_magic.kernel.monitor import THREAD_NAME, Sampler

from support.fakes import FakeTensorFlow, StandInFramework, monitor_threads, wait_for

MIB = 1024 * 1024
GIB = 1024 * MIB
ME = 4242
TORCH = (
    ChartedFigure("allocated", "in_use_bytes", "allocated"),
    ChartedFigure("reserved", "reserved_bytes", "reserved"),
)

pytestmark = pytest.mark.usefixtures("no_leaked_sampler")


def torch_like(memory=None, **kwargs) -> StandInFramework:
    return StandInFramework("pytorch", "PyTorch", TORCH, memory, **kwargs)


def by_key(sample):
    return {d.key: d for d in sample.devices}


# -- what the adapters answer --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "adapter", [TensorFlow(), PyTorch(), Jax(), FakeTensorFlow()], ids=lambda a: type(a).__name__
)
def test_every_adapter_answers_the_figures_questions_without_its_framework(adapter):
    assert isinstance(adapter, Framework)
    assert adapter.charted_figures and all(
        f.field in {x.name for x in dataclasses.fields(DeviceMemory)} for f in adapter.charted_figures
    )
    assert adapter.figures_absent() is None  # not imported: nothing to say


def test_the_adapters_number_their_gpus_through_cudas_numbering():
    assert PyTorch().gpu_numbering([2, 0]) == {"cuda:0": 2, "cuda:1": 0}
    assert Jax().gpu_numbering([3]) == {"gpu:0": 3}
    assert FakeTensorFlow(Stage.ENUMERATED, gpus={"GPU:0": 1}).gpu_numbering([0, 1]) == {"GPU:0": 1}


def test_tensorflow_says_why_it_has_no_figures():
    assert FakeTensorFlow(Stage.IMPORTED).figures_absent() == "until its first op"
    assert FakeTensorFlow(Stage.STARTED).figures_absent() == (
        "on this build: no GPU, and its CPU allocator keeps none without TF_CPU_ALLOCATOR_USE_BFC=true"
    )
    started = FakeTensorFlow(Stage.STARTED, stats={"CPU:0": AllocatorStats(1, 2)})
    assert started.figures_absent() is None


# -- reading ----------------------------------------------------------------------------------------------
def test_started_frameworks_are_read_and_mapped_to_nvidia_smi_numbers():
    tf = FakeTensorFlow(Stage.STARTED, gpus={"GPU:0": 1}, stats={"GPU:0": AllocatorStats(1 * GIB, 2 * GIB)})
    torch = torch_like({"cuda:0": DeviceMemory(3 * GIB, 4 * GIB, reserved_bytes=5 * GIB)}, numbering=None)
    torch.gpu_numbering = lambda cuda_map: {f"cuda:{k}": i for k, i in enumerate(cuda_map)}
    figures = allocator_figures.read([tf, torch], lambda: [2, 0], clock=lambda: 1700000000.0)
    assert figures.read_at == 1700000000.0 and figures.notes == ()
    assert figures.series == (
        FigureSeries("tensorflow", "in_use", "TensorFlow allocator: in use", "tf_in_use_bytes"),
        FigureSeries("tensorflow", "peak", "TensorFlow allocator: peak", "tf_peak_bytes"),
        FigureSeries("pytorch", "allocated", "PyTorch allocator: allocated"),
        FigureSeries("pytorch", "reserved", "PyTorch allocator: reserved"),
    )
    assert [(d.framework, d.device, d.gpu, d.values) for d in figures.devices] == [
        ("tensorflow", "GPU:0", 1, (("in_use", 1 * GIB), ("peak", 2 * GIB))),
        ("pytorch", "cuda:0", 2, (("allocated", 3 * GIB), ("reserved", 5 * GIB))),  # CUDA device 0 is GPU 2
    ]


def test_a_figure_no_device_keeps_is_not_a_series():
    figures = allocator_figures.read([torch_like({"cuda:0": DeviceMemory(1, 2)})], lambda: [0])
    assert [s.series for s in figures.series] == ["allocated"]  # reserved_bytes None: no reserved line


def test_imported_frameworks_without_figures_are_notes_and_the_others_are_left_out():
    figures = allocator_figures.read(
        [
            torch_like(stage=Stage.IMPORTED, absent="on this build (CPU only: no CUDA allocator)"),
            StandInFramework(
                "jax", "JAX", (), stage=Stage.STARTED, absent="on this build (its CPU backend keeps none)"
            ),
            StandInFramework("tensorflow", "TensorFlow", (), stage=Stage.NOT_IMPORTED, absent="never asked"),
        ],
        lambda: [0],
    )
    assert figures.series == () and figures.devices == ()
    assert figures.notes == (
        "PyTorch: no allocator figures on this build (CPU only: no CUDA allocator)",
        "JAX: no allocator figures on this build (its CPU backend keeps none)",
    )


def test_a_failing_framework_is_a_note_and_the_others_are_still_read():
    broken = torch_like()

    def fails():
        raise RuntimeError("CUDA error: an illegal memory access")

    broken.device_memory = fails
    fine = StandInFramework(
        "jax", "JAX", (ChartedFigure("in_use", "in_use_bytes", "in use"),), {"jax:0": DeviceMemory(7, 8)}
    )
    figures = allocator_figures.read([broken, fine], lambda: [3])
    assert figures.notes == (
        "PyTorch: allocator figures could not be read (RuntimeError: CUDA error: an illegal memory access)",
    )
    assert [(d.framework, d.gpu, d.values) for d in figures.devices] == [("jax", 3, (("in_use", 7),))]


def test_devices_that_cannot_be_numbered_are_charted_on_their_own_with_a_note():
    torch = torch_like({"cuda:0": DeviceMemory(1, 2, reserved_bytes=3)})

    def no_numbering():
        raise OSError("NVML went away")

    figures = allocator_figures.read([torch], no_numbering)
    assert figures.notes == ("PyTorch: its devices could not be matched to GPUs (OSError: NVML went away)",)
    (device,) = figures.devices
    assert device.gpu is None and device.label == "PyTorch cuda:0"
    sample = Sampler(Nvml(lib=shared_server(ME)), ME, figures=lambda: figures).tick()
    alone = by_key(sample)["pytorch:cuda:0"]
    assert alone.label == "PyTorch cuda:0" and alone.figures == (
        ("pytorch", "allocated", 1),
        ("pytorch", "reserved", 3),
    )
    assert alone.total_bytes is None  # no driver readings for it: a gap, not 0


def test_the_snapshot_is_immutable_and_swapped_whole():
    board = Board(clock=lambda: 5.0)
    assert board.latest() is NOTHING_READ and NOTHING_READ.read_at is None
    torch = torch_like({"cuda:0": DeviceMemory(1, 2, reserved_bytes=3)})
    first = board.publish(lambda: [torch], lambda: [0])
    assert board.latest() is first and first.read_at == 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.notes = ("changed",)  # type: ignore[misc]
    torch.memory["cuda:0"] = DeviceMemory(10, 20, reserved_bytes=30)
    second = board.publish(lambda: [torch], lambda: [0])
    assert board.latest() is second and first.devices[0].values == (("allocated", 1), ("reserved", 3))


def test_publishing_never_raises_into_the_users_cell():
    def unlistable():
        raise RuntimeError("no frameworks today")

    figures = Board(clock=lambda: 1.0).publish(unlistable, lambda: [0])
    assert figures.read_at == 1.0
    assert figures.notes == ("allocator figures could not be read (RuntimeError: no frameworks today)",)


# -- the sampler: figures per GPU, the older wire fields, and never a framework from its thread -----------------
def test_the_sampler_puts_each_frameworks_figures_on_its_gpu_and_sums_logical_gpus():
    tf = FakeTensorFlow(
        Stage.STARTED,
        gpus={"GPU:0": 1, "GPU:1": 1},
        stats={"GPU:0": AllocatorStats(100 * MIB, 150 * MIB), "GPU:1": AllocatorStats(300 * MIB, 320 * MIB)},
    )
    torch = torch_like(
        {"cuda:0": DeviceMemory(1 * GIB, 2 * GIB, reserved_bytes=3 * GIB)}, numbering={"cuda:0": 1}
    )
    board = Board()
    board.publish(lambda: [tf, torch], lambda: [0, 1, 2, 3])
    gpu1 = by_key(Sampler(Nvml(lib=shared_server(ME)), ME, figures=board.latest).tick())["gpu1"]
    assert gpu1.figures == (
        ("tensorflow", "in_use", 400 * MIB),
        ("tensorflow", "peak", 470 * MIB),
        ("pytorch", "allocated", 1 * GIB),
        ("pytorch", "reserved", 3 * GIB),
    )
    assert (gpu1.tf_in_use_bytes, gpu1.tf_peak_bytes) == (400 * MIB, 470 * MIB)  # the stable wire fields


def test_the_panel_sends_each_frameworks_series_with_its_label_and_the_notes():
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    torch = torch_like(
        {"cuda:0": DeviceMemory(1 * GIB, 2 * GIB, reserved_bytes=3 * GIB)}, numbering={"cuda:0": 1}
    )
    jax = StandInFramework(
        "jax", "JAX", (), stage=Stage.STARTED, absent="on this build (its CPU backend keeps none)"
    )
    board = Board(clock=lambda: 1700000000.0)
    board.publish(lambda: [torch, jax], lambda: [0, 1])
    s = Sampler(Nvml(lib=shared_server(ME)), ME, figures=board.latest)
    sent = widget.batch([s.tick(), s.tick()])
    assert sent["figures"] == [
        {"framework": "pytorch", "series": "allocated", "label": "PyTorch allocator: allocated"},
        {"framework": "pytorch", "series": "reserved", "label": "PyTorch allocator: reserved"},
    ]
    assert sent["d"]["gpu1"]["frameworks"] == {
        "pytorch": {"allocated": [GIB, GIB], "reserved": [3 * GIB, 3 * GIB]}
    }
    assert "frameworks" not in sent["d"]["gpu0"]  # nothing of any framework there: no series, not zeros
    assert sent["figure_notes"] == ["JAX: no allocator figures on this build (its CPU backend keeps none)"]
    assert sent["figures_read_at"] == 1700000000.0


def test_the_sampler_thread_never_calls_an_adapter():
    """Adapters that record the thread of every call: the sampler's thread runs many ticks and
    is never among them; the user's thread (publishing) is."""
    torch = torch_like({"cuda:0": DeviceMemory(1, 2, reserved_bytes=3)}, numbering={"cuda:0": 0})
    jax = StandInFramework("jax", "JAX", (), stage=Stage.IMPORTED, absent="until its first operation")
    board = Board()
    board.publish(lambda: [torch, jax], lambda: [0])
    s = Sampler(Nvml(lib=shared_server(ME)), ME, interval=0.1, figures=board.latest)
    s.start()
    try:
        wait_for(lambda: len(s.history) >= 5)
        board.publish(lambda: [torch, jax], lambda: [0])  # a cell ends meanwhile
        wait_for(lambda: len(s.history) >= 8)
    finally:
        assert s.stop()
    assert s.latest().devices[0].figures == (("pytorch", "allocated", 1), ("pytorch", "reserved", 3))
    callers = {t.name for t in torch.threads + jax.threads}
    assert callers == {threading.current_thread().name} and THREAD_NAME not in callers


def _recording(adapter, calls: list) -> None:
    """Wrap every method of a real adapter so that each call records its thread."""
    for name in dir(type(adapter)):
        if (
            name.startswith("__")
            or not callable(getattr(type(adapter), name, None))
            or isinstance(getattr(type(adapter), name), type)
        ):
            continue
        method = getattr(adapter, name)

        def recorded(*args, _method=method, _name=name, **kwargs):
            calls.append((threading.current_thread().name, type(adapter).__name__, _name))
            return _method(*args, **kwargs)

        setattr(adapter, name, recorded)


def test_a_real_sessions_panel_asks_its_adapters_only_on_the_users_thread(session):
    """``%gpu monitor``'s own sources on a session with every adapter (TensorFlow started, PyTorch
    and JAX as they are): no call into any adapter comes from the sampler's thread."""
    pytest.importorskip("tfgpu_magic.kernel.widget")
    (tf,) = [f for f in session.frameworks() if isinstance(f, FakeTensorFlow)]
    tf.fake_stage, tf.gpus, tf.found = Stage.STARTED, {"GPU:0": 1}, [1]
    tf.stats["GPU:0"] = AllocatorStats(GIB, GIB)
    calls: list = []
    for adapter in session.frameworks():
        _recording(adapter, calls)
    panel = panels.open_panel(interval=0.1, window=60, display=False, session=session)
    try:
        sampler = monitor.active_sampler()
        wait_for(lambda: len(sampler.history) >= 5)
        allocator_figures.publish(session)  # a cell ends
        wait_for(lambda: len(sampler.history) >= 8)
        assert by_key(sampler.latest())["gpu1"].tf_in_use_bytes == GIB
    finally:
        monitor.stop_panels()
        panel.close()
    assert calls and {thread for thread, _, _ in calls} == {threading.current_thread().name}, [
        c for c in calls if c[0] == THREAD_NAME
    ][:5]
    assert monitor_threads() == []


# -- publishing: after each cell, at each %gpu ---------------------------------------------------------
def test_every_gpu_command_publishes(gpu):
    board = allocator_figures.board_of(gpu.session)
    assert board.latest() is NOTHING_READ
    gpu.session.adapter("tensorflow").fake_stage = Stage.STARTED
    gpu.session.adapter("tensorflow").gpus = {"GPU:0": 1}
    gpu.session.adapter("tensorflow").stats["GPU:0"] = AllocatorStats(3 * MIB, 4 * MIB)
    gpu("status --json")
    figures = board.latest()
    assert figures.read_at is not None
    assert [(d.device, d.gpu, d.values) for d in figures.devices] == [
        ("GPU:0", 1, (("in_use", 3 * MIB), ("peak", 4 * MIB)))
    ]


def test_each_cell_end_publishes_and_a_second_install_replaces_the_first(shell, session):
    allocator_figures.install(shell, session)
    allocator_figures.install(shell, session)  # a second %load_ext
    try:
        hooks = [
            h for h in shell.events.callbacks["post_run_cell"] if getattr(h, "__name__", "") == "after_cell"
        ]
        assert len(hooks) == 1
        board = allocator_figures.board_of(session)
        session.adapter("tensorflow").fake_stage = Stage.IMPORTED
        shell.run_cell("x = 1")
        assert board.latest().notes == ("TensorFlow: no allocator figures until its first op",)
    finally:
        shell.events.unregister("post_run_cell", allocator_figures._hooks[shell])


# -- the trace: every started framework, by its adapter's name -----------------------------------------------
def test_the_trace_reports_each_started_framework_by_name_and_says_once_which_keeps_no_figures(
    session, monkeypatch
):
    from tfgpu_magic.kernel import trace

    torch = torch_like(
        {"cuda:0": DeviceMemory(1 * GIB, 1 * GIB, reserved_bytes=2 * GIB)}, numbering={"cuda:0": 2}
    )
    jax = StandInFramework(
        "jax", "JAX", (), stage=Stage.STARTED, absent="on this build (its CPU backend keeps none)"
    )
    monkeypatch.setattr(session, "frameworks", lambda: (torch, jax))
    tracer = trace.Tracer(shell=None, session=session)
    tracer.pre_run_cell(None)
    torch.memory["cuda:0"] = DeviceMemory(3 * GIB, 4 * GIB, reserved_bytes=4 * GIB)
    assert tracer.lines(0.5) == [
        "[gpu trace] GPU 2 (PyTorch cuda:0): peak 4,096 MiB (+3,072 MiB in this cell), retained +2,048 MiB, 0.50 s",
        "[gpu trace] JAX: no allocator figures on this build (its CPU backend keeps none); nothing of it to trace",
    ]
    tracer.pre_run_cell(None)
    assert tracer.lines(0.5)[1:] == []  # said once


def test_the_trace_reply_names_the_frameworks_by_their_adapters(session, monkeypatch):
    from tfgpu_magic.kernel import trace

    torch = torch_like(stage=Stage.IMPORTED)
    jax = StandInFramework("jax", "JAX", (), stage=Stage.IMPORTED)
    monkeypatch.setattr(session, "frameworks", lambda: (torch, jax))
    assert trace._what_is_traced(session) == (
        "after each cell, the allocator peak and retained change of PyTorch and JAX on each GPU, once started"
    )


def test_the_traces_no_stats_text_is_tensorflows_own():
    assert (
        FakeTensorFlow(Stage.STARTED).trace_absent().startswith("TensorFlow's allocator keeps no statistics")
    )
