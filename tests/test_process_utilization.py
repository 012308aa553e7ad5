"""Per-process GPU utilization: the simulated driver's samples, Nvml.process_utilization, the reader."""

from __future__ import annotations

import json

import pytest

from tfgpu_magic.gpus.nvml import GpuLost, Nvml, ReadingFailed
from tfgpu_magic.gpus.simulated import FileServerNvml, SimulatedNvml, mig_server, shared_server
from tfgpu_magic.gpus.utilization import DEVICE, PROCESS, UtilizationReader, of_pids

ME = 4242
NVMLError = SimulatedNvml.NVMLError


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def server_at(clock: Clock, make=shared_server) -> SimulatedNvml:
    server = make(ME)
    server.clock = clock
    return server


def test_busy_processes_have_samples_an_idle_one_has_none():
    nvml = Nvml(lib=server_at(Clock()))
    gpu0 = nvml.process_utilization(0)
    assert gpu0.percent_by_pid == {41001: 97}
    gpu1 = nvml.process_utilization(1)
    assert gpu1.percent_by_pid == {41003: 35}  # this kernel (ME) ran nothing: no sample
    assert gpu1.percent_of([ME]) == 0
    assert gpu1.percent_of([ME, 41003]) == 35
    assert not gpu1.per_device


def test_no_sample_since_the_timestamp_is_nobody_busy_and_keeps_the_timestamp():
    clock = Clock()
    nvml = Nvml(lib=server_at(clock))
    first = nvml.process_utilization(0)
    again = nvml.process_utilization(0, first.latest_us)
    assert again.percent_by_pid == {} and again.latest_us == first.latest_us
    clock.now += 1.0
    later = nvml.process_utilization(0, first.latest_us)
    assert later.percent_by_pid == {41001: 97} and later.latest_us == first.latest_us + 1_000_000


def test_the_reader_reads_each_gpu_since_its_previous_reading():
    clock = Clock()
    server = server_at(clock)
    reader = UtilizationReader(Nvml(lib=server))
    first = reader.read([0, 1])
    assert of_pids(first[0], [41001]).percent == 97
    assert reader.read([0])[0].percent_by_pid == {}  # nothing new since
    server.gpus[0].processes[0].sm_percent = 0  # alice's training stops...
    clock.now += 30
    assert of_pids(reader.read([0])[0], [41001]).percent == 0  # ...and the next window shows it
    server.gpus[0].processes[0].sm_percent = 50
    clock.now += 30
    assert of_pids(reader.read([0])[0], [41001]).percent == 50


def test_a_gpu_without_per_process_samples_gives_the_gpu_figure_said_per_device():
    server = server_at(Clock())
    server.gpus[2].unsupported.add("process_utilization")
    server.gpus[2].utilization = 12
    reading = Nvml(lib=server).process_utilization(2)
    assert reading.per_device and reading.device_percent == 12
    figure = of_pids(reading, [ME])
    assert (figure.percent, figure.scope) == (12, DEVICE)
    assert figure.note.startswith("per device") and "Not Supported" in figure.note


def test_a_gpu_in_mig_mode_has_neither_figure_and_the_note_says_both():
    nvml = Nvml(lib=server_at(Clock(), mig_server))
    with pytest.raises(ReadingFailed) as caught:
        nvml.process_utilization(3)
    assert caught.value.note == (
        "process utilization: Not Supported (and the GPU's own utilization: Not Supported)"
    )
    figure = of_pids(UtilizationReader(nvml).read([3])[3], [41005])
    assert figure.percent is None and "could not be read" in figure.note
    assert of_pids(UtilizationReader(nvml).read([0])[0], [41001]).scope == PROCESS


@pytest.mark.parametrize(
    "fault, lost",
    [
        (NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION), False),
        (NVMLError(999), False),
        (RuntimeError("boom"), False),
        (TypeError("bad handle"), False),
        (NVMLError(SimulatedNvml.NVML_ERROR_GPU_IS_LOST), True),
    ],
)
def test_a_fault_is_that_gpus_note_and_the_others_are_read(fault, lost):
    server = server_at(Clock())
    server.gpus[1].faults["process_utilization"] = fault
    nvml = Nvml(lib=server)
    with pytest.raises(GpuLost if lost else ReadingFailed):
        nvml.process_utilization(1)
    found = UtilizationReader(nvml).read([0, 1])
    assert isinstance(found[1], str) and found[1]
    assert found[0].percent_by_pid == {41001: 97}
    assert server.faults_raised == 2


@pytest.mark.parametrize("sm", [101, 255, 10**30])  # a c_uint is never negative
def test_an_impossible_percentage_fails_the_reading(sm):
    server = server_at(Clock())
    server.gpus[0].processes[0].sm_percent = sm
    with pytest.raises(ReadingFailed) as caught:
        Nvml(lib=server).process_utilization(0)
    assert caught.value.reading == "process utilization"


def test_a_flood_of_samples_is_bounded():
    server = server_at(Clock())
    server.gpus[0].processes = [
        type(server.gpus[0].processes[0])(50000 + n, 1, sm_percent=1) for n in range(2000)
    ]
    reading = Nvml(lib=server).process_utilization(0)
    assert 0 < len(reading.percent_by_pid) <= 4096


def test_a_server_file_gives_its_processes_samples(tmp_path):
    spec = tmp_path / "server.json"
    spec.write_text(
        json.dumps({"gpus": [{"processes": [{"pid": 4194305, "used_mib": 1024, "sm_percent": 40}]}]})
    )
    reading = Nvml(lib=FileServerNvml(str(spec))).process_utilization(0)
    assert reading.percent_by_pid == {4194305: 40}


@pytest.mark.parametrize("planted", ["busy", None, [1], 10**30])
def test_a_planted_percentage_in_a_server_file_is_refused_or_fails_only_its_reading(tmp_path, planted):
    """The file is shared state: whatever ``sm_percent`` holds, no reading outside it breaks."""
    spec = tmp_path / "server.json"
    spec.write_text(
        json.dumps({"gpus": [{"processes": [{"pid": 4194305, "used_mib": 1, "sm_percent": planted}]}]})
    )
    nvml = Nvml(lib=FileServerNvml(str(spec)))
    # not a number at all: the file is no server's description, said so (NVML unavailable)
    assert nvml.available() == isinstance(planted, int)
    if not nvml.available():
        return
    with pytest.raises(ReadingFailed):
        nvml.process_utilization(0)
    assert nvml.memory(0).used_bytes == 1024**2
