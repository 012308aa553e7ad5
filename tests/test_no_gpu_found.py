"""The driver lists GPUs, TensorFlow found none: `%gpu` and `%gpu trace` say why and what fixes it.

Issue 17, item 10.  Fresh processes on the real CPU build (whose `tf.sysconfig.get_build_info()`
says `is_cuda_build: False`) against a simulated driver listing four GPUs; then the diagnosis of
each cause from stated facts, and the session's record of it, in-process.
"""

from __future__ import annotations

import json

import pytest

from tfgpu_magic.frameworks import adapters
from tfgpu_magic.frameworks import tensorflow as tf_runtime
from tfgpu_magic.frameworks import tensorflow_diagnosis as tf_diagnosis
from tfgpu_magic.frameworks.tensorflow import Stage
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml
from tfgpu_magic.kernel import trace
from tfgpu_magic.kernel.session import Session
from tfgpu_magic.kernel.status import build_report, render_text

from support.fakes import FakeTensorFlow
from support.processes import run_scenario

FIX_CUDA = 'pip install "tensorflow[and-cuda]", then restart the kernel'


def trace_lines(outcome: dict) -> list[str]:
    return [line for line in outcome["out"].splitlines() if line.startswith("[gpu trace]")]


# -- fresh kernels on the CPU build -----------------------------------------------------------------
@pytest.fixture(scope="module")
def as_cuda_install():
    """`tensorflow` (a CUDA build on Linux) as far as tfgpu_magic can tell before the import."""
    return run_scenario("no_gpu_found_scenario", "--four-gpus", "--as-cuda-build-install")


@pytest.fixture(scope="module")
def as_installed():
    """This environment as it is: `tensorflow-cpu`."""
    return run_scenario("no_gpu_found_scenario", "--four-gpus")


@pytest.mark.slow
def test_trace_says_once_why_no_gpu_was_found_then_traces_the_cpu_allocator(as_cuda_install):
    assert "; if TensorFlow finds no GPU, its CPU allocator is traced instead" in as_cuda_install["on"]["out"]
    first, figures = trace_lines(as_cuda_install["import"])
    assert first == (
        "[gpu trace] TensorFlow found no GPU: this TensorFlow (tensorflow) is a CPU-only build "
        "(tf.sysconfig.get_build_info(): is_cuda_build False); the driver lists 4 GPUs for this kernel. "
        f"Fix: {FIX_CUDA}; tracing TensorFlow's CPU allocator"
    )
    assert figures.startswith("[gpu trace] CPU:0: peak 4 MiB (+4 MiB in this cell), retained +4 MiB")
    assert trace_lines(as_cuda_install["alloc"])[0].startswith("[gpu trace] CPU:0: peak 68 MiB (+64 MiB")
    assert not any("found no GPU" in line for line in trace_lines(as_cuda_install["alloc"]))  # said once


@pytest.mark.slow
def test_the_cpu_allocator_statistics_are_turned_on_only_once_no_gpu_was_listed(as_cuda_install):
    assert as_cuda_install["env_after_on"] is None  # GPUs were expected: left alone at `%gpu trace`
    assert as_cuda_install["env_after_start"] == "true"  # set just before the runtime started


@pytest.mark.slow
def test_status_text_and_json_carry_the_diagnosis(as_cuda_install):
    text = as_cuda_install["status"]["out"]
    assert "  found no GPU: this TensorFlow (tensorflow) is a CPU-only build" in text
    assert f"  fix: {FIX_CUDA}" in text
    report = json.loads(as_cuda_install["status_json"])
    found = report["tensorflow"]["found_no_gpu"]
    assert found["cause"] == "cpu_build" and found["is_cuda_build"] is False
    assert (
        found["driver_gpus"] == 4 and found["driver_cuda"] == "12.8"
    )  # nvmlSystemGetCudaDriverVersion 12080


@pytest.mark.slow
def test_a_tensorflow_cpu_install_is_told_to_swap_the_distribution(as_installed):
    report = json.loads(as_installed["status_json"])
    found = report["tensorflow"]["found_no_gpu"]
    assert found["distribution"] == "tensorflow-cpu"
    assert (
        found["fix"]
        == 'pip uninstall -y tensorflow-cpu && pip install "tensorflow[and-cuda]", then restart the kernel'
    )
    assert as_installed["env_after_on"] == "true"  # known CPU-only before the import: set at once
    first, figures = trace_lines(as_installed["import"])
    assert figures.startswith("[gpu trace] CPU:0: peak 4 MiB")
    from support.markdown import page_saying

    assert page_saying(first) is not None  # the docs' example (docs/tracing.md) is this kernel's line


# -- each cause, from stated facts --------------------------------------------------------------------
def installed(*names: str):
    return lambda name: name in names


