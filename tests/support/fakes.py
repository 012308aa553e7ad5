"""Test-only helpers around the simulated server (they do not ship in the package)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from tfgpu_magic.frameworks.base import ReportingDefaults
from tfgpu_magic.frameworks.tensorflow import AllocatorStats, InForce, Stage, TensorFlow
from tfgpu_magic.gpus.owners import OwnerLookupTable
from tfgpu_magic.gpus.simulated import SimulatedNvml
from tfgpu_magic.kernel.monitor import THREAD_NAME


def fake_process_table(
    server: SimulatedNvml, me: str = "me", my_pid: int | None = None, hides_others: bool = False
) -> OwnerLookupTable:
    """The simulated server's process table (``owner_of``) as an ``owners.ProcessTable``;
    ``hides_others``: as with ``/proc`` mounted ``hidepid``, a process not alive is hidden, not exited."""
    return OwnerLookupTable(server.owner_of, me=me, my_pid=my_pid, hides_others=hides_others)


class ManualClock:
    """A clock the test moves (``.now``, seconds), for samplers and simulated servers."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds (threads in tests)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


class FakeTensorFlow(TensorFlow):
    """The adapter with TensorFlow replaced by plain state: the one fake the unit tests share.

    ``stage``: where start-up is; ``gpus``: TensorFlow's ``GPU:j`` -> nvidia-smi index;
    ``stats``: allocator readings per device (None for a device without statistics);
    ``found``: CUDA indices of the physical GPUs TensorFlow lists.  Everything else (peak
    windows, folding nested peaks) is the real adapter's code.
    """

    def __init__(
        self,
        stage: Stage = Stage.NOT_IMPORTED,
        gpus: dict[str, int] | None = None,
        stats: dict[str, AllocatorStats | None] | None = None,
        found: list[int] | None = None,
        oom_error: type | None = None,
        cpu_only: bool = False,
    ) -> None:
        super().__init__()
        self.fake_stage = stage
        self.cpu_only = cpu_only  # a tensorflow-cpu install: never sees a GPU
        self.gpus = dict(gpus or {})
        self.stats: dict[str, AllocatorStats | None] = (
            stats if stats is not None else {}
        )  # shared, tests mutate it
        self.found = list(found or [])
        self.oom_error = oom_error
        self.resets: list[str] = []
        self.scopes: list[str] = []
        self.reset_works = True
        self.applied: list[tuple] = []
        self.build: dict | None = {
            "is_cuda_build": not cpu_only,
            "cuda_version": "12.5.1",
            "cudnn_version": "9",
        }

    def stage(self) -> Stage:
        return self.fake_stage

    def on_import(self, module: Any) -> None:
        """``import tensorflow`` finished (the session's post-import hook calls this first)."""
        self.fake_stage = max(self.fake_stage, Stage.IMPORTED)

    def cpu_only_build(self) -> bool:
        return self.cpu_only

    def build_info(self) -> dict | None:
        return None if self.build is None or self.fake_stage is Stage.NOT_IMPORTED else dict(self.build)

    def enumerate_devices(self) -> None:
        if self.fake_stage is Stage.IMPORTED:
            self.fake_stage = Stage.ENUMERATED

    def physical_gpu_indices(self) -> list[int]:
        return list(self.found)

    def apply(self, visible: Any, logical_mib: Any, growth: Any, cuda_map: list[int]) -> None:
        self.applied.append((visible, dict(logical_mib), growth))  # what tf.config would be given

    def in_force(self, cuda_map: list[int], env: Any) -> InForce:
        visible = tuple(sorted({cuda_map[k] for k in self.found if k < len(cuda_map)}))
        return InForce(visible, {i: None for i in visible}, None, "default")

    def gpu_names(self, cuda_map: list[int]) -> dict[str, int]:
        return dict(self.gpus) if self.fake_stage >= Stage.ENUMERATED else {}

    def allocator_stats(self) -> dict[str, AllocatorStats]:
        if self.fake_stage < Stage.STARTED:
            return {}
        return {name: s for name, s in self.stats.items() if s is not None}

    def memory_info(self, device: str) -> AllocatorStats | None:
        return self.stats.get(device) if self.fake_stage is Stage.STARTED else None

    def memory_devices(self) -> tuple[str, ...]:
        if self.fake_stage < Stage.STARTED:
            return ()
        names = tuple(self.allocator_stats())
        return tuple(n for n in names if n.startswith("GPU:")) or tuple(n for n in names if n == "CPU:0")

    def reset_peak(self, device: str) -> bool:
        self.resets.append(device)
        return self.reset_works

    @contextlib.contextmanager
    def device_scope(self, name: str) -> Any:
        self.scopes.append(name)  # entered, then "exit" when the cell leaves it
        try:
            yield
        finally:
            self.scopes.append("exit")

    def oom_error_type(self) -> type | None:
        return self.oom_error

    def keras_policy(self) -> str | None:
        return None


