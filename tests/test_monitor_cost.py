"""What one tick of `%gpu monitor` reads from NVML and sends to the browser.

Process lists are NVML's costly calls: a GPU is listed again only when its used memory changed
since its last listing, or that listing is ``LISTING_MAX_AGE_S`` old.  A sample equal to the last
one sent is not sent, but for a heartbeat every ``HEARTBEAT_S``, and at most
``MAX_MESSAGES_PER_S`` messages go out a second (one every ``HAND_ON_S``), together holding every sample sent.  No timing here: NVML calls are
counted on the simulated server, messages on the panel, and time is an injected clock.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import (
    NVML_ERROR_NO_PERMISSION,
    NVMLError,
    SimulatedGpu,
    SimulatedNvml,
    SimulatedProcess,
    shared_server,
)
from tfgpu_magic.kernel.allocator_figures import NOTHING_READ
from tfgpu_magic.kernel.monitor import HAND_ON_S, LISTING_MAX_AGE_S, Hub, Sampler

from support.fakes import ManualClock as Clock
from support.panel_wire import packed_runs, unpacked

ME = 4242
MIB = 1024 * 1024
GPUS = 4  # shared_server's
TICKS = round(HAND_ON_S / 0.1)  # ticks of 0.1 s in the least time between two messages (HAND_ON_S)

pytestmark = pytest.mark.usefixtures("no_leaked_sampler")


class CountingNvml(SimulatedNvml):
    """The simulated server, counting the GPUs it lists (each listing starts with the compute
    processes) and, apart, its graphics listings (read only where the compute listing does not
    list this kernel)."""

    listings = 0
    graphics_listings = 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self.listings += 1
        return super().nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        self.graphics_listings += 1
        return super().nvmlDeviceGetGraphicsRunningProcesses(handle)


@pytest.fixture
def fake():
    """(server, clock, sampler): a sampler on shared_server's GPUs whose listings are counted."""
    server, clock = CountingNvml(shared_server(ME).gpus), Clock()
    return server, clock, Sampler(Nvml(lib=server), ME, clock=clock)


def tick(sampler: Sampler, clock: Clock, seconds: float = 0.1):
    clock.now += seconds
    return {d.key: d for d in sampler.tick().devices}


def mine(server: SimulatedNvml) -> SimulatedProcess:
    return server.gpus[1].processes[0]  # this kernel's process on GPU 1


# -- process lists ---------------------------------------------------------------------------------
def test_the_first_tick_lists_every_gpu_and_an_unchanged_gpu_is_not_listed_again(fake):
    server, clock, s = fake
    first = tick(s, clock, 0)
    assert server.listings == GPUS  # every GPU
    # Graphics too where the compute listing does not list this kernel: all but GPU 1.
    assert server.graphics_listings == GPUS - 1
    assert first["gpu1"].mine_bytes == 10240 * MIB and first["gpu0"].mine_bytes == 0
    calls = server.calls
    again = tick(s, clock)
    assert server.listings == GPUS and server.graphics_listings == GPUS - 1
    assert server.calls - calls == 2 * GPUS  # memory and utilization: names and handles are kept
    assert (
        again["gpu1"].mine_bytes == 10240 * MIB and again["gpu0"].mine_bytes == 0
    )  # the last listing's answer


def test_this_kernel_allocating_or_freeing_lists_that_gpu_at_once_and_its_share_follows(fake):
    server, clock, s = fake
    tick(s, clock, 0)
    mine(server).used_mib += 512
    grown = tick(s, clock)
    assert server.listings == GPUS + 1  # GPU 1 only
    assert server.graphics_listings == GPUS - 1  # its compute listing lists this kernel
    assert grown["gpu1"].mine_bytes == (10240 + 512) * MIB
    mine(server).used_mib -= 2048
    freed = tick(s, clock)
    assert server.listings == GPUS + 2
    assert freed["gpu1"].mine_bytes == (10240 + 512 - 2048) * MIB
    assert freed["gpu1"].used_bytes == grown["gpu1"].used_bytes - 2048 * MIB


def test_another_process_changing_memory_lists_its_gpu_and_leaves_this_kernels_share(fake):
    server, clock, s = fake
    tick(s, clock, 0)
    server.gpus[0].processes[0].used_mib += 1024  # alice's training on GPU 0
    after = tick(s, clock)
    assert server.listings == GPUS + 1 and server.graphics_listings == GPUS  # this kernel is not on GPU 0
    assert after["gpu0"].mine_bytes == 0 and after["gpu1"].mine_bytes == 10240 * MIB


