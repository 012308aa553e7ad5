"""`%gpu trace`: a real kernel on the CPU build (fresh process), then the hooks' edge cases in-process."""

from __future__ import annotations

import re

import pytest

from tfgpu_magic.frameworks import tensorflow as tf_runtime
from tfgpu_magic.frameworks.tensorflow import AllocatorStats, Stage
from tfgpu_magic.gpus.simulated import SimulatedNvml
from tfgpu_magic.kernel import trace

from support.fakes import FakeTensorFlow
from support.processes import run_scenario

MIB = 1024 * 1024
SOON = "tracing on: after each cell once TensorFlow has started, its allocator peak and retained change"


def lines(outcome: dict) -> list[str]:
    """The trace lines a cell printed, durations masked."""
    found = [line for line in outcome["out"].splitlines() if line.startswith("[gpu trace]")]
    return [re.sub(r", \d+\.\d\d s$", ", T s", line) for line in found]


@pytest.fixture(scope="module")
def kernel():
    return run_scenario("trace_scenario")


def without_others(out: str) -> str:
    """The reply's TensorFlow part: before any import the installed PyTorch and JAX are named after it."""
    return (
        out.split("; also the allocator of PyTorch and JAX on each GPU, once started")[0].rstrip("\n") + "\n"
    )


@pytest.mark.slow
def test_before_tensorflow_starts_it_turns_on_the_cpu_allocator_statistics(kernel):
    assert kernel["env_before"] is None
    assert without_others(kernel["on"]["out"]) == (
        SOON + "; no GPU will be visible, so TF_CPU_ALLOCATOR_USE_BFC=true is now set for "
        "TensorFlow's CPU allocator to keep statistics\n"
    )
    assert kernel["env_after"] == "true"
    assert without_others(kernel["again"]["out"]) == (
        "tracing is already on: after each cell once TensorFlow has started, its allocator peak and "
        "retained change; no GPU will be visible, so the CPU allocator is traced "
        "(TF_CPU_ALLOCATOR_USE_BFC=true is set)\n"
    )
    assert kernel["before_tf"]["out"] == ""  # silent until TensorFlow has started


@pytest.mark.slow
def test_lines_match_the_tensors_the_cells_allocate(kernel):
    assert lines(kernel["import"]) == [
        "[gpu trace] CPU:0: peak 4 MiB (+4 MiB in this cell), retained +4 MiB, T s"
    ]
    assert lines(kernel["alloc"]) == [
        "[gpu trace] CPU:0: peak 68 MiB (+64 MiB in this cell), retained +64 MiB, T s"
    ]
    assert lines(kernel["temporary"]) == [
        "[gpu trace] CPU:0: peak 100 MiB (+32 MiB in this cell), retained unchanged, T s"
    ]
    assert lines(kernel["free"]) == [
        "[gpu trace] CPU:0: peak 68 MiB (+0 B in this cell), retained -64 MiB, T s"
    ]
    assert lines(kernel["python_only"]) == [
        "[gpu trace] CPU:0: peak 4 MiB (+0 B in this cell), retained unchanged, T s"
    ]


@pytest.mark.slow
def test_a_failing_cell_is_traced_after_its_traceback(kernel):
    error = kernel["error"]
    assert not error["ok"] and error["error"] == "ValueError: boom"
    assert error["out"].index("ValueError: boom") < error["out"].index("[gpu trace]")
    assert lines(error) == ["[gpu trace] CPU:0: peak 20 MiB (+16 MiB in this cell), retained +16 MiB, T s"]


@pytest.mark.slow
def test_a_nested_peak_reset_does_not_hide_the_cells_peak(kernel):
    # The reset came after the 32 MiB temporary was freed; without folding the peak would be +0 B.
    # (The BFC allocator may hand out a larger free chunk than asked, so the rise is at least 32 MiB.)
    (line,) = lines(kernel["nested_reset"])
    rise = re.search(r"\(\+(\d+) MiB in this cell\), retained unchanged, T s$", line)
    assert rise and int(rise.group(1)) >= 32, line