def diagnose(**facts):
    given = {
        "driver_gpus": 4,
        "build_info": {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"},
        "driver_cuda": "12.8",
        "installed": installed("tensorflow"),
    }
    return tf_diagnosis.diagnose(**{**given, **facts})


def test_a_cuda_build_without_cudas_pip_libraries():
    found = diagnose()
    assert found.cause == "cuda_libraries_missing"
    assert found.missing_wheels == ("nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12")
    assert "built for CUDA 12.5.1 and cuDNN 9" in found.why and "the driver supports CUDA 12.8" in found.why
    assert found.fix == FIX_CUDA


def test_a_cuda_build_newer_than_the_driver():
    found = diagnose(
        driver_cuda="11.8", installed=installed("tensorflow", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12")
    )
    assert found.cause == "driver_too_old"
    assert "newer than the driver: the driver supports CUDA 11.8" in found.why
    assert found.fix.startswith("install an NVIDIA driver that supports CUDA 12.5")


def test_a_cuda_build_with_its_libraries_and_a_recent_driver_points_at_tensorflows_own_log():
    found = diagnose(installed=installed("tensorflow", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12"))
    assert found.cause == "unknown"
    assert "list_physical_devices('GPU')" in found.fix and "--force-reinstall" in found.fix


def test_unreadable_facts_are_said_to_be_unknown_not_guessed():
    found = diagnose(build_info=None, driver_cuda=None)
    assert found.cause == "unknown" and found.cuda_build is None
    assert "build information could not be read" in found.why and "CUDA version is unknown" in found.why
    odd = diagnose(build_info={"is_cuda_build": True, "cuda_version": "9" * 5000})
    assert odd.missing_wheels == () and len(odd.why) < 400  # an absurd version is cut, no major read


# -- the session's record ---------------------------------------------------------------------------------
class CountingTensorFlow(FakeTensorFlow):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.build_reads = 0

    def build_info(self):
        self.build_reads += 1
        return super().build_info()


def four_gpu_session(tf: FakeTensorFlow, driver_cuda: int | None = 12080) -> Session:
    driver = SimulatedNvml([SimulatedGpu() for _ in range(4)])
    driver.cuda_driver_version = driver_cuda
    return Session(nvml=Nvml(lib=driver), env={}, frameworks=adapters(tensorflow=tf))


def test_status_reads_the_diagnosis_made_once(monkeypatch):
    from tfgpu_magic.frameworks import tensorflow as tensorflow_adapter

    monkeypatch.setattr(tensorflow_adapter, "distribution_installed", installed("tensorflow"))
    tf = CountingTensorFlow(stage=Stage.STARTED, found=[])
    session = four_gpu_session(tf)
    first = build_report(session)["tensorflow"]["found_no_gpu"]
    assert first["cause"] == "cuda_libraries_missing" and first["driver_cuda"] == "12.8"
    tf.build = {"is_cuda_build": False}  # a build cannot change under a running kernel: never read again
    assert build_report(session)["tensorflow"]["found_no_gpu"] == first
    assert tf.build_reads == 1
    assert "  fix: " + FIX_CUDA in render_text(build_report(session))


def test_no_diagnosis_when_tensorflow_found_its_gpus_or_cuda_was_shown_none():
    assert (
        build_report(four_gpu_session(FakeTensorFlow(stage=Stage.STARTED, found=[0, 1, 2, 3])))["tensorflow"][
            "found_no_gpu"
        ]
        is None
    )
    hidden = four_gpu_session(FakeTensorFlow(stage=Stage.STARTED, found=[]))
    hidden.machine.env["CUDA_VISIBLE_DEVICES"] = ""  # %gpu use none: nothing to find, nothing to explain
    assert build_report(hidden)["tensorflow"]["found_no_gpu"] is None
    assert (
        "found_no_gpu" not in build_report(four_gpu_session(FakeTensorFlow()))["tensorflow"]
    )  # not imported


def test_a_driver_without_the_cuda_version_reading_leaves_it_unknown():
    session = four_gpu_session(FakeTensorFlow(stage=Stage.STARTED, found=[]), driver_cuda=None)
    assert session.nvml.cuda_driver_version() is None
    assert (
        "the driver's CUDA version is unknown" in build_report(session)["tensorflow"]["found_no_gpu"]["why"]
    )


def test_a_failing_diagnosis_is_a_note(monkeypatch):
    session = four_gpu_session(FakeTensorFlow(stage=Stage.STARTED, found=[]))
    monkeypatch.setattr(
        tf_runtime.TensorFlow, "no_gpu_diagnosis", lambda self, view: 1 / 0
    )  # the adapter's, for %gpu
    report = build_report(session)
    assert report["tensorflow"]["found_no_gpu"] is None
    assert (
        "could not tell why TensorFlow found no GPU (ZeroDivisionError: division by zero)" in report["notes"]
    )


# -- the moment the CPU allocator is chosen -------------------------------------------------------------
class Listing:
    """Just enough of the `tensorflow` module for TensorFlow._cpu_stats_when_no_gpu."""

    def __init__(self, gpus: list) -> None:
        self.config = type(
            "config", (), {"list_physical_devices": staticmethod(lambda kind=None: list(gpus))}
        )


@pytest.mark.parametrize(
    "gpus, wanted, preset, expected",
    [
        ([], True, None, "true"),  # asked, no GPU: statistics on
        (["GPU:0"], True, None, None),  # a GPU was found: TensorFlow's allocator choice stands
        ([], False, None, None),  # not asked (tracing off): left alone
        ([], True, "false", "false"),  # the user's own value wins
    ],
)
def test_cpu_statistics_at_start(monkeypatch, gpus, wanted, preset, expected):
    monkeypatch.delenv(tf_runtime.CPU_STATS_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(tf_runtime.CPU_STATS_ENV, preset)
    tf = tf_runtime.TensorFlow()
    tf._tf = Listing(gpus)
    tf.cpu_stats_if_no_gpu = wanted
    tf._cpu_stats_when_no_gpu()
    import os

    assert os.environ.get(tf_runtime.CPU_STATS_ENV) == expected
    assert tf.cpu_stats_set_at_start is (expected == "true" and preset is None)


def test_trace_asks_for_it_only_while_on(shell, session):
    assert session.adapter("tensorflow").cpu_stats_if_no_gpu is False
    trace.set_tracing(shell, session, True)  # the fake server lists four GPUs: they are expected
    assert session.adapter("tensorflow").cpu_stats_if_no_gpu is True
    trace.set_tracing(shell, session, False)
    assert session.adapter("tensorflow").cpu_stats_if_no_gpu is False
