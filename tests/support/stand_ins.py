"""Stand-ins for what only a GPU build of PyTorch or JAX does, keeping each framework's own rules.

``torch.cuda`` as a CUDA build behaves: calls queued with ``_lazy_call`` run when CUDA starts, and
a memory fraction is set per device.  ``jax`` as a GPU build behaves for the adapter: the backends
start once, at the first device query, reading the environment through the plugin-options function.
"""

from __future__ import annotations

import contextlib
import os
import types

from tfgpu_magic.frameworks import adapters
from tfgpu_magic.gpus.nvml import Nvml
from tfgpu_magic.gpus.simulated import shared_server
from tfgpu_magic.kernel.session import Session

from .fakes import FakeTensorFlow

GIB = 1 << 30


# -- PyTorch, a CUDA build -------------------------------------------------------------------------
class StandInCuda:
    """``torch.cuda`` as a CUDA build behaves: lazy start, queued calls, a fraction per device."""

    def __init__(self, totals: list[int]) -> None:
        self.totals = totals
        self.started = False
        self.queued: list = []
        self.fractions: dict[int, float] = {}
        self.allocated = [0] * len(totals)
        self.peak = [0] * len(totals)
        self.reserved = [0] * len(totals)
        self.current_device: int | None = None

    def allocate(self, k: int, size: int) -> None:  # what a tensor does to the caching allocator
        self.allocated[k] += size
        self.peak[k] = max(self.peak[k], self.allocated[k])
        self.reserved[k] = max(self.reserved[k], self.allocated[k])

    def reset_peak_memory_stats(self, k: int) -> None:
        self.peak[k] = self.allocated[k]

    @contextlib.contextmanager
    def device(self, k: int):
        self.current_device = k
        try:
            yield
        finally:
            self.current_device = None

    def is_initialized(self) -> bool:
        return self.started

    def _lazy_call(self, fn) -> None:
        if self.started:
            fn()
        else:
            self.queued.append(fn)

    def start(self) -> None:  # what _lazy_init does: start CUDA, then run the queued calls
        self.started = True
        for fn in self.queued:
            fn()

    def device_count(self) -> int:
        return len(self.totals)

    def get_device_properties(self, k: int):
        return types.SimpleNamespace(total_memory=self.totals[k])

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        assert self.started, "set_per_process_memory_fraction starts CUDA: it must wait for the start"
        self.fractions[device] = fraction

    def memory_allocated(self, k):
        return self.allocated[k]

    def max_memory_allocated(self, k):
        return self.peak[k]

    def memory_reserved(self, k):
        return self.reserved[k]

    def empty_cache(self):
        self.reserved = list(self.allocated)


class OutOfMemoryError(RuntimeError):
    """``torch.OutOfMemoryError``'s stand-in."""


def cuda_torch(totals: list[int]) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        cuda=StandInCuda(totals),
        version=types.SimpleNamespace(cuda="12.8"),
        _C=types.SimpleNamespace(),
        OutOfMemoryError=OutOfMemoryError,
    )


def torch_session(env: dict | None = None) -> Session:
    return Session(
        nvml=Nvml(lib=shared_server()), env=dict(env or {}), frameworks=adapters(tensorflow=FakeTensorFlow())
    )


# -- JAX, a GPU build -----------------------------------------------------------------------------
class StandInJax:
    """``jax`` as a GPU build behaves for the adapter: backends start at the first device query,
    reading the environment through the plugin-options function; memory per device."""

    def __init__(self, gpus: int = 2) -> None:
        self.started = False
        self.read_env: dict | None = None
        self.gpus = [StandInDevice(k) for k in range(gpus)]
        self.cleared = 0
        self.default = None
        self._in_first_devices = False
        bridge = types.SimpleNamespace(backends_are_initialized=lambda: self.started, backends=self._backends)
        xla_client = types.SimpleNamespace(generate_pjrt_gpu_plugin_options=self._options)
        self._src = types.SimpleNamespace(xla_bridge=bridge, lib=types.SimpleNamespace(xla_client=xla_client))
        self.errors = types.SimpleNamespace(JaxRuntimeError=type("JaxRuntimeError", (RuntimeError,), {}))

    def _options(self) -> dict:
        options = {
            "platform_name": "cuda",
            "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
        }
        if os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"):
            options["memory_fraction"] = float(os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"])
        if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"):
            options["preallocate"] = os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] not in ("false", "0")
        return options

    def _backends(self) -> dict:
        if not self.started:
            self.read_env = self._options()
            self.started = True
        clients = {"cpu": types.SimpleNamespace(platform="cpu")}
        if self.gpus:  # JAX 0.11's CUDA plugin: the client's platform is "gpu", its key "cuda"
            clients["cuda"] = types.SimpleNamespace(platform="gpu")
        return clients

    def devices(self) -> list:
        # As JAX 0.11 on a GPU: jax.devices() goes through a cached get_backend(), which cannot be
        # entered again while its first call is starting the backends (seen on an H100: an adapter
        # asking jax.devices() from inside that start recorded "no GPU").
        if self._in_first_devices:
            raise RuntimeError("get_backend() re-entered while the backends start")
        self._in_first_devices = not self.started
        try:
            self._src.xla_bridge.backends()  # as jax.devices() does: the first call starts the backends
        finally:
            self._in_first_devices = False
        return self.gpus

    def clear_caches(self) -> None:
        self.cleared += 1

    def default_device(self, device):
        self.default = device
        return contextlib.nullcontext()


class StandInDevice:
    platform = "gpu"

    def __init__(self, k: int) -> None:
        self.id = k
        self.stats = {"bytes_in_use": 0, "peak_bytes_in_use": 0, "bytes_limit": 30 * GIB, "pool_bytes": 0}

    def memory_stats(self) -> dict:
        return dict(self.stats)


def jax_session() -> Session:
    return Session(
        nvml=Nvml(lib=shared_server()), env=os.environ, frameworks=adapters(tensorflow=FakeTensorFlow())
    )