@pytest.mark.slow
def test_after_start_it_names_the_devices_and_off_stops_the_lines(kernel):
    assert kernel["on_when_started"]["out"].splitlines()[0] == (
        "tracing is already on: after each cell, TensorFlow's allocator peak and retained change on CPU:0"
    )
    assert kernel["off"]["out"] == "tracing off\n"
    assert kernel["after_off"]["out"] == ""
    assert kernel["off_again"]["out"] == "tracing is already off\n"


# -- in-process: no TensorFlow here, its readings are simulated --------------------------------
@pytest.fixture
def tracing(shell, session, monkeypatch):
    """A TensorFlow kernel on a machine where PyTorch and JAX are not installed (their part of the
    reply is tests/test_frameworks_said.py's)."""
    monkeypatch.setattr(session.adapter("pytorch"), "installed", lambda: False)
    monkeypatch.setattr(session.adapter("jax"), "installed", lambda: False)
    yield lambda on: trace.set_tracing(shell, session, on)
    trace.set_tracing(shell, session, False)


def run(shell, capsys, code: str) -> tuple[bool, str, str]:
    outcome = shell.run_cell(code)
    captured = capsys.readouterr()
    return outcome.success, captured.out, captured.err


def started_with(session, stats: dict[str, AllocatorStats], gpus: dict[str, int] | None = None) -> None:
    session.adapter("tensorflow").fake_stage = Stage.STARTED
    session.adapter("tensorflow").stats = stats
    session.adapter("tensorflow").gpus = gpus or {}


def test_gpus_expected_so_the_cpu_allocator_is_left_alone(tracing, session):
    # the fake server shows four GPUs: the allocator is chosen only once TensorFlow lists none
    assert tracing(True) == SOON + "; if TensorFlow finds no GPU, its CPU allocator is traced instead"
    assert tf_runtime.CPU_STATS_ENV not in session.env


def test_no_gpu_and_not_started_sets_the_variable_in_the_sessions_environment(tracing, session):
    session.nvml = type(session.nvml)(lib=SimulatedNvml([]))
    assert tracing(True).endswith(
        "TF_CPU_ALLOCATOR_USE_BFC=true is now set for TensorFlow's CPU allocator to keep statistics"
    )
    assert session.env[tf_runtime.CPU_STATS_ENV] == "true"


def test_a_cpu_only_tensorflow_sees_no_gpu_whatever_the_driver_lists(tracing, session):
    """tensorflow-cpu beside four GPUs (the simulated server): the CPU allocator is what to trace."""
    session.adapter("tensorflow").cpu_only = True
    assert tracing(True).endswith(
        "TF_CPU_ALLOCATOR_USE_BFC=true is now set for TensorFlow's CPU allocator to keep statistics"
    )
    assert session.env[tf_runtime.CPU_STATS_ENV] == "true"


