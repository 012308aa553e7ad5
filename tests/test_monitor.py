"""The monitor's sampler and panel on the fake NVML server: readings, faults, lifecycle, bounds."""

from __future__ import annotations

import gc
import itertools
import threading
import time
from dataclasses import dataclass

import pytest

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import SimulatedGpu, SimulatedNvml, SimulatedProcess, shared_server
from tfgpu_magic.kernel import monitor, panels
from tfgpu_magic.kernel.monitor import HAND_ON_S, MAX_HISTORY, Hub, Sampler

from support.fakes import monitor_threads, tf_figures, wait_for
from support.panel_wire import unpacked

MIB = 1024 * 1024
GIB = 1024 * MIB
ME = 4242  # this kernel's pid on the fake server


@dataclass
class Stats:  # the shape of tf_runtime.AllocatorStats
    current_bytes: int
    peak_bytes: int


def by_key(sample):
    return {d.key: d for d in sample.devices}


def sampler(server=None, **kwargs) -> Sampler:
    return Sampler(Nvml(lib=server or shared_server(ME)), ME, **kwargs)


pytestmark = pytest.mark.usefixtures("no_leaked_sampler")


# -- readings ------------------------------------------------------------------------------
def test_reads_every_gpu_total_used_and_this_kernel():
    gpus = by_key(sampler().tick())
    assert list(gpus) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert gpus["gpu1"].label == "GPU 1 · NVIDIA A100-SXM4-80GB"
    assert gpus["gpu1"].total_bytes == 81920 * MIB
    assert gpus["gpu1"].used_bytes == (300 + 10240 + 4096 + 8192) * MIB
    assert gpus["gpu1"].mine_bytes == 10240 * MIB
    assert gpus["gpu0"].mine_bytes == 0  # listed nowhere there: a true zero
    assert gpus["gpu0"].tf_in_use_bytes is None  # TensorFlow not started: missing, not 0
    assert all(d.error is None for d in gpus.values())


def test_readings_follow_the_processes():
    server = shared_server(ME)
    s = sampler(server)
    before = by_key(s.tick())["gpu1"]
    server.gpus[1].processes[0].used_mib += 512
    after = by_key(s.tick())["gpu1"]
    assert after.mine_bytes - before.mine_bytes == 512 * MIB
    assert after.used_bytes - before.used_bytes == 512 * MIB


def test_sources_read_again_unchanged_keep_the_plan_and_a_new_limit_is_charted(monkeypatch):
    """The limits and visible GPUs are read again every SLOW_SOURCES_S, each time a new dict or
    list: one equal to the last stands for it, so the tick's plan is not worked out again."""
    monkeypatch.setattr(monitor, "SLOW_SOURCES_S", 0.0)  # read the sources on every tick
    caps = {1: 20 * GIB}
    s = sampler(limits=lambda: dict(caps), visible=lambda: [0, 1, 2, 3])
    s.tick()
    plan = s._planned
    s.tick()
    assert s._planned is plan  # equal sources: the same plan
    caps[1] = 10 * GIB
    assert by_key(s.tick())["gpu1"].limit_bytes == 10 * GIB and s._planned is not plan


def test_tensorflow_allocator_and_limit_join_their_gpu():
    s = sampler(
        figures=tf_figures(
            {"GPU:0": Stats(1 * GIB, 3 * GIB), "CPU:0": Stats(5 * MIB, 9 * MIB)}, {"GPU:0": 1}
        ),
        limits=lambda: {1: 20 * GIB},
    )
    gpus = by_key(s.tick())
    assert (gpus["gpu1"].tf_in_use_bytes, gpus["gpu1"].tf_peak_bytes) == (1 * GIB, 3 * GIB)
    assert gpus["gpu1"].limit_bytes == 20 * GIB
    assert gpus["gpu0"].limit_bytes is None
    assert gpus["gpu1"].figures == (("tensorflow", "in_use", 1 * GIB), ("tensorflow", "peak", 3 * GIB))
    cpu = gpus["tensorflow:CPU:0"]
    assert (cpu.label, cpu.tf_in_use_bytes, cpu.total_bytes) == ("TensorFlow CPU:0", 5 * MIB, None)


def test_only_the_visible_gpus_are_charted():
    gpus = by_key(sampler(visible=lambda: [1, 3]).tick())
    assert list(gpus) == ["gpu1", "gpu3"]