def test_a_listing_as_old_as_the_bound_is_read_again_even_if_used_memory_did_not_change(fake):
    server, clock, s = fake
    tick(s, clock, 0)
    # Another process frees just what this kernel takes within one tick: "used" does not move.
    mine(server).used_mib += 512
    server.gpus[1].processes[2].used_mib -= 512
    stale = tick(s, clock, LISTING_MAX_AGE_S - 0.1)
    assert server.listings == GPUS and stale["gpu1"].mine_bytes == 10240 * MIB
    fresh = tick(s, clock, 0.1)  # the listing is LISTING_MAX_AGE_S old now
    assert server.listings == 2 * GPUS  # every GPU's listing was as old
    assert fresh["gpu1"].mine_bytes == (10240 + 512) * MIB


def test_a_clock_that_went_back_lists_again(fake):
    server, clock, s = fake
    tick(s, clock, 0)
    tick(s, clock, -60)  # the wall clock was set back
    assert server.listings == 2 * GPUS


def test_a_failed_listing_says_so_and_is_tried_again_on_the_next_tick(fake):
    server, clock, s = fake
    tick(s, clock, 0)
    server.gpus[1].faults["compute_processes"] = NVMLError(NVML_ERROR_NO_PERMISSION)
    mine(server).used_mib += 512
    failed = tick(s, clock)["gpu1"]
    assert (
        failed.mine_bytes is None and failed.error == "GPU 1: process list failed (Insufficient Permissions)"
    )
    assert failed.used_bytes is not None
    del server.gpus[1].faults["compute_processes"]
    listings = server.listings
    back = tick(s, clock)["gpu1"]  # used memory as on the failed tick, and well within the bound
    assert server.listings == listings + 1
    assert back.mine_bytes == (10240 + 512) * MIB and back.error is None


def test_a_note_from_a_listing_stays_while_that_listing_stands():
    server, clock = CountingNvml([SimulatedGpu(processes=[SimulatedProcess(ME, None)])]), Clock()
    s = Sampler(Nvml(lib=server), ME, clock=clock)
    for _ in range(3):
        gpu = tick(s, clock)["gpu0"]
        assert gpu.mine_bytes is None and gpu.error == "GPU 0: NVML cannot say how much this kernel holds"
    assert server.listings == 1  # listed once


def test_a_gpu_that_answers_again_is_listed_afresh(fake):
    server, clock, s = fake
    tick(s, clock, 0)
    server.gpus[1].lost = True
    lost = tick(s, clock)["gpu1"]
    assert lost.mine_bytes is None and lost.error.startswith("GPU 1 stopped answering")
    assert server.listings == GPUS  # no memory reading: no listing either
    server.gpus[1].lost = False
    back = tick(s, clock)["gpu1"]  # the same used memory as before it was lost
    assert server.listings == GPUS + 1
    assert back.mine_bytes == 10240 * MIB and back.error is None


# -- what the panel sends --------------------------------------------------------------------------
class ManualSampler(Sampler):
    """A sampler whose thread never starts: the test ticks it, so messages are exact."""

    def start(self) -> None:
        pass


class Allocator:
    """The allocator figures as the sampler reads them: none, or a failure."""

    broken = False

    def __call__(self) -> dict:
        if self.broken:
            raise RuntimeError("not today")
        return NOTHING_READ


@pytest.fixture
def panel():
    """(panel, server, clock, sampler, allocator): a MemoryPanel whose messages are recorded in .sent."""
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    hub, server, clock, allocator = Hub(), shared_server(ME), Clock(), Allocator()
    sampler = ManualSampler(Nvml(lib=server), ME, interval=0.1, clock=clock, figures=allocator)
    made = widget.MemoryPanel(hub, lambda: sampler, interval=0.1)
    made.sent = []
    made.send = lambda content, buffers=None: made.sent.append(unpacked(content, buffers))
    yield made, server, clock, sampler, allocator
    made.close()
    hub.stop_all()


def ticks(sampler: Sampler, clock: Clock, n: int, seconds: float = 0.1) -> None:
    for _ in range(n):
        clock.now += seconds
        sampler.tick()


def test_a_sample_equal_to_the_last_one_sent_is_not_sent(panel):
    p, _server, clock, s, _ = panel
    ticks(s, clock, 5)
    assert len(p.sent) == 1 and p.sent[0]["t"] == [s.history[0].time_s]
    assert len(s.history) == 5  # the kernel keeps every sample: a view that asks gets them all
    p._on_message(p, {"kind": "history"}, [])
    assert len(p.sent[-1]["t"]) == 5


