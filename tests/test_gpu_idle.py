"""Idle GPU memory per kernel from the server's readings: tfgpu_magic.server.gpu_idle, and its figures on /metrics."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tfgpu_magic import __version__
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.gpus.utilization import UtilizationReader
from tfgpu_magic.server import kernel_inventory, metrics
from tfgpu_magic.server.gpu_idle import IdleTracker, add_cull_deadline, span_text
from tfgpu_magic.server.kernel_inventory import KernelDescription

GIB = 1024**3
START = 1_795_000_000.0
KERNEL = KernelDescription(
    id="k1", name="python3", path="train.ipynb", execution_state="idle", pid=os.getpid()
)


class Server:
    """shared_server, with this process as a kernel holding 10 GiB on GPU 1, read as the server reads it."""

    def __init__(self, tracker: IdleTracker) -> None:
        self.now = START
        self.sim = shared_server(my_pid=os.getpid())
        self.sim.clock = lambda: self.now
        self.nvml = Nvml(lib=self.sim)
        self.reader = UtilizationReader(self.nvml)
        self.tracker = tracker

    def mine(self):
        return next(p for p in self.sim.gpus[1].processes if p.pid == os.getpid())

    def read(self, after_s: float = 0.0) -> dict:
        self.now += after_s
        reply = kernel_inventory.inventory(
            self.nvml, [KERNEL], clock=lambda: self.now, utilization=self.reader
        )
        self.tracker.annotate(reply)
        return reply["kernels"][0]


def test_memory_held_at_zero_is_counted_from_the_first_idle_reading_and_noticed_past_the_thresholds():
    server = Server(IdleTracker(after_s=60, min_bytes=GIB))
    first = server.read()
    assert first["gpu_utilization"] == {"1": {"percent": 0, "scope": "process", "note": None}}
    assert first["gpu_idle_since"] == "2026-11-18T11:06:40.000000Z"
    assert first["idle_gpu_memory_byte_seconds"] == 0.0 and first["gpu_idle_notice"] is None
    second = server.read(30)
    assert second["idle_gpu_memory_byte_seconds"] == 10 * GIB * 30
    assert second["gpu_idle_notice"] is None  # 30 s < 60 s
    third = server.read(30)
    assert third["idle_gpu_memory_byte_seconds"] == 10 * GIB * 60
    assert third["gpu_idle_notice"] == (
        "This kernel has held 10.0 GiB of GPU memory (the driver's figure) at 0% GPU utilization for 60 s: "
        "`%gpu free` gives it back to your colleagues"
    )


def test_work_on_the_gpu_ends_the_stretch_and_the_memory_time_stays():
    server = Server(IdleTracker(after_s=60, min_bytes=GIB))
    server.read()
    server.read(120)
    server.mine().sm_percent = 40  # a cell trains on it
    busy = server.read(10)
    assert busy["gpu_utilization"]["1"]["percent"] == 40
    assert busy["gpu_idle_since"] is None and busy["gpu_idle_notice"] is None
    assert busy["idle_gpu_memory_byte_seconds"] == 10 * GIB * 120  # the busy interval is not added
    server.mine().sm_percent = 0
    again = server.read(10)
    assert again["gpu_idle_since"] is not None and again["gpu_idle_notice"] is None
    assert again["idle_gpu_memory_byte_seconds"] == 10 * GIB * 120  # a new stretch starts at this reading


def test_below_the_memory_threshold_nothing_is_noticed_but_the_memory_time_is_counted():
    server = Server(IdleTracker(after_s=0, min_bytes=20 * GIB))
    server.read()
    kernel = server.read(5)
    assert kernel["gpu_idle_notice"] is None and kernel["idle_gpu_memory_byte_seconds"] == 10 * GIB * 5


def test_an_unknown_utilization_is_not_idle():
    server = Server(IdleTracker(after_s=0, min_bytes=0))
    server.read()
    server.sim.gpus[1].faults["process_utilization"] = RuntimeError("boom")
    kernel = server.read(5)
    assert kernel["gpu_utilization"]["1"]["percent"] is None
    assert kernel["gpu_idle_since"] is None and kernel["gpu_idle_notice"] is None
    assert kernel["idle_gpu_memory_byte_seconds"] == 0.0


def test_the_notice_says_when_the_culler_acts():
    reply = {"kernels": [{"gpu_idle_notice": "held", "cull_due_at": "2026-11-27T06:30:00.000000Z"}]}
    add_cull_deadline(reply)
    assert reply["kernels"][0]["gpu_idle_notice"] == (
        "held; the idle culler shuts it down at 06:30 UTC if it stays idle"
    )


def test_spans_are_said_in_the_largest_sensible_unit():
    assert [span_text(s) for s in (5, 119, 600, 7260)] == ["5 s", "119 s", "10 min", "2 h 1 min"]


def test_metrics_carry_each_kernels_utilization_and_idle_memory_time():
    server = Server(IdleTracker(after_s=60, min_bytes=GIB))
    server.read()
    reply = kernel_inventory.inventory(
        server.nvml, [KERNEL], clock=lambda: server.now + 30, utilization=server.reader
    )
    server.tracker.annotate(reply)
    registry = CollectorRegistry()

    class Fixed:
        def collect(self):
            return metrics.families(reply, __version__)

    registry.register(Fixed())
    parsed = {
        s.name: (s.labels, s.value)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    kernel_labels = {"kernel_id": "k1", "kernel_name": "python3", "path": "train.ipynb"}
    uuid = reply["gpus"][1]["uuid"]
    assert parsed["tfgpu_kernel_gpu_utilization_ratio"] == (
        {**kernel_labels, "gpu": "1", "gpu_uuid": uuid, "scope": "process"},
        0.0,
    )
    assert parsed["tfgpu_kernel_idle_gpu_memory_byte_seconds_total"] == (kernel_labels, 10.0 * GIB * 30)


def test_the_thresholds_are_the_server_extensions_settings(caplog):
    import logging

    from traitlets.config import Config

    from tfgpu_magic.server import extension as serverext

    log = logging.getLogger("idle-settings-test")
    config = Config({"TfgpuMagic": {"idle_notice_after": 120.0, "idle_notice_min_memory": "512M"}})
    settings, _ = serverext.load_settings(config, log)
    tracker = settings.idle_tracker()
    assert (tracker.after_s, tracker.min_bytes) == (120.0, 512 * 1024**2)
    default = serverext.load_settings(Config(), log)[0].idle_tracker()
    assert (default.after_s, default.min_bytes) == (600.0, GIB)
    wrong = Config({"TfgpuMagic": {"idle_notice_after": -1.0}})
    with caplog.at_level(logging.ERROR):
        assert serverext.load_settings(wrong, log)[0].idle_notice_after == 600.0
    assert "TfgpuMagic.idle_notice_after must be at least 0 s" in caplog.text


def test_a_reply_without_its_time_measures_nothing():
    tracker = IdleTracker(after_s=0, min_bytes=0)
    reply = {
        "generated_at": None,
        "kernels": [{"id": "k", "total_gpu_memory_bytes": GIB, "gpu_utilization": {}}],
    }
    tracker.annotate(reply)
    assert reply["kernels"][0]["gpu_idle_since"] is None
    assert reply["kernels"][0]["idle_gpu_memory_byte_seconds"] == 0.0
