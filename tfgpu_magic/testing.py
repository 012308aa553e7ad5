"""The old name of :mod:`tfgpu_magic.simulated`, kept so notebooks written against it still run."""

from .gpus.simulated import SimulatedGpu as FakeGpu
from .gpus.simulated import SimulatedNvml as FakeNvml
from .gpus.simulated import SimulatedProcess as FakeProcess
from .gpus.simulated import busy_server, shared_server

__all__ = ["FakeGpu", "FakeNvml", "FakeProcess", "busy_server", "shared_server"]