# -- faults --------------------------------------------------------------------------------
def test_a_lost_gpu_is_a_gap_with_a_message_and_the_others_go_on():
    server = shared_server(ME)
    s = sampler(server)
    server.gpus[2].lost = True
    gpus = by_key(s.tick())
    lost = gpus["gpu2"]
    assert (lost.total_bytes, lost.used_bytes, lost.mine_bytes) == (None, None, None)
    assert lost.error == ("GPU 2 stopped answering (GPU is lost); the chart resumes if it answers again")
    assert gpus["gpu1"].mine_bytes == 10240 * MIB and gpus["gpu1"].error is None
    server.gpus[2].lost = False
    back = by_key(s.tick())["gpu2"]
    assert back.total_bytes == 24576 * MIB and back.error is None


def test_an_unsupported_memory_reading_is_a_gap_with_a_message():
    server = shared_server(ME)
    server.gpus[0].unsupported.add("memory")
    gpu = by_key(sampler(server).tick())["gpu0"]
    assert gpu.used_bytes is None
    assert gpu.error == "GPU 0: memory reading failed (Not Supported)"


def test_memory_nvml_cannot_attribute_is_missing_not_zero():
    server = SimulatedNvml([SimulatedGpu(processes=[SimulatedProcess(ME, None)])])
    gpu = by_key(sampler(server).tick())["gpu0"]
    assert gpu.mine_bytes is None
    assert gpu.used_bytes == 300 * MIB
    assert gpu.error == "GPU 0: NVML cannot say how much this kernel holds"


def test_without_nvidia_gpus_the_panel_says_so_and_still_shows_tensorflow():
    s = sampler(SimulatedNvml([], driver=False), figures=tf_figures({"CPU:0": Stats(7 * MIB, 8 * MIB)}))
    sample = s.tick()
    assert sample.status.startswith("No NVIDIA GPU to chart: no NVIDIA driver could be reached")
    assert [d.key for d in sample.devices] == ["tensorflow:CPU:0"]


def test_a_failing_source_becomes_a_note_and_sampling_goes_on():
    def broken():
        raise RuntimeError("not today")

    sample = sampler(figures=broken, limits=broken).tick()
    assert sample.status == (
        "the allocator figures could not be read (RuntimeError: not today); "
        "the configured limits could not be read (RuntimeError: not today)"
    )
    assert by_key(sample)["gpu1"].mine_bytes == 10240 * MIB


def test_a_broken_listener_does_not_stop_the_others():
    s = sampler()
    seen = []
    s.subscribe(lambda sample: 1 / 0)
    s.subscribe(seen.append)
    s.tick()
    assert len(seen) == 1


# -- bounds --------------------------------------------------------------------------------
def test_history_is_bounded_by_the_window():
    clock = iter(range(10**6)).__next__
    s = sampler(interval=0.1, keep_s=300, clock=lambda: clock() * 0.1)
    for _ in range(5000):
        s.tick()
    assert len(s.history) == 3002  # 300 s at 0.1 s, and a little slack
    assert s.history[-1].time_s == pytest.approx(499.9)


def test_history_has_a_hard_cap_whatever_the_window():
    s = sampler(interval=0.1, keep_s=10**6)
    assert s.history.maxlen == MAX_HISTORY


def test_a_longer_interval_shrinks_history_and_keeps_the_newest():
    s = sampler(interval=0.1, keep_s=60)
    for _ in range(700):
        s.tick()
    newest = s.history[-1]
    s.interval = 1.0
    assert s.history.maxlen == 62 and len(s.history) == 62 and s.history[-1] is newest


@pytest.mark.parametrize("seconds", [0.05, 0, -1, float("nan")])
def test_interval_below_the_minimum_is_refused(seconds):  # and above the maximum: test_panel_lifecycle.py
    with pytest.raises(ValueError, match=r"interval must be from 0.1 s to 60 s"):
        sampler(interval=seconds)