def test_an_unchanged_sample_is_sent_once_a_heartbeat_so_the_time_axis_moves_on(panel):
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    p, _server, clock, s, _ = panel
    assert widget.HEARTBEAT_S == HAND_ON_S == 2.0
    step = 0.125  # s, exact in binary: sixteen ticks are two seconds
    ticks(s, clock, 1, step)
    start = clock.now
    ticks(s, clock, 15, step)  # 1.875 s later: nothing new yet
    assert len(p.sent) == 1
    ticks(s, clock, 1, step)
    assert len(p.sent) == 2 and p.sent[1]["t"] == [start + 2.0]  # one point: the line is flat
    assert p.sent[1]["d"]["gpu1"]["mine"] == [10240 * MIB]
    ticks(s, clock, 16, step)
    assert len(p.sent) == 3


def test_a_change_brings_the_last_unchanged_sample_so_the_chart_stays_flat_up_to_it(panel):
    p, server, clock, s, _ = panel
    ticks(s, clock, TICKS + 1)  # a hand-on's time with nothing sent: a change goes out at once
    before = clock.now
    mine(server).used_mib += 512
    ticks(s, clock, 1)
    assert len(p.sent) == 2
    change = p.sent[1]
    assert change["t"] == [before, clock.now]
    assert change["d"]["gpu1"]["mine"] == [10240 * MIB, (10240 + 512) * MIB]
    assert all(len(column) == 2 for device in change["d"].values() for column in device.values())
    mine(server).used_mib += 512  # right after a message: nothing unsent to bring
    ticks(s, clock, 1)
    after = clock.now
    ticks(s, clock, TICKS - 2)  # it waits for the gap between messages (1.9 s since the last)
    assert len(p.sent) == 2
    ticks(s, clock, 1)
    assert p.sent[2]["t"] == [after]


@pytest.mark.parametrize("what", ["utilization", "error", "status"])
def test_a_change_of_utilization_a_message_or_the_status_is_sent(panel, what):
    p, server, clock, s, allocator = panel
    ticks(s, clock, 1)
    if what == "utilization":
        server.gpus[0].utilization = 12
    elif what == "error":
        server.gpus[3].lost = True
    else:
        allocator.broken = True  # a source that fails: a note in the status
    ticks(s, clock, 1, HAND_ON_S)  # a hand-on's time after the last message: sent at once
    assert len(p.sent) == 2
    sent = p.sent[1]
    assert sent["d"]["gpu0"]["util"] == [12 if what == "utilization" else 97]
    if what == "error":
        assert sent["errors"]["gpu3"].startswith("GPU 3 stopped answering")
    else:
        assert sent["errors"]["gpu3"] is None
    if what == "status":
        assert sent["status"].startswith("the allocator figures could not be read (RuntimeError")
    else:
        assert sent["status"] is None
    ticks(s, clock, 3)
    assert len(p.sent) == 2  # the same again: not sent


def test_a_stopped_panel_ends_its_chart_at_the_last_sample_taken_for_it(panel):
    p, _server, clock, s, _ = panel
    ticks(s, clock, 4)
    assert len(p.sent) == 1
    p._on_message(p, {"kind": "stop"}, [])
    assert len(p.sent) == 2 and p.sent[1]["t"] == [clock.now]
    ticks(s, clock, 20)
    assert len(p.sent) == 2


def test_after_the_history_a_change_comes_alone(panel):
    p, server, clock, s, _ = panel
    ticks(s, clock, TICKS + 1)  # a hand-on's time with nothing sent: the change will go out at once
    p._on_message(p, {"kind": "history"}, [])  # holds the unsent samples
    mine(server).used_mib += 512
    ticks(s, clock, 1)
    assert p.sent[-1]["kind"] == "samples" and p.sent[-1]["t"] == [clock.now]


# -- at most MAX_MESSAGES_PER_S messages a second (one a hand-on) ----------------------------------------------------
def busy(server: SimulatedNvml, sampler: Sampler, clock: Clock, n: int, seconds: float = 0.1) -> None:
    """n ticks, GPU 0's utilization changing on each: every sample differs from the last."""
    for _ in range(n):
        server.gpus[0].utilization = (server.gpus[0].utilization + 1) % 100
        ticks(sampler, clock, 1, seconds)