# A process that allocates 256 MiB on GPU 0 through CuPy (or PyTorch), prints "allocated", and
# holds it until its stdin closes: the real-GPU tests' stand-in for a training job.
GPU_ALLOCATOR_SCRIPT = """
import sys
try:
    import cupy
    block = cupy.zeros(256 * 1024 * 1024, dtype=cupy.uint8)
    cupy.cuda.runtime.deviceSynchronize()
except ImportError:
    import torch
    block = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
print("allocated", flush=True)
sys.stdin.read()
"""


def monitor_threads() -> list[threading.Thread]:
    """The monitor's sampler threads alive in this process."""
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


# -- the frameworks' allocator figures, as the panel's sampler is given them ---------------------------
def tf_figures(stats: dict, gpus: dict | None = None) -> Any:
    """A sampler's ``figures`` source: TensorFlow (the fake adapter, started) with ``stats`` per
    device and ``gpus`` (``GPU:j`` -> nvidia-smi index), read again at each call, as the kernel
    reads it after each cell.  Tests tick the sampler on their own thread, or stand in for it."""
    from tfgpu_magic.kernel import allocator_figures

    adapter = FakeTensorFlow(Stage.STARTED, gpus=gpus or {}, stats=stats)
    return lambda: allocator_figures.read([adapter], lambda: list(range(8)))


class StandInFramework:
    """Any framework's adapter as plain state: its key, name, figures and stage, and the thread of
    every call made to it (``threads``), so a test can say who asked."""

    def __init__(
        self,
        key: str,
        name: str,
        charted: tuple,
        memory: dict | None = None,
        stage: Stage = Stage.STARTED,
        absent: str | None = None,
        numbering: dict | None = None,
    ) -> None:
        self.key, self.name, self.charted_figures = key, name, charted
        self.memory = dict(memory or {})  # device -> DeviceMemory; tests change it
        self.fake_stage, self.absent, self.numbering = stage, absent, numbering
        self.threads: list[threading.Thread] = []

    def _called(self) -> None:
        self.threads.append(threading.current_thread())

    def stage(self) -> Stage:
        self._called()
        return self.fake_stage

    def device_memory(self) -> dict:
        self._called()
        return dict(self.memory) if self.fake_stage is Stage.STARTED else {}

    def figures_absent(self) -> str | None:
        self._called()
        return self.absent

    def gpu_numbering(self, cuda_map: list[int]) -> dict[str, int]:
        self._called()
        if self.numbering is not None:
            return dict(self.numbering)
        return {f"{self.key}:{k}": index for k, index in enumerate(cuda_map)}

    # what the trace asks of it
    import_says_little = False
    no_gpu_diagnosed = False

    def installed(self) -> bool:
        return True

    def open_peak_window(self) -> Any:
        from tfgpu_magic.frameworks.base import UnresettablePeakWindow

        self._called()
        return UnresettablePeakWindow(self.device_memory)

    def trace_label(self, device: str, gpu: int | None) -> str:
        return f"{self.name} {device}" if gpu is None else f"GPU {gpu} ({self.name} {device})"

    def trace_absent(self) -> str | None:
        return (
            None
            if self.absent is None
            else f"{self.name}: no allocator figures {self.absent}; nothing of it to trace"
        )

    def trace_ready(self, env: Any, visible: Any) -> bool | None:
        return None

    def trace_reply(self, env: Any, visible: Any, label: Any) -> str | None:
        return None

    def trace_stopped(self) -> None:
        pass


class WriteSideDefaults(ReportingDefaults):
    """A framework that takes no setting and has no figures (a stand-in's base): every command
    passes it by, it is given nothing and frees nothing.  Stand-ins override what they test."""

    charted_figures: tuple = ()
    import_says_little = no_gpu_diagnosed = False

    def figures_absent(self) -> str | None:
        return None

    def gpu_numbering(self, cuda_map: list[int]) -> dict:
        return {}

    managed_variables: tuple[str, ...] = ()
    environ: Any = None
    cuda_record: Any = None

    def takes(self, command: Any) -> bool:
        return False

    def consider(self, change: Any) -> str | None:
        return None

    def prepare(self, change: Any) -> None:
        pass

    def give(self, resolution: Any, host: Any) -> bool:
        return False

    def takes_share(self) -> bool:
        return False

    def share_fixed(self) -> bool:
        return False

    def arrived(self, plan: Any) -> str | None:
        return None

    def enumerated(self) -> bool:
        return False

    def cuda_found(self) -> list[int] | None:
        return None

    def device_gpus(self, cuda_map: list[int]) -> dict[str, int]:
        return {}

    def set_precision(self, policy: str | None) -> str | None:
        return None

    def side_imports(self) -> dict:
        return {}

    def frozen(self, kept: Any, host: Any) -> list[str]:
        return []

    def free_reading(self) -> Any:
        return {}

    def free(self, plan: Any, before: Any) -> Any:
        from tfgpu_magic.frameworks.base import FreeReport

        return FreeReport()