# -- lifecycle -----------------------------------------------------------------------------
def test_one_sampler_is_shared_and_stops_with_its_last_member():
    hub, made = Hub(), []

    def make():
        made.append(sampler(interval=0.1))
        return made[-1]

    first, second = object(), object()
    s = hub.join(first, make, 60)
    assert hub.join(second, make, 300) is s and len(made) == 1
    assert s.history.maxlen == 3002  # the widest window of the members
    wait_for(lambda: len(s.history) >= 3)
    assert len(monitor_threads()) == 1
    hub.leave(first)
    assert s.running and hub.sampler is s
    hub.leave(second)
    assert not s.running and hub.sampler is None
    assert monitor_threads() == []


def test_sampling_goes_on_while_the_main_thread_is_busy():
    s = sampler(interval=0.1)
    s.start()
    try:
        end = time.monotonic() + HAND_ON_S + 0.6  # the first reading, then a hand-on's (HAND_ON_S)
        while time.monotonic() < end:  # a busy cell: no sleeping, no event loop
            sum(range(1000))
        assert len(s.history) >= 1 + round(HAND_ON_S / 0.1)
    finally:
        s.stop()
    assert not s.running


def test_the_thread_hands_on_its_first_reading_at_once_then_a_hand_ons_time_of_them_and_at_a_stop_what_waits():
    s = sampler(interval=0.1)
    batches: list[int] = []
    s.subscribe(lambda handed: batches.append(len(handed)), packed=True)
    s.start()
    try:
        wait_for(lambda: len(batches) >= 3, timeout=4 * HAND_ON_S + 5)
    finally:
        assert s.stop()
    per = round(HAND_ON_S / 0.1)  # readings a hand-on at 0.1 s
    assert batches[:3] == [1, per, per]
    assert batches[-1] <= per  # the stop handed on what waited
    assert sum(batches) == len(s.history) and s._waiting == []  # every reading taken was handed on


def test_readers_see_each_reading_at_once_and_the_handed_on_ones_apart():
    s = sampler(interval=0.1)
    handed: list[int] = []
    s.subscribe(lambda batch: handed.append(len(batch)), packed=True)
    s.tick()  # read and handed on
    s._read()  # read on the thread's next tick: in the history, not yet handed on
    s._read()
    assert len(s.snapshot()) == 3 and s.latest().time_s == s.snapshot()[-1].time_s
    assert len(s.snapshot(handed_on=True)) == 1 and handed == [1]
    s._hand_on()
    assert len(s.snapshot(handed_on=True)) == 3 and handed == [1, 2]


def test_a_history_shorter_than_a_hand_on_holds_nothing_handed_on_while_all_of_it_waits():
    """With ``keep`` shorter than one hand-on, every kept sample may still wait for it: none of
    them was handed on, so the handed-on snapshot is empty, not the oldest waiting ones."""
    s = sampler(interval=0.1, keep_s=1.0)  # 12 samples kept, 20 readings a hand-on
    s.tick()
    for _ in range(15):
        s._read()
    assert len(s.history) == s.history.maxlen < len(s._waiting) == 15
    assert s.snapshot(handed_on=True) == []
    s._hand_on()
    assert len(s.snapshot(handed_on=True)) == s.history.maxlen


def test_readings_packed_later_are_each_of_their_own_tick():
    """A tick keeps NVML's answers and the process listing it read by; they are packed into the
    history later (by the first reader, or the hand-on), and each sample is its own tick's."""
    server = shared_server(ME)
    s = sampler(server, interval=0.1)
    mine = server.gpus[1].processes[0]  # this kernel's process on GPU 1
    readings = []
    for _ in range(3):
        s._read()  # the thread's tick: nothing packed yet
        readings.append(mine.used_mib)
        mine.used_mib += 512  # used memory moved: the next tick lists GPU 1 again
    assert len(s._taken) == 3 and len(s._history) == 0
    packed = [by_key(sample)["gpu1"] for sample in s.snapshot()]
    assert [d.mine_bytes for d in packed] == [mib * MIB for mib in readings]
    assert packed[1].used_bytes - packed[0].used_bytes == 512 * MIB
    assert len(s._taken) == 0 and len(s._waiting) == 3  # packed by the reader, still to hand on


