"""GPU utilization from the driver's own sample buffer (``nvmlDeviceGetSamples``), read once a
hand-on, instead of ``nvmlDeviceGetUtilizationRates`` on every tick of ``%gpu monitor``.

A tick's utilization must be what the driver had sampled by then, whichever way it was read; a
driver that keeps no samples, stops sampling or stamps them with another clock is read each tick
as before.  NVML calls are counted on the simulated server; time is an injected clock shared by
the sampler and the server, as the wall clock is on a real machine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu_magic.gpus.nvml import GpuLost, Nvml, ReadingFailed
from tfgpu_magic.gpus.simulated import (
    NVML_ERROR_NOT_SUPPORTED,
    NVMLError,
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    shared_server,
)
from tfgpu_magic.kernel.monitor import UTILIZATION_SAMPLE_MAX_AGE_S, Sampler

from support.fakes import ManualClock

ME = 4242
PERIOD_S = 0.1


class MovingServer(SimulatedNvml):
    """A server whose GPUs' utilization moves with every driver sample: (sample number + 7 x GPU) % 101.
    Calls are counted per function."""

    sample_period_us = int(PERIOD_S * 1_000_000)

    def __init__(self, gpus: list[SimulatedGpu], clock: ManualClock) -> None:
        super().__init__(gpus)
        self.clock = clock
        self.counted: dict[str, int] = {}

    def utilization_at(self, handle, at_us: int) -> int:
        return (at_us // self.sample_period_us + 7 * int(handle)) % 101

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.counted["rates"] = self.counted.get("rates", 0) + 1
        reading = super().nvmlDeviceGetUtilizationRates(handle)
        reading.gpu = self.utilization_at(handle, int(self.clock() * 1_000_000))
        return reading

    def nvmlDeviceGetSamples(self, handle, samplingType, timeStamp):
        self.counted["samples"] = self.counted.get("samples", 0) + 1
        return super().nvmlDeviceGetSamples(handle, samplingType, timeStamp)

    def truth(self, index: int, at_s: float) -> int:
        """The newest sample's value at ``at_s``: what the rates reading answers then."""
        return self.utilization_at(
            index, int(at_s * 1_000_000) // self.sample_period_us * self.sample_period_us
        )


def gpus(n: int = 3) -> list[SimulatedGpu]:
    return [SimulatedGpu(total_mib=16384, utilization=0) for _ in range(n)]


def utilization(samples) -> list[dict[str, int | None]]:
    return [{d.key: d.utilization_percent for d in s.devices} for s in samples]


# -- Nvml.utilization_samples ---------------------------------------------------------------------
def test_the_samples_are_newer_than_asked_oldest_first_with_their_times():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(1), clock)
    nvml = Nvml(lib=server)
    everything = nvml.utilization_samples(0)
    assert len(everything) == SimulatedNvml.UTILIZATION_SAMPLES_KEPT
    assert [at for at, _ in everything] == sorted(at for at, _ in everything)
    assert all(percent == server.utilization_at(0, at) for at, percent in everything)
    newest = everything[-1][0]
    assert newest <= clock.now * 1e6 < newest + server.sample_period_us
    assert nvml.utilization_samples(0, newest) == []  # nothing newer: NVML's NOT_FOUND
    clock.now += 0.35
    assert [at for at, _ in nvml.utilization_samples(0, newest)] == [
        newest + k * server.sample_period_us for k in (1, 2, 3)
    ]


def test_a_gpu_without_samples_a_binding_without_the_function_and_a_lost_gpu_raise():
    server = shared_server(ME)  # GPU 3 has no utilization reading at all
    nvml = Nvml(lib=server)
    with pytest.raises(ReadingFailed) as failed:
        nvml.utilization_samples(3)
    assert failed.value.reading == "utilization samples"
    server.gpus[0].lost = True
    with pytest.raises(GpuLost):
        nvml.utilization_samples(0)

    class OldBinding(SimulatedNvml):
        nvmlDeviceGetSamples = None  # an nvidia-ml-py without the function

    with pytest.raises(ReadingFailed):
        Nvml(lib=OldBinding(gpus(1))).utilization_samples(0)


@given(value=st.integers(min_value=101, max_value=2**32 - 1))
@settings(max_examples=25)
def test_a_sample_that_is_no_percentage_fails_the_reading(value):
    class Broken(SimulatedNvml):
        def nvmlDeviceGetSamples(self, handle, samplingType, timeStamp):
            return 1, [SimpleNamespace(timeStamp=1, sampleValue=SimpleNamespace(uiVal=value))]

    with pytest.raises(ReadingFailed, match="utilization sample"):
        Nvml(lib=Broken(gpus(1))).utilization_samples(0)


# -- the sampler ----------------------------------------------------------------------------------
def sampler(server: SimulatedNvml, clock: ManualClock) -> Sampler:
    return Sampler(Nvml(lib=server), ME, interval=PERIOD_S, clock=clock)


