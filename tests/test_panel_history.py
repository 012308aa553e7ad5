"""The history the kernel keeps for the panel: packed, exact, and as small as stated.

monitor.py states what a full history costs (8 GPUs, every reading changing every tick, GPU
utilization included: 3.62 MiB with the sys.getsizeof walk below; 3.25 MiB before utilization
was kept, when tracemalloc agreed); the test measures it again and holds the code to that figure.
"""

from __future__ import annotations

import gc
import sys
import types
from dataclasses import dataclass

from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import busy_server
from tfgpu_magic.kernel.allocator_figures import FigureSeries
from tfgpu_magic.kernel.monitor import MAX_HISTORY, DeviceSample, Sample, Sampler, _Stored

from support.fakes import tf_figures

ME = 4242
MIB = 1024 * 1024
STATED_MIB = 3.85  # monitor.py's comment (3.25 before utilization was kept, 3.62 before allocator figures)


@dataclass
class Stats:  # the shape of tf_runtime.AllocatorStats
    current_bytes: int
    peak_bytes: int


def deep_size(root: object) -> int:
    """Bytes held by ``root`` and everything it refers to, each object once (types and modules left out)."""
    seen: set[int] = set()
    todo, total = [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)) or obj is None:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


def full_history_of_8_gpus() -> Sampler:
    server = busy_server(ME, gpus=8)
    tick = [0]

    stats: dict = {}
    read = tf_figures(stats, {f"GPU:{i}": i for i in range(8)})

    def figures():  # TensorFlow's allocator changes on every tick, read as after each cell
        tick[0] += 1
        stats.update(
            {f"GPU:{i}": Stats(10**9 + tick[0] * 4096 + i, 2 * 10**9 + tick[0] * 4096 + i) for i in range(8)}
        )
        return read()

    s = Sampler(
        Nvml(lib=server),
        ME,
        interval=0.1,
        keep_s=10**6,
        figures=figures,
        limits=lambda: {i: 20 * 1024 * MIB for i in range(8)},
    )
    for _ in range(MAX_HISTORY + 200):  # full, and then some: the oldest go
        for gpu in server.gpus:  # every reading changes on every tick: the worst case
            gpu.processes[0].used_mib += 1
        s.tick()
    return s


def test_a_full_history_of_8_gpus_stays_within_the_stated_size():
    s = full_history_of_8_gpus()
    assert len(s.history) == MAX_HISTORY and len(s.latest().devices) == 8
    held = deep_size(s.history)
    assert held / MIB <= STATED_MIB * 1.05, f"{held / MIB:.2f} MiB for {MAX_HISTORY} samples of 8 GPUs"
    assert held / MIB >= STATED_MIB * 0.7, f"{held / MIB:.2f} MiB: smaller than stated; update the figure"


def test_packing_keeps_every_reading_gap_and_message():
    devices = (
        DeviceSample(
            "gpu0",
            "GPU 0 · A100",
            80 * 2**30,
            2**40,
            0,
            None,
            None,
            7,
            None,
            figures=(("pytorch", "allocated", 3), ("pytorch", "reserved", None)),
        ),
        DeviceSample("gpu1", "GPU 1", None, None, None, None, None, None, "GPU 1 stopped answering"),
        # The older wire fields are filled from the figures their series name (TensorFlow's).
        DeviceSample(
            "tensorflow:CPU:0",
            "TensorFlow CPU:0",
            tf_in_use_bytes=2**63 - 1,
            tf_peak_bytes=0,
            figures=(("tensorflow", "in_use", 2**63 - 1), ("tensorflow", "peak", 0)),
        ),
    )
    series = (
        FigureSeries("pytorch", "allocated", "PyTorch allocator: allocated"),
        FigureSeries("pytorch", "reserved", "PyTorch allocator: reserved"),
        FigureSeries("tensorflow", "in_use", "TensorFlow allocator: in use", "tf_in_use_bytes"),
        FigureSeries("tensorflow", "peak", "TensorFlow allocator: peak", "tf_peak_bytes"),
    )
    sample = Sample(
        1700000000.25,
        devices,
        "a note",
        series,
        1700000000.0,
        ("JAX: no allocator figures until its first operation",),
    )
    stored = _Stored.pack(sample, None)
    assert stored.unpack() == sample
    assert stored.devices == devices and stored.time_s == sample.time_s


def test_what_does_not_fit_an_int64_is_a_gap_not_an_error():
    odd = DeviceSample(
        "gpu0", "GPU 0", total_bytes=2**70, used_bytes=-(2**63), mine_bytes=12.0, limit_bytes="x"
    )
    back = _Stored.pack(Sample(1.0, (odd,)), None).unpack().devices[0]
    assert (back.total_bytes, back.used_bytes, back.mine_bytes, back.limit_bytes) == (None, None, 12, None)


def test_unchanged_labels_messages_and_status_are_shared_with_the_previous_sample():
    def sample(used: int) -> Sample:
        lost = DeviceSample("gpu1", f"GPU {1}", error=f"GPU {1} stopped answering")
        return Sample(
            float(used), (DeviceSample("gpu0", f"GPU {0} · A100", used_bytes=used), lost), f"status {1}"
        )

    first = _Stored.pack(sample(1), None)
    second = _Stored.pack(sample(2), first)
    assert second.layout is first.layout and second.errors is first.errors and second.status is first.status
    assert second.unpack().devices[0].used_bytes == 2