def _inside_a_listing(s: Sampler, other, failing_gpu: int) -> None:
    """The interleaving of two readings on two threads, made deterministic: while ``s`` lists
    GPU 3 (a ctypes call, the GIL released), ``other()`` runs, and in it GPU ``failing_gpu``'s
    memory reading fails (its listing is dropped)."""
    nvml = s.nvml
    read_memory, held_by = nvml.memory_and_utilization_of, nvml.memory_of_process
    inside = {"now": False, "done": False}

    def memory(indices, rates=None):
        found = read_memory(indices, rates)
        if inside["now"]:
            found[failing_gpu] = RuntimeError(f"GPU {failing_gpu} stopped answering")
        return found

    def memory_of_process(index, pid):
        if index == 3 and not inside["done"]:
            inside["done"] = inside["now"] = True
            try:
                other()
            finally:
                inside["now"] = False
        return held_by(index, pid)

    nvml.memory_and_utilization_of, nvml.memory_of_process = memory, memory_of_process


def test_a_tick_and_a_read_on_another_thread_each_keep_their_own_listings():
    """A tick's sample is packed with the listings its own reading made, whatever a read() on
    the user's thread replaced them with meanwhile; and the other way round."""
    ticks = itertools.count(1000)
    s = sampler(interval=0.1, clock=lambda: float(next(ticks)))
    _inside_a_listing(s, s.read, failing_gpu=1)  # read() runs inside the thread's tick
    s._read()
    s._read()
    samples = s.snapshot()
    assert [sample.status for sample in samples] == [None, None]  # no "sampling failed (KeyError: 1)"
    assert [sample.time_s for sample in samples] == sorted(sample.time_s for sample in samples)
    assert by_key(samples[0])["gpu1"].mine_bytes == 10240 * MIB

    s = sampler(interval=0.1)
    _inside_a_listing(s, s._read, failing_gpu=1)  # the thread ticks inside read()
    assert by_key(s.read())["gpu1"].mine_bytes == 10240 * MIB  # no KeyError for the user


def test_a_sample_that_fails_as_it_is_packed_keeps_its_ticks_time():
    ticks = itertools.count(1000)
    s = sampler(interval=0.1, clock=lambda: float(next(ticks)))
    s._read()
    s._read()
    s._taken[0] = (*s._taken[0][:3], {})  # a tick whose listings say nothing: packing it fails
    times = [entry[0] for entry in s._taken]
    samples = s.snapshot()
    assert [sample.time_s for sample in samples] == times
    assert samples[0].status.startswith("sampling failed (KeyError") and samples[1].status is None


def test_a_panel_joining_a_running_sampler_gets_the_readings_at_once():
    s = sampler(interval=0.1)
    s.start()
    try:
        wait_for(lambda: len(s.history) >= 1)
        time.sleep(0.35)  # readings wait for the next hand-on
        waited = len(s.history)
        s.start()  # what Hub.join does for a new panel
        wait_for(lambda: len(s.history) > waited, timeout=0.5)
    finally:
        s.stop()


def test_a_shorter_interval_takes_effect_without_waiting_out_the_old_one():
    s = sampler(interval=30)
    s.start()
    try:
        wait_for(lambda: len(s.history) == 1)
        s.interval = 0.1
        wait_for(lambda: len(s.history) >= 3, timeout=2)
    finally:
        s.stop()


# -- the panel -----------------------------------------------------------------------------
class ManualSampler(Sampler):
    """A sampler whose thread never starts: the test ticks it, so messages are exact."""

    def start(self) -> None:
        pass


@pytest.fixture
def panel_on_fake():
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    hub, server = Hub(), shared_server(ME)
    made = []
    # each tick a hand-on's time on: a panel sends at most one message a hand-on (MAX_MESSAGES_PER_S)
    clock = itertools.count(1_700_000_000.0, HAND_ON_S).__next__

    def make():
        made.append(ManualSampler(Nvml(lib=server), ME, interval=0.5, clock=clock))
        return made[-1]

    def open_one(**kwargs):
        panel = widget.MemoryPanel(hub, make, **kwargs)
        panel.sent = []
        panel.send = lambda content, buffers=None: panel.sent.append(unpacked(content, buffers))
        return panel

    yield open_one, hub, server, made
    hub.stop_all()


def test_each_message_holds_only_the_new_sample(panel_on_fake):
    open_one, _hub, server, made = panel_on_fake
    panel = open_one()
    made[0].tick()
    server.gpus[1].processes[0].used_mib += 512
    made[0].tick()
    first, second = panel.sent
    assert first["kind"] == second["kind"] == "samples"
    assert len(first["t"]) == len(second["t"]) == 1
    assert second["d"]["gpu1"]["mine"] == [(10240 + 512) * MIB]
    assert set(second["d"]["gpu1"]) == {"total", "used", "mine", "tf", "peak", "limit", "util"}
    assert [d["key"] for d in panel.devices] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    panel.close()


