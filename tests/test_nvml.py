"""The NVML reader against a fake pynvml that behaves like a shared server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu_magic.gpus.nvml import GpuLost, Nvml, NvmlUnavailable
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess, shared_server

MIB = 1024 * 1024


def test_readings_are_typed_with_units(server):
    nvml = Nvml(lib=server)
    gpu = nvml.gpu(1)
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.memory.total_bytes == 81920 * MIB
    assert gpu.memory.used_bytes == (300 + 10240 + 4096 + 8192) * MIB
    assert gpu.memory.free_bytes == gpu.memory.total_bytes - gpu.memory.used_bytes
    assert gpu.utilization_percent == 35
    assert gpu.compute_capability == (8, 0)
    assert gpu.mig_enabled is False
    assert gpu.pci_bus_id.startswith("00000000:")


def test_unsupported_reading_is_missing_not_zero(server):
    assert Nvml(lib=server).gpu(3).utilization_percent is None


def test_lost_gpu_is_marked_and_others_still_read(server):
    nvml = Nvml(lib=server)
    server.gpus[2].lost = True
    assert nvml.gpu(2).lost and nvml.gpu(2).memory is None
    assert nvml.gpu(1).memory is not None
    with pytest.raises(GpuLost):
        nvml.memory(2)


def test_processes_with_missing_memory(server):
    server.gpus[1].processes[1].used_mib = None
    procs = {p.pid: p for p in Nvml(lib=server).processes(1)}
    assert procs[41002].used_memory_bytes is None
    assert procs[41003].used_memory_bytes == 8192 * MIB


def test_no_driver_degrades_to_one_clear_message():
    nvml = Nvml(lib=SimulatedNvml([], driver=False))
    assert nvml.available() is False
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver could be reached through NVML"):
        nvml.device_count()


def test_starts_once_lazily():
    server = shared_server()
    nvml = Nvml(lib=server)
    assert server.init_calls == 0
    nvml.gpus()
    nvml.gpus()
    assert server.init_calls == 1
    nvml.shutdown()
    assert server.initialized is False


def test_static_facts_are_read_once(server):
    nvml = Nvml(lib=server)
    assert nvml.uuid(2) == server.gpus[2].uuid
    assert nvml.total_bytes(2) == 24576 * MIB
    calls = server.calls
    for _ in range(5):
        nvml.uuid(2), nvml.total_bytes(2)
    assert server.calls == calls


def test_a_refused_reading_is_missing_and_says_why(server):
    server.gpus[1].faults["utilization"] = SimulatedNvml.NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION)
    gpu = Nvml(lib=server).gpu(1)
    assert gpu.utilization_percent is None and gpu.memory is not None
    assert gpu.notes == ("utilization: Insufficient Permissions",)
    assert Nvml(lib=server).gpu(3).notes == ("utilization: Not Supported",)


# -- used memory as nvidia-smi counts it ------------------------------------------------------
def test_used_memory_leaves_out_the_drivers_reservation_like_nvidia_smi(server):
    """On a real idle H100 (driver 580) NVML's version-1 reading said 480 MiB used, nvidia-smi 0."""
    server.gpus[2].reserved_mib = 480
    memory = Nvml(lib=server).memory(2)
    assert memory.used_bytes == 300 * MIB  # the listed overhead only, as nvidia-smi shows it
    assert memory.reserved_bytes == 480 * MIB
    assert memory.free_bytes == (24576 - 300 - 480) * MIB


def test_a_driver_without_the_version_2_reading_falls_back_to_version_1(server):
    server.gpus[2].reserved_mib = 480
    server.memory_v2 = False
    memory = Nvml(lib=server).memory(2)
    assert (memory.used_bytes, memory.reserved_bytes) == ((300 + 480) * MIB, None)


def test_a_binding_without_the_version_argument_falls_back_to_version_1(server):
    class OldBinding(SimulatedNvml):
        def nvmlDeviceGetMemoryInfo(self, handle):  # nvidia-ml-py before the version argument
            return super().nvmlDeviceGetMemoryInfo(handle)

    old = OldBinding(server.gpus)
    assert Nvml(lib=old).memory(1).reserved_bytes is None


def test_a_gpu_lost_during_the_version_2_reading_is_still_lost(server):
    server.gpus[2].lost = True
    with pytest.raises(GpuLost):
        Nvml(lib=server).memory(2)