def test_the_adapter_reads_a_cpu_only_build_from_the_installed_packages(monkeypatch):
    from importlib import metadata

    installed = {"tensorflow-cpu"}

    def distribution(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    adapter = tf_runtime.TensorFlow()
    assert adapter.cpu_only_build() is True
    installed.add("tensorflow")  # a CUDA build (perhaps beside a stray tensorflow-cpu)
    assert adapter.cpu_only_build() is False
    installed.discard("tensorflow-cpu")
    assert adapter.cpu_only_build() is False


def test_silent_while_tensorflow_is_not_started(tracing, shell, capsys):
    tracing(True)
    capsys.readouterr()
    assert run(shell, capsys, "x = 1") == (True, "", "")


def test_started_without_statistics_says_how_to_get_them_once(tracing, shell, capsys, session):
    started_with(session, {})
    no_stats = session.adapter("tensorflow").trace_absent()
    assert tracing(True) == "tracing on: " + no_stats
    assert no_stats == (
        "TensorFlow's allocator keeps no statistics in this kernel: no GPU is visible and TensorFlow "
        "started without TF_CPU_ALLOCATOR_USE_BFC=true. Restart the kernel and run `%gpu trace` before "
        "`import tensorflow` (it sets the variable), or set it in the kernel's environment"
    )
    # The fake server lists four GPUs that TensorFlow did not find: why comes first, once.
    tf = session.adapter("tensorflow")
    why = f"[gpu trace] {tf.no_gpu_diagnosis(session.view(tf)).line()}\n"
    assert run(shell, capsys, "x = 1") == (True, why + f"[gpu trace] {no_stats}\n", "")
    assert run(shell, capsys, "x = 2") == (True, "", "")


def test_gpu_lines_use_nvidia_smi_numbers(tracing, shell, capsys, session):
    stats = {"GPU:0": AllocatorStats(10 * MIB, 10 * MIB), "GPU:1": AllocatorStats(0, 0)}
    started_with(session, stats, {"GPU:0": 1, "GPU:1": 3})
    assert tracing(True) == (
        "tracing on: after each cell, TensorFlow's allocator peak and retained change on "
        "GPU 1 (TF GPU:0), GPU 3 (TF GPU:1)"
    )
    capsys.readouterr()
    shell.user_ns.update(stats=stats, AllocatorStats=AllocatorStats, MIB=MIB)
    ok, out, _ = run(shell, capsys, "stats['GPU:0'] = AllocatorStats(3 * MIB, 12 * MIB)")
    assert ok
    assert [re.sub(r", \d+\.\d\d s$", ", T s", line) for line in out.splitlines()] == [
        "[gpu trace] GPU 1 (TF GPU:0): peak 12 MiB (+2 MiB in this cell), retained -7 MiB, T s",
        "[gpu trace] GPU 3 (TF GPU:1): peak 0 B (+0 B in this cell), retained unchanged, T s",
    ]


def test_a_failing_hook_never_breaks_the_cell_and_says_so_once(tracing, shell, capsys, session):
    def broken():
        raise RuntimeError("allocator gone")

    session.adapter("tensorflow").open_peak_window = broken
    session.adapter(
        "tensorflow"
    ).fake_stage = Stage.IMPORTED  # a window is opened for an imported framework only, as for any
    tracing(True)
    capsys.readouterr()
    ok, out, err = run(shell, capsys, "y = 41 + 1")
    assert (ok, out, shell.user_ns["y"]) == (True, "", 42)
    assert err == (
        "tfgpu_magic: `%gpu trace` could not read TensorFlow's allocator "
        "(RuntimeError('allocator gone')); the cell itself is unaffected\n"
    )
    assert run(shell, capsys, "y = 43") == (True, "", "")


def test_hooks_take_ipythons_event_arguments(session):
    events = []

    class Shell:
        class events:
            register = staticmethod(lambda name, f: events.append(name))
            unregister = staticmethod(lambda name, f: events.remove(name))

    tracer = trace.Tracer(Shell(), session)
    tracer.start()
    tracer.pre_run_cell(object())  # ExecutionInfo
    tracer.post_run_cell(object())  # ExecutionResult
    tracer.stop()
    assert events == []


class _ResettingAllocator(FakeTensorFlow):
    """A CPU allocator whose reset really moves the peak down to what is in use."""

    def __init__(self, state: dict) -> None:
        super().__init__(Stage.STARTED)
        self.state = state

    def memory_info(self, device):
        return AllocatorStats(self.state["current"], self.state["peak"])

    def allocator_stats(self):
        return {"CPU:0": self.memory_info("CPU:0")}

    def reset_peak(self, device):
        self.state["peak"] = self.state["current"]
        return True


def test_peak_windows_survive_nested_resets():
    """An inner window's reset must not lose the outer window's earlier peak."""
    state = {"current": 10, "peak": 10}
    tf = _ResettingAllocator(state)
    outer = tf.open_peak_window()
    state.update(current=15, peak=50)  # a temporary of 40 then 5 kept
    inner = tf.open_peak_window()
    state.update(current=25, peak=30)
    assert inner.read() == {"CPU:0": (15, AllocatorStats(25, 30))}
    inner.close()
    assert outer.read() == {"CPU:0": (10, AllocatorStats(25, 50))}
    outer.close()


@pytest.mark.parametrize(
    "start, stats, expected",
    [
        (0, AllocatorStats(0, 0), "peak 0 B (+0 B in this cell), retained unchanged"),
        (0, AllocatorStats(512, 768), "peak 768 B (+768 B in this cell), retained +512 B"),
        (MIB, AllocatorStats(MIB + 3072, MIB + 4096), "peak 1 MiB (+4 KiB in this cell), retained +3 KiB"),
        (
            12 * 1024 * MIB,
            AllocatorStats(11 * 1024 * MIB, 13 * 1024 * MIB),
            "peak 13.0 GiB (+1,024 MiB in this cell), retained -1,024 MiB",
        ),
    ],
)
def test_format_line(start, stats, expected):
    assert trace.format_line("CPU:0", start, stats, 1.234) == f"[gpu trace] CPU:0: {expected}, 1.23 s"


# -- cells run inside a cell: `%%capture` runs its body with shell.run_cell --------------------
def test_capture_of_status_json_holds_only_the_json(gpu, tracing, shell, capsys, session, monkeypatch):
    """Tutorial 2's pattern: the trace line belongs to the notebook cell, not to %%capture's body."""
    import json

    started_with(session, {"CPU:0": AllocatorStats(0, 0)})
    # The no-GPU line is said once, in whichever test of this file traces first; it has tests of its own.
    monkeypatch.setattr(session.adapter("tensorflow"), "no_gpu_diagnosis", lambda view: None)
    tracing(True)
    capsys.readouterr()
    ok, out, err = run(shell, capsys, "%%capture status_json\n%gpu status --json")
    assert (ok, err) == (True, "")
    captured = shell.user_ns["status_json"].stdout
    assert "[gpu trace]" not in captured
    assert json.loads(captured)["me"]["label"] == "this kernel"
    # The line is printed once, for the notebook's cell, after the capture has ended.
    assert [re.sub(r", \d+\.\d\d s$", ", T s", line) for line in out.splitlines()] == [
        "[gpu trace] CPU:0: peak 0 B (+0 B in this cell), retained unchanged, T s"
    ]


def test_the_outer_cell_reports_what_its_captured_body_allocated(tracing, shell, capsys, session):
    stats = {"CPU:0": AllocatorStats(MIB, MIB)}
    started_with(session, stats)
    tracing(True)
    capsys.readouterr()
    shell.user_ns.update(stats=stats, AllocatorStats=AllocatorStats, MIB=MIB)
    ok, out, _ = run(shell, capsys, "%%capture inner\nstats['CPU:0'] = AllocatorStats(5 * MIB, 9 * MIB)")
    assert ok and shell.user_ns["inner"].stdout == ""
    assert [re.sub(r", \d+\.\d\d s$", ", T s", line) for line in out.splitlines()] == [
        "[gpu trace] CPU:0: peak 9 MiB (+8 MiB in this cell), retained +4 MiB, T s"
    ]
    # A blank body is a cell IPython announces only after it ran: still one line, outside.
    ok, out, _ = run(shell, capsys, "%%capture blank\n\n")
    assert ok and shell.user_ns["blank"].stdout == ""
    assert len(out.splitlines()) == 1 and out.startswith("[gpu trace] CPU:0: ")
    # And the next ordinary cell is traced as before.
    assert len(run(shell, capsys, "z = 1")[1].splitlines()) == 1


def test_turning_tracing_on_inside_a_capture_prints_nothing_until_the_next_cell(gpu, shell, capsys, session):
    started_with(session, {"CPU:0": AllocatorStats(0, 0)})
    try:
        ok, out, _ = run(shell, capsys, "%%capture answer\n%gpu trace")
        assert ok and out == ""
        assert shell.user_ns["answer"].stdout.startswith("tracing on: ")
        assert run(shell, capsys, "z = 2")[1].startswith("[gpu trace] CPU:0: ")
    finally:
        trace.set_tracing(shell, session, False)


@pytest.mark.slow
def test_capture_of_status_json_in_a_real_kernel(kernel):
    import json

    assert "[gpu trace]" not in kernel["captured"]
    assert json.loads(kernel["captured"])["tensorflow"]["stage"] == "started"
    assert [line.split(": peak")[0] for line in lines(kernel["capture"])] == ["[gpu trace] CPU:0"]