def ticks(s: Sampler, clock: ManualClock, n: int, seconds: float = 0.1, *, hand_on_every: int = 10) -> list:
    """``n`` ticks as the thread takes them: read each tick, handed on every ``hand_on_every``."""
    handed = []
    for k in range(n):
        clock.now += seconds
        s._read()
        if (k + 1) % hand_on_every == 0:
            handed += [stored.unpack() for stored in s._hand_on()]
            s._plan_now = s._plan_or_none()
    return handed


def test_after_the_first_hand_on_a_tick_reads_memory_only_and_each_value_is_the_drivers_at_its_time():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(3), clock)
    s = sampler(server, clock)
    first = s.tick()  # read each tick until a hand-on has found out whether samples are kept
    assert server.counted == {"rates": 3, "samples": 3}
    server.counted.clear()
    handed = ticks(s, clock, 30, 0.07)  # ticks out of step with the driver's samples
    assert server.counted == {"samples": 3 * 3}  # one call a GPU a hand-on; none a tick
    assert len(handed) == 30
    for sample in [first, *handed]:
        for index in range(3):
            assert utilization([sample])[0][f"gpu{index}"] == server.truth(index, sample.time_s)


def test_the_readings_besides_utilization_are_those_of_their_tick():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(2), clock)
    s = sampler(server, clock)
    s.tick()
    used = []
    for k in range(10):
        clock.now += 0.1
        server.gpus[1].processes = [SimulatedProcess(41001, 100 * (k + 1))]
        used.append(100 * (k + 1) * 1024 * 1024)
        s._read()
    handed = [stored.unpack() for stored in s._hand_on()]
    seen = [{d.key: d for d in h.devices}["gpu1"].used_bytes for h in handed]
    assert [b - seen[0] for b in seen] == [b - used[0] for b in used]  # each tick's own reading


def test_a_driver_clock_that_is_not_this_samplers_is_read_each_tick():
    clock, drivers = ManualClock(1_800_000_000.0), ManualClock(1_800_000_000.0)
    drivers.now = clock.now - 3600  # samples stamped an hour away
    server = MovingServer(gpus(2), drivers)
    s = sampler(server, clock)
    s.tick()
    server.counted.clear()
    handed = ticks(s, clock, 10)
    assert server.counted == {"rates": 2 * 10}
    assert all(u["gpu0"] is not None for u in utilization(handed))


def test_a_gpu_in_mig_mode_or_without_samples_is_read_each_tick_and_the_others_from_samples():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(3), clock)
    server.gpus[2].unsupported = {"utilization"}  # no utilization at all: a gap, as before
    original = server.nvmlDeviceGetSamples

    def no_samples_on_gpu_1(handle, samplingType, timeStamp):
        if int(handle) == 1:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return original(handle, samplingType, timeStamp)

    server.nvmlDeviceGetSamples = no_samples_on_gpu_1
    s = sampler(server, clock)
    s.tick()
    server.counted.clear()
    handed = ticks(s, clock, 10)
    assert server.counted == {"rates": 2 * 10, "samples": 1}  # GPUs 1 and 2 each tick; GPU 0 once
    last = handed[-1]
    assert utilization([last])[0] == {
        "gpu0": server.truth(0, last.time_s),
        "gpu1": server.truth(1, last.time_s),
        "gpu2": None,
    }


def test_a_driver_that_stops_sampling_leaves_gaps_never_an_old_value_then_is_read_each_tick():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(1), clock)
    s = sampler(server, clock)
    s.tick()
    ticks(s, clock, 10)
    stopped_at = clock.now
    server.utilization_at = lambda handle, at_us: 50  # type: ignore[method-assign]
    newest = {"at": int(stopped_at * 1e6)}
    original = SimulatedNvml.nvmlDeviceGetSamples

    def frozen(handle, samplingType, timeStamp):  # no sample after stopped_at
        if int(timeStamp) >= newest["at"] - server.sample_period_us:
            raise NVMLError(6)  # NOT_FOUND
        return original(server, handle, samplingType, timeStamp)

    server.nvmlDeviceGetSamples = frozen
    later = ticks(s, clock, 30)
    for sample in later:
        value = utilization([sample])[0]["gpu0"]
        if sample.time_s - stopped_at > UTILIZATION_SAMPLE_MAX_AGE_S:
            assert value is None or value == 50  # a gap, or (read each tick by then) the rates answer
    server.counted.clear()
    ticks(s, clock, 10)
    assert server.counted.get("rates") == 10  # read each tick from then on


def test_a_failed_memory_reading_gets_no_utilization_from_samples():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(2), clock)
    s = sampler(server, clock)
    s.tick()
    server.gpus[1].lost = True
    handed = ticks(s, clock, 10)
    assert all(u["gpu1"] is None for u in utilization(handed))
    assert all(u["gpu0"] is not None for u in utilization(handed))


def test_a_single_read_kept_nowhere_has_utilization_though_it_comes_from_samples_on_ticks():
    clock = ManualClock(1_800_000_000.0)
    server = MovingServer(gpus(2), clock)
    s = sampler(server, clock)
    s.tick()
    assert s._from_samples == {0: True, 1: True}
    reading = s.read()
    assert utilization([reading])[0] == {f"gpu{i}": server.truth(i, reading.time_s) for i in range(2)}
    assert len(s.history) == 1  # kept nowhere