def sent_times(p) -> list[float]:
    return [t for message in p.sent for t in message["t"]]


def test_busy_gpus_at_a_tenth_of_a_second_send_one_message_a_hand_on_holding_every_sample(panel):
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    p, server, clock, s, _ = panel
    assert widget.MAX_MESSAGES_PER_S == 1 / HAND_ON_S == 0.5
    busy(server, s, clock, TICKS + 1)
    assert [len(m["t"]) for m in p.sent] == [1, TICKS]  # at once, then a hand-on's samples
    busy(server, s, clock, 100 - TICKS - 1)  # ten seconds in all
    assert len(p.sent) == 1 + 10 * widget.MAX_MESSAGES_PER_S - 1  # the last 1.9 s still waits
    p._on_message(p, {"kind": "stop"}, [])  # Stop sends what waits
    assert sent_times(p) == [sample.time_s for sample in s.history]  # none lost, in order
    utils = [u for m in p.sent for u in m["d"]["gpu0"]["util"]]
    assert utils == [(97 + i) % 100 for i in range(1, 101)]
    assert all(len(col) == len(m["t"]) for m in p.sent for dev in m["d"].values() for col in dev.values())


def test_a_hand_on_of_changing_samples_is_one_message_holding_them_all(panel):
    p, server, clock, s, _ = panel
    ticks(s, clock, TICKS + 1)  # the first message, then a hand-on's time of the same
    sent, quiet = len(p.sent), clock.now
    for _ in range(TICKS):  # as the thread takes them: read each tick, handed on together
        clock.now += 0.1
        server.gpus[0].utilization = (server.gpus[0].utilization + 1) % 100
        s._read()
    handed = s._hand_on()
    assert len(p.sent) == sent + 1
    # the last unchanged sample first: the chart holds the old value up to the change
    assert p.sent[-1]["t"] == [quiet] + [h.time_s for h in handed]


def test_a_change_after_a_hand_ons_time_without_messages_goes_out_at_once(panel):
    p, server, clock, s, _ = panel
    ticks(s, clock, TICKS + 1)  # one message, then a hand-on's time of the same
    quiet = clock.now
    busy(server, s, clock, 1)
    assert len(p.sent) == 2 and p.sent[1]["t"] == [quiet, clock.now]
    busy(server, s, clock, 1)  # a message went out 0.1 s ago: this one waits
    assert len(p.sent) == 2


def test_a_waiting_batch_goes_out_with_the_next_tick_past_the_gap_though_nothing_changed(panel):
    p, server, clock, s, _ = panel
    ticks(s, clock, 1)
    busy(server, s, clock, 1)
    change = clock.now
    ticks(s, clock, TICKS - 2)  # the same as the change: nothing to add, and 1.9 s since the message
    assert len(p.sent) == 1
    ticks(s, clock, 1)
    assert len(p.sent) == 2 and p.sent[1]["t"] == [change]  # the unchanged tick itself is not sent
    unchanged = clock.now
    busy(server, s, clock, 1)  # right after a message: waits, with the unchanged sample before it
    change = clock.now
    assert len(p.sent) == 2
    ticks(
        s, clock, 1, HAND_ON_S + 0.5
    )  # the sampler was held up: this tick is a heartbeat, and takes the batch along
    assert len(p.sent) == 3 and p.sent[2]["t"] == [unchanged, change, clock.now]


def test_at_a_hand_ons_time_and_longer_every_changed_sample_has_its_own_message(panel):
    p, server, clock, s, _ = panel
    p.interval = HAND_ON_S  # from the browser: the sampler follows
    assert s.interval == HAND_ON_S == 2.0
    for step in (2.0, 1.88, 2.12, 2.0, 4.0, 1.96):  # a tick's time comes a little early or late
        busy(server, s, clock, 1, step)
    assert [len(m["t"]) for m in p.sent] == [1] * 6
    assert sent_times(p) == [sample.time_s for sample in s.history]


def test_a_clock_set_back_does_not_hold_a_change(panel):
    p, server, clock, s, _ = panel
    busy(server, s, clock, 1)
    busy(server, s, clock, 1, -60.0)
    assert len(p.sent) == 2


def test_stop_sends_the_waiting_batch_and_the_last_unchanged_sample(panel):
    p, server, clock, s, _ = panel
    busy(server, s, clock, 3)
    ticks(s, clock, 1)
    assert [len(m["t"]) for m in p.sent] == [1]
    p.stop()
    assert sent_times(p) == [sample.time_s for sample in s.history]
    assert len(p.sent) == 2


