"""The NVML calls a status refresh makes, per function (counts, not times): a counting fake in
front of the simulated server.  MIG mode is read once per device handle; a GPU lost drops the
handle and its mode, and NVML's shutdown every handle: the next reading asks the driver again."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedNvml, shared_server
from tfgpu_magic.kernel import status
from tfgpu_magic.kernel.session import Session


class Counting:
    """``lib`` with every ``nvml*`` call counted by name."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call

    def refresh(self, session: Session) -> Counter[str]:
        """The calls one ``%gpu status`` report makes."""
        before = Counter(self.calls)
        status.build_report(session)
        made = Counter(self.calls)
        made.subtract(before)
        return +made


@pytest.fixture
def counted():
    lib = Counting(shared_server(my_pid=os.getpid()))
    session = Session(nvml=Nvml(lib=lib), env={})
    session.nvml.device_count()  # started: the start is no refresh's
    return lib, session


def per_gpu(counts: Counter[str], gpus: int) -> dict[str, float]:
    return {name: n / gpus for name, n in counts.items()}


def test_a_warm_refresh_reads_memory_utilization_and_processes_only(counted):
    lib, session = counted
    gpus = session.nvml.device_count()
    cold = lib.refresh(session)
    assert cold["nvmlDeviceGetMigMode"] == gpus  # once per GPU, with the other facts read once
    for _ in range(3):
        warm = lib.refresh(session)
        assert "nvmlDeviceGetMigMode" not in warm
        assert "nvmlDeviceGetHandleByIndex" not in warm
        # This kernel's utilization (issue 31, item 4) is read only on the GPUs where NVML lists one of
        # its processes holding memory: one call there (GPU 1 of 4 here), none elsewhere.
        utilization = warm.pop("nvmlDeviceGetProcessUtilization")
        assert utilization == 1
        assert per_gpu(warm, gpus) == {
            "nvmlDeviceGetMemoryInfo": 1,
            "nvmlDeviceGetUtilizationRates": 1,
            "nvmlDeviceGetComputeRunningProcesses": 1,
            "nvmlDeviceGetGraphicsRunningProcesses": 1,
        }, warm


def test_a_lost_gpu_is_asked_its_mig_mode_again(counted):
    lib, session = counted
    lib.refresh(session)
    server = lib._lib
    server.gpus[1].lost = True
    lib.refresh(session)  # GPU 1 answers "GPU is lost": its handle and mode are dropped
    server.gpus[1].lost = False
    again = lib.refresh(session)
    assert again["nvmlDeviceGetMigMode"] == 1 and again["nvmlDeviceGetHandleByIndex"] == 1
    assert "nvmlDeviceGetMigMode" not in lib.refresh(session)


def test_shutdown_forgets_the_mig_modes(counted):
    lib, session = counted
    lib.refresh(session)
    session.nvml.shutdown()
    gpus = session.nvml.device_count()
    assert lib.refresh(session)["nvmlDeviceGetMigMode"] == gpus


def test_no_mig_support_is_remembered_with_its_note(counted):
    lib, session = counted
    lib._lib.gpus[2].unsupported.add("mig")
    for _ in range(2):
        reading = session.nvml.gpu(2)
        assert reading.mig_enabled is None and "MIG mode: Not Supported" in reading.notes
    assert lib.calls["nvmlDeviceGetMigMode"] == 1


def test_another_failure_is_not_remembered(counted):
    lib, session = counted
    lib._lib.gpus[2].faults["mig"] = SimulatedNvml.NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION)
    assert "MIG mode: Insufficient Permissions" in session.nvml.gpu(2).notes
    del lib._lib.gpus[2].faults["mig"]
    assert session.nvml.gpu(2).mig_enabled is False and lib.calls["nvmlDeviceGetMigMode"] == 2


def test_the_first_refresh_reads_memory_once_per_gpu():
    """A new reader's first refresh needs each GPU's total (to resolve the request) and then its
    reading: the total's reading is the refresh's, one memory call per GPU."""
    lib = Counting(shared_server(my_pid=os.getpid()))
    session = Session(nvml=Nvml(lib=lib), env={})
    gpus = session.nvml.device_count()
    first = lib.refresh(session)
    assert first["nvmlDeviceGetMemoryInfo"] == gpus, first
    assert lib.refresh(session)["nvmlDeviceGetMemoryInfo"] == gpus


def test_the_totals_reading_is_not_used_once_stale():
    clock = [100.0]
    lib = Counting(shared_server(my_pid=os.getpid()))
    nvml = Nvml(lib=lib, clock=lambda: clock[0])
    assert nvml.total_bytes(0) is not None
    used_then = nvml.gpu(0).memory
    assert nvml.total_bytes(1) is not None
    clock[0] += 5.0  # a reader that asked the total long ago: its next reading is a new one
    before = lib.calls["nvmlDeviceGetMemoryInfo"]
    assert nvml.gpu(1).memory is not None and used_then is not None
    assert lib.calls["nvmlDeviceGetMemoryInfo"] == before + 1
    assert nvml.gpu(0).memory is not None and lib.calls["nvmlDeviceGetMemoryInfo"] == before + 2