def test_pci_bus_id_and_compute_capability_are_read_once_a_failure_is_read_again(server):
    nvml = Nvml(lib=server)
    server.gpus[2].faults["pci"] = SimulatedNvml.NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION)
    first = nvml.gpu(2)
    assert first.pci_bus_id is None and first.notes == ("PCI bus id: Insufficient Permissions",)
    server.gpus[2].faults.clear()
    second = nvml.gpu(2)  # the failure was not remembered: read now
    assert second.pci_bus_id == server.gpus[2].pci_bus_id and second.compute_capability == (8, 6)
    calls = server.calls
    third = nvml.gpu(2)
    assert third == second
    assert server.calls - calls == 2  # memory, utilization: the static facts and MIG mode are remembered


# -- the monitor's tick: every GPU's memory and utilization in one call -----------------------
def test_the_monitors_reading_is_each_gpus_memory_and_utilization_as_memory_reads_them(server):
    nvml = Nvml(lib=server)
    read = nvml.memory_and_utilization_of(range(4))
    for index, reading in enumerate(read):
        memory = nvml.memory(index)
        assert reading[:2] == (memory.total_bytes, memory.used_bytes)
    assert [r[2] for r in read] == [nvml.gpu(i).utilization_percent for i in range(4)]
    assert read[3][2] is None  # no utilization there: a gap, not 0 and not a failure


def test_a_lost_gpu_is_its_failure_in_its_place_and_the_others_are_read(server):
    nvml = Nvml(lib=server)
    nvml.memory_and_utilization_of(range(4))
    server.gpus[2].lost = True
    read = nvml.memory_and_utilization_of(range(4))
    assert isinstance(read[2], GpuLost) and str(read[2]).startswith("GPU 2 stopped answering")
    assert all(isinstance(read[i], tuple) for i in (0, 1, 3))
    server.gpus[2].lost = False  # it answers again: a new handle, read as before
    memory = nvml.memory(2)
    assert nvml.memory_and_utilization_of([2]) == [
        (memory.total_bytes, memory.used_bytes, nvml.utilization(2))
    ]


def test_a_failed_memory_reading_is_said_as_memory_says_it(server):
    server.gpus[1].faults["memory"] = SimulatedNvml.NVMLError(SimulatedNvml.NVML_ERROR_NO_PERMISSION)
    nvml = Nvml(lib=server)
    (read,) = nvml.memory_and_utilization_of([1])
    with pytest.raises(type(read)) as raised:
        nvml.memory(1)
    assert str(read) == str(raised.value)


def test_a_driver_without_version_2_is_found_once_then_asked_version_1_straight_away(server):
    server.gpus[2].reserved_mib = 480
    server.memory_v2 = False
    nvml = Nvml(lib=server)
    first = nvml.memory_and_utilization_of(range(4))
    assert first[2][1] == (300 + 480) * MIB  # version 1 counts the reservation as used, as memory() does
    calls = server.calls
    assert nvml.memory_and_utilization_of(range(4)) == first
    assert server.calls - calls == 2 * 4  # memory and utilization, no failed version-2 call first


@given(
    listed=st.lists(
        st.tuples(
            st.integers(1, 6),  # few pids: one listed twice, in one listing or both, is common
            st.one_of(st.none(), st.integers(-1, 2**54)),  # no figure, or one out of range
            st.sampled_from(["compute", "graphics"]),
        ),
        max_size=8,
    )
)
@settings(max_examples=60)
def test_one_processs_share_is_what_the_listing_says_for_it(listed):
    """``memory_of_process`` (the monitor's question, asked without building the listing) gives
    each pid the figure ``processes`` gives it, None where NVML has none, and 0 where it is not
    listed: the compute listing's where both list it, whatever duplicates and figures NVML sends."""
    server = SimulatedNvml([SimulatedGpu()])
    server.gpus[0].processes = [
        SimulatedProcess(pid, None if raw is None else raw / MIB, kind=kind) for pid, raw, kind in listed
    ]
    nvml = Nvml(lib=server)
    figures = {p.pid: p.used_memory_bytes for p in nvml.processes(0)}
    for pid in range(1, 8):
        assert nvml.memory_of_process(0, pid) == figures.get(pid, 0), pid