def test_a_view_gets_the_history_once_when_it_asks(panel_on_fake):
    open_one, _hub, _server, made = panel_on_fake
    panel = open_one()
    for _ in range(5):
        made[0].tick()
    panel.sent.clear()
    panel._on_message(panel, {"kind": "history"}, [])
    (history,) = panel.sent
    assert history["kind"] == "history" and len(history["t"]) == 5
    assert len(history["d"]["gpu3"]["used"]) == 5
    panel.close()


def test_a_fault_reaches_the_panel_as_null_and_a_message(panel_on_fake):
    open_one, _hub, server, made = panel_on_fake
    panel = open_one()
    server.gpus[3].lost = True
    made[0].tick()
    (message,) = panel.sent
    assert message["d"]["gpu3"]["used"] == [None]
    assert message["errors"]["gpu3"].startswith("GPU 3 stopped answering")
    assert message["errors"]["gpu1"] is None
    panel.close()


def test_panels_share_the_sampler_and_the_stop_button_of_the_last_one_ends_it(panel_on_fake):
    open_one, hub, server, made = panel_on_fake
    one, two = open_one(window=60), open_one(interval=0.2, window=900)
    assert len(made) == 1 and made[0].interval == 0.2
    assert one.interval == 0.2  # every panel's control shows the shared sampler's interval
    two.interval = 1.0  # from the browser
    assert made[0].interval == one.interval == 1.0
    made[0].tick()
    assert len(one.sent) == len(two.sent) == 1
    one._on_message(one, {"kind": "stop"}, [])
    assert not one.running and hub.sampler is made[0]
    server.gpus[1].processes[0].used_mib += 512  # a new reading: sent to the running panel
    made[0].tick()
    assert len(one.sent) == 1 and len(two.sent) == 2  # a stopped panel gets nothing more
    two.close()
    assert hub.sampler is None


def test_interval_and_window_from_the_browser_reach_the_sampler(panel_on_fake):
    open_one, _hub, _server, made = panel_on_fake
    panel = open_one(interval=0.5, window=60)
    panel.interval = 0.1
    panel.window = 240
    assert made[0].interval == 0.1 and made[0].history.maxlen == 2402
    panel.close()


def test_open_panel_wires_a_given_nvml_and_closing_stops_the_thread():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    panel = panels.open_panel(interval=0.1, window=60, nvml=Nvml(lib=shared_server()), display=False)
    try:
        s = monitor.active_sampler()
        wait_for(lambda: len(s.history) >= 2)
        assert monitor.sampler_running()
        assert [d.key for d in s.history[-1].devices] == ["gpu0", "gpu1", "gpu2", "gpu3"]
        assert by_key(s.history[-1])["gpu1"].mine_bytes == 10240 * MIB  # our pid on the fake
    finally:
        panel.close()
    assert monitor.active_sampler() is None and not monitor.sampler_running()
    del panel
    gc.collect()


def test_the_front_end_closing_the_panel_stops_the_sampler():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    panel = panels.open_panel(interval=0.1, window=60, nvml=Nvml(lib=shared_server()), display=False)
    try:
        wait_for(monitor.sampler_running)
        panel.comm.handle_close({"content": {"comm_id": panel.comm.comm_id, "data": {}}})
        assert not panel.running and not monitor.sampler_running()
    finally:
        panel.close()


def test_monitor_off_stops_every_panel_and_the_thread():
    pytest.importorskip("tfgpu_magic.kernel.widget")
    fake = Nvml(lib=shared_server())
    opened = [panels.open_panel(interval=0.1, window=60, nvml=fake, display=False) for _ in range(2)]
    try:
        wait_for(monitor.sampler_running)
        answer = monitor.stop_panels()
        assert answer.startswith("Stopped 2 memory panels; the sampling thread has ended.")
        assert not monitor.sampler_running() and monitor.active_sampler() is None
        assert [p.running for p in opened] == [False, False]  # the browser shows them as stopped
        assert monitor.stop_panels() == "No memory panel is running in this kernel."
    finally:
        for panel in opened:
            panel.close()


