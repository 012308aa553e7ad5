"""A simulated shared GPU server, for trying tfgpu_magic without a GPU: a documented, stable entry point.

Each server stands in for NVIDIA's NVML (the ``pynvml`` module) and is handed to the code that
reads GPUs: ``tfgpu_magic.set_device_source(shared_server())`` in a kernel, or
``--TfgpuMagic.device_source=tfgpu_magic.simulated:kernels_server`` for the Jupyter server.
The classes and functions live in :mod:`tfgpu_magic.gpus.simulated`; these are the same objects.
"""

from .gpus.simulated import (
    HostKernelsNvml,
    LiveKernelsNvml,
    NVMLError,
    SimulatedGpu,
    SimulatedMigInstance,
    SimulatedNvml,
    SimulatedProcess,
    busy_server,
    host_kernels_server,
    kernels_server,
    mig_server,
    shared_server,
)

__all__ = [
    "HostKernelsNvml",
    "LiveKernelsNvml",
    "NVMLError",
    "SimulatedGpu",
    "SimulatedMigInstance",
    "SimulatedNvml",
    "SimulatedProcess",
    "busy_server",
    "host_kernels_server",
    "kernels_server",
    "mig_server",
    "shared_server",
]