def test_the_history_holds_the_waiting_batch(panel):
    p, server, clock, s, _ = panel
    busy(server, s, clock, 3)
    p._on_message(p, {"kind": "history"}, [])
    assert p.sent[-1]["kind"] == "history" and len(p.sent[-1]["t"]) == 3
    ticks(s, clock, TICKS + 1)  # nothing waits: only a heartbeat comes
    assert [m["kind"] for m in p.sent] == ["samples", "history", "samples"] and len(p.sent[-1]["t"]) == 1


# -- what a tick costs: NVML calls and messages, counted ----------------------------------------------
class Counting:
    """``lib`` with every ``nvml*`` call counted by name."""

    def __init__(self, lib: SimulatedNvml) -> None:
        self._lib = lib
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str):
        attr = getattr(self._lib, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr

        def call(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


def test_a_tick_makes_two_nvml_calls_a_gpu_and_one_message_a_hand_on_serves_every_panel():
    """The floor of a tick where the driver's utilization samples are not used (their clock is not
    the sampler's here: tests/test_utilization_samples.py has the other case): memory and
    utilization per GPU, the process lists of a GPU only when its memory moved, and one message a
    hand-on whatever the number of samples or panels."""
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    server, clock, hub = shared_server(ME), Clock(), Hub()
    lib = Counting(server)
    made: list[Sampler] = []

    def make() -> Sampler:
        made.append(ManualSampler(Nvml(lib=lib), ME, interval=0.1, clock=clock))
        return made[-1]

    panels = [widget.MemoryPanel(hub, make, interval=0.1) for _ in range(2)]
    for p in panels:
        p.sent = []
        p.send = lambda content, buffers=None, p=p: p.sent.append(unpacked(content, buffers))
    try:
        assert len(made) == 1 and hub.sampler is made[0]  # one sampler, one reading a tick, for both
        sampler = made[0]
        busy(server, sampler, clock, 1)  # the first tick also names the GPUs and lists their processes
        before = Counter(lib.calls)
        busy(server, sampler, clock, 10)
        memory, utilization = "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates"
        assert lib.calls - before == Counter({memory: 10 * GPUS, utilization: 10 * GPUS})
        mine(server).used_mib += 512  # this kernel allocates on GPU 1: that GPU alone is listed
        before = Counter(lib.calls)
        busy(server, sampler, clock, 1)
        listings = {"nvmlDeviceGetComputeRunningProcesses": 1}  # it lists this kernel: no graphics listing
        assert lib.calls - before == Counter({memory: GPUS, utilization: GPUS, **listings})
        for p in panels:
            p.sent.clear()
        busy(server, sampler, clock, 100)  # ten seconds, every sample new
        assert len(panels[0].sent) == 10 * widget.MAX_MESSAGES_PER_S == 5
        assert panels[0].sent == panels[1].sent
        assert sum(len(m["t"]) for m in panels[0].sent) >= 100 - TICKS + 1  # all but those still waiting
    finally:
        for p in panels:
            p.close()
        hub.stop_all()


# -- what a batch holds: the same from packed samples as from Samples ------------------------------------


@settings(max_examples=200, deadline=None)
@given(packed_runs())
def test_a_batch_cut_from_packed_samples_is_the_batch_of_those_samples(stored):
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    assert widget.batch_packed(stored) == widget.batch([s.unpack() for s in stored])


@settings(max_examples=200, deadline=None)
@given(packed_runs())
def test_a_batch_sent_with_binary_buffers_reads_back_as_the_batch_of_those_samples(stored):
    """What the panel sends (widget.batch_wire) says what batch() says; samples of one layout
    carry their numbers in two buffers, and the JSON part holds none of them."""
    widget = pytest.importorskip("tfgpu_magic.kernel.widget")
    content, buffers = widget.batch_wire(stored)
    assert unpacked(content, buffers) == widget.batch([s.unpack() for s in stored])
    one_layout = all(s.layout is stored[0].layout and s.figures is stored[0].figures for s in stored)
    keys = [key for key, _, _ in stored[0].layout]
    if one_layout and len(set(keys)) == len(keys):
        assert "t" not in content and "d" not in content
        assert [len(b) for b in map(bytes, buffers)] == [
            8 * len(stored),
            8 * len(stored) * len(stored[0].readings),
        ]
    else:
        assert buffers == [] and content == widget.batch_packed(stored)