def test_all_names_are_public_and_present():
    for name in monitor.__all__:
        assert hasattr(monitor, name), name


# -- a real GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_readings_follow_a_process_allocating_and_freeing_on_a_real_gpu():
    import os

    nvml = Nvml()
    if not nvml.available():
        pytest.skip("no NVIDIA driver reachable through NVML")
    try:
        import cupy as xp
    except ImportError:
        xp = None
    torch = None
    if xp is None:
        torch = pytest.importorskip("torch", reason="needs CuPy or PyTorch to allocate GPU memory")
    s = Sampler(nvml, os.getpid(), interval=0.1)

    def mine():
        return by_key(s.tick())["gpu0"].mine_bytes or 0

    size = 2 * GIB
    if xp is not None:
        xp.cuda.Device(0).use()
        warm = xp.zeros(1)  # the CUDA context alone holds a few hundred MiB
        before = mine()
        block = xp.empty(size, dtype=xp.uint8)
        block.fill(1)
        xp.cuda.Device(0).synchronize()
        during = mine()
        del block
        xp.get_default_memory_pool().free_all_blocks()
        del warm
    else:
        warm = torch.zeros(1, device="cuda:0")
        before = mine()
        block = torch.ones(size, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        during = mine()
        del block
        torch.cuda.empty_cache()
        del warm
    after = mine()
    assert during - before >= size * 0.95
    assert during - after >= size * 0.95


# -- finalisers and the hub's lock (issue 17, item 7) -------------------------------------------------
class _Finalised:
    """An old panel that only a garbage collection frees; closing it leaves and forgets, as MemoryPanel.close does."""

    def __init__(self, hub):
        self.hub, self.cycle, self.closed = hub, self, []

    def __del__(self):
        self.hub.leave(self, shown=True)
        self.hub.forget(self)
        _FINALISED.append(True)


_FINALISED: list[bool] = []


def _finishes(work, seconds: float = 20.0) -> bool:
    """Whether ``work`` returns (a deadlock never does; the thread is a daemon, so a hang fails the test only)."""
    done = threading.Event()
    threading.Thread(target=lambda: (work(), done.set()), daemon=True).start()
    return done.wait(seconds)


def test_a_collection_while_a_sampler_is_made_finalises_an_old_panel_without_deadlock():
    hub = Hub()
    _FINALISED.clear()

    def make():
        _Finalised(hub)  # garbage at once: a cycle only the collector frees
        gc.collect()  # the collection an allocation in make() can trigger, forced
        return sampler(interval=0.1)

    member = object()
    assert _finishes(lambda: hub.join(member, make, 60)), "hub.join deadlocked in a finaliser"
    assert _FINALISED == [True]
    hub.stop_all()


def test_a_collection_under_the_hubs_lock_finalises_an_old_panel_without_deadlock(monkeypatch):
    hub = Hub()
    _FINALISED.clear()
    s = sampler(interval=0.1)
    real_keep = s.keep

    def keep_and_collect(seconds):  # keep() runs under the lock: any allocation there may collect
        _Finalised(hub)
        gc.collect()
        real_keep(seconds)

    monkeypatch.setattr(s, "keep", keep_and_collect)
    member = object()
    assert _finishes(lambda: hub.join(member, lambda: s, 60)), "a finaliser waited for the hub's lock"
    assert _FINALISED == [True]
    assert _finishes(lambda: hub.set_window(member, 120))
    hub.stop_all()


@pytest.mark.gpu
def test_a_real_drivers_utilization_samples_are_stamped_with_the_wall_clock():
    """What the monitor's use of nvmlDeviceGetSamples rests on: the driver keeps samples of GPU 0's
    utilization, stamped in microseconds of the wall clock (time.time), and the sampler reads them
    rather than a rates reading each tick."""
    import os

    nvml = Nvml()
    if not nvml.available():
        pytest.skip("no NVIDIA driver reachable through NVML")
    samples = nvml.utilization_samples(0)
    now_us = time.time() * 1e6
    assert samples, "the driver kept no utilization samples"
    assert now_us - 2e6 <= samples[-1][0] <= now_us + 1e6
    s = Sampler(nvml, os.getpid(), interval=0.1)
    s.tick()
    assert s._from_samples.get(0) is True
